"""Microcontroller footprint: python bench/mcu.py

Compiles the test models (micro CNN, MLPerf Tiny's KWS DS-CNN, the .tflite of tools/tflite_model.py)
for Cortex-M4, M7 and M55, runs each under QEMU against onnxruntime, and records flash, RAM, arena vs its
lower bound, instructions (QEMU -icount) and the measured stack. Also times the kernels from TVM's C
(arm-none-eabi-gcc -O2) against the LLVM-built ones. Writes bench/results/mcu.json and the table in
docs/benchmarks.md."""

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import onnx

import deploytool
from deploytool import benchmark
from deploytool.zoo import kws_dscnn, micro_cnn

root = Path(__file__).resolve().parent
sys.path.insert(0, str(root.parent / "tools"))
import tflite_model  # noqa: E402

work = Path(tempfile.mkdtemp(prefix="deploytool-mcu-bench-"))
models = {}
for f in (micro_cnn, kws_dscnn):
    onnx.save(f(), work / f"{f.__name__}.onnx")
    models[f.__name__] = (work / f"{f.__name__}.onnx", work / f"{f.__name__}.onnx")
tfl, twin = tflite_model.write(work)
models["micro_nhwc.tflite"] = (tfl, twin)
rows = []
for name, (model, ref) in models.items():
    for target in ("cortex-m4", "cortex-m7", "cortex-m55"):
        out = work / f"{name}-{target}"
        t0 = time.perf_counter()
        res = deploytool.compile(model, target=target, output=out)
        fp = res.artifact.metadata["footprint"]
        run = deploytool.run(out, check=ref)
        # the same bundle with TVM's C kernels instead of the LLVM-built object
        (out / "kernels_thumb.o").rename(work / "k.o")
        run_c = deploytool.run(out, check=ref)
        (work / "k.o").rename(out / "kernels_thumb.o")
        rows.append({"model": name, "target": target, "compile_s": round(time.perf_counter() - t0, 1),
                     "flash_code": fp["flash"]["code"], "flash_weights": fp["flash"]["weights"],
                     "arena": fp["ram"]["arena"], "arena_lower_bound": fp["arena_lower_bound"],
                     "arena_ratio": fp["arena_ratio"], "stack_measured": run.ran_on["stack_bytes"],
                     "ram_other": fp["ram"]["other"], "instructions": run.ran_on["instructions"],
                     "instructions_c_kernels": run_c.ran_on["instructions"], "image": run.ran_on["image"],
                     "max_rel_err": max(c.max_rel_err for c in run.comparison)})
        r = rows[-1]
        print(f"{name} {target}: flash {r['flash_code'] + r['flash_weights']} B, arena {r['arena']} B "
              f"({r['arena_ratio']:.3f}x bound), {r['instructions']:,} instructions "
              f"(C kernels {r['instructions_c_kernels']:,}), stack {r['stack_measured']} B")
shutil.rmtree(work, ignore_errors=True)
out = root / "results" / "mcu.json"
out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "models": rows}, indent=1))
benchmark.write_doc(root / "results", root.parent / "docs" / "benchmarks.md")
print(f"wrote {out}")
