"""Untuned benchmark over the frozen corpus: python bench/untuned.py [--models a,b] [--update-manifest]

Writes bench/results/untuned-<target>.json and the table in docs/benchmarks.md."""

import argparse
import json
import sys
from pathlib import Path

from deploytool import benchmark
from deploytool.artifact import sha256_file

p = argparse.ArgumentParser()
p.add_argument("--models", help="comma-separated subset")
p.add_argument("--target", default="x86")
p.add_argument("--threads", type=int)
p.add_argument("--repeats", type=int, default=20)
p.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
p.add_argument("--update-manifest", action="store_true", help="(re)generate the models and pin their hashes")
args = p.parse_args()

root = Path(__file__).resolve().parent
cache = Path(args.cache)
if args.update_manifest:
    manifest = benchmark.load_manifest()
    for e in manifest["models"]:
        e.pop("sha256", None)
        out = cache / f"{e['name']}.onnx"
        out.unlink(missing_ok=True)
        e["sha256"] = sha256_file(benchmark.materialize(e, cache))
        print(e["name"], e["sha256"])
    benchmark.MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    sys.exit(0)

out_dir = root / "results"
out_dir.mkdir(exist_ok=True)
build_dir = cache.parent / "artifacts"
build_dir.mkdir(parents=True, exist_ok=True)
names = args.models.split(",") if args.models else None
res = benchmark.run_untuned(names, cache, build_dir, target=args.target, threads=args.threads, repeats=args.repeats)
md = benchmark.markdown(res)
path = out_dir / f"untuned-{args.target}.json"
if names:  # a subset rerun replaces its rows in the full table, and says when it ran
    old = json.loads(path.read_text()) if path.exists() else None
    merged = benchmark.merge_results(old, res)
    if merged is not res:
        merged["date"] = old["date"]
        merged["notes"] = [n for n in old.get("notes", []) if not any(n.startswith(m + ":") for m in names)] + \
            [f"{m}: rerun {res['date']}" for m in names]
    res = merged
path.write_text(json.dumps(res, indent=2) + "\n")
benchmark.write_doc(out_dir, root.parent / "docs" / "benchmarks.md")
print(md)
