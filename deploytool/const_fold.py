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

The index arithmetic that ONNX exporters and TVM's importer write around Gather, Shape and
Concat (``shape_to_tensor`` of a static shape, integer add/subtract/multiply, comparisons, ``where``,
``take``, ``concat``, integer casts) is folded here too: two's-complement wrap-around in numpy as
in TIR. A LinearAttention node (its ONNX function body) made 100 such FoldConstant builds, 3.3 s
of a 4.5 s compile.
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
# integer ops whose numpy forms wrap around like TIR's (no division: TIR's floors, C's truncates)
_INT_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
               "relax.maximum": np.maximum, "relax.minimum": np.minimum}
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_COMPARE = {"relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
            "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal}
_INDEX = {"relax.shape_to_tensor", "relax.where", "relax.take", "relax.concat"}


def fold_pass():
    """The numpy folding pass: a Relax module pass (see the module doc)."""
    from tvm import relax

    from deploytool.pipeline import _op_rewrite_pass

    def rewrite(call, bb):
        out = _evaluate(call, lambda e: _constant(e, bb))
        if out is None:
            return None
        dtype = str(call.ty.dtype)
        # (not np.ascontiguousarray: it makes a 0-d array 1-d)
        return relax.const(np.array(out, dtype=dtype, order="C"), dtype)

    return _op_rewrite_pass({name: rewrite for name in (*_BINARY, *_UNARY, *_MOVES, *_COMPARE, *_INDEX)},
                            "NumpyFoldConstant")


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
    import tvm
    from tvm import relax

    name = call.op.name
    ty = call.ty
    dtype = str(getattr(ty, "dtype", ""))
    if not dtype or getattr(ty, "shape", None) is None:
        return None
    try:
        shape = [int(x) for x in ty.shape]
    except (TypeError, ValueError):  # symbolic
        return None
    if name == "relax.shape_to_tensor":  # of a shape known at compile time
        values = getattr(call.args[0].ty, "values", None)
        if values is None or not all(isinstance(v, tvm.tirx.IntImm) for v in values):
            return None
        return np.array([int(v) for v in values], dtype=dtype).reshape(shape)
    if name in _BINARY or name in _UNARY or name in _COMPARE or name in ("relax.where", "relax.concat"):
        if name == "relax.concat":
            if not isinstance(call.args[0], relax.Tuple):
                return None
            args = list(call.args[0].fields)
        else:
            args = list(call.args)
        cs = [constant(a) for a in args]
        if any(c is None for c in cs):
            return None
        xs = [_value(c) for c in cs]
        if name in _COMPARE:
            if len({str(x.dtype) for x in xs}) != 1 or str(xs[0].dtype) not in (*_FLOATS, *_INTS):
                return None
            out = _COMPARE[name](*xs)
        elif name == "relax.where":
            if str(xs[0].dtype) != "bool" or any(str(x.dtype) != dtype for x in xs[1:]):
                return None
            out = np.where(*xs)
        elif name == "relax.concat":
            if any(str(x.dtype) != dtype for x in xs):
                return None
            out = np.concatenate(xs, axis=int(call.attrs.axis))
        else:
            fn = _BINARY.get(name) if dtype in _FLOATS else _INT_BINARY.get(name) if dtype in _INTS else None
            if fn is None and dtype in _FLOATS:
                fn = _UNARY.get(name)
            if fn is None or any(str(x.dtype) != dtype for x in xs):
                return None
            with np.errstate(all="ignore"):
                out = fn(*xs)
        return out if list(out.shape) == shape else None
    if name == "relax.take":
        cs = [constant(a) for a in call.args]
        if any(c is None for c in cs):
            return None
        x, idx = (_value(c) for c in cs)
        if str(idx.dtype) not in _INTS:
            return None
        axis = int(call.attrs.axis) if call.attrs.axis is not None else None
        n = x.size if axis is None else x.shape[axis]
        mode = str(call.attrs.mode)
        if mode == "fast" and (idx.size and (idx.min() < 0 or idx.max() >= n)):
            return None  # undefined in TIR: leave it to TVM
        if mode not in ("fast", "wrap", "clip") or n == 0:
            return None
        out = np.take(x, idx, axis=axis, mode="raise" if mode == "fast" else mode)
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
        src = str(x.dtype)
        if dtype in _FLOATS and src in _FLOATS:
            return x.astype(dtype)
        # integers and bools among themselves (wrap-around) and to floats (nearest), not floats to
        # integers (out of range, C's cast is undefined)
        if src in (*_INTS, "bool") and dtype in (*_INTS, *_FLOATS):
            return x.astype(dtype)
        return None
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
