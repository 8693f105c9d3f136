"""deploytool as an ``onnx.backend.base.Backend``, so that onnx's own ``BackendTest`` can drive it:

    import onnx.backend.test
    from deploytool.onnx_backend import DeploytoolBackend
    globals().update(onnx.backend.test.BackendTest(DeploytoolBackend, __name__).include(r"test_relu").test_cases)

``prepare`` imports the model with deploytool's frontend (input shapes fixed from the first call's
inputs when the model leaves them dynamic), builds it for the host with deploytool's pipeline
(default schedules) and returns a rep that runs it in the relax VM.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
from onnx.backend.base import Backend, BackendRep


class DeploytoolRep(BackendRep):
    def __init__(self, model, target: str = "x86"):
        self.model = model
        self.target = target
        self._vm = None
        self._shapes: dict | None = None

    def _build(self, inputs):
        import onnx
        import tvm
        from tvm import relax

        from deploytool import pipeline, targets
        from deploytool.frontend import graph_inputs, import_onnx

        shapes = {}
        for vi, x in zip(graph_inputs(self.model), inputs):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == np.ndim(x) and any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
                shapes[vi.name] = tuple(np.shape(x))
        tgt = targets.load(self.target)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            onnx.save(self.model, path)
            imported = import_onnx(path, shapes)
        mod = pipeline.schedule(pipeline.partition(pipeline.optimize(imported.mod, tgt), tgt), tgt, {})
        self._vm = relax.VirtualMachine(pipeline.build(mod, tgt), tvm.cpu())
        self._shapes = shapes

    def run(self, inputs, **kwargs):
        import tvm

        if isinstance(inputs, dict):
            from deploytool.frontend import graph_inputs

            inputs = [inputs[vi.name] for vi in graph_inputs(self.model)]
        inputs = [np.asarray(x, order="C") for x in inputs]
        if self._vm is None:
            self._build(inputs)
        r = self._vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
        return tuple([r.numpy()] if hasattr(r, "numpy") else [x.numpy() for x in r])


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
