"""deploytool's own ONNX converters: operators TVM 0.27's importer lacks, or gets wrong in some
forms, rewritten at the ONNX level into operators it imports correctly (TVM is not forked).

Each converter takes a node and a :class:`Ctx` (element types, known shapes and constant values
from onnx's shape inference) and returns replacement nodes, or None to leave the node as it is
(TVM's converter handles that form, or the information the rewrite needs is not known yet).
``convert`` runs three times during import: early, before the model's interface is widened
(quantize / dequantize of 2/4/8-bit types must be rewritten before then), after function
expansion (bodies can hold ops a converter takes), and late, after input shapes are fixed and
constants folded (DFT and Resize need static shapes and constant operands).

Every rewrite computes what ONNX's reference implementation computes (the node tests check it):
quantized ops through integer/float arithmetic, DFT and Resize as products with matrices built at
compile time by the reference's own one-axis routine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from deploytool.onnx_passes import FLOAT_TYPES, MINIFLOATS, SUBBYTE_CARRIER

log = logging.getLogger(__name__)

_STD = ("", "ai.onnx")
# ONNX integer element types -> (min, max)
INT_RANGES = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767), 6: (-2**31, 2**31 - 1),
              12: (0, 2**32 - 1), 21: (0, 15), 22: (-8, 7), 25: (0, 3), 26: (-2, 1)}
SUBBYTE = set(SUBBYTE_CARRIER)  # UINT4, INT4, UINT2, INT2
# the largest matrix (elements) a DFT or Resize is turned into
MAX_MATRIX = 1 << 24


@dataclass
class Ctx:
    opset: int
    elem: dict = field(default_factory=dict)     # name -> ONNX element type
    shapes: dict = field(default_factory=dict)   # name -> list of dims (None where unknown)
    consts: dict = field(default_factory=dict)   # name -> np.ndarray
    inits: list = field(default_factory=list)    # initializers the rewrites add
    prefix: str = ""

    def name(self, tag: str) -> str:
        return f"{self.prefix}__{tag}"

    def const(self, tag: str, value) -> str:
        from onnx import numpy_helper

        n = self.name(tag)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def static_shape(self, name: str):
        s = self.shapes.get(name)
        return s if s is not None and all(d is not None for d in s) else None

    def rank(self, name: str):
        s = self.shapes.get(name)
        return None if s is None else len(s)


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _input(node, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _nd(op, ins, outs, **kw):
    from onnx import helper

    return helper.make_node(op, ins, outs, **kw)


# ----------------------------------------------------------------------------- plain decompositions
def swish(node, ctx):
    """Swish(x; alpha) = x * Sigmoid(alpha * x)."""
    alpha = _attrs(node).get("alpha", 1.0)
    x, y = node.input[0], node.output[0]
    a = ctx.const("alpha", np.array(alpha, np.float32))
    return [_nd("CastLike", [a, x], [ctx.name("a")]), _nd("Mul", [x, ctx.name("a")], [ctx.name("ax")]),
            _nd("Sigmoid", [ctx.name("ax")], [ctx.name("s")]), _nd("Mul", [x, ctx.name("s")], [y])]


def lp_normalization(node, ctx):
    """LpNormalization(x; axis, p) = x / ReduceL{p}(x, axis, keepdims=1), 0 where the norm is 0."""
    attrs = _attrs(node)
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    if p not in (1, 2):
        return None
    x, y = node.input[0], node.output[0]
    op = "ReduceL2" if p == 2 else "ReduceL1"
    if ctx.opset >= 18:
        red = _nd(op, [x, ctx.const("axes", np.array([axis], np.int64))], [ctx.name("n")], keepdims=1)
    else:
        red = _nd(op, [x], [ctx.name("n")], axes=[axis], keepdims=1)
    # a zero norm gives 0, not 0/0 (the reference's rule)
    zero = ctx.const("zero", np.array(0.0, np.float32))
    return [red, _nd("Div", [x, ctx.name("n")], [ctx.name("d")]), _nd("CastLike", [zero, x], [ctx.name("0")]),
            _nd("Equal", [ctx.name("n"), ctx.name("0")], [ctx.name("z")]),
            _nd("Where", [ctx.name("z"), ctx.name("0"), ctx.name("d")], [y])]


def hyperbolic(node, ctx):
    """Sinh/Cosh(x) = (exp(x) -/+ exp(-x)) / 2 (TVM imports them, but its CPU codegen has no intrinsic)."""
    x, y, n = node.input[0], node.output[0], ctx.name
    half = ctx.const("half", np.array(0.5, np.float32))
    combine = "Sub" if node.op_type == "Sinh" else "Add"
    return [_nd("Exp", [x], [n("ep")]), _nd("Neg", [x], [n("nx")]), _nd("Exp", [n("nx")], [n("en")]),
            _nd(combine, [n("ep"), n("en")], [n("s")]), _nd("CastLike", [half, x], [n("h")]),
            _nd("Mul", [n("s"), n("h")], [y])]


def cumprod(node, ctx):
    """CumProd(x, axis) = exp(CumSum(log|x|)) with the sign from the parity of CumSum(x < 0); a zero
    gives log 0 = -inf, so exp(-inf) = 0 from there on. Computed in double, cast back to x's type
    (rounded for integers). exclusive/reverse carry over to CumSum unchanged."""
    from onnx import helper

    if ctx.opset < 14:
        return None
    x, axis, y = node.input[0], node.input[1], node.output[0]
    attrs = _attrs(node)
    n = ctx.name
    cs = dict(exclusive=attrs.get("exclusive", 0), reverse=attrs.get("reverse", 0))
    k = lambda tag, v: _nd("Constant", [], [n(tag)], value=helper.make_tensor(n(tag) + "_t", 11, [], [v]))  # noqa: E731
    return [
        _nd("Cast", [x], [n("d")], to=11), _nd("Abs", [n("d")], [n("a")]), _nd("Log", [n("a")], [n("l")]),
        _nd("CumSum", [n("l"), axis], [n("s")], **cs), _nd("Exp", [n("s")], [n("m")]),
        k("zero", 0.0), k("one", 1.0), k("two", 2.0),
        _nd("Less", [n("d"), n("zero")], [n("neg")]), _nd("Cast", [n("neg")], [n("negd")], to=11),
        _nd("CumSum", [n("negd"), axis], [n("cnt")], **cs),
        _nd("Div", [n("cnt"), n("two")], [n("half")]), _nd("Floor", [n("half")], [n("fl")]),
        _nd("Mul", [n("fl"), n("two")], [n("even")]), _nd("Sub", [n("cnt"), n("even")], [n("odd")]),  # 0 or 1
        _nd("Mul", [n("odd"), n("two")], [n("odd2")]), _nd("Sub", [n("one"), n("odd2")], [n("sign")]),  # +-1
        _nd("Mul", [n("m"), n("sign")], [n("p")]), _nd("Round", [n("p")], [n("r")]),
        # integers take the rounded product, floats the product itself: 0.5 cast to x's type is 0
        # exactly for integer types
        k("h", 0.5), _nd("CastLike", [n("h"), x], [n("hx")]), _nd("Cast", [n("hx")], [n("hd")], to=11),
        _nd("Equal", [n("hd"), n("zero")], [n("isint")]), _nd("Where", [n("isint"), n("r"), n("p")], [n("pick")]),
        _nd("CastLike", [n("pick"), x], [y]),
    ]


def elu(node, ctx):
    """Elu on a non-float32 input (TVM's converter mixes a float32 constant in): where(x > 0, x,
    alpha * (exp(x) - 1)), the constants cast to x's type."""
    x, y, n = node.input[0], node.output[0], ctx.name
    if ctx.elem.get(x) in (None, 1):
        return None
    alpha = _attrs(node).get("alpha", 1.0)
    a, one, zero = (ctx.const(t, np.array(v, np.float32)) for t, v in (("alpha", alpha), ("one", 1.0), ("zero", 0.0)))
    return [_nd("CastLike", [a, x], [n("a")]), _nd("CastLike", [one, x], [n("1")]),
            _nd("CastLike", [zero, x], [n("0")]), _nd("Exp", [x], [n("e")]), _nd("Sub", [n("e"), n("1")], [n("em")]),
            _nd("Mul", [n("a"), n("em")], [n("neg")]), _nd("Greater", [x, n("0")], [n("pos")]),
            _nd("Where", [n("pos"), x, n("neg")], [y])]


def clip(node, ctx):
    """Clip with constant bounds as comparisons and Where: TVM's converter emits them as TE calls
    (call_tir), which TVM's ToMixedPrecision cannot type, so --dtype float16 failed on every model
    with a Clip (MobileNetV2's ReLU6). A NaN bound means no bound (ONNX's reference)."""
    x, y = node.input[0], node.output[0]
    bounds = [_input(node, i) for i in (1, 2)]
    if any(b and b not in ctx.consts for b in bounds) or not any(bounds):
        return None
    nodes, cur = [], x
    for i, (b, op) in enumerate(zip(bounds, ("Less", "Greater"))):
        if not b or np.isnan(np.asarray(ctx.consts[b], np.float64)).any():
            continue
        out = ctx.name(f"clip{i}")  # where(x < lo, lo, x): elementwise, fuses into the producer
        nodes += [_nd("CastLike", [b, x], [out + "_b"]), _nd(op, [cur, out + "_b"], [out + "_c"]),
                  _nd("Where", [out + "_c", out + "_b", cur], [out])]
        cur = out
    return nodes + [_nd("Identity", [cur], [y])]


def is_inf(node, ctx):
    """IsInf with detect_positive=0 or detect_negative=0 (TVM's converter ignores both)."""
    attrs = _attrs(node)
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    if pos and neg:
        return None
    x, y, n = node.input[0], node.output[0], ctx.name
    zero = ctx.const("zero", np.array(0.0, np.float32))
    if not pos and not neg:
        return [_nd("IsInf", [x], [n("i")]), _nd("Xor", [n("i"), n("i")], [y])]
    return [_nd("IsInf", [x], [n("i")]), _nd("CastLike", [zero, x], [n("0")]),
            _nd("Greater" if pos else "Less", [x, n("0")], [n("side")]), _nd("And", [n("i"), n("side")], [y])]


def reduce_bool(node, ctx):
    """ReduceMax/ReduceMin over booleans (TVM cannot build them): through uint8."""
    x, y, n = node.input[0], node.output[0], ctx.name
    if ctx.elem.get(x) != 9:
        return None
    red = _nd(node.op_type, [n("u8")] + list(node.input[1:]), [n("r")])
    red.attribute.extend(node.attribute)
    return [_nd("Cast", [x], [n("u8")], to=2), red, _nd("Cast", [n("r")], [y], to=9)]


def rms_normalization(node, ctx):
    """RMSNormalization over axes starting at 0 (TVM's converter gets the rank wrong there), as its
    schema's function body computes it: x * 1/sqrt(mean(x^2) + eps) in the stash type, then scale."""
    x, scale, y, n = node.input[0], node.input[1], node.output[0], ctx.name
    r = ctx.rank(x)
    attrs = _attrs(node)
    if r is None:
        return None
    axis = attrs.get("axis", -1) % r
    if axis != 0:
        return None
    stash = attrs.get("stash_type", 1)
    eps = ctx.const("eps", np.array(attrs.get("epsilon", 1e-5), np.float32))
    axes = ctx.const("axes", np.arange(axis, r, dtype=np.int64))
    return [_nd("Cast", [x], [n("x")], to=stash), _nd("Mul", [n("x"), n("x")], [n("x2")]),
            _nd("ReduceMean", [n("x2"), axes], [n("m")], keepdims=1), _nd("Cast", [eps], [n("e")], to=stash),
            _nd("Add", [n("m"), n("e")], [n("me")]), _nd("Sqrt", [n("me")], [n("rms")]),
            _nd("Reciprocal", [n("rms")], [n("inv")]), _nd("Mul", [n("x"), n("inv")], [n("nx")]),
            _nd("CastLike", [n("nx"), x], [n("nc")]), _nd("Mul", [n("nc"), scale], [y])]


def space_to_depth(node, ctx):
    """SpaceToDepth in CRD mode (opset 25; TVM's converter knows DCR only): reshape, transpose,
    reshape with the static shape."""
    attrs = _attrs(node)
    mode = attrs.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    shape = ctx.static_shape(node.input[0])
    if mode != "CRD" or shape is None or len(shape) != 4:
        return None
    b, c, h, w = shape
    k = attrs["blocksize"]
    s1 = ctx.const("s1", np.array([b, c, h // k, k, w // k, k], np.int64))
    s2 = ctx.const("s2", np.array([b, c * k * k, h // k, w // k], np.int64))
    n = ctx.name
    return [_nd("Reshape", [node.input[0], s1], [n("r")]), _nd("Transpose", [n("r")], [n("t")], perm=[0, 1, 3, 5, 2, 4]),
            _nd("Reshape", [n("t"), s2], [node.output[0]])]


def mod(node, ctx):
    """Float Mod with fmod=0 (the result takes the divisor's sign, as numpy's mod): C fmod, plus the
    divisor where the remainder is non-zero and its sign differs from the divisor's. TVM's
    x - floor(x / y) * y gives NaN for an infinite divisor where numpy gives x or the infinity."""
    x, y, n = node.input[0], node.input[1], ctx.name
    if _attrs(node).get("fmod", 0) or ctx.elem.get(x) not in FLOAT_TYPES:
        return None
    zero = ctx.const("zero", np.array(0.0, np.float32))
    return [_nd("Mod", [x, y], [n("r")], fmod=1), _nd("CastLike", [zero, x], [n("0")]),
            _nd("Less", [n("r"), n("0")], [n("rn")]), _nd("Less", [y, n("0")], [n("yn")]),
            _nd("Xor", [n("rn"), n("yn")], [n("differ")]), _nd("Equal", [n("r"), n("0")], [n("rz")]),
            _nd("Not", [n("rz")], [n("nz")]), _nd("And", [n("differ"), n("nz")], [n("fix")]),
            _nd("Add", [n("r"), y], [n("ry")]), _nd("Where", [n("fix"), n("ry"), n("r")], [node.output[0]])]


def bitcast(node, ctx):
    """BitCast between integer types of one width (and bool -> 8 bits): the same bits are the value
    modulo 2^bits, which is what a same-width integer Cast computes."""
    widths = {9: 8, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 12: 32, 7: 64, 13: 64}
    src, dst = ctx.elem.get(node.input[0]), _attrs(node).get("to")
    if src not in widths or dst not in widths or widths[src] != widths[dst] or dst == 9:
        return None
    return [_nd("Cast", [node.input[0]], [node.output[0]], to=dst)]


# ONNX integer element types -> (bits, signed, the unsigned type of that width)
INT_TYPES = {2: (8, False, 2), 3: (8, True, 2), 4: (16, False, 4), 5: (16, True, 4), 6: (32, True, 12),
             12: (32, False, 12), 7: (64, True, 13), 13: (64, False, 13)}


def bit_shift(node, ctx):
    """BitShift with every shift amount defined: the amount is read as unsigned (a negative one is
    huge), and one of the type's width or more shifts every bit out (0; the sign on a signed right
    shift), as ONNX's reference computes. LLVM leaves such shifts undefined, and what the machine
    gives differs by ISA (AVX-512's variable byte shifts saturate the amount, AVX2's scalar shifts
    mask it): shift by min(amount, width - 1) instead, and pick 0 where the amount was too large."""
    x, s, y = node.input[0], node.input[1], node.output[0]
    t = ctx.elem.get(x)
    if t not in INT_TYPES or ctx.elem.get(s) != t:
        return None
    bits, signed, unsigned = INT_TYPES[t]
    right = _attrs(node).get("direction", b"") in (b"RIGHT", "RIGHT")
    n = ctx.name
    nodes = [_nd("Cast", [s], [n("u")], to=unsigned)] if signed else [_nd("Identity", [s], [n("u")])]
    nodes += [_nd("Cast", [ctx.const("last", np.array(bits - 1))], [n("last")], to=unsigned),
              _nd("Min", [n("u"), n("last")], [n("um")]), _nd("Cast", [n("um")], [n("amt")], to=t)]
    shift = _nd("BitShift", [x, n("amt")], [y if right and signed else n("sh")])
    shift.attribute.extend(node.attribute)
    nodes.append(shift)
    if right and signed:  # shifting by width - 1 already fills with the sign
        return nodes
    return nodes + [_nd("Greater", [n("u"), n("last")], [n("big")]), _nd("Cast", [ctx.const("zero", np.array(0))],
                                                                         [n("zero")], to=t),
                    _nd("Where", [n("big"), n("zero"), n("sh")], [y])]


def cast_to_subbyte(node, ctx):
    """A float Cast (or CastLike) to a 2/4-bit integer wraps modulo 2^bits in ONNX's reference
    (-9.0 -> uint4 7). LLVM's float-to-narrow-unsigned conversion of a negative value is undefined
    (it gave 7 with AVX-512 and 0 with AVX2): convert to int32 first (exact for these values), then
    narrow, which keeps the low bits."""
    x, y = node.input[0], node.output[0]
    to = _attrs(node).get("to") if node.op_type == "Cast" else ctx.elem.get(_input(node, 1))
    if ctx.elem.get(x) not in FLOAT_TYPES or to not in SUBBYTE:
        return None
    return [_nd("Cast", [x], [ctx.name("i32")], to=6), _nd("Cast", [ctx.name("i32")], [y], to=to)]


# ----------------------------------------------------------------------------- quantization
def _float_param(ctx, p: str, tag: str, x: str, axis: int, block: int):
    """Nodes and the name of quantization parameter ``p`` as float32 (cast first: a float8/4-bit
    parameter that only feeds a Cast becomes a float32 input), shaped to broadcast against ``x``:
    per tensor as it is, per axis reshaped to (.., C, ..), blocked gathered along ``axis`` (index
    i -> i // block)."""
    r, pr = ctx.rank(x), ctx.rank(p)
    f = ctx.name(tag + "f")
    nodes = [_nd("Cast", [p], [f], to=1)]
    if block:
        shape = ctx.static_shape(x)
        if shape is None:
            return None
        idx = ctx.const(f"{tag}_idx", np.arange(shape[axis], dtype=np.int64) // block)
        return nodes + [_nd("Gather", [f, idx], [ctx.name(tag)], axis=axis)], ctx.name(tag)
    if pr == 1 and r is not None and r > 1:
        shape = ctx.const(f"{tag}_shape", np.array([-1 if i == axis else 1 for i in range(r)], np.int64))
        return nodes + [_nd("Reshape", [f, shape], [ctx.name(tag)])], ctx.name(tag)
    return nodes, f


def dequantize_linear(node, ctx):
    """DequantizeLinear of 2/4-bit integers or 8/4-bit floats, or blocked: (float(x) - float(zp)) *
    scale in float32, cast to the output type."""
    x, scale, zp = node.input[0], node.input[1], _input(node, 2)
    attrs = _attrs(node)
    block = attrs.get("block_size", 0)
    tx, tzp = ctx.elem.get(x), ctx.elem.get(zp) if zp else None
    if not (block or tx in SUBBYTE or tx in MINIFLOATS or tzp in MINIFLOATS):
        return None
    r = ctx.rank(x)
    if r is None:
        return None
    axis = attrs.get("axis", 1) % max(r, 1)
    out_t = attrs.get("output_dtype") or ctx.elem.get(scale) or 1
    n = ctx.name
    nodes = [_nd("Cast", [x], [n("x")], to=1)]
    b = _float_param(ctx, scale, "scale", x, axis, block)
    if b is None:
        return None
    nodes += b[0]
    value = n("x")
    if zp:
        bz = _float_param(ctx, zp, "zp", x, axis, block)
        if bz is None:
            return None
        nodes += bz[0] + [_nd("Sub", [n("x"), bz[1]], [n("xz")])]
        value = n("xz")
    b = (None, b[1])
    nodes += [_nd("Mul", [value, b[1]], [n("y")]), _nd("Cast", [n("y")], [node.output[0]], to=out_t)]
    return nodes


def quantize_linear(node, ctx):
    """QuantizeLinear to 2/4-bit integers (round half to even, + zero point, saturate) or to 8/4-bit
    floats (x / scale, then a saturating Cast that the interface pass computes), or blocked."""
    x, scale, zp = node.input[0], node.input[1], _input(node, 2)
    attrs = _attrs(node)
    block = attrs.get("block_size", 0)
    out_t = ctx.elem.get(zp) if zp else (attrs.get("output_dtype") or 2)
    if out_t is None or not (block or out_t in SUBBYTE or out_t in MINIFLOATS):
        return None
    r = ctx.rank(x)
    if r is None:
        return None
    axis = attrs.get("axis", 1) % max(r, 1)
    n = ctx.name
    nodes = [_nd("Cast", [x], [n("x")], to=1)]
    b = _float_param(ctx, scale, "scale", x, axis, block)
    if b is None:
        return None
    nodes += b[0] + [_nd("Div", [n("x"), b[1]], [n("q")])]
    value = n("q")
    if out_t not in MINIFLOATS:
        nodes.append(_nd("Round", [value], [n("qr")]))
        value = n("qr")
    if zp:
        bz = _float_param(ctx, zp, "zp", x, axis, block)
        if bz is None:
            return None
        nodes += bz[0] + [_nd("Add", [value, bz[1]], [n("qz")])]
        value = n("qz")
    if out_t in MINIFLOATS:
        nodes.append(_nd("Cast", [value], [node.output[0]], to=out_t, saturate=attrs.get("saturate", 1)))
        return nodes
    lo, hi = INT_RANGES[out_t]
    nodes += [_nd("Clip", [value, ctx.const("lo", np.array(lo, np.float32)), ctx.const("hi", np.array(hi, np.float32))],
                  [n("c")]),
              _nd("Cast", [n("c")], [node.output[0]], to=out_t)]
    return nodes


def _int32_minus_zp(ctx, v: str, zp: str, tag: str, zp_shape=None):
    nodes = [_nd("Cast", [v], [ctx.name(tag)], to=6)]
    if not zp:
        return nodes, ctx.name(tag)
    z = zp
    if zp_shape is not None:
        nodes.append(_nd("Reshape", [zp, ctx.const(f"{tag}_zs", np.array(zp_shape, np.int64))], [ctx.name(tag + "zr")]))
        z = ctx.name(tag + "zr")
    nodes += [_nd("Cast", [z], [ctx.name(tag + "z")], to=6),
              _nd("Sub", [ctx.name(tag), ctx.name(tag + "z")], [ctx.name(tag + "m")])]
    return nodes, ctx.name(tag + "m")


def _requantize(ctx, acc: str, scales: list, y_scale: str, y_zp: str, out_t: int, y: str, rnd: str = "Round"):
    """``acc`` (int32) * (prod(scales) / y_scale) [+ y_zp], rounded and saturated to ``out_t``: the
    multiplier in the scales' type, the product in double (numpy's int32 x float promotion)."""
    n = ctx.name
    nodes = [_nd("Mul", scales, [n("ss")]), _nd("Div", [n("ss"), y_scale], [n("mult")]),
             _nd("Cast", [n("mult")], [n("multd")], to=11), _nd("Cast", [acc], [n("accd")], to=11),
             _nd("Mul", [n("accd"), n("multd")], [n("v")])]
    value = n("v")
    if y_zp:
        nodes += [_nd("Cast", [y_zp], [n("yz")], to=11), _nd("Add", [value, n("yz")], [n("vz")])]
        value = n("vz")
    lo, hi = INT_RANGES[out_t]
    nodes += [_nd(rnd, [value], [n("r")]),
              _nd("Clip", [n("r"), ctx.const("lo", np.array(lo, np.float64)), ctx.const("hi", np.array(hi, np.float64))],
                  [n("c")]),
              _nd("Cast", [n("c")], [y], to=out_t)]
    return nodes


def qlinear_matmul(node, ctx):
    """QLinearMatMul: integer MatMul of the zero-point-shifted operands (int32, exact), requantized."""
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (list(node.input) + [""] * 8)[:8]
    out_t = ctx.elem.get(y_zp) if y_zp else ctx.elem.get(a)
    if out_t not in INT_RANGES:
        return None
    na, va = _int32_minus_zp(ctx, a, a_zp, "a")
    nb, vb = _int32_minus_zp(ctx, b, b_zp, "b")
    return na + nb + [_nd("MatMul", [va, vb], [ctx.name("acc")])] + _requantize(
        ctx, ctx.name("acc"), [a_s, b_s], y_s, y_zp, out_t, node.output[0])


def _conv_attrs(node):
    from onnx import helper

    return [helper.make_attribute(k, v) for k, v in _attrs(node).items()
            if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")]


def _w_zp_shape(ctx, w: str, w_zp: str):
    """A per-output-channel weight zero point reshaped to (M, 1, ..)."""
    zr, wr = ctx.rank(w_zp) if w_zp else None, ctx.rank(w)
    zs = ctx.static_shape(w_zp) if w_zp else None
    if zr == 1 and wr and zs and zs[0] > 1:
        return [-1] + [1] * (wr - 1)
    return None


def conv_integer(node, ctx):
    """ConvInteger: Conv of the zero-point-shifted operands in float32 (exact for 8-bit operands:
    every partial sum is an integer below 2^24 for kernels of up to ~500 taps... checked against the
    kernel size), rounded back to int32."""
    x, w, x_zp, w_zp = (list(node.input) + [""] * 4)[:4]
    ws = ctx.static_shape(w)
    if ws is None or int(np.prod(ws[1:])) * 255 * 255 >= 2**24:
        return None
    nx, vx = _int32_minus_zp(ctx, x, x_zp, "x")
    nw, vw = _int32_minus_zp(ctx, w, w_zp, "w", _w_zp_shape(ctx, w, w_zp))
    conv = _nd("Conv", [ctx.name("xf"), ctx.name("wf")], [ctx.name("acc")])
    conv.attribute.extend(_conv_attrs(node))
    return nx + nw + [_nd("Cast", [vx], [ctx.name("xf")], to=1), _nd("Cast", [vw], [ctx.name("wf")], to=1), conv,
                      _nd("Round", [ctx.name("acc")], [ctx.name("accr")]),
                      _nd("Cast", [ctx.name("accr")], [node.output[0]], to=6)]


def qlinear_conv(node, ctx):
    """QLinearConv: ConvInteger's exact float32 convolution plus the int32 bias, requantized (per
    output channel weight scales broadcast over (1, M, 1, ..))."""
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (list(node.input) + [""] * 9)[:9]
    ws, wr = ctx.static_shape(w), ctx.rank(w)
    out_t = ctx.elem.get(y_zp) if y_zp else ctx.elem.get(x)
    if ws is None or out_t not in INT_RANGES or int(np.prod(ws[1:])) * 255 * 255 >= 2**24:
        return None
    n = ctx.name
    nx, vx = _int32_minus_zp(ctx, x, x_zp, "x")
    nw, vw = _int32_minus_zp(ctx, w, w_zp, "w", _w_zp_shape(ctx, w, w_zp))
    conv = _nd("Conv", [n("xf"), n("wf")], [n("acc")])
    conv.attribute.extend(_conv_attrs(node))
    nodes = nx + nw + [_nd("Cast", [vx], [n("xf")], to=1), _nd("Cast", [vw], [n("wf")], to=1), conv,
                       _nd("Round", [n("acc")], [n("accr")]), _nd("Cast", [n("accr")], [n("acci")], to=6)]
    acc = n("acci")
    if bias:
        bshape = ctx.const("bshape", np.array([1, -1] + [1] * (wr - 2), np.int64))
        nodes += [_nd("Reshape", [bias, bshape], [n("br")]), _nd("Add", [acc, n("br")], [n("accb")])]
        acc = n("accb")
    scale_w = w_s
    if ctx.rank(w_s) == 1 and (ctx.static_shape(w_s) or [1])[0] > 1:
        nodes.append(_nd("Reshape", [w_s, ctx.const("wsshape", np.array([1, -1] + [1] * (wr - 2), np.int64))],
                         [n("wsr")]))
        scale_w = n("wsr")
    # the reference clips, then rounds (half to even)
    return nodes + _requantize(ctx, acc, [x_s, scale_w], y_s, y_zp, out_t, node.output[0])


# ----------------------------------------------------------------------------- linear maps as matrices
def _apply_along_axis(ctx, x: str, rank: int, axis: int, matrix: np.ndarray, bias, y: str, tag: str, dtype):
    """``y`` = ``matrix`` (out x in) applied along ``axis`` of ``x`` (+ ``bias`` per output index):
    a MatMul with the axis moved last."""
    n = ctx.name
    perm = [d for d in range(rank) if d != axis] + [axis]
    inv = list(np.argsort(perm))
    m = ctx.const(f"{tag}_m", matrix.T.astype(dtype))
    nodes = []
    cur = x
    if axis != rank - 1:
        nodes.append(_nd("Transpose", [cur], [n(f"{tag}_t")], perm=perm))
        cur = n(f"{tag}_t")
    out = y if axis == rank - 1 and bias is None else n(f"{tag}_mm")
    nodes.append(_nd("MatMul", [cur, m], [out]))
    cur = out
    if bias is not None:
        out = y if axis == rank - 1 else n(f"{tag}_b")
        nodes.append(_nd("Add", [cur, ctx.const(f"{tag}_bias", bias.astype(dtype))], [out]))
        cur = out
    if axis != rank - 1:
        nodes.append(_nd("Transpose", [cur], [y], perm=[int(i) for i in inv]))
    return nodes


def dft(node, ctx):
    """DFT with a static signal: one MatMul with the (real-valued) matrix of the whole transform --
    forward, inverse, one-sided and inverse one-sided (irfft), dft_length padding or truncation --
    built by applying numpy's FFT (what the reference computes) to each basis vector."""
    attrs = _attrs(node)
    x = node.input[0]
    shape = ctx.static_shape(x)
    length_in, axis_in = _input(node, 1), _input(node, 2)
    if shape is None or (length_in and length_in not in ctx.consts) or (axis_in and axis_in not in ctx.consts):
        return None
    rank = len(shape)
    if ctx.opset >= 20:
        axis = int(ctx.consts[axis_in]) if axis_in else -2
    else:
        axis = attrs.get("axis", 1)
    axis %= rank
    if axis == rank - 1:
        return None
    inverse, onesided = attrs.get("inverse", 0), attrs.get("onesided", 0)
    L, c = shape[axis], shape[-1]
    n = int(ctx.consts[length_in]) if length_in else (2 * (L - 1) if inverse and onesided else L)
    if c not in (1, 2) or n <= 0:
        return None

    def transform(sig):  # sig: (..., L) complex -> (..., n_out, c_out) real
        if inverse and onesided:
            return np.fft.irfft(sig, n=n, axis=-1)[..., None]
        out = np.fft.ifft(sig, n=n, axis=-1) if inverse else np.fft.fft(sig, n=n, axis=-1)
        if onesided and not inverse:
            out = out[..., : n // 2 + 1]
        return np.stack([out.real, out.imag], axis=-1)

    basis = np.eye(L * c).reshape(L * c, L, c)
    sig = basis[..., 0] + (1j * basis[..., 1] if c == 2 else 0)
    out = transform(sig)  # (L*c, n_out, c_out)
    n_out, c_out = out.shape[1], out.shape[2]
    if L * c * n_out * c_out > MAX_MATRIX or ctx.elem.get(x) not in FLOAT_TYPES:
        return None
    # in x out, in double: the reference computes in double; float32 sums drift past the node tests' 1e-7
    matrix = out.reshape(L * c, n_out * c_out)
    # (.., L, .., c): the signal axis and the complex axis next to each other, flattened, transformed
    perm = [d for d in range(rank) if d not in (axis, rank - 1)] + [axis, rank - 1]
    lead = [shape[d] for d in perm[:-2]]
    nm = ctx.name
    nodes = [_nd("Transpose", [x], [nm("t")], perm=perm)]
    src = nm("t")
    if ctx.elem[x] != 11:
        nodes.append(_nd("Cast", [src], [nm("tc")], to=11))
        src = nm("tc")
    nodes += [_nd("Reshape", [src, ctx.const("s1", np.array(lead + [L * c], np.int64))], [nm("f")]),
              _nd("MatMul", [nm("f"), ctx.const("m", matrix)], [nm("y")]),
              _nd("Reshape", [nm("y"), ctx.const("s2", np.array(lead + [n_out, c_out], np.int64))], [nm("yr")])]
    inv = [int(i) for i in np.argsort(perm)]
    res = nm("yr")
    if ctx.elem[x] != 11:
        nodes.append(_nd("Cast", [res], [nm("yc")], to=ctx.elem[x]))
        res = nm("yc")
    nodes.append(_nd("Transpose", [res], [node.output[0]], perm=inv))
    return nodes


def upsample(node, ctx):
    """Upsample (opset 7-9, deprecated): nearest with integer scales is np.repeat, i.e. Resize with
    asymmetric coordinates and floor rounding; linear is Resize's asymmetric linear."""
    attrs = _attrs(node)
    mode = attrs.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if len(node.input) > 1:
        scales = node.input[1]
    elif "scales" in attrs:
        scales = ctx.const("scales", np.array(attrs["scales"], np.float32))
    else:
        return None
    kw = dict(mode=mode, coordinate_transformation_mode="asymmetric")
    if mode == "nearest":
        kw["nearest_mode"] = "floor"
    return [_nd("Resize", [node.input[0], "", scales], [node.output[0]], **kw)]


def _resize_maps(x_shape, attrs, roi, scales, sizes):
    """Per resized axis: (axis, matrix out x in, bias per output index or None), computed with the
    reference's own one-axis routine on the identity (interpolation is linear along each axis; a
    tf_crop_and_resize extrapolation is the bias)."""
    from onnx.reference.ops import op_resize as ref

    mode = attrs.get("mode", "nearest")
    r = len(x_shape)
    axes = attrs.get("axes")
    if axes is not None:
        axes = [a % r for a in axes]
    if roi is not None and np.asarray(roi).size == 0:
        roi = None
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    if axes is not None:
        if scales is not None:
            full = [1.0] * r
            for i, d in enumerate(axes):
                full[d] = float(scales[i])
            scales = full
        if sizes is not None:
            full = list(x_shape)
            for i, d in enumerate(axes):
                full[d] = int(sizes[i])
            sizes = full
        if roi is not None:
            full = [0.0] * r + [1.0] * r
            for i, d in enumerate(axes):
                full[d], full[r + d] = roi[i], roi[len(axes) + i]
            roi = full
    else:
        axes = list(range(r))
    if sizes is not None:
        scales = [sizes[i] / x_shape[i] for i in range(r)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scales[a] for a in axes)
            scales = [s if i in axes else 1.0 for i in range(r)]
            sizes = [int(s * x_shape[i] + 0.5) if i in axes else x_shape[i] for i in range(r)]
    else:
        sizes = list((np.array(scales) * np.array(x_shape)).astype(int))
    if mode == "nearest":
        nm = attrs.get("nearest_mode", "round_prefer_floor")
        fct = lambda v, s: ref._nearest_coeffs(v, mode=nm)  # noqa: E731
    elif mode == "cubic":
        f = ref._cubic_coeffs_antialias if attrs.get("antialias") else ref._cubic_coeffs
        a = attrs.get("cubic_coeff_a", -0.75)
        fct = lambda v, s: f(v, s, A=a)  # noqa: E731
    else:
        fct = ref._linear_coeffs_antialias if attrs.get("antialias") else ref._linear_coeffs
    kw = dict(coordinate_transformation_mode=attrs.get("coordinate_transformation_mode", "half_pixel"),
              exclude_outside=bool(attrs.get("exclude_outside", 0)))
    maps = []
    for d in axes:
        same_roi = roi is None or (np.isclose(roi[d], 0.0) and np.isclose(roi[d + r], 1.0))
        if np.isclose(scales[d], 1.0) and int(sizes[d]) == x_shape[d] and same_roi:
            continue
        axis_roi = None if roi is None else [roi[d], roi[d + r]]
        size_in, size_out = x_shape[d], int(sizes[d])
        if size_in * size_out > MAX_MATRIX:
            raise ValueError("too large")
        m = ref._interpolate_1d_along_axis(np.eye(size_in), 0, float(scales[d]), size_out, fct, roi=axis_roi,
                                           extrapolation_value=0.0, **kw)
        extra = ref._interpolate_1d_along_axis(np.zeros((size_in, 1)), 0, float(scales[d]), size_out, fct,
                                               roi=axis_roi, extrapolation_value=1.0, **kw)[:, 0]
        ev = attrs.get("extrapolation_value", 0.0)
        bias = extra * ev if np.any(extra) and ev else None
        maps.append((d, m, bias))
    return maps


def resize(node, ctx):
    """Resize of a static float tensor with constant operands, in the forms TVM's converter lacks or
    computes differently from ONNX (axes, keep_aspect_ratio_policy, antialias, cubic, downsampling,
    half_pixel_symmetric, tf_crop_and_resize, nearest from sizes): per resized axis, a Gather
    (nearest: each output picks one input) or a MatMul with the interpolation matrix."""
    x = node.input[0]
    shape = ctx.static_shape(x)
    roi_n, scales_n, sizes_n = _input(node, 1), _input(node, 2), _input(node, 3)
    if shape is None or ctx.elem.get(x) not in FLOAT_TYPES or any(v and v not in ctx.consts for v in (roi_n, scales_n, sizes_n)):
        return None
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in _attrs(node).items()}
    scales = ctx.consts[scales_n] if scales_n and ctx.consts[scales_n].size else None
    sizes = ctx.consts[sizes_n] if sizes_n and ctx.consts[sizes_n].size else None
    mode = attrs.get("mode", "nearest")
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    if not (attrs.get("axes") is not None or attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch"
            or attrs.get("antialias") or mode == "cubic" or ctm in ("half_pixel_symmetric", "tf_crop_and_resize")
            or (scales is not None and np.any(scales < 1)) or (sizes is not None and mode == "nearest")
            or (sizes is not None and np.any(np.asarray(sizes) < np.asarray(shape)[list(attrs.get("axes") or range(len(shape)))]))):
        return None
    roi = ctx.consts[roi_n] if roi_n else None
    try:
        maps = _resize_maps(shape, attrs, roi, scales, sizes)
    except Exception as e:  # the reference routine's private API changed, or too large
        log.debug("Resize not rewritten: %s", e)
        return None
    dtype = np.float64 if ctx.elem[x] == 11 else np.float32
    nodes, cur = [], x
    if not maps:
        return [_nd("Identity", [x], [node.output[0]])]
    if ctx.elem[x] not in (1, 11):
        nodes.append(_nd("Cast", [x], [ctx.name("xc")], to=1))
        cur = ctx.name("xc")
    for i, (d, m, bias) in enumerate(maps):
        last = i == len(maps) - 1
        y = node.output[0] if last and ctx.elem[x] in (1, 11) else ctx.name(f"r{i}")
        one_hot = bias is None and np.all((m == 0) | (m == 1)) and np.all(m.sum(axis=1) == 1)
        if one_hot:
            idx = ctx.const(f"idx{i}", m.argmax(axis=1).astype(np.int64))
            nodes.append(_nd("Gather", [cur, idx], [y], axis=d))
        else:
            nodes += _apply_along_axis(ctx, cur, len(shape), d, m, bias, y, f"a{i}", dtype)
        cur = y
    if ctx.elem[x] not in (1, 11):
        nodes.append(_nd("Cast", [cur], [node.output[0]], to=ctx.elem[x]))
    return nodes


CONVERTERS = {
    "Swish": swish, "LpNormalization": lp_normalization, "Sinh": hyperbolic, "Cosh": hyperbolic, "CumProd": cumprod,
    "Elu": elu, "Clip": clip, "IsInf": is_inf, "ReduceMax": reduce_bool, "ReduceMin": reduce_bool,
    "RMSNormalization": rms_normalization, "SpaceToDepth": space_to_depth, "BitCast": bitcast, "Mod": mod,
    "DequantizeLinear": dequantize_linear, "QuantizeLinear": quantize_linear, "QLinearMatMul": qlinear_matmul,
    "QLinearConv": qlinear_conv, "ConvInteger": conv_integer, "DFT": dft, "Upsample": upsample, "Resize": resize,
    "BitShift": bit_shift, "Cast": cast_to_subbyte, "CastLike": cast_to_subbyte,
}


def _context(model):
    """Element types, shapes and constants of ``model``'s top-level graph (onnx shape inference)."""
    from onnx import numpy_helper, shape_inference

    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception as e:
        log.debug("shape inference failed: %s", e)
        inferred = model
    g = inferred.graph
    ctx = Ctx(opset=next((o.version for o in model.opset_import if o.domain in _STD), 0))
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        tt = vi.type.tensor_type
        ctx.elem[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            ctx.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    for t in g.initializer:
        ctx.elem[t.name] = t.data_type
        ctx.shapes[t.name] = list(t.dims)
        try:
            ctx.consts[t.name] = numpy_helper.to_array(t)
        except Exception:
            pass
    for node in g.node:
        if node.op_type == "Constant" and node.domain in _STD:
            t = next((a.t for a in node.attribute if a.name == "value"), None)
            if t is not None:
                try:
                    ctx.consts[node.output[0]] = numpy_helper.to_array(t)
                except Exception:
                    pass
    return ctx


# nodes a converter surely leaves alone, told apart without shape inference (which a model of
# hundreds of MB of weights pays for in seconds): most models cast, few to 2/4-bit types
_SURELY_KEPT = {"Cast": lambda n: _attrs(n).get("to") not in SUBBYTE}


def _may_convert(node) -> bool:
    if node.op_type not in CONVERTERS or node.domain not in _STD:
        return False
    kept = _SURELY_KEPT.get(node.op_type)
    return kept is None or not kept(node)


def convert(model) -> set[str]:
    """Rewrite the top-level nodes that a converter takes, in place; returns the op types rewritten."""
    if not any(_may_convert(n) for n in model.graph.node):
        return set()
    ctx = _context(model)
    done, nodes = set(), []
    for k, node in enumerate(model.graph.node):
        fn = CONVERTERS.get(node.op_type) if node.domain in _STD else None
        if fn is None:
            nodes.append(node)
            continue
        ctx.prefix = f"{node.output[0]}__{node.op_type.lower()}{k}"
        mark = len(ctx.inits)
        try:
            out = fn(node, ctx)
        except Exception as e:  # a converter must never break an import that TVM could do
            log.debug("%s not rewritten: %s", node.op_type, e)
            out = None
        if out is None:
            del ctx.inits[mark:]
            nodes.append(node)
            continue
        nodes.extend(out)
        done.add(node.op_type)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.graph.initializer.extend(ctx.inits)
        if model.ir_version < 4:
            from onnx import helper

            model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                     for t in ctx.inits)
    return done
