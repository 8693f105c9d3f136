"""Winograd convolutions for CPUs: 3x3 stride-1 convolutions in F(m x m, 3 x 3).

A 3x3 convolution computes each output with 9 multiply-adds per input channel. Winograd's minimal
filtering computes an m x m output tile from an (m+2) x (m+2) input tile with (m+2)^2 multiplies
per input channel instead of 9 m^2: 2.25x fewer for F(2x2, 3x3), 4x fewer for F(4x4, 3x3), in
exchange for cheap linear transforms of the input tiles and of the output tiles (the weights are
transformed once, here, at compile time). What is left is a batch of (m+2)^2 independent GEMMs
[tiles x CI] x [CI x CO], which tuning schedules like any GEMM. onnxruntime's CPU convolutions
(MLAS: im2col + SGEMM) do all 9 m^2 multiplies.

``winograd_pass(tile)``: after the CPU layout conversion (NHWC activations, HWIO weights), every
float32 conv2d with a constant 3x3 kernel, stride 1, dilation 1, one group, at least
``MIN_CHANNELS`` input and output channels, at least ``MIN_TILES`` output tiles and transformed
weights of at most ``MAX_WEIGHT_BYTES`` (a small image with many channels is bound by reading
weights 4x the size of the 3x3 ones: seen on YOLOv3-tiny's and ResNet-50's last 3x3 layers)
becomes one ``call_te`` of ``conv2d_nhwc`` below with the transformed weights
``U[eps, nu, ci, co] = (G w G^T)[eps, nu]`` as a new constant. Opt-in (``--winograd``: every
eligible convolution by F(4x4); ``--winograd auto``: each convolution direct, by F(2x2) or by
F(4x4), whichever its tuning log times fastest, see ``pick``): the kernels differ from the direct
ones, so a tuning log serves only builds made with the same choice (the log header records it).
Their default schedule is the ``winograd`` rule of schedules/cpu.py, and their design space
(schedules/space.tiling_searched).

Numerics: F(4x4, 3x3) loses ~1-2 decimal digits against a direct float32 convolution (its
transform matrices hold 1/4, 1/6, 1/24 ...); F(2x2, 3x3) is exact up to rounding. ``tile=4`` by
default (`deploytool run --check` compares with onnxruntime at rtol 1e-4 of the output's scale).
"""

from __future__ import annotations

import numpy as np

MIN_CHANNELS = 16   # below this the transforms cost more than the multiplies they save
MIN_TILES = 16      # fewer output tiles: the transformed weights (4x the 3x3 ones) are read for too little work
MAX_WEIGHT_BYTES = 32 << 20  # larger transformed weights stream from DRAM (YOLOv3-tiny's 512->1024 conv at
#                              13x13, 75 MB: 14.0 ms by Winograd vs 7.8 ms direct, measured alone)
TILES = (2, 4)
SEPARABLE = (4,)  # tiles whose transforms are computed in two passes (see conv2d_nhwc)
# --winograd auto takes a convolution's Winograd kernel when its record is at most this fraction of
# the direct kernel's. Timed alone, a Winograd kernel finds its intermediate tiles (the transformed
# input and the GEMM's output: MBs of workspace, not arguments, so the cold timing's flush leaves
# them in cache) where the last call left them; in the model they are cold. YOLOv3-tiny's 104x104
# 32->64 convolution (9 MB of tiles) took 0.82 ms alone against 0.93 direct, and 1.24-1.66 ms in the
# model against 1.14-1.18; those chosen by 38-44% ran faster in the model too (Zen 5, 2026-12-05).
AUTO_MARGIN = 0.8


def transform_matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, G) of F(tile x tile, 3 x 3) as float64 numpy arrays: Y = A^T [(G w G^T) * (B^T d B)] A."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    return tuple(np.asarray(x, dtype="float64") for x in
                 _cook_toom_convolution(_interpolation_points(tile + 1), tile, 3))


def transform_weights(w_hwio: np.ndarray, tile: int) -> np.ndarray:
    """HWIO 3x3 weights -> U[alpha, alpha, CI, CO], computed in float64."""
    _, _, g = transform_matrices(tile)
    u = np.einsum("ek,klio,nl->enio", g, w_hwio.astype("float64"), g)
    return u.astype(w_hwio.dtype)


def conv2d_nhwc(data, u, padding, tile: int):
    """TE: NHWC ``data`` convolved with 3x3 weights given as Winograd-transformed ``u``
    [alpha, alpha, CI, CO]; ``padding`` (top, left, bottom, right).

    The input transform is written out term by term, over the nonzero coefficients only (+-1 as
    additions and subtractions): for F(4x4) (``SEPARABLE``) in two passes, B^T d B one over the
    tile's rows (``data_pack_rows``) then one over its columns (``data_pack``); for F(2x2), whose
    B has two nonzeros a column, in one. The inverse A^T M A is two small reductions
    (``inverse_rows``, ``inverse``). F(4x4)'s transforms written as one 6 x 6 reduction over a matrix of
    constants (before 2026-12-05) took 3x the arithmetic: its kernel ran 1.25-1.55x longer, cold
    (14x14x256, 28x28x128, 56x56x64 convolutions, Zen 5)."""
    from tvm import te, topi

    a_np, b_np, _ = transform_matrices(tile)
    n, h, w, ci = (int(x) for x in data.shape)
    alpha, co = int(u.shape[0]), int(u.shape[3])
    m = tile
    dtype = str(data.dtype)
    pt, pl, pb, pr = padding
    oh, ow = h + pt + pb - 2, w + pl + pr - 2
    nh, nw = -(-oh // m), -(-ow // m)
    p_all = n * nh * nw
    data_pad = topi.nn.pad(data, (0, pt, pl, 0),
                           (0, nh * m + 2 - h - pt, nw * m + 2 - w - pl, 0), name="data_pad")

    def tile_in(ra, rb, p, c):  # the input tile, read straight from the padded input
        return data_pad[p // (nh * nw), (p // nw) % nh * m + ra, p % nw * m + rb, c]

    # V[eps, nu] = sum_ra sum_rb B[ra, eps] d[ra, rb] B[rb, nu]
    if tile in SEPARABLE:
        rows = te.compute((alpha, alpha, p_all, ci),
                          lambda eps, rb, p, c: _by_column(b_np, eps, lambda ra: tile_in(ra, rb, p, c), dtype),
                          name="data_pack_rows")
        v = te.compute((alpha, alpha, p_all, ci),
                       lambda eps, nu, p, c: _by_column(b_np, nu, lambda rb: rows[eps, rb, p, c], dtype),
                       name="data_pack")
    else:
        v = te.compute((alpha, alpha, p_all, ci),
                       lambda eps, nu, p, c: _by_column(b_np, eps, lambda ra: _by_column(
                           b_np, nu, lambda rb: tile_in(ra, rb, p, c), dtype), dtype),
                       name="data_pack")
    k = te.reduce_axis((0, ci), "ci")
    mm = te.compute((alpha, alpha, p_all, co),
                    lambda eps, nu, p, o: te.sum(v[eps, nu, p, k] * u[eps, nu, k, o], axis=[k]),
                    name="bgemm")
    # Y[vh, vw] = sum_ra sum_rb A[ra, vh] M[ra, rb] A[rb, vw], two passes, each a reduction with
    # its coefficients a Select over A (zeros included): written out over the GEMM's output at
    # constant rows, its consumers made MultiLevelTiling's write reuse fail in the search
    # ("TensorRegion pattern match failed")
    ra = te.reduce_axis((0, alpha), "r_a")
    inv_rows = te.compute((m, alpha, p_all, co),
                          lambda vh, rb, p, o: te.sum(mm[ra, rb, p, o] * _coefficient(a_np, ra, vh, dtype), axis=[ra]),
                          name="inverse_rows")
    rb = te.reduce_axis((0, alpha), "r_b")
    y = te.compute((m, m, p_all, co),
                   lambda vh, vw, p, o: te.sum(inv_rows[vh, rb, p, o] * _coefficient(a_np, rb, vw, dtype), axis=[rb]),
                   name="inverse")
    return te.compute((n, oh, ow, co),
                      lambda b, i, j, o: y[i % m, j % m, b * nh * nw + i // m * nw + j // m, o],
                      name="conv2d_winograd")


def _coefficient(mat: np.ndarray, i, j, dtype: str):
    """mat[i, j] for loop variables i, j (unrolled by the schedule): a Select over its nonzeros."""
    from tvm import tirx

    out = tirx.const(0.0, dtype)
    for a in range(mat.shape[0]):
        for b in range(mat.shape[1]):
            if mat[a, b] != 0:
                out = tirx.Select(tirx.all(i == a, j == b), tirx.const(float(mat[a, b]), dtype), out)
    return out


def _by_column(mat: np.ndarray, col, term, dtype: str):
    """sum_r mat[r, col] * term(r) for a column index ``col`` (a loop variable, which the schedule
    unrolls): a Select over the columns of the sums written out over each column's nonzero
    coefficients, those of +-1 as additions and subtractions."""
    from tvm import tirx

    sums = []
    for j in range(mat.shape[1]):
        out = None
        for r in range(mat.shape[0]):
            c = float(mat[r, j])
            if c == 0.0:
                continue
            t = term(r)
            if c in (1.0, -1.0):
                out = (t if c > 0 else -t) if out is None else (out + t if c > 0 else out - t)
            else:
                t = t * tirx.const(c, dtype)
                out = t if out is None else out + t
        sums.append(out if out is not None else tirx.const(0.0, dtype))
    expr = sums[-1]
    for j in range(len(sums) - 2, -1, -1):
        expr = tirx.Select(col == j, sums[j], expr)
    return expr


def _padding(attrs) -> tuple[int, int, int, int]:
    """conv2d's padding as (top, left, bottom, right)."""
    pad = [int(p) for p in attrs.padding]
    return tuple(pad * 2 if len(pad) == 2 else pad)


def eligible(call, tile: int = 4) -> bool:
    """A float32 NHWC/HWIO conv2d with a constant 3x3 kernel, stride 1, dilation 1, one group,
    enough channels, enough output tiles, and transformed weights small enough to stay in cache."""
    import tvm

    attrs = call.attrs
    w = call.args[1]
    if not isinstance(w, tvm.ir.Constant) or str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "HWIO":
        return False
    if str(attrs.out_layout) not in ("NHWC", "") or int(attrs.groups) != 1:
        return False
    if [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1]:
        return False
    kh, kw, ci, co = (int(d) for d in w.value.shape)
    xs = call.args[0].ty
    if str(w.value.dtype) != "float32" or str(getattr(xs, "dtype", "")) != "float32" or xs.shape is None:
        return False
    try:
        n, h, wd, _ = (int(d) for d in xs.shape)
    except (TypeError, ValueError):  # dynamic shape
        return False
    if (kh, kw) != (3, 3) or ci < MIN_CHANNELS or co < MIN_CHANNELS:
        return False
    pad = _padding(attrs)
    oh, ow = h + pad[0] + pad[2] - 2, wd + pad[1] + pad[3] - 2
    tiles = n * -(-oh // tile) * -(-ow // tile)
    return tiles >= MIN_TILES and (tile + 2) ** 2 * ci * co * 4 <= MAX_WEIGHT_BYTES


def call_signature(call) -> tuple[int, ...]:
    """A conv2d call's shapes as ``kernel_signature`` gives them for its kernel: (N, H, W, CI, CO,
    OH, OW)."""
    n, h, w, ci = (int(d) for d in call.args[0].ty.shape)
    co = int(call.args[1].value.shape[3])
    pad = _padding(call.attrs)
    return n, h, w, ci, co, h + pad[0] + pad[2] - 2, w + pad[1] + pad[3] - 2


def kernel_signature(name: str, shapes: list) -> tuple[tuple[int, ...], int] | None:
    """For a kernel computing one 3x3 NHWC convolution (its arguments' ``shapes``: data first, the
    output last): ((N, H, W, CI, CO, OH, OW), how: 0 for a direct kernel, else the Winograd tile m
    of F(m x m, 3 x 3), its weights transformed to (m+2) x (m+2)); None for any other kernel. The
    direct and the Winograd kernels of one convolution have the same signature, which is how
    ``--winograd auto`` pairs them."""
    if len(shapes) < 3 or any(len(s) != 4 for s in (shapes[0], shapes[-1])):
        return None
    n, h, w, ci = shapes[0]
    for s in shapes[1:-1]:
        if len(s) == 4 and s[0] == s[1] and s[2] == ci and s[3] == shapes[-1][3]:
            wino = "winograd" in name and s[0] in {t + 2 for t in TILES}
            if s[0] == 3 or wino:
                on, oh, ow, co = shapes[-1]
                return ((n, h, w, ci, co, oh, ow), s[0] - 2 if wino else 0) if on == n else None
    return None


def pick(times: dict[int, float]) -> int:
    """Of one convolution's kernels timed on one machine (how -> seconds: 0 direct, m the
    Winograd F(m x m) tile), how to compute it: the fastest Winograd tile where it takes at most
    AUTO_MARGIN of the direct kernel's time, else 0 (direct; also where the direct kernel has no
    time)."""
    wino = {m: t for m, t in times.items() if m}
    if 0 not in times or not wino:
        return 0
    m = min(wino, key=wino.get)
    return m if wino[m] <= AUTO_MARGIN * times[0] else 0


def choose(direct: list, winograd: list, best_s: list[dict[str, float]]) -> dict[tuple[int, ...], tuple[int, float, float]]:
    """``--winograd auto``: the convolutions to compute by Winograd, and with which tile, where the
    tuning log says that kernel is faster than the direct one. ``direct`` and ``winograd``: (name,
    workload hash, arg shapes) of the kernels of the model built without Winograd and with it (a
    build per tile, their kernels together); ``best_s``: the log's best latency per workload, one
    dict per machine, preferred first: a convolution's kernels are compared on the first machine
    that timed the direct one and a Winograd one (latencies of two machines do not compare).
    Returns signature -> (tile, direct seconds, Winograd seconds) for each chosen convolution
    (``pick``). A convolution no machine timed both ways stays direct (so does one whose channels
    pad_channels widened: its direct kernel's signature is then the padded one, and pairs with
    nothing)."""
    kernels: dict[tuple[int, ...], dict[int, list[str]]] = {}
    for ks, wino in ((direct, False), (winograd, True)):
        for name, wl, shapes in ks:
            sig = kernel_signature(name, shapes)
            if sig is not None and bool(sig[1]) == wino:
                kernels.setdefault(sig[0], {}).setdefault(sig[1], []).append(wl)
    out = {}
    for sig, hows in kernels.items():
        for best in best_s:
            times = {how: min(ts) for how, wls in hows.items() if (ts := [best[h] for h in wls if h in best])}
            if 0 in times and len(times) > 1:
                m = pick(times)
                if m:
                    out[sig] = (m, times[0], times[m])
                break
    return out


def winograd_pass(tile: int = 4, only=None):
    """A module pass computing every eligible conv2d (see ``eligible``) by Winograd F(tile, 3);
    with ``only``, just some: a mapping ``call_signature`` -> tile (each its own tile), or a
    collection of signatures (by ``tile``)."""
    import tvm
    from tvm import relax

    from deploytool.pipeline import _relax_function_pass

    tiles = dict(only) if isinstance(only, dict) else None
    for t in (tile, *(tiles or {}).values()):
        if t not in TILES:
            raise ValueError(f"Winograd tile {t}: use one of {TILES}")
    conv_op = tvm.ir.Op.get("relax.nn.conv2d")

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op != conv_op:
                return call
            m = tile
            if only is not None:
                sig = call_signature(call) if eligible(call, min(TILES)) else None
                if sig not in only:
                    return call
                m = tiles[sig] if tiles is not None else tile
            if not eligible(call, m):
                return call
            u = transform_weights(call.args[1].value.numpy(), m)
            return self.builder_.call_te(conv2d_nhwc, call.args[0], relax.const(u), _padding(call.attrs), m,
                                         primfunc_name_hint="conv2d_winograd")

    return _relax_function_pass(Rewriter, "Winograd")
