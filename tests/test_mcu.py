"""Cortex-M C bundles: a small CNN (conv, depthwise, pooling, dense, softmax) and MLPerf Tiny's
keyword-spotting DS-CNN, plus a .tflite model, compiled for Cortex-M4, M7 and M55; built for the host
with gcc and run under qemu-system-arm (mps2-an386 / mps2-an500 / mps3-an547) with outputs checked against
onnxruntime; the static arena within 1.05x of the lower bound that the test computes itself; the
bundle's own Makefile; the footprint report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

pytestmark = pytest.mark.models


def _need(*tools):
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (`make toolchains` installs them)")


@pytest.fixture(scope="module")
def mcu_models(tmp_path_factory):
    import onnx

    from deploytool.zoo import kws_dscnn, micro_cnn

    d = tmp_path_factory.mktemp("mcu")
    out = {}
    for f in (micro_cnn, kws_dscnn):
        onnx.save(f(), d / f"{f.__name__}.onnx")
        out[f.__name__] = d / f"{f.__name__}.onnx"
    sys.path.insert(0, str(REPO / "tools"))
    import tflite_model

    out["tflite"], out["tflite_twin"] = tflite_model.write(d)
    return out


def test_micro_models_are_microcontroller_sized(mcu_models):
    import onnx
    from onnx import numpy_helper

    w = {n: sum(numpy_helper.to_array(i).nbytes for i in onnx.load(mcu_models[n]).graph.initializer)
         for n in ("micro_cnn", "kws_dscnn")}
    assert 20_000 <= w["micro_cnn"] <= 100_000, w
    ops = {n.op_type for n in onnx.load(mcu_models["micro_cnn"]).graph.node}
    assert {"Conv", "MaxPool", "GlobalAveragePool", "Gemm", "Softmax"} <= ops
    assert any(a.name == "group" and a.i > 1 for n in onnx.load(mcu_models["micro_cnn"]).graph.node for a in n.attribute)
    assert 50_000 <= w["kws_dscnn"] <= 120_000, w


def _lower_bound(plan: dict) -> int:
    """Recomputed from the executor's steps and the tensors' shapes: the most bytes live at one step
    (intermediate tensors from the step that writes them to the last that reads them, plus the step's
    workspace)."""
    first, last = {}, {}
    for s, step in enumerate(plan["steps"]):
        for a in step["args"]:
            first.setdefault(a, s)
            last[a] = s
    arena = {n: t for n, t in plan["tensors"].items() if t["role"] == "arena"}
    best = 0
    for s, step in enumerate(plan["steps"]):
        live = sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize for n, t in arena.items()
                   if first[n] <= s <= last[n])
        best = max(best, live + step["workspace"])
    return best


@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7", "cortex-m55"])
@pytest.mark.parametrize("model", ["micro_cnn", "kws_dscnn"])
def test_bundle_matches_onnxruntime_on_host_and_qemu(cli, mcu_models, tmp_path, model, target):
    _need("arm-none-eabi-gcc", "qemu-system-arm", "gcc")
    out = tmp_path / f"{model}-{target}"
    r = cli("compile", mcu_models[model], "--target", target, "-o", out)
    assert r.code == 0, r
    assert "flash" in r.out and "arena" in r.out
    for f in ("model.h", "model.c", "kernels.c", "weights.c", "runtime.c", "Makefile", "memory_plan.json",
              "footprint.json", "include/tvm/ffi/c_api.h"):
        assert (out / f).is_file(), f
    src = (out / "model.c").read_text()
    assert "malloc" not in src and "TVMFFIFunctionCall" not in src  # no interpreter, no heap
    plan = json.loads((out / "memory_plan.json").read_text())
    bound = _lower_bound(plan)
    assert plan["arena_bytes"] <= 1.05 * bound, (plan["arena_bytes"], bound)
    fp = json.loads((out / "footprint.json").read_text())
    assert fp["flash"]["weights"] >= 0.95 * sum(t["bytes"] for t in plan["tensors"].values() if t["role"] == "weight")
    assert fp["ram"]["arena"] == plan["arena_bytes"] and fp["flash"]["code"] > 0 and fp["ram"]["stack"] > 0
    # the API header: names, shapes and the arena size as compile-time constants
    h = (out / "model.h").read_text()
    assert "int model_run(const void* const inputs[MODEL_NUM_INPUTS], void* const outputs[MODEL_NUM_OUTPUTS]);" in h
    assert f"#define MODEL_ARENA_BYTES {plan['arena_bytes']}" in h and "#define MODEL_INPUT_0_SHAPE" in h
    for on in ("host", "qemu"):
        r = cli("run", out, "--check", mcu_models[model], "--on", on)
        assert r.code == 0 and "check passed" in r.out, r
    machine = {"cortex-m4": "mps2-an386", "cortex-m7": "mps2-an500", "cortex-m55": "mps3-an547"}[target]
    assert machine in r.out and "instructions" in r.out and "stack high-water" in r.out
    assert (out / "kernels_thumb.o").is_file()  # the MCU runs LLVM's kernels; the host build the C ones


def test_bundle_makefile_builds_the_library(cli, mcu_models, tmp_path):
    _need("arm-none-eabi-gcc", "make")
    out = tmp_path / "kws"
    assert cli("compile", mcu_models["kws_dscnn"], "--target", "cortex-m4", "-o", out, "-q").code == 0
    r = subprocess.run(["make", "-C", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and (out / "libmodel.a").is_file(), r.stdout + r.stderr
    syms = subprocess.run(["arm-none-eabi-nm", str(out / "libmodel.a")], capture_output=True, text=True).stdout
    assert " T model_run" in syms and " T TVMBackendAllocWorkspace" in syms


def test_tflite_model_compiles_to_a_bundle(cli, mcu_models, tmp_path):
    """A .tflite (written by tools/tflite_model.py) through TVM's Relax TFLite frontend; its ONNX twin
    (same weights) is the onnxruntime reference."""
    _need("arm-none-eabi-gcc", "qemu-system-arm")
    out = tmp_path / "tfl"
    r = cli("compile", mcu_models["tflite"], "--target", "cortex-m7", "-o", out)
    assert r.code == 0, r
    r = cli("run", out, "--check", mcu_models["tflite_twin"])
    assert r.code == 0 and "check passed" in r.out, r
    meta = json.loads((out / "deploytool.json").read_text())
    assert meta["inputs"][0]["shape"] == [1, 16, 16, 3] and meta["model"]["file"] == "micro_nhwc.tflite"


def test_qdq_int8_model_runs_and_relative_bundle_paths(cli, tmp_path):
    """Stretch goal, as far as it goes: an ONNX QDQ (int8) conv imports and matches onnxruntime
    on the MCU; TVM dequantizes the int8 weights at compile time, so they ship and compute as float.
    Also: a bundle named by a relative path runs (the build happens in a scratch folder)."""
    _need("arm-none-eabi-gcc", "qemu-system-arm")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    q = [("xs", np.float32(0.02)), ("xz", np.int8(0)), ("ws", np.float32(0.01)), ("wz", np.int8(0)),
         ("ys", np.float32(0.05)), ("yz", np.int8(0))]
    inits = [numpy_helper.from_array(np.array(v), n) for n, v in q]
    inits.append(numpy_helper.from_array(rng.integers(-127, 127, (8, 3, 3, 3)).astype(np.int8), "w"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "qdq.onnx")
    assert cli("compile", "qdq.onnx", "--target", "cortex-m7", "-o", "qdq-m7", "-q", cwd=tmp_path).code == 0
    r = cli("run", "qdq-m7", "--check", "qdq.onnx", cwd=tmp_path)
    assert r.code == 0 and "check passed" in r.out, r


def test_tflite_errors(cli, tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\0" * 64)
    r = cli("compile", bad, "--target", "cortex-m7", "-o", tmp_path / "x")
    assert r.code == 2 and "not a TFLite flatbuffer" in r.err, r


def test_memory_planner_against_the_bound():
    """Unit check of the planner on interval patterns where greedy placement is known to struggle."""
    from deploytool.cbundle import Buffer, plan_memory

    rng = np.random.default_rng(0)
    for _ in range(50):
        bufs = []
        for i in range(12):
            a = int(rng.integers(0, 10))
            bufs.append(Buffer(f"b{i}", int(rng.integers(1, 64)) * 16, a, a + int(rng.integers(0, 4))))
        plan = plan_memory(bufs)
        for x in plan.buffers:  # no two overlapping lifetimes share bytes
            for y in plan.buffers:
                if x is not y and x.overlaps(y):
                    assert x.offset + x.nbytes <= y.offset or y.offset + y.nbytes <= x.offset
        assert plan.arena_bytes >= plan.lower_bound
