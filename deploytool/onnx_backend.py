"""deploytool as an ``onnx.backend.base.Backend``, so that onnx's own ``BackendTest`` can drive it:

    import onnx.backend.test
    from deploytool.onnx_backend import DeploytoolBackend
    globals().update(onnx.backend.test.BackendTest(DeploytoolBackend, __name__).include(r"test_relu").test_cases)

``prepare`` imports the model with deploytool's frontend (input shapes fixed from the first call's
inputs when the model leaves them dynamic), builds it for the host with deploytool's pipeline
(default schedules) and returns a rep that runs it in the relax VM. The conformance runner
(deploytool.conformance) uses the same steps: specialize, import_proto, build, vm_of, run_vm.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
from onnx.backend.base import Backend, BackendRep


def specialize(model, inputs: list, bind_shape_operands: bool = False) -> tuple[dict, dict, list]:
    """What a user would pass to compile ``model`` for these input values: ``--input-shape`` for
    inputs with dynamic dims, and (``bind_shape_operands``) ``--bind-input`` for inputs that carry
    shapes, axes or sizes. Returns (shapes, bindings, the inputs left to pass at run time)."""
    from deploytool.frontend import graph_inputs
    from deploytool.onnx_passes import shape_operand_inputs

    feed = list(zip(graph_inputs(model), inputs))
    bind = {}
    if bind_shape_operands:
        operands = set(shape_operand_inputs(model))
        bind = {vi.name: x for vi, x in feed if vi.name in operands}
    # A zero-element input carries no data (its shape and dtype say all of it), while TVM's importer
    # cannot type a zero dim (it becomes a symbolic one that no tensor matches): bind it.
    bind.update({vi.name: np.asarray(x) for vi, x in feed if np.size(x) == 0})
    shapes = {}
    for vi, x in feed:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in bind and len(dims) == np.ndim(x) and any(
                not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
            shapes[vi.name] = tuple(np.shape(x))
    return shapes, bind, [x for vi, x in feed if vi.name not in bind]


def import_proto(model, shapes: dict, bind: dict | None = None):
    """deploytool's ONNX import of an in-memory model."""
    import onnx

    from deploytool.frontend import import_onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        return import_onnx(path, shapes, bind)


def build(imported, target="x86"):
    """deploytool's pipeline (default schedules) for ``target`` (a preset name or Target), in memory:
    a relax executable."""
    from deploytool import pipeline, targets

    tgt = targets.load(target) if isinstance(target, str) else target
    mod = pipeline.schedule(pipeline.partition(pipeline.optimize(imported.mod, tgt), tgt), tgt, {})
    return pipeline.build(mod, tgt)


def vm_of(executable):
    import tvm
    from tvm import relax

    return relax.VirtualMachine(executable, tvm.cpu())


def run_vm(vm, inputs: list) -> list:
    import tvm

    # np.asarray(order="C") keeps 0-d inputs 0-d (np.ascontiguousarray makes them 1-d)
    from deploytool.onnx_passes import widen_subbyte_array

    r = vm["main"](*[tvm.runtime.tensor(np.asarray(widen_subbyte_array(x), order="C")) for x in inputs])
    return [r.numpy()] if hasattr(r, "numpy") else [x.numpy() for x in r]


class DeploytoolRep(BackendRep):
    def __init__(self, model, target: str = "x86"):
        self.model = model
        self.target = target
        self._vm = None

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            from deploytool.frontend import graph_inputs

            inputs = [inputs[vi.name] for vi in graph_inputs(self.model)]
        inputs = [np.asarray(x, order="C") for x in inputs]
        if self._vm is None:
            shapes, _, _ = specialize(self.model, inputs)
            self._vm = vm_of(build(import_proto(self.model, shapes), self.target))
        return tuple(run_vm(self._vm, inputs))


class DeploytoolBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return DeploytoolRep(model, kwargs.get("target", "x86"))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = DeploytoolBackend.prepare
run_model = DeploytoolBackend.run_model
supports_device = DeploytoolBackend.supports_device
