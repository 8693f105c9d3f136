"""Constant folding in numpy, before TVM's FoldConstant.

TVM's FoldConstant evaluates each foldable call by legalizing it to TIR, building that PrimFunc
(LLVM, one module per call) and running it unscheduled. A model's weight preparation is hundreds of
such calls: BatchNorm folded into the convolutions (a multiply per weight, an add per bias), layout
changes of every weight. On ResNet-50 the two FoldConstant passes after BatchNorm folding and
after the layout conversion took 17.4 s and 5.4 s of a 26 s compile (531 LLVM builds). Here the
common, exactly specified ops are computed in numpy, with Relax's semantics: elementwise float
arithmetic (correctly rounded, as TIR's), shape and layout ops (data movement), casts between float
types (round to nearest even, as TIR's). What is left (integer division, anything else) is left
to FoldConstant.
"""

from __future__ import annotations

import numpy as np

# float elementwise ops whose numpy forms are IEEE-exact like TIR's
_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
           "relax.divide": np.divide, "relax.maximum": np.maximum, "relax.minimum": np.minimum}
_UNARY = {"relax.sqrt": np.sqrt, "relax.negative": np.negative}
_FLOATS = ("float16", "float32", "float64")
_MOVES = {"relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.astype",
          "relax.layout_transform"}


def fold_pass():
    """The numpy folding pass: a Relax module pass (see the module doc)."""
    from tvm import relax

    from deploytool.pipeline import _op_rewrite_pass

    def rewrite(call, bb):
        out = _evaluate(call, lambda e: _constant(e, bb))
        if out is None:
            return None
        dtype = str(call.ty.dtype)
        return relax.const(np.ascontiguousarray(out.astype(dtype, copy=False)), dtype)

    return _op_rewrite_pass({name: rewrite for name in (*_BINARY, *_UNARY, *_MOVES)}, "NumpyFoldConstant")


def _constant(e, bb):
    """The constant ``e`` is (or is bound to, in the builder ``bb``), else None."""
    import tvm
    from tvm import relax

    while isinstance(e, relax.Var):
        b = bb.lookup_binding(e)
        if b is None:
            return None
        e = b
    # a scalar operand, R.add(x, T.float32(1e-05)), or a tensor
    return e if isinstance(e, (tvm.tirx.FloatImm, tvm.tirx.IntImm, tvm.ir.GenericConst)) else None


def _value(c) -> np.ndarray:
    """A constant (see _constant) as an array."""
    return c.value.numpy() if hasattr(c.value, "numpy") else np.array(c.value, dtype=str(c.ty.dtype))


def _evaluate(call, constant):
    """``call``'s value computed in numpy, or None where it is not one of ours or not constant."""
    name = call.op.name
    ty = call.ty
    dtype = str(getattr(ty, "dtype", ""))
    if not dtype or getattr(ty, "shape", None) is None:
        return None
    try:
        shape = [int(x) for x in ty.shape]
    except (TypeError, ValueError):  # symbolic
        return None
    if name in _BINARY or name in _UNARY:
        if dtype not in _FLOATS:
            return None
        cs = [constant(a) for a in call.args]
        if any(c is None for c in cs):
            return None
        xs = [_value(c) for c in cs]
        if any(str(x.dtype) != dtype for x in xs):
            return None
        with np.errstate(all="ignore"):
            out = (_BINARY.get(name) or _UNARY[name])(*xs)
        return out if list(out.shape) == shape else None
    c = constant(call.args[0]) if call.args else None
    if c is None:
        return None
    x = _value(c)
    if name == "relax.reshape":
        return x.reshape(shape)
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return np.transpose(x, None if axes is None else [int(a) for a in axes])
    if name in ("relax.expand_dims", "relax.squeeze"):
        return x.reshape(shape) if x.size == int(np.prod(shape)) else None
    if name == "relax.astype":
        if dtype not in _FLOATS or str(x.dtype) not in _FLOATS:
            return None
        return x.astype(dtype)
    if name == "relax.layout_transform":
        return _layout_transform(x, call.attrs, shape)
    return None


def _layout_transform(x, attrs, shape):
    """A layout_transform without padding: TVM's IndexMap.map_tensor moves the data (in C++, no
    build)."""
    import tvm

    if attrs.pad_value is not None:
        return None
    out = attrs.index_map.map_tensor(tvm.runtime.tensor(np.ascontiguousarray(x))).numpy()
    return out if list(out.shape) == shape else None
