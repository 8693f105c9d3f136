"""ONNX import: load and validate a model, fix its input shapes, give every value a clean C
identifier, find every operator we cannot import, and translate it to a Relax IRModule."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deploytool.artifact import TensorSpec, sha256_file
from deploytool.errors import ModelError, ShapeError, UnsupportedOperatorError, describe

# Domains whose operators the Relax importer handles by op_type.
_STD_DOMAINS = ("", "ai.onnx")


@dataclass
class ModelInfo:
    """What `deploytool inspect` reports about an ONNX model (before import)."""

    path: str
    sha256: str
    ir_version: int
    opsets: dict[str, int]
    producer: str
    inputs: list[TensorSpec]           # dynamic dims appear as -1; see dynamic_dims
    outputs: list[TensorSpec]
    dynamic_dims: dict[str, list[str]]  # input name -> names of its dynamic dims
    op_histogram: Counter
    initializer_count: int
    initializer_bytes: int
    unsupported: dict[str, int] = field(default_factory=dict)  # no TVM converter (nor one of deploytool's)
    left_out: dict[str, str] = field(default_factory=dict)  # see left_out()
    expandable: set[str] = field(default_factory=set)  # of the unsupported: imported through their ONNX function body

    @property
    def blocking(self) -> dict[str, int]:
        """The unsupported operators import cannot get past (no ONNX function body either)."""
        return {k: v for k, v in self.unsupported.items() if k not in self.expandable}

    @property
    def opset(self) -> int:
        return _default_domain(self.opsets)


def _default_domain(opsets: dict[str, int]) -> int:
    return opsets.get("", opsets.get("ai.onnx", 0))


def default_opset(model) -> int:
    """The model's opset of the default (ai.onnx) domain; 0 when it declares none."""
    return _default_domain({o.domain: o.version for o in model.opset_import})


@dataclass
class ImportedModel:
    """An imported model: the clean ONNX graph, its Relax module and the I/O specs."""

    onnx_model: Any              # onnx.ModelProto after shape fixing and renaming
    mod: Any                     # tvm.IRModule with a Relax "main"
    inputs: list[TensorSpec]     # name = original ONNX name, tvm_name = sanitized name
    outputs: list[TensorSpec]
    info: ModelInfo


def load_onnx(path: str | Path):
    """Load and check an ONNX file; every failure is a one-line ModelError."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.exists():
        raise ModelError(f"model file '{path}' not found", "check the path")
    if path.is_dir():
        raise ModelError(f"'{path}' is a folder, not an ONNX file", "pass the .onnx file inside it")
    data = path.read_bytes()
    if not data:
        raise ModelError(f"'{path}' is empty", "re-export the model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        # An ONNX file starts with field 1 (ir_version, varint): tag byte 0x08.
        if data[:1] == b"\x08":
            raise ModelError(f"'{path}' is a truncated or corrupted ONNX file (protobuf does not parse)",
                             "copy or download it again, or re-export it") from None
        raise ModelError(f"'{path}' is not an ONNX model", "pass a .onnx file exported by your framework") from None
    if model.ir_version == 0 or not model.HasField("graph") or not model.graph.node:
        if data[:1] == b"\x08" and model.ir_version:
            raise ModelError(f"'{path}' is a truncated ONNX file (it has no graph)",
                             "copy or download it again, or re-export it")
        raise ModelError(f"'{path}' is not an ONNX model", "pass a .onnx file exported by your framework")
    if _uses_external_data(model):
        from onnx.external_data_helper import load_external_data_for_model

        try:
            load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as e:
            raise ModelError(f"'{path}' keeps weights in external files that cannot be read ({e})",
                             "keep the .data files next to the .onnx file") from None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"'{path}' fails the ONNX checker: {first}", "re-export the model or fix the node named") from None
    return model


def _uses_external_data(model) -> bool:
    from onnx import TensorProto

    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def _np_dtype(elem_type: int) -> str:
    from onnx import helper

    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError):
        from onnx import TensorProto

        return TensorProto.DataType.Name(elem_type).lower()


def _value_spec(vi) -> tuple[TensorSpec, list[str]]:
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":  # sequence/optional/map: named by left_out(), never compiled
        return TensorSpec(name=vi.name, shape=(), dtype=(kind or "unknown").split("_")[0], tvm_name=vi.name), []
    tt = vi.type.tensor_type
    dims, dyn = [], []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(-1)
            dyn.append(d.dim_param or f"dim{i}")
    return TensorSpec(name=vi.name, shape=tuple(dims), dtype=_np_dtype(tt.elem_type), tvm_name=vi.name), dyn


def graph_inputs(model) -> list:
    """Real inputs: graph inputs that are not initializers (IR < 4 lists weights as inputs)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def iter_nodes(graph):
    """All nodes of a graph and of its subgraphs (If/Loop/Scan bodies)."""
    from onnx import AttributeProto

    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from iter_nodes(g)


def _tvm_ops() -> set[str]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return set(_get_convert_map())


def supported_op_types() -> set[str]:
    """TVM's converters, plus the operators deploytool rewrites into them (onnx_converters)."""
    from deploytool.onnx_converters import CONVERTERS
    from deploytool.onnx_unroll import INLINED, UNROLLED

    return _tvm_ops() | set(CONVERTERS) | UNROLLED | INLINED


def unsupported_ops(model) -> dict[str, int]:
    """Every operator type the importer cannot handle, with its count (all at once)."""
    known = supported_op_types()
    bad: Counter = Counter()
    for node in iter_nodes(model.graph):
        if node.domain in _STD_DOMAINS:
            if node.op_type not in known:
                bad[node.op_type] += 1
        else:
            bad[f"{node.domain}::{node.op_type}"] += 1
    return dict(bad)


# What deploytool leaves out by design (the coverage issue's fixed list): training operators,
# string operators, and sequence/optional/map values at the model's interface.
TRAINING_OPS = {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "Gradient", "Momentum", "Adam", "Adagrad"}
TRAINING_DOMAIN = "ai.onnx.preview.training"
STRING_OPS = {"StringNormalizer", "RegexFullMatch", "StringConcat", "StringSplit", "TfIdfVectorizer", "LabelEncoder"}


def has_function_body(op_type: str, opset: int, domain: str = "") -> bool:
    """Whether ONNX's schema of ``op_type`` at ``opset`` has a function body (deploytool expands
    such an operator when TVM has no converter for it)."""
    from onnx import defs

    try:
        schema = defs.get_schema(op_type, opset, domain)
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def left_out(model) -> dict[str, str]:
    """What in ``model`` falls under what deploytool leaves out by design: {operator, or
    'input NAME' / 'output NAME': why}."""
    out = {}
    for node in iter_nodes(model.graph):
        if node.domain == TRAINING_DOMAIN or (node.domain in _STD_DOMAINS and node.op_type in TRAINING_OPS):
            out[node.op_type] = "training operator"
        elif node.op_type in STRING_OPS:
            out[node.op_type] = "string operator"
    inits = {t.name for t in model.graph.initializer}
    for what, vis in (("input", [v for v in model.graph.input if v.name not in inits]), ("output", model.graph.output)):
        for vi in vis:
            kind = vi.type.WhichOneof("value")
            if kind in ("sequence_type", "optional_type", "map_type"):
                out[f"{what} {vi.name}"] = f"{kind.split('_')[0]} value at the interface"
            elif kind == "tensor_type" and vi.type.tensor_type.elem_type == 8:
                out[f"{what} {vi.name}"] = "string tensor at the interface"
    return out


def model_info(model, path: str | Path) -> ModelInfo:
    from onnx import numpy_helper  # noqa: F401  (keeps the onnx import local)

    ins, dyn = [], {}
    for vi in graph_inputs(model):
        spec, d = _value_spec(vi)
        ins.append(spec)
        if d:
            dyn[vi.name] = d
    outs = [_value_spec(vi)[0] for vi in model.graph.output]
    n_params, n_bytes = count_parameters(model)
    unsupported = unsupported_ops(model)
    opset = default_opset(model)
    return ModelInfo(
        path=str(path), sha256=sha256_file(path), ir_version=model.ir_version,
        opsets={o.domain: o.version for o in model.opset_import},
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        inputs=ins, outputs=outs, dynamic_dims=dyn,
        op_histogram=Counter(n.op_type for n in iter_nodes(model.graph)),
        initializer_count=n_params, initializer_bytes=n_bytes, unsupported=unsupported,
        left_out=left_out(model),
        expandable={op for op in unsupported if "::" not in op and has_function_body(op, opset)},
    )


def count_parameters(model) -> tuple[int, int]:
    """Learned parameters: float initializers, float Constant tensors, and ConstantOfShape fills
    with constant shapes (how the light models store their weights). Integer tensors (shapes,
    indices) are not parameters."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    n_params = n_bytes = 0

    def add(n: int, dtype: str) -> None:
        nonlocal n_params, n_bytes
        n_params += n
        n_bytes += n * np.dtype(dtype).itemsize

    for t in model.graph.initializer:
        dt = _np_dtype(t.data_type)
        if dt.startswith(("float", "bfloat")):
            add(int(np.prod(t.dims)) if len(t.dims) else 1, dt)
    for node in iter_nodes(model.graph):
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and _np_dtype(a.t.data_type).startswith("float"):
                    add(int(np.prod(a.t.dims)) if len(a.t.dims) else 1, _np_dtype(a.t.data_type))
        elif node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            dt = _np_dtype(value.data_type) if value is not None else "float32"
            if dt.startswith("float"):
                add(int(np.prod(numpy_helper.to_array(inits[node.input[0]]))), dt)
    return n_params, n_bytes


def parse_input_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``name:1,3,224,224`` options (the name may itself contain ':')."""
    out: dict[str, tuple[int, ...]] = {}
    for s in specs or []:
        name, sep, dims = s.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip() != "")
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise ShapeError(f"bad --input-shape '{s}'", "write it as NAME:D1,D2,... with positive dims, e.g. data:1,3,224,224")
        out[name] = shape
    return out


_IDENT = re.compile(r"[^0-9A-Za-z_]")


def sanitize_name(name: str) -> str:
    s = _IDENT.sub("_", name)
    if not s or s[0].isdigit():
        s = "v_" + s
    return s


def sanitize_names(model) -> dict[str, str]:
    """Rename every value (and node) to a unique C identifier, in place, subgraphs included.
    Returns old -> new for the names that changed. ONNX names such as ``gpu_0/data_0`` otherwise
    reach code generators as identifiers and break the CUDA build."""
    from onnx import AttributeProto

    graphs = []

    def collect(g):
        graphs.append(g)
        for node in g.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    collect(attr.g)
                elif attr.type == AttributeProto.GRAPHS:
                    for sg in attr.graphs:
                        collect(sg)

    collect(model.graph)
    names: list[str] = []
    for g in graphs:
        names += [v.name for v in list(g.input) + list(g.output) + list(g.value_info)]
        names += [t.name for t in g.initializer]
        names += [t.values.name for t in g.sparse_initializer]
        for n in g.node:
            names += list(n.input) + list(n.output)
    mapping: dict[str, str] = {}
    used = {n for n in names if n and sanitize_name(n) == n}
    for n in dict.fromkeys(names):
        if not n or n in used and sanitize_name(n) == n:
            continue
        base = sanitize_name(n)
        new, k = base, 1
        while new in used:
            new, k = f"{base}_{k}", k + 1
        used.add(new)
        mapping[n] = new
    if not mapping:
        return {}
    for g in graphs:
        for v in list(g.input) + list(g.output) + list(g.value_info):
            v.name = mapping.get(v.name, v.name)
        for t in g.initializer:
            t.name = mapping.get(t.name, t.name)
        for n in g.node:
            n.input[:] = [mapping.get(x, x) for x in n.input]
            n.output[:] = [mapping.get(x, x) for x in n.output]
            if n.name:
                n.name = sanitize_name(n.name)
    return mapping


def _apply_input_shapes(model, overrides: dict[str, tuple[int, ...]], info: ModelInfo) -> None:
    names = {s.name for s in info.inputs}
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise ShapeError(f"--input-shape names unknown input(s) {', '.join(unknown)}",
                         f"the model's inputs are: {', '.join(sorted(names))}")
    still_dynamic = []
    for vi in graph_inputs(model):
        dims = vi.type.tensor_type.shape.dim
        if vi.name in overrides:
            new = overrides[vi.name]
            if len(dims) and len(new) != len(dims):
                raise ShapeError(f"--input-shape gives {vi.name} rank {len(new)}, the model has rank {len(dims)}",
                                 f"give {len(dims)} dims")
            del dims[:]
            for d in new:
                dims.add().dim_value = d
        elif vi.name in info.dynamic_dims:
            still_dynamic.append(vi.name)
    if still_dynamic:
        hints = " ".join(
            f"--input-shape {n}:" + ",".join(str(d) if d > 0 else "N" for d in next(s for s in info.inputs if s.name == n).shape)
            for n in still_dynamic)
        raise ShapeError(
            "input(s) with dynamic dims: " + ", ".join(f"{n} ({', '.join(info.dynamic_dims[n])})" for n in still_dynamic),
            f"fix them with {hints}")


def _upgrade_old_slice(model, info: ModelInfo):
    """Models below opset 10 give Slice its starts/ends as attributes, and TVM's converter for
    that form is broken: convert such models to opset 10 with onnx's version converter (the
    model is kept as it is when the converter cannot)."""
    if not (0 < info.opset < 10) or not any(n.op_type == "Slice" for n in iter_nodes(model.graph)):
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, 10)
    except Exception:  # the converter lacks an adapter for some op: import as it is
        return model


def rewrite_for_import(model) -> None:
    """ONNX-level rewrites, in place, that make the imported graph better:

    * ``Sum(a, b, ...)`` -> ``Add(Add(a, b), ...)``: TVM imports Sum as stack + sum(axis=0), a copy
      of every operand into a 5-D tensor that also blocks fusing residual adds into convolutions
      and breaks layout conversion.
    * ``Dropout`` (inference) -> ``Identity`` when its mask is unused: TVM imports it as a tuple,
      which TVM's layout conversion cannot rewrite.
    * opset < 7 ``PRelu`` with a 1-D slope of C = X.shape[1] values: the legacy per-channel slope
      is reshaped to (C, 1, ..., 1), which means the same under every opset's broadcasting (TVM's
      converter asserts on it).
    """
    from onnx import helper, numpy_helper

    opset = default_opset(model) or 99
    if opset < 7:
        shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
        inits = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type != "PRelu" or node.domain not in _STD_DOMAINS or len(node.input) < 2:
                continue
            x_shape, slope = shapes.get(node.input[0]), inits.get(node.input[1])
            if not x_shape or len(x_shape) < 3 or slope is None or len(slope.dims) != 1:
                continue
            if slope.dims[0] != x_shape[1] or slope.dims[0] == x_shape[-1]:
                continue
            arr = numpy_helper.to_array(slope).reshape([x_shape[1]] + [1] * (len(x_shape) - 2))
            name = f"{node.input[1]}__per_channel"
            model.graph.initializer.append(numpy_helper.from_array(arr, name))
            if model.ir_version < 4:
                model.graph.input.append(helper.make_tensor_value_info(name, slope.data_type, list(arr.shape)))
            node.input[1] = name

    def walk(graph):
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        nodes = []
        for node in graph.node:
            if (node.op_type == "Dropout" and node.domain in _STD_DOMAINS
                    and (len(node.output) < 2 or not node.output[1] or node.output[1] not in used)):
                nodes.append(helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name))
            elif node.op_type == "Sum" and node.domain in _STD_DOMAINS:
                ins = list(node.input)
                if len(ins) == 1:
                    nodes.append(helper.make_node("Identity", ins, list(node.output), name=node.name))
                else:
                    acc = ins[0]
                    for i, x in enumerate(ins[1:]):
                        last = i == len(ins) - 2
                        out = node.output[0] if last else f"{node.output[0]}__sum{i}"
                        nodes.append(helper.make_node("Add", [acc, x], [out], name=f"{node.name}__add{i}" if node.name else ""))
                        acc = out
            else:
                for attr in node.attribute:
                    if attr.g is not None and attr.g.node:
                        walk(attr.g)
                    for g in attr.graphs:
                        walk(g)
                nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)

    walk(model.graph)


def import_onnx(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
                bind: dict[str, Any] | None = None) -> ImportedModel:
    """Load, validate, fix shapes, sanitize names and import to Relax. ``bind`` makes inputs
    constants with the given values (compile-time specialization of shape/axes inputs)."""
    from deploytool import onnx_converters, onnx_passes, onnx_unroll

    model = load_onnx(path)
    if bind:
        names = {vi.name for vi in graph_inputs(model)}
        unknown = [n for n in bind if n not in names]
        if unknown:
            raise ShapeError(f"--bind-input names unknown input(s) {', '.join(unknown)}",
                             f"the model's inputs are: {', '.join(sorted(names))}")
        onnx_passes.bind_inputs(model, bind)
    # our own converters, early: quantize/dequantize of 2/4/8-bit types before the interface is widened
    onnx_converters.convert(model)
    onnx_passes.widen_subbyte_io(model)
    info = model_info(model, path)
    # operators TVM lacks (or gets wrong) are replaced by their ONNX function bodies where they have one
    if (info.unsupported or onnx_passes.ALWAYS_EXPAND & set(info.op_histogram)
            or any(onnx_passes.needs_expansion(n) for n in model.graph.node)):
        model, _ = onnx_passes.expand_functions(model, set(info.unsupported))
        remaining = unsupported_ops(model)
        if remaining:
            raise UnsupportedOperatorError(remaining)
        onnx_converters.convert(model)  # bodies can hold operators a converter takes (SwiGLU's Swish)
    _apply_input_shapes(model, dict(input_shapes or {}), info)
    orig_inputs = [vi.name for vi in graph_inputs(model)]
    orig_outputs = [vi.name for vi in model.graph.output]
    model = _upgrade_old_slice(model, info)
    onnx_passes.normalize_constants(model)
    onnx_unroll.unroll(model)
    left = Counter(n.op_type for n in model.graph.node if n.op_type in onnx_unroll.UNROLLED)
    if left:
        raise UnsupportedOperatorError(dict(left), "deploytool unrolls Scan/LSTM/GRU/RNN when the sequence length "
                                       f"is static (at most {onnx_unroll.MAX_UNROLL} steps; Scan without nested "
                                       "subgraphs, no per-sequence lengths in reverse): fix the input shapes with "
                                       "--input-shape, or export the loop unrolled")
    model = onnx_passes.fold_constants(model)
    # late: converters that need static shapes and constant operands (DFT, Resize, ...)
    if onnx_converters.convert(model):
        model = onnx_passes.fold_constants(model)
    converter_only = set(onnx_converters.CONVERTERS) - _tvm_ops()
    left = Counter(n.op_type for n in model.graph.node if n.op_type in converter_only)
    if left:
        raise UnsupportedOperatorError(dict(left), "deploytool converts these only when the shapes and the "
                                       "operands they depend on are known at compile time: fix the input shapes "
                                       "with --input-shape and bind such inputs with --bind-input")
    left = Counter(n.op_type for n in model.graph.node if n.op_type in onnx_unroll.INLINED)
    if left:
        raise UnsupportedOperatorError(dict(left), "deploytool inlines If when its condition is known at compile "
                                       "time; bind the inputs it depends on (--bind-input), or export the model "
                                       "without data-dependent branches")
    rewrite_for_import(model)
    mapping = sanitize_names(model)

    from tvm.relax.frontend.onnx import from_onnx

    shape_dict = {}
    dtype_dict = {}
    for vi in graph_inputs(model):
        spec, _ = _value_spec(vi)
        shape_dict[vi.name] = list(spec.shape)
        dtype_dict[vi.name] = spec.dtype
    try:
        mod = from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict, opset=default_opset(model) or None,
                        keep_params_in_input=False, sanitize_input_names=False)
    except Exception as e:  # the importer raises many kinds; keep one line
        raise ModelError(f"importing '{Path(path).name}' failed: {describe(e)}",
                         "run 'deploytool inspect' on it and file an issue with the model attached") from e

    main = mod["main"]
    inputs = []
    for orig, param in zip(orig_inputs, main.params):
        sinfo = param.ty
        inputs.append(TensorSpec(name=orig, tvm_name=param.name,
                                 shape=tuple(int(d) for d in sinfo.shape.values), dtype=str(sinfo.dtype)))
    ret = main.ret_ty
    rets = list(ret.fields) if hasattr(ret, "fields") else [ret]
    if len(rets) != len(orig_outputs):
        raise ModelError(f"the imported model has {len(rets)} outputs where the ONNX graph has {len(orig_outputs)}",
                         "file an issue with the model attached")
    outputs = []
    for orig, sinfo in zip(orig_outputs, rets):
        if not hasattr(sinfo, "dtype") or sinfo.shape is None:
            raise ModelError(f"output {orig} is not a tensor of static shape ({sinfo})",
                             "fix the input shapes with --input-shape, or file an issue with the model attached")
        shape = tuple(int(d) for d in sinfo.shape.values)
        outputs.append(TensorSpec(name=orig, tvm_name=mapping.get(orig, orig), shape=shape, dtype=str(sinfo.dtype)))
    return ImportedModel(onnx_model=model, mod=mod, inputs=inputs, outputs=outputs, info=info)


# ----------------------------------------------------------------------------- TFLite
def import_tflite(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None) -> ImportedModel:
    """Import a float .tflite model through TVM's Relax TFLite frontend (microcontroller users
    arrive with them). Names are the TFLite tensor names; ``onnx_model`` is None."""
    from collections import Counter

    from deploytool.artifact import sha256_file

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file '{path}' not found", "check the path")
    data = path.read_bytes()
    if data[4:8] != b"TFL3":
        raise ModelError(f"'{path.name}' is not a TFLite flatbuffer (no TFL3 identifier)",
                         "pass a .tflite file written by the TFLite converter")
    try:
        import tflite
    except ImportError:
        raise ModelError("reading .tflite files needs the 'tflite' package", "pip install tflite") from None
    model = tflite.Model.GetRootAsModel(data, 0)
    if model.SubgraphsLength() != 1:
        raise ModelError(f"'{path.name}' has {model.SubgraphsLength()} subgraphs; one is supported",
                         "convert the model with a single subgraph")
    sg = model.Subgraphs(0)
    types = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 9: "int8", 7: "int16", 6: "bool"}

    def spec(i: int) -> TensorSpec:
        t = sg.Tensors(i)
        name = t.Name().decode()
        shape = tuple(int(x) for x in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        return TensorSpec(name=name, tvm_name=sanitize_name(name), shape=shape, dtype=types.get(t.Type(), "float32"))

    inputs = [spec(int(i)) for i in sg.InputsAsNumpy()]
    outputs = [spec(int(i)) for i in sg.OutputsAsNumpy()]
    overrides = dict(input_shapes or {})
    inputs = [TensorSpec(s.name, tuple(overrides.get(s.name, s.shape)), s.dtype, s.tvm_name) for s in inputs]
    codes = Counter()
    op_names = {v: n for n, v in vars(tflite.BuiltinOperator).items() if not n.startswith("_")}
    for k in range(sg.OperatorsLength()):
        oc = model.OperatorCodes(sg.Operators(k).OpcodeIndex())
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        codes[op_names.get(code, str(code))] += 1
    from tvm.relax.frontend.tflite import from_tflite

    try:
        mod = from_tflite(model, shape_dict={s.name: s.shape for s in inputs},
                          dtype_dict={s.name: s.dtype for s in inputs})
    except Exception as e:
        raise ModelError(f"importing '{path.name}' failed: {describe(e)}",
                         "check its operators with a TFLite viewer; file an issue with the model attached") from e
    main = mod["main"]
    inputs = [TensorSpec(s.name, s.shape, s.dtype, p.name) for s, p in zip(inputs, main.params)]
    info = ModelInfo(path=str(path), sha256=sha256_file(path), ir_version=0, opsets={"tflite": model.Version()},
                     producer=(model.Description() or b"").decode(errors="replace"), inputs=inputs, outputs=outputs,
                     dynamic_dims={}, op_histogram=codes, initializer_count=0, initializer_bytes=0)
    return ImportedModel(onnx_model=None, mod=mod, inputs=inputs, outputs=outputs, info=info)


def import_model(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
                 bind: dict[str, Any] | None = None) -> ImportedModel:
    """ONNX, or TFLite by its .tflite suffix."""
    if str(path).endswith(".tflite"):
        if bind:
            raise ShapeError("--bind-input works on ONNX models", "drop it for .tflite models")
        return import_tflite(path, input_shapes)
    return import_onnx(path, input_shapes, bind)
