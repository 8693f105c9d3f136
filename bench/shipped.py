"""The shipped tuning logs on this machine: python bench/shipped.py [--target x86-avx2] [--models a,b]

For every log in tuning_logs/ for --target (model-<target>.jsonl[.gz]), builds its corpus model from
the log with --require-tuned, checks it against onnxruntime, and times both engines with `deploytool
bench --compare` (--rounds rounds alternating onnxruntime and deploytool; the ratio is the median of
the rounds' ratios). No tuning. Writes bench/results/shipped-<target>-<label>.json (label: the CPU,
e.g. zen3) and the section of docs/benchmarks.md."""

import argparse
import json
import sys
from pathlib import Path

from deploytool import benchmark
from deploytool.errors import DeploytoolError

p = argparse.ArgumentParser()
p.add_argument("--target", default="x86-avx2")
p.add_argument("--models", help="comma-separated subset of the corpus names")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--repeats", type=int, default=20)
p.add_argument("--threads", type=int)
p.add_argument("--label", help="the machine, in the file name (default: the CPU's family, e.g. zen3)")
p.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
args = p.parse_args()

root = Path(__file__).resolve().parent
names = args.models.split(",") if args.models else None
try:
    logs = benchmark.shipped_logs(root.parent / "tuning_logs", args.target)
    if not logs or (names and not set(names) & set(logs)):
        raise DeploytoolError(f"tuning_logs/ has no {args.target} log" + (f" for {args.models}" if names else ""),
                              f"pick a target and models it has logs for ({', '.join(sorted(logs)) or 'none here'})")
    res = benchmark.run_shipped(args.target, root.parent / "tuning_logs", Path(args.cache),
                                Path(args.cache).parent / "artifacts", names=names, rounds=args.rounds,
                                repeats=args.repeats, threads=args.threads)
except DeploytoolError as e:
    print(f"bench/shipped.py: error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
label = args.label or res["host"]["family"]
out = root / "results" / f"shipped-{args.target}-{label}.json"
if out.is_file():  # a --models subset replaces its rows, keeps the others' (and the notes)
    old = json.loads(out.read_text())
    res = benchmark.merge_results(old, res)
    res["notes"] = old.get("notes", [])
out.write_text(json.dumps(res, indent=2) + "\n")
benchmark.write_doc(root / "results", root.parent / "docs" / "benchmarks.md")
print(benchmark.markdown_shipped(res))
