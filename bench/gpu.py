"""GPU benchmark: deploytool vs torch eager, torch.compile (max-autotune) and onnxruntime, in one run.

    python bench/gpu.py [--models resnet50,bert_encoder] [--batches 1,32] [--dtypes float32,float16]
                        [--log-dir tuning_logs] [--compile-modes max-autotune] [--out bench/results]

Every engine runs the same model with the same weights (the frozen corpus's ONNX file; torch runs
it through bench/onnx_torch.py) on the same inputs. float32 comparisons run with TF32 off (torch's
matmul and cuDNN flags), float16 ones with torch's module and inputs in half precision and
deploytool's --dtype float16 (mixed precision, float32 interface). deploytool's outputs are checked
against onnxruntime (CPU, float32) before timing. Latency: wall clock per call with the device
synchronized, median of at least --repeats calls after warm-up, the same loop for every engine.

A tuning log ``<log-dir>/<model>-b<batch>-<dtype>-cuda.jsonl`` (or ``.jsonl.gz``) is used when it exists (its
coverage is reported). Writes ``gpu.json`` and ``gpu.md`` to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def log_name(model: str, batch: int, dtype: str) -> str:
    return f"{model}-b{batch}-{dtype}-cuda.jsonl"


def find_log(log_dir: Path, model: str, batch: int, dtype: str) -> Path:
    """The model's log in ``log_dir``: the plain one a tuning run appends to, else the shipped .gz."""
    plain = Path(log_dir) / log_name(model, batch, dtype)
    gz = plain.with_name(plain.name + ".gz")
    return gz if gz.exists() and not plain.exists() else plain


def timed(fn, sync, warmup: int, repeats: int, min_s: float = 1.0) -> dict:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    t_start = time.perf_counter()
    while len(samples) < repeats or (time.perf_counter() - t_start < min_s and len(samples) < 2000):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "n": len(samples)}


def model_file(name: str, batch: int, cache: Path) -> Path:
    import onnx

    from deploytool import benchmark
    from onnx_torch import rebatch

    entry = {e["name"]: e for e in benchmark.load_manifest()["models"]}[name]
    base = benchmark.materialize(entry, cache)
    if batch == 1:
        return base
    out = cache / f"{name}-b{batch}.onnx"
    if not out.exists():
        onnx.save(rebatch(onnx.load(base), batch), out)
    return out


def feeds_for(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    from deploytool.artifact import TensorSpec
    from deploytool.frontend import load_onnx
    from deploytool.inputs import random_inputs

    m = load_onnx(path)
    inits = {t.name for t in m.graph.initializer}
    specs = []
    for i in m.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        dt = {1: "float32", 7: "int64", 6: "int32"}[tt.elem_type]
        specs.append(TensorSpec(i.name, tuple(d.dim_value for d in tt.shape.dim), dt))
    return random_inputs(specs, seed)


def run_torch(onnx_path: Path, feeds, dtype: str, mode: str | None, warmup: int, repeats: int) -> dict:
    import onnx
    import torch

    from onnx_torch import module_from_onnx

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    mod = module_from_onnx(onnx.load(onnx_path)).cuda().eval()
    args = [torch.from_numpy(v).cuda() for v in feeds.values()]
    if dtype == "float16":
        mod = mod.half()
        args = [a.half() if a.is_floating_point() else a for a in args]
    t0 = time.perf_counter()
    fn = torch.compile(mod, mode=mode) if mode else mod
    with torch.inference_mode():
        # compiles here for torch.compile; the output is copied out at once (CUDA-graph replays of
        # max-autotune overwrite it)
        output = fn(*args).float().cpu().numpy()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        res = timed(lambda: fn(*args), torch.cuda.synchronize, warmup, repeats)
    res["output"] = output
    if mode:
        res["compile_s"] = compile_s
    torch.cuda.empty_cache()
    return res


def run_ort(onnx_path: Path, feeds, warmup: int, repeats: int) -> dict | None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    sess = ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider"])
    return timed(lambda: sess.run(None, feeds), lambda: None, warmup, repeats)


def run_deploytool(onnx_path: Path, feeds, dtype: str, log: Path | None, out_dir: Path, warmup: int, repeats: int,
                   ref, tag: str = "", split_k: bool = True, cublas: bool = False, cudnn: bool = False) -> dict:
    import deploytool
    from deploytool.artifact import Artifact
    from deploytool.reference import compare
    from deploytool.runner import LocalRunner

    so = out_dir / f"{onnx_path.stem}-{dtype}{tag}-cuda.so"
    t0 = time.perf_counter()
    res = deploytool.compile(onnx_path, target="cuda", output=so, dtype=dtype, split_k=split_k,
                             cublas=cublas and dtype == "float16", cudnn=cudnn and dtype == "float16",
                             tuning_log=log if log and log.exists() else None)
    compile_s = time.perf_counter() - t0
    runner = LocalRunner(Artifact.open(so))
    outs = runner.run(feeds)
    cmp = compare(outs, ref, 3e-2 if dtype == "float16" else 1e-4)
    tm = runner.time(feeds, warmup=warmup, repeats=repeats, min_seconds=1.0)
    tuned = sum(1 for v in res.schedules.values() if v == "tuned")
    return {"median_ms": tm.median_ms, "min_ms": tm.min_ms, "n": tm.repeats, "compile_s": compile_s,
            "check": "pass" if all(c.ok for c in cmp) else f"FAIL (rel err {max(c.max_rel_err for c in cmp):.2g})",
            "max_rel_err": max(c.max_rel_err for c in cmp), "tuned_kernels": tuned, "kernels": len(res.schedules),
            "output": next(iter(outs.values()))}


def gpu_and_folders(args):
    """(this machine's GPU, --cache, --out), the folders made; None (said on stderr) without a GPU."""
    from deploytool import cuda

    gpu = cuda.local_gpu()
    if gpu is None:
        print("no NVIDIA GPU here: run this on the GPU machine", file=sys.stderr)
        return None
    cache, out = Path(args.cache), Path(args.out)
    cache.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return gpu, cache, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,bert_encoder")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--log-dir", default=str(REPO / "tuning_logs"))
    ap.add_argument("--compile-modes", default="max-autotune",
                    help="torch.compile modes to time, comma-separated ('' for none)")
    ap.add_argument("--compile-dtypes", default="float16", help="dtypes for which torch.compile runs")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/deploytool/corpus"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--alt-log-dir", help="also build and time deploytool from the logs here, in the same run "
                    "(a column deploytool_ALT-LABEL): two tuning methods compared on equal terms")
    ap.add_argument("--alt-label", default="alt")
    ap.add_argument("--alt-no-split-k", action="store_true", help="build the --alt-log-dir column without split-K "
                    "(deploytool.splitk): its logs were tuned on the unsplit kernels")
    ap.add_argument("--cublas", action="store_true", help="float16 rows: build deploytool with --cublas (matmuls "
                    "on cuBLAS); --also-tir adds the build without it as a column deploytool_tir")
    ap.add_argument("--cudnn", action="store_true", help="float16 rows: build deploytool with --cudnn (convolutions "
                    "on cuDNN, NHWC, epilogues fused); --also-tir adds the build without it as a column deploytool_tir")
    ap.add_argument("--also-tir", action="store_true")
    ap.add_argument("--torch-only", action="store_true", help="time only the torch engines (deploytool rows "
                    "from an earlier run of the same script)")
    args = ap.parse_args(argv)

    from deploytool.benchmark import markdown_gpu
    from deploytool.reference import ort_run, ort_session

    found = gpu_and_folders(args)
    if found is None:
        return 2
    gpu, cache, out = found
    import torch
    modes = [m for m in args.compile_modes.split(",") if m]
    rows = []

    def save(rows_now):
        """gpu.json and gpu.md as measured so far: a run cut short keeps what it measured."""
        for r in rows_now:
            for v in r.values():
                if isinstance(v, dict):
                    v.pop("output", None)
        print(json.dumps(rows_now[-1]), flush=True)
        result = {"kind": "gpu", "gpu": gpu.to_dict(), "torch": torch.__version__,
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows_now}
        (out / "gpu.json").write_text(json.dumps(result, indent=1))
        (out / "gpu.md").write_text(markdown_gpu(result))
        return result

    for name in args.models.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            path = model_file(name, batch, cache)
            feeds = feeds_for(path)
            ref = ort_run(ort_session(path), feeds)
            for dtype in args.dtypes.split(","):
                row = {"model": name, "batch": batch, "dtype": dtype}
                log = find_log(Path(args.log_dir), name, batch, dtype)
                try:
                    if args.torch_only:
                        raise RuntimeError("not run (--torch-only)")
                    row["deploytool"] = run_deploytool(path, feeds, dtype, log, cache, args.warmup, args.repeats, ref,
                                                       cublas=args.cublas, cudnn=args.cudnn)
                    row["log"] = log.name if log.exists() else None
                    row["cublas"] = args.cublas and dtype == "float16"
                    row["cudnn"] = args.cudnn and dtype == "float16"
                    if (row["cublas"] or row["cudnn"]) and args.also_tir:
                        row["deploytool_tir"] = run_deploytool(path, feeds, dtype, log, cache, args.warmup,
                                                               args.repeats, ref, tag="-tir")
                except Exception as e:  # a failed engine is a row entry, not the end of the run
                    row["deploytool"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if args.alt_log_dir and not args.torch_only:
                    alt = find_log(Path(args.alt_log_dir), name, batch, dtype)
                    try:
                        row[f"deploytool_{args.alt_label}"] = run_deploytool(
                            path, feeds, dtype, alt, cache, args.warmup, args.repeats, ref, tag=f"-{args.alt_label}",
                            split_k=not args.alt_no_split_k)
                        row[f"log_{args.alt_label}"] = alt.name if alt.exists() else None
                    except Exception as e:
                        row[f"deploytool_{args.alt_label}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                # deploytool's numbers saved before torch's engines run: a cold torch.compile max-autotune
                # of ResNet-50 b1 ran past a 430 s call limit and took the whole row with it
                save(rows + [dict(row, partial="torch engines not run yet")])
                try:
                    row["torch_eager"] = run_torch(path, feeds, dtype, None, args.warmup, args.repeats)
                except Exception as e:
                    row["torch_eager"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if dtype in args.compile_dtypes.split(","):
                    for mode in modes:
                        try:
                            row[f"torch_compile_{mode}"] = run_torch(path, feeds, dtype, mode, args.warmup, args.repeats)
                        except Exception as e:
                            row[f"torch_compile_{mode}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if dtype == "float32":
                    row["onnxruntime_cuda"] = run_ort(path, feeds, args.warmup, args.repeats) or {
                        "error": "onnxruntime has no CUDAExecutionProvider here"}
                # agreement of torch with onnxruntime (the converter is right)
                te = row["torch_eager"]
                if "output" in te:
                    r = next(iter(ref.values()))
                    row["torch_vs_ort_rel_err"] = float(np.abs(te["output"] - r).max() / (np.abs(r).max() or 1))
                rows.append(row)
                result = save(rows)
    print(markdown_gpu(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
