"""Tuned benchmark over the frozen corpus: python bench/tuned.py [--models a,b] [--trials-per-task 64]

Tunes each model (resuming its log under --log-dir), builds it from the log with --require-tuned,
checks it against onnxruntime and times both. Writes bench/results/tuned-<target>.json and the
tuned section of docs/benchmarks.md."""

import argparse
import json
from pathlib import Path

from deploytool import benchmark

p = argparse.ArgumentParser()
p.add_argument("--models", help="comma-separated subset")
p.add_argument("--target", default="x86-avx512")
p.add_argument("--trials-per-task", type=int, default=64)
p.add_argument("--threads", type=int)
p.add_argument("--repeats", type=int, default=20)
p.add_argument("--clock-ghz", type=float, help="core clock for the %% of peak (default: /proc/cpuinfo's)")
p.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
p.add_argument("--log-dir", default=str(Path.home() / ".cache" / "deploytool" / "tuning"))
p.add_argument("--label", help="write bench/results/tuned-<target>-<label>.json instead (another budget: --label long)")
args = p.parse_args()

root = Path(__file__).resolve().parent
cache = Path(args.cache)
out_dir = root / "results"
out_dir.mkdir(exist_ok=True)
build_dir = cache.parent / "artifacts"
build_dir.mkdir(parents=True, exist_ok=True)
log_dir = Path(args.log_dir)
log_dir.mkdir(parents=True, exist_ok=True)
names = args.models.split(",") if args.models else None
res = benchmark.run_tuned(names, cache, build_dir, log_dir, target=args.target, trials_per_task=args.trials_per_task,
                          threads=args.threads, repeats=args.repeats, clock_ghz=args.clock_ghz)
out = out_dir / (f"tuned-{args.target}-{args.label}.json" if args.label else f"tuned-{args.target}.json")
res = benchmark.merge_results(json.loads(out.read_text()) if out.is_file() else None, res)
out.write_text(json.dumps(res, indent=2) + "\n")
benchmark.write_doc(out_dir, root.parent / "docs" / "benchmarks.md")
print(benchmark.markdown_tuned(res))
