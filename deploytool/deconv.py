"""Transposed convolutions as convolutions, on CPUs (the sub-pixel form).

TVM 0.27 lowers ``conv2d_transpose`` to a loop nest over a zero-inserted, padded copy of the input
that no rule of ``schedules.cpu`` takes (it falls to ``parallel_fallback``): a decoder's 4x4
stride-2 ConvTranspose ran at 3 GFLOP/s, 85x onnxruntime's time. A transposed convolution of
stride s is s^d ordinary convolutions of the input, one per output phase, each with every s-th tap
of the kernel; stacked along the output channels they are ONE stride-1 convolution with
``s^d x C_out`` channels and ``ceil(k / s)`` taps per axis, whose output a pixel shuffle (reshape,
transpose, reshape) interleaves and a slice crops by the pads. That convolution then runs NHWC
with the register-tiled schedule, is tuned like any other, and no multiply touches an inserted
zero (the kernel is padded with zero taps to ceil(k / s) only where s does not divide k).

Derivation (one axis; x the input, w[ci, co, kk] the weights, p the begin pad): the transposed
convolution scatters ``u[i s + kk] += x[i] w[kk]`` and keeps ``y[o] = u[o + p]``. For the phase
r = (o + p) mod s, only taps kk = r + s j contribute, with i = q - j where q = (o + p - r) / s:
``u[q s + r] = sum_j x[q - j] w[r + s j]``, a correlation of x, padded by J - 1 = ceil(k/s) - 1
on the left, with the flipped sub-kernel ``K_r[t] = w[r + s (J - 1 - t)]``.

Applies to constant weights, one group, no dilation, static shapes (else the operator stays as
it is, in ONNX's layout: see ``schedules.desired_layouts``).
"""

from __future__ import annotations

import math


def applies(target) -> bool:
    return target.family in ("x86", "arm")


def subpixel_pass():
    from deploytool.pipeline import _op_rewrite_pass

    return _op_rewrite_pass({"relax.nn.conv2d_transpose": lambda c, bb: _rewrite(c, 2),
                             "relax.nn.conv1d_transpose": lambda c, bb: _rewrite(c, 1)},
                            "TransposedConvAsSubpixel")


def subpixel_weights(w, strides):
    """[C_in, C_out, k...] transposed-convolution weights -> [prod(s) x C_out, C_in, J...] convolution
    weights, J = ceil(k / s) per axis, output channels ordered (phase per axis..., c_out)."""
    import itertools

    import numpy as np

    cin, cout, ks = w.shape[0], w.shape[1], w.shape[2:]
    taps = [math.ceil(k / s) for k, s in zip(ks, strides)]
    out = np.zeros((*strides, cout, cin, *taps), w.dtype)
    for r in itertools.product(*(range(s) for s in strides)):
        for t in itertools.product(*(range(j) for j in taps)):
            kk = tuple(ri + si * (ji - 1 - ti) for ri, si, ji, ti in zip(r, strides, taps, t))
            if all(k < kmax for k, kmax in zip(kk, ks)):
                out[r + (slice(None), slice(None)) + t] = w[(slice(None), slice(None)) + kk].T
    return out.reshape(math.prod(strides) * cout, cin, *taps)


def _ints(xs):
    """A static shape as ints; None for no shape (None) or a symbolic dimension."""
    try:
        return [int(x) for x in xs]
    except (TypeError, ValueError):
        return None


def _rewrite(call, nd: int):
    from tvm import relax

    from deploytool.pipeline import _FLOATS, _is_tensor_const

    x, w = call.args
    a = call.attrs
    sp = "HW" if nd == 2 else "W"
    if not _is_tensor_const(w) or str(a.data_layout) != "NC" + sp or str(a.kernel_layout) != "IO" + sp \
            or str(a.out_layout) != "NC" + sp or int(a.groups) != 1 or any(int(d) != 1 for d in a.dilation):
        return None
    dtype = str(getattr(x.ty, "dtype", ""))
    if dtype not in _FLOATS or str(w.value.dtype) != dtype or (a.out_dtype and str(a.out_dtype) not in ("", dtype)):
        return None
    in_shape = _ints(getattr(x.ty, "shape", None))
    out_shape = _ints(getattr(call.ty, "shape", None))
    if in_shape is None or out_shape is None:
        return None
    strides = [int(s) for s in a.strides]
    begin = [int(p) for p in a.padding[:nd]]
    wv = w.value.numpy()
    cout = wv.shape[1]
    taps = [math.ceil(k / s) for k, s in zip(wv.shape[2:], strides)]
    # the stacked convolution's output length per axis: Q = H + J - 1 with J - 1 zeros on each side,
    # plus e more on the end where the cropped output reaches past Q s (an output_padding)
    lo, hi, q = [], [], []
    for h, o, s, j, p in zip(in_shape[2:], out_shape[2:], strides, taps, begin):
        e = max(0, math.ceil((o + p - (h + j - 1) * s) / s))
        lo.append(j - 1)
        hi.append(j - 1 + e)
        q.append(h + j - 1 + e)
    wp = relax.const(subpixel_weights(wv, strides), dtype)
    n = in_shape[0]
    if nd == 2:
        y = relax.op.nn.conv2d(x, wp, strides=1, padding=[lo[0], lo[1], hi[0], hi[1]], data_layout="NCHW",
                               kernel_layout="OIHW")
        y = relax.op.reshape(y, [n, strides[0], strides[1], cout, q[0], q[1]])
        y = relax.op.permute_dims(y, [0, 3, 4, 1, 5, 2])
        y = relax.op.reshape(y, [n, cout, q[0] * strides[0], q[1] * strides[1]])
    else:
        y = relax.op.nn.conv1d(x, wp, strides=1, padding=[lo[0], hi[0]], data_layout="NCW", kernel_layout="OIW")
        y = relax.op.reshape(y, [n, strides[0], cout, q[0]])
        y = relax.op.permute_dims(y, [0, 2, 3, 1])
        y = relax.op.reshape(y, [n, cout, q[0] * strides[0]])
    axes = list(range(2, 2 + nd))
    y = relax.op.strided_slice(y, axes=axes, begin=begin, end=[p + o for p, o in zip(begin, out_shape[2:])])
    return y
