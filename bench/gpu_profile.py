"""Where a deploytool CUDA build spends its time: per-kernel GPU time through CUPTI.

    python bench/gpu_profile.py [--models resnet50] [--batches 1] [--dtype float16]
                                [--log-dir tuning_logs] [--out bench/results]

TVM 0.27's VM has no profiler any more; torch.profiler's CUDA activity (CUPTI) records every kernel
the process launches, TVM's included, also inside CUDA-graph replays. Per model: wall time per
call, the sum of kernel times per call, and the kernels by GPU time, with the tuning log's
estimate for the same kernel next to it. Writes gpu_profile.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def profile(so: Path, feeds, calls: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    from deploytool.artifact import Artifact
    from deploytool.runner import LocalRunner

    runner = LocalRunner(Artifact.open(so))
    tm = runner.time(feeds, warmup=10, repeats=50, min_seconds=1.0)
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            runner.run(feeds)
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name != "CUDA" or "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        per[e.name][0] += 1
        per[e.name][1] += e.time_range.elapsed_us()  # a device event: the kernel's own span
    kernels = sorted(({"kernel": k, "launches_per_call": n / calls, "us_per_call": us / calls}
                      for k, (n, us) in per.items()), key=lambda r: -r["us_per_call"])
    return {"median_ms": tm.median_ms, "kernel_ms": sum(r["us_per_call"] for r in kernels) / 1e3,
            "launches_per_call": sum(r["launches_per_call"] for r in kernels), "kernels": kernels}


LEGEND = ("GPU us per call: the kernel's time summed over its launches in one call of the model (CUPTI); "
          "log best us per launch: the tuning log's best for the kernel's function, as the tuner timed it (alone; "
          "logs tuned since 2026-11-30 16:00 UTC time each launch after an L2 flush, earlier ones launch after "
          "launch on the same buffers, so inputs and weights stayed in L2; a function that compiles to two kernels, "
          "`_kernel_1`, has one log entry for both).")


def markdown(results: list[dict], top: int) -> list[str]:
    md = []
    for r in results:
        md += [f"### {r['model']} b{r['batch']} {r['dtype']}: {r['median_ms']:.3f} ms per call, kernels "
               f"{r['kernel_ms']:.3f} ms ({r['launches_per_call']:.0f} launches)", "",
               "| kernel | launches | GPU us per call | us per launch | log best us per launch | in model / log |",
               "|---|---:|---:|---:|---:|---:|"]
        for k in r["kernels"][:top]:
            one = k["us_per_call"] / k["launches_per_call"]
            lb = k["log_best_ms"] * 1e3 if k["log_best_ms"] is not None else None
            md.append(f"| {k['kernel']} | {k['launches_per_call']:.0f} | {k['us_per_call']:.1f} | {one:.1f} | "
                      + (f"{lb:.1f} | {one / lb:.2f}x |" if lb else "- | - |"))
        md.append("")
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--log-dir", default=str(REPO / "tuning_logs"))
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--cublas", action="store_true", help="build with --cublas (float16 matmuls on cuBLAS)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)

    import deploytool
    from deploytool.tuninglog import TuningLog
    from gpu import feeds_for, find_log, model_file

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models.split(","):
        for b in map(int, args.batches.split(",")):
            path = model_file(name, b, Path(args.cache))
            log = find_log(Path(args.log_dir), name, b, args.dtype)
            log = log if log.exists() else None
            so = out / f"{name}-b{b}-{args.dtype}-profile.so"
            t0 = time.perf_counter()
            built = deploytool.compile(path, target="cuda", output=so, dtype=args.dtype, tuning_log=log,
                                      cublas=args.cublas)
            compile_s = time.perf_counter() - t0
            r = profile(so, feeds_for(path), args.calls)
            est = {}
            if log is not None:  # by workload hash: the log may know a kernel under another graph's name
                best = TuningLog.read(log).best_by_workload()
                est = {t.name: best[t.workload_hash].seconds * 1e3 for t in built.tasks if t.workload_hash in best}
            for k in r["kernels"]:
                base = re.sub(r"_kernel(_\d+)?$", "", k["kernel"])
                k["log_best_ms"] = est.get(base)
            r.update(model=name, batch=b, dtype=args.dtype, compile_s=compile_s,
                     log=str(log) if log else None)
            results.append(r)
    import torch

    header = [f"`python bench/gpu_profile.py --models {args.models} --batches {args.batches}`, "
              f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. " + LEGEND, ""]
    md = header + markdown(results, args.top)
    (out / "gpu_profile.json").write_text(json.dumps(results, indent=1))
    (out / "gpu_profile.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
