"""The corpus's ONNX models as PyTorch modules, weights included, for the GPU benchmark.

Torch eager and torch.compile must run the SAME model with the SAME weights as deploytool, so the
ONNX graph is executed node by node with torch ops (the operators of the benchmarked models only:
a converter for the benchmark, not a general one). torch.compile traces through the node loop
(the graph is static), so it sees one straight-line program.
"""

from __future__ import annotations

import numpy as np


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pads2d(pads):
    if not pads:
        return 0
    t, l, b, r = pads
    if (t, l) != (b, r):
        raise NotImplementedError(f"asymmetric pads {pads}")
    return (t, l)


def module_from_onnx(model):
    """An ``nn.Module`` computing ``model`` (an onnx.ModelProto) with torch ops."""
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper

    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(_attrs(n)["value"])
    inputs = [i.name for i in g.input if i.name not in consts]
    outputs = [o.name for o in g.output]
    nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n)) for n in g.node if n.op_type != "Constant"]
    # Reshape targets as Python ints, read once here (torch.compile cannot trace numpy iteration)
    shapes = {n.input[1]: [int(v) for v in consts[n.input[1]]] for n in g.node if n.op_type == "Reshape"}

    class OnnxModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = {}
            for i, (k, v) in enumerate(consts.items()):
                name = f"c{i}"
                self.names[k] = name
                self.register_buffer(name, torch.from_numpy(np.ascontiguousarray(v)))

        def forward(self, *args):
            env = dict(zip(inputs, args))
            for k, name in self.names.items():
                env[k] = getattr(self, name)
            for op, ins, outs, a in nodes:
                x = [env[i] if i else None for i in ins]
                env[outs[0]] = _run(op, x, a, ins)
            res = [env[o] for o in outputs]
            return res[0] if len(res) == 1 else tuple(res)

    def _run(op, x, a, ins):
        if op == "Conv":
            return F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, stride=tuple(a.get("strides", (1, 1))),
                            padding=_pads2d(a.get("pads")), dilation=tuple(a.get("dilations", (1, 1))),
                            groups=a.get("group", 1))
        if op == "BatchNormalization":
            return F.batch_norm(x[0], x[3], x[4], x[1], x[2], False, 0.0, a.get("epsilon", 1e-5))
        if op == "Relu":
            return F.relu(x[0])
        if op in ("Sum", "Add"):
            out = x[0]
            for y in x[1:]:
                out = out + y
            return out
        if op == "Mul":
            return x[0] * x[1]
        if op == "Div":
            return x[0] / x[1]
        if op == "Sub":
            return x[0] - x[1]
        if op == "Erf":
            return torch.erf(x[0])
        if op == "MaxPool":
            return F.max_pool2d(x[0], tuple(a["kernel_shape"]), tuple(a.get("strides", a["kernel_shape"])),
                                _pads2d(a.get("pads")))
        if op == "AveragePool":
            return F.avg_pool2d(x[0], tuple(a["kernel_shape"]), tuple(a.get("strides", a["kernel_shape"])),
                                _pads2d(a.get("pads")), count_include_pad=bool(a.get("count_include_pad", 0)))
        if op == "GlobalAveragePool":
            return x[0].mean(dim=(2, 3), keepdim=True)
        if op == "Flatten":
            return torch.flatten(x[0], a.get("axis", 1))
        if op == "Reshape":
            shape = shapes[ins[1]]
            shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
            return torch.reshape(x[0], shape)
        if op == "Gemm":
            b = x[1].t() if a.get("transB", 0) else x[1]
            y = x[0] @ b * a.get("alpha", 1.0)
            return y + x[2] * a.get("beta", 1.0) if len(x) > 2 and x[2] is not None else y
        if op == "MatMul":
            return torch.matmul(x[0], x[1])
        if op == "Transpose":
            return x[0].permute(*a["perm"])
        if op == "Softmax":
            return torch.softmax(x[0], dim=a.get("axis", -1))
        if op == "LayerNormalization":
            axis = a.get("axis", -1)
            shape = x[0].shape[axis:] if axis >= 0 else x[0].shape[axis:]
            return F.layer_norm(x[0], tuple(shape), x[1], x[2] if len(x) > 2 else None, a.get("epsilon", 1e-5))
        if op == "Gather":
            return torch.index_select(x[0], a.get("axis", 0), x[1].reshape(-1)).reshape(*x[1].shape, *x[0].shape[1:])
        if op == "Identity":
            return x[0]
        raise NotImplementedError(f"ONNX op {op} (benchmark converter)")

    return OnnxModule()


def rebatch(model, batch: int):
    """``model`` with batch ``batch``: the first input dim set, and Reshape shape constants that fix
    batch 1 in their first entry rewritten (the corpus models export their Reshapes that way)."""
    import copy

    from onnx import numpy_helper

    m = copy.deepcopy(model)
    inits = {t.name: t for t in m.graph.initializer}
    for i in m.graph.input:
        if i.name not in inits:
            i.type.tensor_type.shape.dim[0].dim_value = batch
    for o in m.graph.output:
        o.type.tensor_type.shape.dim[0].dim_value = batch
    for n in m.graph.node:
        if n.op_type == "Reshape" and n.input[1] in inits:
            t = inits[n.input[1]]
            arr = numpy_helper.to_array(t).copy()
            if arr.size and arr[0] == 1:
                arr[0] = batch
                t.CopyFrom(numpy_helper.from_array(arr.astype(np.int64), t.name))
    del m.graph.value_info[:]
    return m
