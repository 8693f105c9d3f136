"""A/B of the default (untuned) CUDA schedules: deploytool's rules against TVM's dlight rules alone.

    python bench/gpu_rules.py [--cases resnet50:32,resnet50:1,bert_encoder:32] [--dtype float16]
                              [--rounds 5] [--out bench/results]

schedules.gpu puts ``TensorCoreMatmul`` in front of dlight's rules: dlight's ``Matmul`` uses tensor
cores only when every GEMM dimension is above 64. This builds each case twice without a tuning log
(every kernel on its default schedule), ours and dlight's alone, compiling all builds in parallel
(one process each), then checks both against onnxruntime and times them in interleaved rounds in
one process (the GPU machine is shared and noisy: ratios from one run). Writes
``gpu-rules.json`` and ``gpu-rules.md`` to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def build(path: str, dtype: str, so: str, dlight_only: bool) -> dict:
    import deploytool
    from deploytool.schedules import gpu

    if dlight_only:  # this process only
        ours = gpu.rules
        gpu.rules = lambda: [r for r in ours() if not isinstance(r, gpu.TensorCoreMatmul)]
    t0 = time.perf_counter()
    res = deploytool.compile(path, target="cuda", output=so, dtype=dtype)
    rules: dict[str, int] = {}
    for r in res.schedules.values():
        rules[r] = rules.get(r, 0) + 1
    return {"compile_s": time.perf_counter() - t0, "rules": rules}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="resnet50:32,resnet50:1,bert_encoder:32", help="MODEL:BATCH,...")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)

    from gpu import feeds_for, gpu_and_folders, model_file

    from deploytool.artifact import Artifact
    from deploytool.reference import compare, ort_run, ort_session
    from deploytool.runner import LocalRunner

    found = gpu_and_folders(args)
    if found is None:
        return 2
    gpu, cache, out = found
    cases = [(m, int(b)) for m, b in (c.split(":") for c in args.cases.split(","))]
    paths = {c: model_file(c[0], c[1], cache) for c in cases}
    variants = {"ours": False, "dlight": True}
    jobs = {}
    with ProcessPoolExecutor(len(cases) * len(variants)) as pool:
        for c in cases:
            for v, dl in variants.items():
                so = cache / f"{c[0]}-b{c[1]}-{args.dtype}-{v}-rules.so"
                jobs[c, v] = (so, pool.submit(build, str(paths[c]), args.dtype, str(so), dl))
        builds = {k: dict(f.result(), so=so) for k, (so, f) in jobs.items()}
    rows = []
    for c in cases:
        feeds = feeds_for(paths[c])
        ref = ort_run(ort_session(paths[c]), feeds)
        runners, row = {}, {"model": c[0], "batch": c[1], "dtype": args.dtype}
        for v in variants:
            b = builds[c, v]
            runners[v] = LocalRunner(Artifact.open(b["so"]))
            cmp = compare(runners[v].run(feeds), ref, 3e-2 if args.dtype == "float16" else 1e-4)
            row[v] = {"compile_s": round(b["compile_s"], 1), "rules": b["rules"],
                      "check": "pass" if all(x.ok for x in cmp) else "FAIL",
                      "max_rel_err": max(x.max_rel_err for x in cmp), "rounds_ms": []}
        for _ in range(args.rounds):
            for v in variants:
                row[v]["rounds_ms"].append(runners[v].time(feeds, warmup=3, repeats=args.repeats).median_ms)
        for v in variants:
            row[v]["median_ms"] = statistics.median(row[v]["rounds_ms"])
        row["speedup"] = row["dlight"]["median_ms"] / row["ours"]["median_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"kind": "gpu-rules", "gpu": gpu.to_dict(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "rows": rows}
    (out / "gpu-rules.json").write_text(json.dumps(result, indent=1))
    lines = [f"Untuned CUDA builds, {gpu.name}, {result['date']}: deploytool's default rules vs TVM's dlight alone "
             f"(median of {args.rounds} interleaved rounds).", "",
             "| model | batch | dtype | ours ms | dlight alone ms | speedup | kernels on TensorCoreMatmul | check |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['ours']['median_ms']:.3f} | "
                     f"{r['dlight']['median_ms']:.3f} | {r['speedup']:.2f}x | "
                     f"{r['ours']['rules'].get('TensorCoreMatmul', 0)} | {r['ours']['check']} / {r['dlight']['check']} |")
    (out / "gpu-rules.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
