"""ResNet-50's batch-32 float16 convolutions, one by one, on the GPU: deploytool's cuDNN graph
plans (deploytool/native/cudnn_graph.h, the code of ``--cudnn`` builds) against torch's cuDNN
convolutions in channels-last, in the same process. Needs torch and a C++ compiler, not TVM.

    python bench/cudnn_convs.py [--candidates 4] [--out DIR]

Per convolution (with the epilogue the model puts after it, BatchNorm folded into a bias):
- ``fused``: our plan of conv + bias (+ residual) (+ ReLU) in one cuDNN graph;
- ``conv``: our plan of the convolution alone;
- ``torch_conv``: torch's F.conv2d (channels-last, cudnn.benchmark on, so its fastest algorithm);
- ``torch_eager``: torch's conv + bias, then the residual add and ReLU as torch ops.
Each is the mean of ``--repeats`` launches between CUDA events, after a warm-up; the fused
output is checked against torch's. Writes cudnn_convs.json and .md under --out.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (count, C in, H in, K out, kernel, stride, pad, residual, relu): ResNet-50 v1 as the onnx wheel's
# light_resnet50.onnx has it (stride 2 in the 3x3 convolution; every BatchNorm folded into a bias).
# A block's projection shortcut is computed with its bias alone; the last 1x1 of each block takes
# the shortcut as its residual, then ReLU.
RESNET50 = [
    (1, 3, 224, 64, 7, 2, 3, False, True),
    (1, 64, 56, 64, 1, 1, 0, False, True),
    (3, 64, 56, 64, 3, 1, 1, False, True),
    (3, 64, 56, 256, 1, 1, 0, True, True),
    (1, 64, 56, 256, 1, 1, 0, False, False),
    (2, 256, 56, 64, 1, 1, 0, False, True),
    (1, 256, 56, 128, 1, 1, 0, False, True),
    (1, 128, 56, 128, 3, 2, 1, False, True),
    (4, 128, 28, 512, 1, 1, 0, True, True),
    (1, 256, 56, 512, 1, 2, 0, False, False),
    (3, 512, 28, 128, 1, 1, 0, False, True),
    (3, 128, 28, 128, 3, 1, 1, False, True),
    (1, 512, 28, 256, 1, 1, 0, False, True),
    (1, 256, 28, 256, 3, 2, 1, False, True),
    (6, 256, 14, 1024, 1, 1, 0, True, True),
    (1, 512, 28, 1024, 1, 2, 0, False, False),
    (5, 1024, 14, 256, 1, 1, 0, False, True),
    (5, 256, 14, 256, 3, 1, 1, False, True),
    (1, 1024, 14, 512, 1, 1, 0, False, True),
    (1, 512, 14, 512, 3, 2, 1, False, True),
    (3, 512, 7, 2048, 1, 1, 0, True, True),
    (1, 1024, 14, 2048, 1, 2, 0, False, False),
    (2, 2048, 7, 512, 1, 1, 0, False, True),
    (2, 512, 7, 512, 3, 1, 1, False, True),
]


def build_shim(out_dir: Path) -> Path:
    so = out_dir / "cudnn_convs.so"
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-shared", "-fPIC", "-I",
           str(ROOT / "deploytool" / "native"), str(ROOT / "bench" / "cudnn_convs.cc"), "-o", str(so), "-ldl"]
    subprocess.run(cmd, check=True)
    return so


def cudnn_path(torch) -> str | None:
    for d in sys.path:
        found = sorted(glob.glob(os.path.join(d, "nvidia", "cudnn", "lib", "libcudnn.so.*")))
        if found:
            return found[0]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--candidates", type=int, default=4, help="engine configurations timed per plan")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_results"))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    if "DEPLOYTOOL_CUDNN" not in os.environ and cudnn_path(torch):
        os.environ["DEPLOYTOOL_CUDNN"] = cudnn_path(torch)
    lib = ctypes.CDLL(str(build_shim(out)))
    lib.dt_plan.restype = ctypes.c_void_p
    lib.dt_plan.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int] + [ctypes.c_void_p] * 6 + \
        [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.dt_execute.argtypes = [ctypes.c_void_p] * 8
    for fn in (lib.dt_workspace, lib.dt_chosen, lib.dt_configs):
        fn.argtypes = [ctypes.c_void_p]
    lib.dt_workspace.restype = ctypes.c_int64
    stream = torch.cuda.current_stream().cuda_stream

    def timed(fn, repeats):
        fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(repeats):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / repeats

    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for count, c, h, k, r, s, pad, residual, relu in RESNET50:
        n = args.batch
        p = (h + 2 * pad - r) // s + 1
        cl = torch.channels_last
        x = torch.randn(n, c, h, h, generator=g).half().to(dev).to(memory_format=cl)
        w = (torch.randn(k, c, r, r, generator=g) / (c * r * r) ** 0.5).half().to(dev).to(memory_format=cl)
        bias = (torch.randn(k, generator=g) * 0.1).half().to(dev)
        z = torch.randn(n, k, p, p, generator=g).half().to(dev).to(memory_format=cl) if residual else None
        y = torch.empty(n, k, p, p, dtype=torch.half, device=dev).to(memory_format=cl)
        spec = (ctypes.c_int64 * 19)(n, h, h, c, k, r, r, p, p, s, s, pad, pad, 1, 1, 1, 1, int(residual), int(relu))
        ptr = lambda t: ctypes.c_void_p(t.data_ptr()) if t is not None else None  # noqa: E731
        row = {"count": count, "shape": f"{c}x{h}x{h} -> {k}x{p}x{p}, {r}x{r}/{s}",
               "epilogue": "bias" + ("+z" if residual else "") + ("+relu" if relu else ""),
               "gflop": 2 * n * p * p * k * c * r * r / 1e9}

        def reference():
            t = F.conv2d(x, w, bias, stride=s, padding=pad)
            if z is not None:
                t = t + z
            return torch.relu(t) if relu else t

        for label, fuse in (("fused", 1), ("conv", 0)):
            err = ctypes.create_string_buffer(1024)
            t0 = time.time()
            plan = lib.dt_plan(spec, fuse, ptr(x), ptr(w), ptr(bias), ptr(z), ptr(y), ctypes.c_void_p(stream),
                               args.candidates, 5, int(args.verbose), err, 1024)
            row[f"{label}_plan_s"] = round(time.time() - t0, 3)
            if not plan:
                row[label] = None
                row[f"{label}_error"] = err.value.decode()
                print(f"  {row['shape']} {label}: {err.value.decode()}")
                continue
            ws_bytes = lib.dt_workspace(plan)
            ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=dev)
            launch = lambda: lib.dt_execute(plan, ptr(x), ptr(w), ptr(bias), ptr(z), ptr(y),  # noqa: E731
                                            ctypes.c_void_p(ws.data_ptr()), ctypes.c_void_p(stream))
            if launch() != 0:
                row[label] = None
                row[f"{label}_error"] = "execute failed"
                continue
            torch.cuda.synchronize()
            if fuse:
                ref = reference().float()
                row["max_rel_err"] = float((y.float() - ref).abs().max() / ref.abs().max())
            row[label] = timed(launch, args.repeats)
            row[f"{label}_config"] = f"{lib.dt_chosen(plan)}/{lib.dt_configs(plan)}"
        row["torch_conv"] = timed(lambda: F.conv2d(x, w, bias, stride=s, padding=pad), args.repeats)
        row["torch_eager"] = timed(reference, args.repeats)
        rows.append(row)
        print(f"{count} x {row['shape']:32s} {row['epilogue']:14s} fused {row.get('fused') or float('nan'):.4f} "
              f"conv {row.get('conv') or float('nan'):.4f} torch_conv {row['torch_conv']:.4f} "
              f"eager {row['torch_eager']:.4f} ms  err {row.get('max_rel_err', float('nan')):.1e} "
              f"plan {row.get('fused_plan_s')} s cfg {row.get('fused_config')}", flush=True)

    cols = ["fused", "conv", "torch_conv", "torch_eager"]
    total = {c: sum(r["count"] * (r[c] or float("nan")) for r in rows) for c in cols}
    gflop = sum(r["count"] * r["gflop"] for r in rows)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "batch": args.batch, "candidates": args.candidates,
              "rows": rows, "total_ms": total, "gflop": gflop}
    (out / "cudnn_convs.json").write_text(json.dumps(result, indent=1))
    lines = ["| count | convolution | epilogue | fused ms | conv ms | torch conv ms | torch eager ms | fused TFLOP/s |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        tf = "-" if not r.get("fused") else f"{r['gflop'] / r['fused']:.0f}"
        lines.append(f"| {r['count']} | {r['shape']} | {r['epilogue']} | {f(r.get('fused'))} | {f(r.get('conv'))} | "
                     f"{f(r['torch_conv'])} | {f(r['torch_eager'])} | {tf} |")
    lines.append(f"| {sum(r['count'] for r in rows)} | **all, x count** | | **{total['fused']:.3f}** | {total['conv']:.3f} | "
                 f"{total['torch_conv']:.3f} | {total['torch_eager']:.3f} | {gflop / total['fused']:.0f} |")
    (out / "cudnn_convs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
