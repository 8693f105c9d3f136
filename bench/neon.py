"""NEON, shown: python bench/neon.py [--models a,b] [--target arm]

Cross-compiles corpus models for an ARM preset (default schedules) and reads each build's disassembly:
per kernel, vector vs scalar fused multiply-adds (deploytool.simd). Writes bench/results/simd-<target>.json
and the table in docs/benchmarks.md. No board needed: this is how the schedules prove they vectorize
when the only board is emulated."""

import argparse
import json
import time
from pathlib import Path

import deploytool
from deploytool import benchmark, simd

p = argparse.ArgumentParser()
p.add_argument("--models", default="squeezenet,resnet50,mobilenet_v2,bert_encoder,ds_cnn_1d")
p.add_argument("--target", default="arm")
p.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
args = p.parse_args()

root = Path(__file__).resolve().parent
cache = Path(args.cache)
build = cache.parent / "artifacts"
build.mkdir(parents=True, exist_ok=True)
entries = {e["name"]: e for e in benchmark.load_manifest()["models"]}
rows = []
for name in args.models.split(","):
    model = benchmark.materialize(entries[name], cache)
    so = build / f"{name}-{args.target}.so"
    t0 = time.perf_counter()
    deploytool.compile(model, target=args.target, output=so)
    arch, kernels = simd.report(so)
    dense = [k for k in kernels if simd.is_dense(k.name)]
    rows.append({"model": name, "arch": arch, "compile_s": round(time.perf_counter() - t0, 1),
                 "kernels": len(kernels), "dense": len(dense), "dense_vector": sum(1 for k in dense if k.vector_fma),
                 "vector_fma": sum(k.vector_fma for k in dense), "scalar_fma": sum(k.scalar_fma for k in dense),
                 "widths": sorted({k.widest_bits for k in dense if k.widest_bits}),
                 "scalar_kernels": [k.name for k in dense if not k.vector_fma],
                 "per_kernel": [k.to_dict() for k in kernels]})
    r = rows[-1]
    print(f"{name}: {r['dense_vector']}/{r['dense']} conv/matmul kernels with vector FMAs, widths {r['widths']}")
out = root / "results" / f"simd-{args.target}.json"
out.write_text(json.dumps({"target": args.target, "date": time.strftime("%Y-%m-%d"), "models": rows}, indent=1))
benchmark.write_doc(root / "results", root.parent / "docs" / "benchmarks.md")
print(f"wrote {out}")
