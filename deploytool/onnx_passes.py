"""ONNX-level passes that run before TVM's importer, so that more models import (deploytool owns
them; TVM is not forked):

* ``normalize_constants``: ``Constant`` nodes written with ``value_float(s)`` / ``value_int(s)``
  become ``value`` tensors (TVM's converter reads only ``value``).
* ``expand_functions``: an operator TVM can't import (or imports wrongly) whose ONNX schema has a
  function body is replaced by that body (context-dependent bodies included), inlined with onnx's
  inliner.
* ``fold_constants``: with the input shapes fixed, shape inference plus constant folding at the
  ONNX level: ``Shape``/``Size`` of statically shaped tensors and every node whose inputs are all
  constants are evaluated by onnx's reference implementation and become initializers, so that
  graphs that compute shapes at run time (Shape -> Gather -> Concat -> Reshape) still build.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

EXPAND_DOMAIN = "deploytool.expand"
# Converters in TVM 0.27 that fail or give wrong results although the op has a function body.
ALWAYS_EXPAND = {"Attention"}
_MAX_FOLD_ELEMENTS = 1 << 20


def needs_expansion(node) -> bool:
    """Nodes TVM converts wrongly in one form only: LayerNormalization's optional Mean and
    InvStdDev outputs come out wrong (their shapes too), so a node that uses them is expanded."""
    return node.op_type == "LayerNormalization" and sum(1 for o in node.output if o) > 1


def normalize_constants(model) -> None:
    from onnx import helper, numpy_helper

    for node in _all_nodes(model.graph):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        if "value" in attrs or "sparse_value" in attrs:
            continue
        arr = None
        if "value_float" in attrs:
            arr = np.array(attrs["value_float"].f, np.float32)
        elif "value_floats" in attrs:
            arr = np.array(list(attrs["value_floats"].floats), np.float32)
        elif "value_int" in attrs:
            arr = np.array(attrs["value_int"].i, np.int64)
        elif "value_ints" in attrs:
            arr = np.array(list(attrs["value_ints"].ints), np.int64)
        if arr is None:
            continue
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(arr)))


def _all_nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.g is not None and a.g.node:
                yield from _all_nodes(a.g)
            for g in a.graphs:
                yield from _all_nodes(g)


def _opset(model, domain: str = "") -> int:
    for o in model.opset_import:
        if o.domain in ((domain, "ai.onnx") if domain == "" else (domain,)):
            return o.version
    return 0


def _function_body(node, opset: int, value_types: dict):
    """The FunctionProto of ``node``'s schema at ``opset`` (context-dependent ones instantiated), or None."""
    import onnx
    from onnx import defs

    try:
        schema = defs.get_schema(node.op_type, opset, node.domain)
    except Exception:
        return None
    if schema.has_function:
        return schema.function_body
    if schema.has_context_dependent_function:
        from onnx import helper

        known = [value_types[n] for n in node.input if n in value_types]
        # an input whose type inference could not give: assume the element type of a known input
        # (context-dependent bodies depend on element types), else float32
        fallback = known[0] if known else helper.make_tensor_type_proto(1, None)
        types = [(value_types.get(name) or fallback).SerializeToString() for name in node.input]
        try:
            data = schema.get_context_dependent_function(node.SerializeToString(), types)
        except Exception:
            return None
        fp = onnx.FunctionProto()
        fp.ParseFromString(data)
        return fp
    return None


def _add_default_attributes(node, opset: int) -> None:
    """Write the schema's default values of attributes the node leaves out onto it: a function body
    refers to its attributes by name, and onnx's inliner leaves a reference to an absent attribute
    unresolved (a Cast without 'to', a Constant without a value)."""
    import onnx

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:
        return
    have = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in have and attr.default_value is not None and attr.default_value.name:
            a = onnx.AttributeProto()
            a.CopyFrom(attr.default_value)
            a.name = name
            node.attribute.append(a)


def expand_functions(model, ops: set[str]):
    """Expand every top-level node whose op_type is in ``ops`` (or ALWAYS_EXPAND) into its schema's
    function body. Returns the new model and the ops it expanded."""
    import onnx
    from onnx import helper, inliner, shape_inference

    targets = [n for n in model.graph.node if n.domain in ("", "ai.onnx")
               and (n.op_type in ops or n.op_type in ALWAYS_EXPAND or needs_expansion(n))]
    if not targets:
        return model, set()
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    value_types = {vi.name: vi.type for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
                   + list(inferred.graph.output)}
    for t in inferred.graph.initializer:
        value_types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    opset = _opset(model)
    expanded = set()
    for i, node in enumerate(targets):
        _add_default_attributes(node, opset)
        body = _function_body(node, opset, value_types)
        if body is None:
            continue
        f = onnx.FunctionProto()
        f.CopyFrom(body)
        f.domain, f.name = EXPAND_DOMAIN, f"{node.op_type}_{i}"
        # onnx's inliner skips a function whose default-domain opset differs from the model's; the
        # bodies use long-stable primitives, so they are declared at the model's opset
        for o in f.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = opset
        if not any(o.domain in ("", "ai.onnx") for o in f.opset_import):
            f.opset_import.append(helper.make_opsetid("", opset))
        node.domain, node.op_type = EXPAND_DOMAIN, f.name
        model.functions.append(f)
        expanded.add(body.name or node.op_type)
    if not expanded:
        return model, set()
    if not any(o.domain == EXPAND_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(EXPAND_DOMAIN, 1))
    model = inliner.inline_local_functions(model)
    keep = [o for o in model.opset_import if o.domain != EXPAND_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return model, expanded


FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16


def _pow_needs_cast(node, elem) -> bool:
    """TVM's Pow wants one float type for base and exponent; ONNX allows an integer base and mixed
    types (the result has the base's type)."""
    tb, te = elem.get(node.input[0]), elem.get(node.input[1])
    return tb is not None and te is not None and (tb != te or tb not in FLOAT_TYPES)


def _pow_in_float(node, elem) -> list:
    """Pow computed in the base's float type (double for integer bases), cast back to the base type."""
    from onnx import TensorProto, helper

    tb = elem[node.input[0]]
    ft = tb if tb in FLOAT_TYPES else TensorProto.DOUBLE
    y = node.output[0]
    nodes = []
    x = node.input[0]
    if ft != tb:
        nodes.append(helper.make_node("Cast", [x], [f"{y}__powb"], to=ft))
        x = f"{y}__powb"
    nodes.append(helper.make_node("Cast", [node.input[1]], [f"{y}__powe"], to=ft))
    if ft != tb:
        nodes.append(helper.make_node("Pow", [x, f"{y}__powe"], [f"{y}__powf"]))
        # integer results: round first (pow in floating point can land just below an integer)
        nodes.append(helper.make_node("Round", [f"{y}__powf"], [f"{y}__powr"]))
        nodes.append(helper.make_node("Cast", [f"{y}__powr"], [y], to=tb))
    else:
        nodes.append(helper.make_node("Pow", [x, f"{y}__powe"], [y]))
    return nodes


def fold_constants(model, rounds: int = 4):
    """Shape inference, then fold Shape/Size of static shapes and all-constant nodes into initializers;
    repeated (up to ``rounds`` times) while it folds something: a folded value can make another
    tensor's shape static (Pad with folded pads, then Shape of its output)."""
    for _ in range(rounds):
        before = (len(model.graph.node), sum(n.op_type == "If" for n in model.graph.node))
        model = _fold_once(model)
        if (len(model.graph.node), sum(n.op_type == "If" for n in model.graph.node)) >= before:
            break
    return model


def _inline_if(node, cond) -> list:
    """The branch an If with a constant condition takes, as plain nodes (its outputs bound to the
    If's through Identity). Branch-local initializers become Constant nodes."""
    from onnx import helper

    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if bool(np.asarray(cond).reshape(-1)[0])
                                                                       else "else_branch"))
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in branch.initializer]
    nodes += list(branch.node)
    nodes += [helper.make_node("Identity", [bo.name], [o]) for bo, o in zip(branch.output, node.output) if o]
    return nodes


def _fold_once(model):
    from onnx import helper, numpy_helper, shape_inference
    from onnx.reference import ReferenceEvaluator

    try:
        model = shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:
        log.debug("shape inference failed: %s", e)
        return model
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    shapes = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") == "tensor_type" and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if all(d is not None for d in dims):
                shapes[vi.name] = dims
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.value_info) + list(g.output)
            if vi.type.WhichOneof("value") == "tensor_type"}
    elem.update({t.name: t.data_type for t in g.initializer})
    graph_outputs = {o.name for o in g.output}
    keep_nodes = []
    new_inits = []
    rewritten = False
    opset = _opset(model)
    for node in g.node:
        value = None
        if node.op_type == "If" and node.domain in ("", "ai.onnx") and node.input[0] in consts:
            keep_nodes.extend(_inline_if(node, consts[node.input[0]]))  # folded further next round
            rewritten = True
            continue
        if (node.op_type == "OneHot" and len(node.input) > 1 and node.input[1] in consts
                and consts[node.input[1]].dtype.kind == "f"):  # a float depth: TVM's converter wants an int
            name = f"{node.input[1]}__int64"
            if name not in consts:
                consts[name] = np.asarray(consts[node.input[1]]).astype(np.int64)
                new_inits.append(numpy_helper.from_array(consts[name], name))
            node.input[1] = name
            rewritten = True
        if node.op_type == "OneHot" and elem.get(node.input[0]) in FLOAT_TYPES:  # float indices: TVM wants ints
            cast = f"{node.input[0]}__int64"
            keep_nodes.append(helper.make_node("Cast", [node.input[0]], [cast], to=7))
            node.input[0] = cast
            rewritten = True
        if node.op_type == "Pow" and node.domain in ("", "ai.onnx") and _pow_needs_cast(node, elem):
            keep_nodes.extend(_pow_in_float(node, elem))
            rewritten = True
            continue
        if node.domain in ("", "ai.onnx") and not any(a.g.node for a in node.attribute if a.g is not None):
            if node.op_type == "EyeLike" and node.input[0] in shapes and len(shapes[node.input[0]]) == 2:
                attrs = {a.name: a.i for a in node.attribute}
                dtype = helper.tensor_dtype_to_np_dtype(attrs.get("dtype") or elem.get(node.input[0], 1))
                value = [np.eye(*shapes[node.input[0]], k=attrs.get("k", 0), dtype=dtype)]
            elif node.op_type == "Shape" and node.input[0] in shapes:
                attrs = {a.name: a.i for a in node.attribute}
                value = [np.array(shapes[node.input[0]][attrs.get("start", 0):attrs.get("end")], np.int64)]
            elif node.op_type == "Size" and node.input[0] in shapes:
                value = [np.array(int(np.prod(shapes[node.input[0]])), np.int64)]
            elif (node.op_type not in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                                       "Multinomial", "Bernoulli") and node.input
                  and all(i == "" or i in consts for i in node.input)):
                try:
                    single = helper.make_model(
                        helper.make_graph([node], "fold", [], [helper.make_tensor_value_info(o, 0, None)
                                                               for o in node.output if o],
                                          initializer=[numpy_helper.from_array(np.asarray(consts[i]), i)
                                                       for i in dict.fromkeys(node.input) if i]),
                        opset_imports=[helper.make_opsetid("", opset)])
                    ev = ReferenceEvaluator(single)
                    value = ev.run(None, {})
                    value = [np.asarray(v) for v in value]
                    if any(v.size > _MAX_FOLD_ELEMENTS or v.dtype == object for v in value):
                        value = None
                except Exception as e:
                    log.debug("cannot fold %s: %s", node.op_type, e)
                    value = None
            if node.op_type == "Constant" and value is None:
                try:
                    value = [numpy_helper.to_array(next(a.t for a in node.attribute if a.name == "value"))]
                except StopIteration:
                    value = None
        outs = [o for o in node.output if o]
        if value is not None and len(value) == len(outs):
            for o, v in zip(outs, value):
                consts[o] = v
                shapes[o] = list(v.shape)
                if o in graph_outputs:  # a graph output stays a node's output: Identity of the constant
                    new_inits.append(numpy_helper.from_array(v, f"{o}__folded"))
                    keep_nodes.append(helper.make_node("Identity", [f"{o}__folded"], [o]))
                else:
                    new_inits.append(numpy_helper.from_array(v, o))
            continue
        keep_nodes.append(node)
    if not new_inits and not rewritten:
        return model
    del g.node[:]
    g.node.extend(keep_nodes)
    g.initializer.extend(new_inits)
    if model.ir_version < 4:  # initializers must be graph inputs too
        g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in new_inits)
    # drop value_info of folded names (they are initializers now)
    folded = {t.name for t in new_inits}
    vis = [vi for vi in g.value_info if vi.name not in folded]
    del g.value_info[:]
    g.value_info.extend(vis)
    return model


# ----------------------------------------------------------------------------- sub-byte interfaces
# 4- and 2-bit integers (ONNX UINT4, INT4, UINT2, INT2) -> the byte type that carries them.
SUBBYTE_CARRIER = {21: 2, 22: 3, 25: 2, 26: 3}  # -> UINT8 / INT8
MINIFLOATS = {17, 18, 19, 20, 23, 24}  # FLOAT8E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, FLOAT4E2M1, FLOAT8E8M0


def widen_subbyte_io(model) -> dict[str, str]:
    """TVM's runtime cannot hold 2/4-bit tensors at its boundary (its tensors need whole bytes), while
    kernels compute with them fine. Graph inputs and outputs of those types become int8/uint8 in the
    model's interface, with a Cast to/from the narrow type right inside; returns {name: narrow dtype}.
    Runners widen such arrays on the way in (the values are the same numbers)."""
    from onnx import TensorProto, helper

    g = model.graph
    inits = {t.name for t in g.initializer}
    changed = {}
    new_nodes = []
    for vi in g.input:
        tt = vi.type.tensor_type
        if vi.name in inits or tt.elem_type not in SUBBYTE_CARRIER:
            continue
        narrow = tt.elem_type
        inner = f"{vi.name}__narrow"
        for node in _all_nodes(g):
            node.input[:] = [inner if x == vi.name else x for x in node.input]
        new_nodes.append(helper.make_node("Cast", [vi.name], [inner], to=narrow))
        tt.elem_type = SUBBYTE_CARRIER[narrow]
        changed[vi.name] = TensorProto.DataType.Name(narrow).lower()
    out_casts = []
    for vi in g.output:
        tt = vi.type.tensor_type
        if tt.elem_type not in SUBBYTE_CARRIER:
            continue
        narrow = tt.elem_type
        inner = f"{vi.name}__narrow"
        for node in _all_nodes(g):
            node.output[:] = [inner if x == vi.name else x for x in node.output]
            node.input[:] = [inner if x == vi.name else x for x in node.input]
        out_casts.append(helper.make_node("Cast", [inner], [vi.name], to=SUBBYTE_CARRIER[narrow]))
        tt.elem_type = SUBBYTE_CARRIER[narrow]
        changed[vi.name] = TensorProto.DataType.Name(narrow).lower()
    # 8- and 4-bit floats (no TVM codegen at all): an input that only feeds Cast/CastLike is carried
    # as float32 (every such value is exact in float32), so the Cast out of it becomes a float cast
    for vi in g.input:
        tt = vi.type.tensor_type
        if vi.name in inits or tt.elem_type not in MINIFLOATS:
            continue
        users = [n for n in _all_nodes(g) if vi.name in n.input]
        if users and all(n.op_type in ("Cast", "CastLike") and n.input[0] == vi.name for n in users):
            changed[vi.name] = TensorProto.DataType.Name(tt.elem_type).lower()
            tt.elem_type = TensorProto.FLOAT
    # ... and a graph output cast to one of them is computed as its value in float32: rounded to the
    # narrow format's grid (round half to even), with its overflow, infinity and NaN rules
    replaced = {}
    for vi in g.output:
        tt = vi.type.tensor_type
        if tt.elem_type not in MINIFLOAT_FORMATS:
            continue
        node = next((n for n in g.node if vi.name in n.output), None)
        if node is None or node.op_type not in ("Cast", "CastLike"):
            continue
        saturate = next((a.i for a in node.attribute if a.name == "saturate"), 1)
        replaced[id(node)] = _minifloat_round(node.input[0], vi.name, tt.elem_type, saturate)
        changed[vi.name] = TensorProto.DataType.Name(tt.elem_type).lower()
        tt.elem_type = TensorProto.FLOAT
    if replaced:
        nodes = []
        for n in g.node:
            nodes.extend(replaced.get(id(n), [n]))
        del g.node[:]
        g.node.extend(nodes)
    if new_nodes or out_casts:
        nodes = new_nodes + list(g.node) + out_casts
        del g.node[:]
        g.node.extend(nodes)
    return changed


# format -> (mantissa bits, smallest normal exponent, largest finite value, has inf)
MINIFLOAT_FORMATS = {17: (3, -6, 448.0, False), 18: (3, -7, 240.0, False), 19: (2, -14, 57344.0, True),
                     20: (2, -15, 57344.0, False), 23: (1, 0, 6.0, False)}


def _minifloat_round(x: str, y: str, fmt: int, saturate: int) -> list:
    """Nodes computing ``y`` = ``x`` rounded to the float8/float4 format ``fmt``, as float32 values:
    exponent e = floor(log2|x|) (corrected where the log rounds), clamped to the smallest normal
    exponent (subnormals); quantum 2^(e - mantissa bits); Round (half to even) of |x| / quantum.
    Beyond the largest finite value, infinities included: saturate -> +-max, else inf where the
    format has one, else NaN (float4 always saturates); NaN stays NaN (float4: 0). These are the
    rules of ONNX's reference implementation, which the node tests check."""
    from onnx import helper

    m, emin, vmax, has_inf = MINIFLOAT_FORMATS[fmt]
    p = f"{y}__mf"
    c = lambda name, v: helper.make_node("Constant", [], [p + name], value=helper.make_tensor(p + name + "_t", 1, [], [v]))  # noqa: E731,E501
    nd = helper.make_node
    nodes = [
        nd("Cast", [x], [p + "x"], to=1),
        c("ln2", float(np.log(2.0))), c("two", 2.0), c("one", 1.0), c("emin", float(emin)), c("m", float(m)),
        c("max", vmax), c("nan", float("nan")), c("inf", float("inf")), c("zero", 0.0),
        nd("Abs", [p + "x"], [p + "a"]),
        nd("Log", [p + "a"], [p + "la"]),
        nd("Div", [p + "la", p + "ln2"], [p + "l2"]),
        nd("Floor", [p + "l2"], [p + "e0"]),
        nd("Max", [p + "e0", p + "emin"], [p + "e1"]),                      # also catches log(0) = -inf
        nd("Pow", [p + "two", p + "e1"], [p + "pe"]),
        nd("Greater", [p + "pe", p + "a"], [p + "hi"]),                     # log rounded up: e one less
        nd("Cast", [p + "hi"], [p + "hif"], to=1),
        nd("Sub", [p + "e1", p + "hif"], [p + "e2"]),
        nd("Add", [p + "e2", p + "one"], [p + "e2n"]),
        nd("Pow", [p + "two", p + "e2n"], [p + "pn"]),
        nd("LessOrEqual", [p + "pn", p + "a"], [p + "lo"]),                 # log rounded down: e one more
        nd("Cast", [p + "lo"], [p + "lof"], to=1),
        nd("Add", [p + "e2", p + "lof"], [p + "e3"]),
        nd("Max", [p + "e3", p + "emin"], [p + "e"]),
        nd("Sub", [p + "e", p + "m"], [p + "qe"]),
        nd("Pow", [p + "two", p + "qe"], [p + "q"]),
        nd("Div", [p + "a", p + "q"], [p + "aq"]),
        nd("Round", [p + "aq"], [p + "r0"]),
        nd("Mul", [p + "r0", p + "q"], [p + "r"]),
        nd("Greater", [p + "r", p + "max"], [p + "over"]),
    ]
    # past the largest finite value and at infinity alike
    beyond = p + ("max" if saturate or fmt == 23 else ("inf" if has_inf else "nan"))
    nan_to = p + ("zero" if fmt == 23 else "nan")  # float4 has no NaN: the reference maps it to (-)0
    nodes += [
        nd("Where", [p + "over", beyond, p + "r"], [p + "rs"]),
        nd("IsInf", [p + "x"], [p + "isinf"]),
        nd("Where", [p + "isinf", beyond, p + "rs"], [p + "ri"]),
        nd("Less", [p + "x", p + "zero"], [p + "neg"]),
        nd("Neg", [p + "ri"], [p + "rn"]),
        nd("Where", [p + "neg", p + "rn", p + "ri"], [p + "sgn"]),
        nd("IsNaN", [p + "x"], [p + "isnan"]),
        nd("Where", [p + "isnan", nan_to, p + "sgn"], [y]),
    ]
    return nodes


def widen_subbyte_array(x):
    """A numpy array of a 2/4-bit ml_dtypes integer type as int8/uint8, of an 8/4-bit float type as
    float32 (same values); others unchanged."""
    x = np.asarray(x)
    name = x.dtype.name
    if name in ("int4", "int2"):
        return x.astype(np.int8)
    if name in ("uint4", "uint2"):
        return x.astype(np.uint8)
    if name.startswith(("float8_", "float4_")):
        return x.astype(np.float32)
    return x


# ----------------------------------------------------------------------------- binding inputs to values
# Operand slots that hold shapes, axes, sizes or counts: (op_type, input index). An input feeding
# one of these is what TVM's importer wants as a constant.
SHAPE_OPERANDS = {
    ("Reshape", 1), ("Unsqueeze", 1), ("Squeeze", 1), ("Expand", 1), ("Tile", 1), ("ConstantOfShape", 0),
    ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4), ("Pad", 1), ("Pad", 2), ("Pad", 3),
    ("Resize", 1), ("Resize", 2), ("Resize", 3), ("Upsample", 1), ("TopK", 1), ("Split", 1), ("CumSum", 1),
    ("CumProd", 1), ("OneHot", 1), ("Range", 0), ("Range", 1), ("Range", 2), ("ReduceSum", 1), ("ReduceMean", 1),
    ("ReduceMax", 1), ("ReduceMin", 1), ("ReduceProd", 1), ("ReduceL1", 1), ("ReduceL2", 1),
    ("ReduceLogSum", 1), ("ReduceLogSumExp", 1), ("ReduceSumSquare", 1), ("CenterCropPad", 1),
    ("CenterCropPad", 2), ("Col2Im", 1), ("Col2Im", 2), ("GridSample", 99), ("AffineGrid", 1),
    ("DFT", 1), ("DFT", 2), ("STFT", 1), ("STFT", 3), ("BlackmanWindow", 0), ("HannWindow", 0),
    ("HammingWindow", 0), ("MelWeightMatrix", 0), ("MelWeightMatrix", 1), ("MelWeightMatrix", 2),
    ("Trilu", 1), ("RoiAlign", 2), ("NonMaxSuppression", 2), ("NonMaxSuppression", 3),
    ("NonMaxSuppression", 4), ("Compress", 1), ("Einsum", 99),
    # not a shape, but TVM's importer wants OneHot's [off, on] values constant, and models carry them so
    ("OneHot", 2),
}


def shape_operand_inputs(model) -> list[str]:
    """Graph inputs whose values decide a shape/axes/size operand (see SHAPE_OPERANDS): directly, or
    through any computation on their values (Cast, Sub, Div, Concat...), but not through Shape/Size,
    which read only a tensor's shape."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi.name for vi in model.graph.input if vi.name not in inits]
    producer = {}
    for node in _all_nodes(model.graph):
        for o in node.output:
            producer[o] = node
    wanted, stack = set(), []
    for node in _all_nodes(model.graph):
        for i, name in enumerate(node.input):
            if name and (node.op_type, i) in SHAPE_OPERANDS:
                stack.append(name)
    while stack:
        v = stack.pop()
        if v in wanted:
            continue
        wanted.add(v)
        p = producer.get(v)
        if p is not None and p.op_type not in ("Shape", "Size"):
            stack.extend(x for x in p.input if x)
    return [n for n in inputs if n in wanted]


def bind_inputs(model, values: dict[str, np.ndarray]) -> None:
    """Make graph inputs constants with the given values (compile-time specialization)."""
    from onnx import numpy_helper

    names = {vi.name for vi in model.graph.input}
    for name, value in values.items():
        if name not in names:
            raise KeyError(name)
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    if model.ir_version >= 4:
        keep = [vi for vi in model.graph.input if vi.name not in values]
        del model.graph.input[:]
        model.graph.input.extend(keep)
