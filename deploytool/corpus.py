"""Real models that ship inside the onnx wheel, and the seeded-weight transform that makes their
outputs mean something.

The 9 "light" models (ResNet-50, DenseNet-121, ...) keep their weights as ConstantOfShape
fills, so their outputs are constant: a wrong kernel can still match. ``randomize_weights``
replaces each fill with seeded, He-scaled random values so that outputs stay finite and vary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                "squeezenet", "vgg19", "zfnet512")


def default_model() -> Path:
    """The embedded default model (SqueezeNet 1.0 with seeded random weights; see tools/)."""
    return Path(__file__).parent / "data" / "squeezenet1.0.onnx"


def onnx_test_data_dir() -> Path:
    import onnx.backend.test

    return Path(onnx.backend.test.__file__).parent / "data"


def light_model_path(name: str) -> Path:
    return onnx_test_data_dir() / "light" / f"light_{name}.onnx"


def light_model_output(name: str) -> np.ndarray:
    """The reference output shipped next to a light model."""
    return _read_tensor(onnx_test_data_dir() / "light" / f"light_{name}_output_0.pb")


def _read_tensor(path: Path) -> np.ndarray:
    """A serialized onnx TensorProto (.pb) as an array."""
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(Path(path).read_bytes())
    return numpy_helper.to_array(t)


def node_case_dirs(kind: str) -> list[Path]:
    """Cases of onnx's 'pytorch-converted' or 'pytorch-operator' sets (model.onnx + test_data_set_*)."""
    root = onnx_test_data_dir() / kind
    return sorted(p for p in root.iterdir() if (p / "model.onnx").is_file())


def load_case_data(case_dir: Path, model) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Inputs (by real input name) and reference outputs of a case's first test_data_set."""
    from deploytool.frontend import graph_inputs

    ds = sorted(case_dir.glob("test_data_set_*"))[0]
    names = [vi.name for vi in graph_inputs(model)]
    ins = [_read_tensor(p) for p in sorted(ds.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
    outs = [_read_tensor(p) for p in sorted(ds.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
    return dict(zip(names, ins)), outs


def randomize_weights(model, seed: int = 0):
    """Replace ConstantOfShape weight fills (with constant shapes) by seeded random initializers.

    Scales: He-style N(0, 2/fan_in) for conv/dense weights; BatchNorm scale in [0.2, 0.5]
    (residual sums stay moderate) and variance in [0.5, 1.5]; biases, BN shift and mean N(0, 0.1^2). Returns a new ModelProto."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[tuple]] = {}
    for node in g.node:
        for idx, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, idx))
    keep, new_inits = [], []
    for node in g.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            keep.append(node)
            continue
        shape = tuple(int(x) for x in numpy_helper.to_array(inits[node.input[0]]))
        value = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), np.zeros(1, np.float32))
        if value.dtype.kind != "f":
            keep.append(node)
            continue
        arr = _random_weight(rng, shape, consumers.get(node.output[0], [])).astype(value.dtype)
        new_inits.append(numpy_helper.from_array(arr, node.output[0]))
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    # Shape tensors that fed only the removed fills are dead now.
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    dead = [t.name for t in g.initializer if t.name not in used]
    if dead:
        keep_inits = [t for t in g.initializer if t.name in used]
        del g.initializer[:]
        g.initializer.extend(keep_inits)
        keep_inputs = [i for i in g.input if i.name in used]
        del g.input[:]
        g.input.extend(keep_inputs)
    # IR < 4 requires every initializer to be a graph input too.
    if m.ir_version < 4:
        listed = {i.name for i in g.input}
        for t in new_inits:
            if t.name not in listed:
                g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def _random_weight(rng, shape: tuple[int, ...], uses: list[tuple]) -> np.ndarray:
    op, idx, node = (uses[0][0].op_type, uses[0][1], uses[0][0]) if uses else ("", -1, None)
    if op == "BatchNormalization" and idx == 1:  # small gamma keeps residual sums from exploding
        return rng.uniform(0.2, 0.5, size=shape)
    if op == "BatchNormalization" and idx == 4:
        return rng.uniform(0.5, 1.5, size=shape)
    if len(shape) <= 1:
        return rng.normal(0.0, 0.1, size=shape)
    if op == "Gemm" and idx == 1:
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        fan_in = shape[1] if trans_b else shape[0]
    elif op == "MatMul":
        fan_in = shape[-2]
    else:
        fan_in = int(np.prod(shape[1:]))
    return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), size=shape)
