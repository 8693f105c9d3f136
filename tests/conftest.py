"""Shared fixtures: small real ONNX models made here, a CLI runner through a subprocess,
and compiled artifacts cached per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def make_tiny_model(path: Path, *, dynamic_batch: bool = False, extra_ops: tuple[str, ...] = (), seed: int = 0) -> Path:
    """Two inputs, two outputs, names that are not C identifiers (``in/img``, ``in:bias``):
    Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm (+ bias input) -> out/logits,
    and Sigmoid(bias) -> out:gate. ``extra_ops`` appends unary ops (e.g. unsupported ones)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    batch = "N" if dynamic_batch else 1
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "conv/W")
    cb = numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "conv/B")
    fw = numpy_helper.from_array(rng.normal(0, 0.5, (5, 4)).astype(np.float32), "fc/W")
    nodes = [
        helper.make_node("Conv", ["in/img", "conv/W", "conv/B"], ["c1"], pads=[1, 1, 1, 1], name="conv/1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("GlobalAveragePool", ["r1"], ["p1"]),
        helper.make_node("Flatten", ["p1"], ["f1"]),
        helper.make_node("Gemm", ["f1", "fc/W", "in:bias"], ["g1"], transB=1),
        helper.make_node("Sigmoid", ["in:bias"], ["out:gate"]),
    ]
    last = "g1"
    for i, op in enumerate(extra_ops):
        nodes.append(helper.make_node(op, [last], [f"x{i}"]))
        last = f"x{i}"
    nodes.append(helper.make_node("Identity", [last], ["out/logits"]))
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("in/img", TensorProto.FLOAT, [batch, 3, 8, 8]),
         helper.make_tensor_value_info("in:bias", TensorProto.FLOAT, [1, 5])],
        [helper.make_tensor_value_info("out/logits", TensorProto.FLOAT, [batch, 5]),
         helper.make_tensor_value_info("out:gate", TensorProto.FLOAT, [1, 5])],
        initializer=[w, cb, fw])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="deploytool-tests")
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny.onnx")


@pytest.fixture(scope="session")
def tiny_so(tmp_path_factory, tiny_model) -> Path:
    import deploytool

    out = tmp_path_factory.mktemp("artifacts") / "tiny.so"
    deploytool.compile(tiny_model, target="x86", output=out)
    return out


@pytest.fixture
def tiny_candidates(tiny_model):
    """The tiny model's first kernel as the tuner sees it: (the cost model's TuneContext, the design
    spaces as measure candidates, twice over: a search proposes a schedule more than once)."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool import pipeline, targets
    from deploytool.cost_model.dataset import context
    from deploytool.frontend import import_onnx
    from deploytool.schedules import space

    tgt = targets.load("x86")
    mod = pipeline.partition(pipeline.optimize(import_onnx(tiny_model, {}).mod, tgt), tgt)
    wmod = space.workload_module(mod[pipeline.tasks(mod)[0].name])
    with space.tensor_intrinsics(tgt):
        sctx = ms.TuneContext(mod=wmod, target=tgt.tvm_target(), space_generator=space.space_generator(tgt),
                              task_name="t", num_threads=1, rand_state=1)
        args = ms.arg_info.ArgInfo.from_prim_func(wmod["main"])
        cands = [ms.MeasureCandidate(s, args) for _ in range(2) for s in sctx.generate_design_space()]
    return context(wmod, tgt), cands


class CLIResult:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self):
        return f"<exit {self.code}>\nstdout:\n{self.out}\nstderr:\n{self.err}"


@pytest.fixture(scope="session")
def cli():
    """Run the real `deploytool` console entry point in a subprocess."""

    def run(*args, timeout: float = 600, cwd: Path | None = None, env: dict | None = None) -> CLIResult:
        env = {**os.environ, **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "deploytool", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=env)
        return CLIResult(proc)

    return run
