"""Split-K for GPUs: matmuls and convolutions whose output is too small to fill the GPU.

At batch 1 many of a network's heaviest kernels have a small output and a long reduction: BERT's
FFN down-projection (128 x 768 outputs, K = 3,072), ResNet-50's last stage (7 x 7 x 512 outputs,
K = 4,608). Tiled for tensor cores, such an output makes a few dozen thread blocks on a GPU of
132 SMs, each looping over the whole of K: the H200 ran them at 1-3 TFLOP/s (BERT's down-projection
took 44.5 us a launch against 9.7 us for the up-projection of the same FLOPs; gpu_profile.md).

The rewrite here splits K into S chunks at the graph level: one kernel computes the S partial
products side by side (S times the thread blocks, float32 partials), and a reduction over the
chunks, fused with what followed the operator (bias, activation, residual, cast), adds them up.
Both kernels are ordinary tasks: dlight schedules them by default and MetaSchedule tunes them
(the partial-product kernel is a batched GEMM / a convolution with one more spatial axis, which
its tensor-core rule maps like any other).

S is chosen per operator from its shape and the GPU's SM count: enough 64 x 64 output tiles for
about two waves, chunks of at least ``MIN_CHUNK`` reduction steps, at most ``MAX_SPLIT``.
Operators with enough output tiles (every layer at batch 32) are left alone.
"""

from __future__ import annotations

import math

from deploytool.vendor import static_shape

# SMs per GPU arch: the usual part of each (H100/H200, A100, RTX 30xx/A40, RTX 40xx/L40, Orin).
SM_COUNT = {"sm_90": 132, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_87": 16}
TILE = 64  # the output tile assumed per thread block
MIN_CHUNK = 128  # reduction steps per chunk, at least
MAX_SPLIT = 16
MIN_K = 512  # shorter reductions are not split


def _pow2_floor(x: float) -> int:
    return 1 << int(math.floor(math.log2(x))) if x >= 1 else 1


def choose_split(m: int, n: int, k: int, sm_count: int) -> int:
    """The number of K chunks for a GEMM-shaped operator of M x N outputs and reduction K (1: no
    split). Two waves of ``TILE`` x ``TILE`` tiles over the SMs are the aim."""
    if k < MIN_K:
        return 1
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE)
    if tiles >= sm_count:
        return 1
    s = min(MAX_SPLIT, _pow2_floor(2 * sm_count / tiles), _pow2_floor(k / MIN_CHUNK))
    while s > 1 and k % s:
        s //= 2
    return s


def _matmul_partials(a, b, split: int):
    """partial[s, ..., m, n] = sum_k a[..., m, s*K/S + k] * b[s*K/S + k, n], in float32."""
    from tvm import te

    k = int(a.shape[-1])
    chunk = k // split
    lead = [int(d) for d in a.shape[:-1]]
    n = int(b.shape[-1])
    r = te.reduce_axis((0, chunk), name="k")

    def body(s, *idx):
        *batch, j = idx
        return te.sum(a[(*batch, s * chunk + r)].astype("float32") * b[s * chunk + r, j].astype("float32"), axis=r)

    return te.compute((split, *lead, n), body, name="matmul_splitk")


def _conv2d_partials(x, w, split: int, strides, padding, dilation):
    """partial[n, s, co, h, w] = a convolution over the s-th chunk of input channels, float32
    (NCHW activations, OIHW weights)."""
    from tvm import te, topi

    n, c, h, wd = (int(d) for d in x.shape)
    co, _, kh, kw = (int(d) for d in w.shape)
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    xp = topi.nn.pad(x, [0, 0, pt, pl], [0, 0, pb, pr], name="pad") if any(padding) else x
    chunk = c // split
    rc = te.reduce_axis((0, chunk), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    return te.compute(
        (n, split, co, oh, ow),
        lambda b, s, o, y, xx: te.sum(
            xp[b, s * chunk + rc, y * sh + ry * dh, xx * sw + rx * dw].astype("float32")
            * w[o, s * chunk + rc, ry, rx].astype("float32"), axis=[rc, ry, rx]),
        name="conv2d_splitk")


def _sum_chunks(parts, axis: int, dtype: str):
    """The chunks' sum, written out term by term (an injective kernel, not a reduction), so that
    the graph fuses it with the operator's epilogue (bias, activation, residual, cast)."""
    from tvm import te

    split = int(parts.shape[axis])
    shape = [d for i, d in enumerate(parts.shape) if i != axis]

    def body(*idx):
        total = parts[(*idx[:axis], 0, *idx[axis:])]
        for s in range(1, split):
            total = total + parts[(*idx[:axis], s, *idx[axis:])]
        return total.astype(dtype)

    return te.compute(shape, body, name="sum_splitk")


def applies(target, dtype: str, split_k: bool = True) -> bool:
    """Whether a build for ``target`` in ``dtype`` splits K (CUDA, float16 or float32, not turned off)."""
    return bool(split_k) and target.family == "cuda" and dtype in ("float16", "float32")


def split_k_pass(sm_count: int):
    """The module pass: each float16 or float32 matmul (2-D right operand) and each NCHW/OIHW conv2d with one
    group whose shape calls for it (``choose_split``) becomes partial products + a sum."""
    import tvm
    from tvm import relax

    from deploytool.pipeline import _relax_function_pass

    @relax.expr_functor.mutator
    class SplitK(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ("relax.matmul", "relax.nn.conv2d"):
                return call
            out_dtype = getattr(call.ty, "dtype", None)
            in_dtypes = {str(a.ty.dtype) for a in call.args}
            if out_dtype not in ("float16", "float32") or len(in_dtypes) != 1 or in_dtypes - {"float16", "float32"}:
                return call
            a_shape, b_shape, o_shape = (static_shape(e) for e in (call.args[0], call.args[1], call))
            if a_shape is None or b_shape is None or o_shape is None:
                return call
            if call.op.name == "relax.matmul":
                if len(b_shape) != 2 or len(a_shape) < 2:
                    return call
                k, n = b_shape
                split = choose_split(math.prod(a_shape[:-1]), n, k, sm_count)
                partials, name, extra, axis = _matmul_partials, "matmul_splitk", (), 0
            else:
                at = call.attrs
                if (at.groups != 1 or at.data_layout != "NCHW" or at.kernel_layout != "OIHW"
                        or at.out_layout != "NCHW" or len(a_shape) != 4):
                    return call
                co, ci, kh, kw = b_shape
                split = choose_split(o_shape[0] * o_shape[2] * o_shape[3], co, ci * kh * kw, sm_count)
                while split > 1 and ci % split:
                    split //= 2
                partials, name, axis = _conv2d_partials, "conv2d_splitk", 1
                extra = ([int(v) for v in at.strides], [int(v) for v in at.padding], [int(v) for v in at.dilation])
            if split == 1:
                return call
            parts = self.builder_.emit(self.builder_.call_te(partials, call.args[0], call.args[1], split, *extra,
                                                             primfunc_name_hint=name))
            return self.builder_.call_te(_sum_chunks, parts, axis, out_dtype, primfunc_name_hint="sum_splitk")

    return _relax_function_pass(SplitK, "SplitK")


def sm_count(target) -> int:
    """The SM count the split heuristic assumes for ``target`` (its arch's usual part)."""
    return SM_COUNT.get(str(target.tvm.get("arch", "sm_90")), 132)
