"""Default schedules for CPUs (x86 AVX2/AVX-512, aarch64 NEON at 128-bit vectors).

They need no measurement. Per kernel, the rules below are tried in order and the first that
applies wins; a rule that raises on a kernel is skipped for that kernel only, so one odd kernel
never breaks a build (it stays as legalized: correct, slower).

0. ``winograd``: the Winograd convolutions of ``--winograd`` (deploytool.winograd), per stage.
1. ``depthwise``: depthwise convolutions, channels last: columns of output rows per parallel
   task, register tiles of rows x one channel vector running the whole window (see the rule).
2. ``tile_reduction``: register-blocked reductions -- conv2d in NHWC (grouped too), matmul
   and pooling. The innermost output axis (output channels, or N of a matmul) is vectorized; the
   next one (output width, or M) is unrolled into a tile of rows, so each step of the reduction
   loads one weight vector row and broadcasts one input scalar per row into an FMA. The tile
   accumulates in a local buffer that LLVM keeps in registers; padding is inlined; the epilogue
   (bias, residual add, activation) is inlined into the write-back of the tile; outer tiles are
   fused into one parallel loop. The weights are then laid out in the order the tile reads them
   (``rewrite_layout``; see ``layout_free_params``), once, at compile time.
3. ``row_reduction``: reductions over the trailing axes of rows (softmax, norms, means),
   computed once per row, rows in parallel.
4. ``injective``: elementwise, transposes and layout changes: inline what can be inlined, fuse
   the outer loops into a parallel loop and vectorize the innermost.
5. ``parallel_fallback``: the safety net for what the rules above decline (e.g. an NCHW pooling
   that layout conversion left behind): inline padding, run the leading spatial loops of every
   block in parallel.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from deploytool.schedules.space import inline_is_cheap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CPUParams:
    """What the rules need to know about the CPU."""

    vector_lanes: int       # fp32 lanes per SIMD register
    registers: int          # SIMD registers
    cores: int

    @classmethod
    def for_target(cls, target) -> "CPUParams":
        bits = target.vector_bits
        regs = 32 if bits == 512 or target.arch == "aarch64" else 16
        return cls(vector_lanes=max(1, bits // 32), registers=regs, cores=max(1, target.num_cores))


def apply(mod, target, report: dict | None = None):
    """Schedule every unscheduled PrimFunc of ``mod``; returns the new module. ``report`` gets
    kernel name -> rule name ("none" when no rule applied: the kernel stays as legalized)."""
    from deploytool.schedules.space import unscheduled_kernels

    params = CPUParams.for_target(target)
    tvm_target = target.tvm_target()
    updated = {}
    for gv, func in unscheduled_kernels(mod):
        new, rule = schedule_func(func, tvm_target, params, name=gv.name_hint)
        if report is not None:
            report[gv.name_hint] = rule
        if new is not None:
            updated[gv] = new.with_attr("tirx.is_scheduled", True)
    for gv, func in updated.items():
        mod[gv] = func
    return mod


def schedule_func(func, tvm_target, params: CPUParams, name: str = ""):
    """(new PrimFunc, rule name) from the first rule that schedules ``func``; (None, "none").
    The weights are then laid out as the schedule reads them (``rewrite_layout``), as tuning does."""
    from tvm import s_tir

    marked = with_layout_free(func)
    for rule in RULES:
        try:
            with tvm_target:
                sch = rule(s_tir.Schedule(marked), tvm_target, params)
        except Exception as e:  # this rule does not fit this kernel: try the next
            log.debug("rule %s failed on %s: %s", rule.__name__, name, e)
            continue
        if sch is not None:
            if isinstance(sch, s_tir.Schedule):
                sch = rewrite_layout(sch, name)
                return sch.mod["main"].without_attr(LAYOUT_FREE), rule.__name__
            return sch, rule.__name__
    return None, "none"


# --------------------------------------------------------------------------- weight layout
# A PrimFunc attribute listing the parameters whose layout a schedule may choose (TVM's name);
# MetaSchedule's RewriteLayout reads it.
LAYOUT_FREE = "layout_free_buffers"
# The mark of a layout-rewrite stage. SplitLayoutRewritePreproc moves such stages out of their
# kernel, pipeline.prepack_weights runs them on the constant weights at compile time, and a
# candidate measured alone goes without (RemoveWeightLayoutRewriteBlock, measure._without_prepack).
PREPACK = "meta_schedule.layout_rewrite_preproc"


def layout_free_params(func) -> list[int]:
    """Indices of ``func``'s weights: parameters read by one block only, a reduction of a product
    (it reads another buffer too), through reduction variables and at most one spatial one, the
    output's innermost (a convolution's HWIO or a matmul's K x N weights; not an activation, which
    batch or pixel variables index too, nor the rows a mean or a norm reduces). A 2-D activation
    multiplied by another would pass: its packing then runs with the model, correct but slower
    (``pipeline.prepack_weights``).

    Their layout is the schedule's to choose. Read as HWIO, the micro-kernel's consecutive
    reduction steps load one tile of output channels each, K * 4 bytes apart: 2 KB for 512
    channels, 4 KB for 1,024, so the loads of a 3x3 convolution fall into one or two L1 sets. On a
    Zen 3 (AVX2), YOLOv3-tiny's 3x3 convolutions with 256 to 1,024 output channels ran 1.9-2.3x
    faster with the weights in the order the default schedule reads them ([K / 8][3][3][C][8]; 37
    -> 75-83 GFLOP/s per core, cold), those with 32-128 channels within noise."""
    from tvm import s_tir, tirx

    try:
        sch = s_tir.Schedule(func)
        blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except Exception:
        return []
    out = []
    for i, p in enumerate(func.params):
        readers = [b for b in blocks if any(r.source.same_as(p) for r in b.reads)]
        if len(readers) != 1 or any(w.source.same_as(p) for b in blocks for w in b.writes):
            continue
        blk = readers[0]
        if not any(not r.source.same_as(p) and not any(r.source.same_as(w.source) for w in blk.writes)
                   for r in blk.reads):
            continue
        kinds = [int(iv.iter_type) for iv in blk.iter_vars]
        spatial = [iv.var for iv, k in zip(blk.iter_vars, kinds) if k == 0]
        reduce = [iv.var for iv, k in zip(blk.iter_vars, kinds) if k == 2]
        if not reduce or not spatial or len(kinds) != len(spatial) + len(reduce):
            continue
        region = next(r for r in blk.reads if r.source.same_as(p))
        if len(region.region) < 2:
            continue
        used = [u for r in region.region for u in tirx.analysis.undefined_vars(r.min)]
        if any(any(u.same_as(v) for v in spatial[:-1]) for u in used) or \
                not any(any(u.same_as(v) for v in reduce) for u in used):
            continue
        out.append(i)
    return out


def with_layout_free(func):
    """``func`` marked with its layout-free parameters (LAYOUT_FREE), where it has some."""
    free = layout_free_params(func)
    return func.with_attr(LAYOUT_FREE, free) if free else func


def rewrite_layout(sch, name: str = ""):
    """``sch`` (post-processed) with its layout-free weights laid out in the order its loops read
    them: MetaSchedule's RewriteLayout, the post-processor every CPU tuning candidate goes through
    (schedules.space). ``sch`` unchanged where it does not apply."""
    from tvm.s_tir import meta_schedule as ms

    func = sch.mod["main"]
    if func.attrs is None or LAYOUT_FREE not in func.attrs:
        return sch
    trial = sch.copy()
    try:
        trial.enter_postproc()
        if ms.postproc.RewriteLayout().apply(trial):
            return trial
    except Exception as e:
        log.debug("weights of %s keep their layout: %s", name, e)
    return sch


# --------------------------------------------------------------------------- helpers
def _const(x) -> int | None:
    try:
        return int(x)
    except TypeError:
        return None


def _divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _vector_tile(n: int, lanes: int) -> int:
    """Lanes of the vectorized tile: two full vectors when n allows, else one, else the largest
    power-of-two part-vector (>= 4) that divides n, else the largest divisor <= lanes."""
    if n % (2 * lanes) == 0 and n >= 4 * lanes:
        return 2 * lanes
    v = lanes
    while v >= 4:
        if n % v == 0:
            return v
        v //= 2
    return _divisor_at_most(n, lanes)


def _register_tile(C: int, W: int, lanes: int, registers: int, tall: bool | None = None) -> tuple[int, int]:
    """(vector-axis tile, row tile) of the register-blocked micro-kernel.

    Enough independent accumulators (rows x vectors) hide the FMA latency; their count stays
    within the register file, leaving room for the weight vectors and a broadcast. Both tiles
    divide their axes exactly (a ragged, predicated row tile measured 10x slower)."""
    v = _vector_tile(C, lanes) if C % (2 * lanes) else lanes
    nvec = C // v
    # Each reduction step loads m weight vectors and broadcasts `rows` inputs for rows*m FMAs:
    # maximize FMAs per load, rows*m / (rows + m), while the accumulators, the m weight vectors
    # and the broadcast fit the register file with a spare (7x4 tiles spilled: 0.4x on ResNet's
    # 1x1 convs), and with two vectors per row unless rows are few (prime widths such as 13).
    # More than 8 rows of two vectors only with two registers to spare (13 x 2 on AVX-512, not
    # 14 x 2): YOLOv3-tiny's 13- to 208-wide convs took 13 x 1 or 2 x 4 tiles before; untuned it
    # ran 44.9/45.8/44.6 ms with those and 44.7/42.1/43.1 with 13 x 2 (Intel Xeon, 2 threads).
    # Three or four vectors a row only with fewer than 4 rows, except on AVX-512 (16 lanes): on the
    # Xeon (model 167) taller tiles such as 8 x 3 made the untuned kernels whose tile changed
    # faster on all 9 corpus models probed (calls-weighted: ResNet-50 0.93x, BERT 0.95x,
    # SqueezeNet 0.79x, MobileNet-v2 0.60x with the vector fix of _tile_vector; 3 kernels 6-15%
    # slower; `python bench/defaults_ab.py --change tiles`). NEON, whose 32 registers would allow
    # them too, keeps the limit until measured on a board. (``tall``: that choice, made by hand.)
    tall = lanes >= 16 if tall is None else tall
    best = None
    for rows in (d for d in range(1, min(W, 14) + 1) if W % d == 0):
        for m in (d for d in range(1, min(nvec, 4) + 1) if nvec % d == 0):
            if rows * m + m + 2 > registers or (rows >= 4 and m > 2 and not tall) or \
                    (m > 1 and rows > 8 and rows * m + m + 4 > registers):
                continue
            score = (rows * m / (rows + m), m == 2, rows)
            if best is None or score > best[0]:
                best = (score, rows, m)
    if best is None:
        return v, 1
    _, rows, m = best
    return v * m, rows


def _tile_vector(ci: int, lanes: int) -> int:
    """The vectorized loop's extent within a register tile of ``ci`` channels (the rest of the tile
    is unrolled): whole native vectors, else the part-vector of ``_vector_tile``. (A tile of 24
    channels on AVX-512 was one 24-lane vector, a zmm and a ymm that LLVM juggles: MobileNet-v2's
    1x1 convolutions to 24 channels ran 1.25 and 0.82 ms untuned that way, 0.14 and 0.09 as 3
    vectors of 8 lanes in 8-row tiles.)"""
    return min(ci, lanes) if ci % min(ci, lanes) == 0 else _vector_tile(ci, lanes)


def _iter_kinds(sch, block) -> list[int]:
    return [int(iv.iter_type) for iv in sch.get(block).iter_vars]


def _is_spatial_block(sch, block) -> bool:
    return all(k == 0 for k in _iter_kinds(sch, block))


def _is_padding(sch, block) -> bool:
    return "pad" in sch.get(block).name_hint


def _pads_nothing(sch, block) -> bool:
    """A padding stage of a convolution without padding (a 1x1, an unpadded 3x3): legalization
    emits one anyway, a plain copy of the input (its output has its input's shape)."""
    b = sch.get(block)
    if len(b.reads) != 1 or len(b.writes) != 1:
        return False
    src, dst = b.reads[0].source, b.writes[0].source
    return [_const(d) for d in src.shape] == [_const(d) for d in dst.shape]


def _inline_producers(sch, block, keep_padding: bool = False) -> list:
    """Inline spatial producers (casts, layout changes, padding unless ``keep_padding`` and it pads) into
    ``block``, repeatedly. Returns the padding blocks kept."""
    kept = []
    changed = True
    while changed:
        changed = False
        for p in sch.get_producers(block):
            if keep_padding and _is_padding(sch, p) and not _pads_nothing(sch, p):  # a copy is inlined
                if not any(sch.get(k).same_as(sch.get(p)) for k in kept):
                    kept.append(p)
                continue
            if _is_spatial_block(sch, p) and inline_is_cheap(sch, p):
                try:
                    sch.compute_inline(p)
                    changed = True
                    break
                except Exception:
                    continue
    return kept


def _inline_spatial_intermediates(sch, root, keep: list = ()) -> None:
    """compute_inline every spatial block under ``root`` that is neither an output nor in
    ``keep``, where TVM allows it."""
    skip = [sch.get(b) for b in keep] + [sch.get(b) for b in sch.get_output_blocks(root)]
    for b in sch.get_child_blocks(root):
        if any(sch.get(b).same_as(k) for k in skip) or not _is_spatial_block(sch, b):
            continue
        if not inline_is_cheap(sch, b):
            continue  # materialized: copying it into each read would grow the consumer exponentially
        try:
            sch.compute_inline(b)
        except Exception:
            pass


def _reverse_inline_consumers(sch, block) -> None:
    """Inline the elementwise consumer chain of ``block`` into it (reverse_compute_inline), one
    consumer at a time, and only while the consumer is the sole reader of ``block``'s output and
    reads no other intermediate. (TVM accepts the inline otherwise and leaves a dangling buffer,
    e.g. on GELU's ``x * 0.5 * (1 + erf(x / sqrt 2))``, which reads x twice.)"""
    while True:
        consumers = sch.get_consumers(block)
        if len(consumers) != 1:
            return
        c = consumers[0]
        producers = sch.get_producers(c)
        if len(producers) != 1 or not sch.get(producers[0]).same_as(sch.get(block)):
            return
        try:
            sch.reverse_compute_inline(c)
        except Exception:
            return


def _epilogue_at(sch, root, keep: list, loop, params: "CPUParams") -> None:
    """The rest of an epilogue that could not be inlined into the write-back: inline its inner
    elementwise blocks into their consumers, then compute what is left on each finished tile."""
    _inline_spatial_intermediates(sch, root, keep)
    # looked up after the inlining, which rewrites the blocks (the IR objects taken before would no
    # longer match, and a kept padding stage would be moved onto the tile: seen on a convolution
    # whose epilogue reads its result twice, maximum(x, x * a))
    keep_ids = [sch.get(b) for b in keep]
    loop_sref = sch.get_sref(loop)
    for b in sch.get_child_blocks(root):
        blk = sch.get(b)
        if any(blk.same_as(k) for k in keep_ids):
            continue
        if any(sch.get_sref(lp).same_as(loop_sref) for lp in sch.get_loops(b)):
            continue  # already on the tile
        sch.reverse_compute_at(b, loop, preserve_unit_loops=True)
        _vectorize_inner(sch, sch.get_loops(b)[-1], params.vector_lanes * 4)


# --------------------------------------------------------------------------- rule 0
WINOGRAD_BLOCKS = {"data_pack", "bgemm", "inverse"}  # the blocks that make a kernel deploytool.winograd's


def winograd(sch, tvm_target, params: CPUParams):
    """Winograd convolutions (deploytool.winograd: blocks data_pack_rows, data_pack, bgemm,
    inverse_rows, inverse), stage by stage, each in its own parallel loop: the input transform and
    the inverse transform over (tiles x channel vectors), each tile's row pass computed next to its
    column pass in a local buffer, their small transform loops unrolled (the Select over columns
    folds away) and the channels vectorized; the batched GEMM register-blocked like
    ``tile_reduction`` (output channels in vectors, tiles as rows); the epilogue (bias,
    activation) vectorized over the output channels, reading the inverse transform's tiles."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    if not WINOGRAD_BLOCKS <= names:
        return None
    stages = [n for n in ("data_pack_rows", "data_pack", "bgemm", "inverse_rows", "inverse") if n in names]
    root = sch.get_sblock("root")
    lanes = params.vector_lanes
    pads = [sch.get_sblock("data_pad")] if "data_pad" in names else []
    _inline_spatial_intermediates(sch, root, pads + [sch.get_sblock(n) for n in stages])  # the output gather
    for pad in pads:
        _parallel_vectorize(sch, pad, params)

    def one_pass(blk, inner: bool):
        # a transform pass, loops (e1, e2, p, c[, k]): unrolled e1 e2 (k), vector c; top level,
        # parallel over (p, c-chunks) (returns that loop); inner, at its consumer's (p, c-chunk)
        loops = sch.get_loops(blk)[1 if inner else 0:]
        reduction = len(loops) == 5
        if reduction:  # (e1, e2, p, c, k) -> (e1, e2, p, k, c)
            sch.reorder(loops[4], loops[3])
            loops = sch.get_loops(blk)[1 if inner else 0:]
        fused = None
        if not inner:
            e1, e2, pp, *k, c = loops
            ext_c = _const(sch.get(c).extent)
            v = _vector_tile(ext_c, lanes) if ext_c % lanes == 0 else _divisor_at_most(ext_c, lanes)
            co, ci = sch.split(c, factors=[None, min(v, lanes)])
            sch.reorder(pp, co, e1, e2, *k, ci)
            fused = sch.fuse(pp, co)
            sch.parallel(fused)
            loops = [e1, e2, *k, ci]
        for lp in loops[:-1]:
            sch.unroll(lp)
        _vectorize_inner(sch, loops[-1], lanes)
        if reduction:
            init = sch.decompose_reduction(blk, loops[0])
            _vectorize_inner(sch, sch.get_loops(init)[-1], lanes)
        return fused

    def transform(name):
        # the column pass parallel over (tiles x channel vectors); its row pass, if any, at the
        # same (tile, channel vector), in a local buffer
        fused = one_pass(sch.get_sblock(name), inner=False)
        if name + "_rows" in names:
            rows = sch.get_sblock(name + "_rows")
            sch.compute_at(rows, fused, preserve_unit_loops=True)
            sch.set_scope(rows, 0, "local")
            one_pass(rows, inner=True)

    transform("data_pack")
    transform("inverse")

    # the batched GEMM: (e1, e2, p, co) += V[e1, e2, p, ci] * U[e1, e2, ci, co]
    red = sch.get_sblock("bgemm")
    e1, e2, pp, co, k = sch.get_loops(red)
    P, CO = _const(sch.get(pp).extent), _const(sch.get(co).extent)
    cw, rows = _register_tile(CO, P, lanes, params.registers)
    sch.cache_write(red, 0, "local")
    writeback = sch.get_consumers(red)[0]
    v = min(cw, lanes) if cw % min(cw, lanes) == 0 else cw
    cvec, cii = sch.split(co, factors=[None, v])
    # The register tile's two knobs are sampled tiles, as in ``tile_reduction``: their decisions
    # are the choices above (the default schedule), and tuning samples and mutates them (vectors
    # per row, tiles per register block) -- before, this kernel's space was its default alone.
    c_o, cim = sch.split(cvec, factors=sch.sample_perfect_tile(
        cvec, n=2, max_innermost_factor=4, decision=[CO // cw, cw // v]))
    p_o, pii = sch.split(pp, factors=sch.sample_perfect_tile(
        pp, n=2, max_innermost_factor=16, decision=[P // rows, rows]))
    sch.reorder(e1, e2, c_o, p_o, k, pii, cim, cii)
    fused = sch.fuse(e1, e2, c_o, p_o)
    sch.parallel(fused)
    sch.unroll(pii)
    sch.unroll(cim)
    sch.vectorize(cii)
    sch.reverse_compute_at(writeback, fused, preserve_unit_loops=True)
    _vectorize_inner(sch, sch.get_loops(writeback)[-1], lanes * 4)
    init = sch.decompose_reduction(red, k)
    _vectorize_inner(sch, sch.get_loops(init)[-1], lanes * 4)

    # the epilogue: whatever is left after the inverse transform (the output gather + bias + act.)
    for b in sch.get_child_blocks(root):
        if sch.get(b).name_hint not in ("data_pad", *stages) \
                and not sch.get(b).name_hint.endswith("_local") and _is_spatial_block(sch, b):
            loops = sch.get_loops(b)
            if loops and not any(sch.get(lp).kind == 1 for lp in loops):  # not already parallel
                _parallel_vectorize(sch, b, params)
    return sch


# --------------------------------------------------------------------------- rule 1
def _plain_reduction(sch, red):
    """(block, number of spatial iters, loop extents, spatial vars) of a reduction block that
    ``tile_reduction`` and ``depthwise`` can tile: one output, its loops its spatial iters then its
    reduction iters, constant extents, and a plain store (the output indexed by the spatial vars
    in order); None for any other."""
    blk = sch.get(red)
    if len(blk.writes) != 1:
        return None
    kinds = [int(iv.iter_type) for iv in blk.iter_vars]
    n_sp = sum(1 for k in kinds if k == 0)
    if kinds != [0] * n_sp + [2] * (len(kinds) - n_sp) or n_sp < 1:
        return None
    loops = sch.get_loops(red)
    if len(loops) != len(kinds):
        return None
    extents = [_const(sch.get(lp).extent) for lp in loops]
    if any(e is None for e in extents):
        return None
    out_region = blk.writes[0].region
    sp_vars = [iv.var for iv in blk.iter_vars[:n_sp]]
    if len(out_region) != n_sp or any(not r.min.same_as(v) for r, v in zip(out_region, sp_vars)):
        return None
    return blk, n_sp, extents, sp_vars


def tile_reduction(sch, tvm_target, params: CPUParams):
    """Register-blocked reduction: conv2d NHWC / depthwise, matmul, pooling."""

    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    reds = [b for b in blocks if any(k == 2 for k in _iter_kinds(sch, b))]
    if len(reds) != 1:
        return None
    red = reds[0]
    # Padding is materialized as its own parallel, vectorized stage: inlined, it puts a bounds
    # check on every input load of the micro-kernel (measured 2x slower on 3x3 convolutions).
    # Depthwise convolutions (the padded input is indexed by the output channel itself) are
    # memory-bound: a padded copy of the input costs more than the bounds checks, so their
    # padding is inlined (MobileNet-v2's depthwise convs: up to 2.8x). Other convolutions keep it;
    # a "padding" that pads nothing (a 1x1's) is a plain copy and is inlined (see _pads_nothing:
    # MobileNetV2 untuned 0.92-0.96x, ResNet-50 0.98x in-process A/B on a Zen 3).
    pads = _inline_producers(sch, red, keep_padding=not _is_depthwise(sch, red))
    nest = _plain_reduction(sch, red)
    if nest is None:
        return None
    blk, n_sp, extents, sp_vars = nest
    # Pick the vectorized axis: the innermost spatial axis of extent > 1.
    c_idx = max((i for i in range(n_sp) if extents[i] > 1), default=None)
    if c_idx is None:
        return None
    c_var = sp_vars[c_idx]
    group = None  # grouped convolution: the input channel depends on c only through c // group
    if not _contiguous_or_absent(blk, c_var):
        group = _group_size(blk, c_var)
        if group is None or extents[c_idx] % group or not _contiguous_or_absent(blk, c_var, ignore_floordiv=group):
            return None
    out_buf = blk.writes[0].source
    one_input = len([r for r in blk.reads if not r.source.same_as(out_buf)]) == 1
    lanes = params.vector_lanes
    w_idx = max((i for i in range(c_idx) if extents[i] > 1), default=None)
    W = extents[w_idx] if w_idx is not None else 1
    ci, wi = _register_tile(group or extents[c_idx], W, lanes, params.registers)
    if w_idx is not None and not group and not one_input:  # not poolings: no broadcasts, not measured
        pads += _spread_rows(sch, red, pads, sp_vars[w_idx], wi)

    # Accumulate in a local tile; fuse the epilogue into its write-back. A pooling with nothing
    # after it accumulates in its output instead: through a local tile its 3x3 max pools ran 3.3x
    # slower on a Zen 3 (0.335 vs 0.102 ms cold for SqueezeNet's first), the window being too
    # short to pay for the tile's init and write-back.
    direct = one_input and len(sch.get_child_blocks(root)) == 1 + len(pads) and not sch.get_consumers(red)
    writeback = None
    if not direct:
        sch.cache_write(red, 0, "local")
        writeback = sch.get_consumers(red)[0]
        _reverse_inline_consumers(sch, writeback)

    loops = sch.get_loops(red)
    sp_loops, r_loops = list(loops[:n_sp]), list(loops[n_sp:])
    v = _tile_vector(ci, lanes)
    if group:
        # groups outside, then tiles within a group: (g * group + r) // group simplifies to g,
        # so the input channel is one broadcast per tile
        cg, cr = sch.split(sp_loops[c_idx], factors=[None, group])
        co, cii = sch.split(cr, factors=[None, ci])
        co = sch.fuse(cg, co)
        cim, cii = sch.split(cii, factors=[None, v])  # whole native vectors, unrolled
    else:
        # The register tile's two knobs are sampled tiles whose decisions are the choices above:
        # replayed as is they give the default schedule, and tuning (schedules.space) samples
        # and mutates them (vectors per row, rows per tile).
        cvec, cii = sch.split(sp_loops[c_idx], factors=[None, v])
        n_vec = extents[c_idx] // v
        co, cim = sch.split(cvec, factors=sch.sample_perfect_tile(
            cvec, n=2, max_innermost_factor=4, decision=[n_vec // (ci // v), ci // v]))
    if w_idx is not None:
        wo, wii = sch.split(sp_loops[w_idx], factors=sch.sample_perfect_tile(
            sp_loops[w_idx], n=2, max_innermost_factor=14, decision=[W // wi, wi]))
    outer = [lp for i, lp in enumerate(sp_loops) if i not in (c_idx, w_idx)]
    if one_input:
        # pooling: no weights to keep in cache across pixels, so the channel tiles of one pixel run
        # in neighbouring iterations (co outermost streams the input once per channel tile; on a
        # Zen 3, SqueezeNet's second max pool 0.042-0.048 -> 0.041-0.055 ms cold, 0.042 -> 0.025-0.030
        # warm; the others within noise)
        outer = outer + ([wo] if w_idx is not None else []) + [co]
    else:
        outer = [co] + outer + ([wo] if w_idx is not None else [])
    inner = ([wii] if w_idx is not None else []) + [cim, cii]
    sch.reorder(*outer, *r_loops, *inner)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(fused)
    if w_idx is not None:
        sch.unroll(wii)
    sch.unroll(cim)
    sch.vectorize(cii)

    # Write back the finished tile right after its reduction, and run what is left of the
    # epilogue on that tile.
    if writeback is not None:
        sch.reverse_compute_at(writeback, fused, preserve_unit_loops=True)
        _vectorize_inner(sch, sch.get_loops(writeback)[-1], lanes * 4)
        if len(sch.get_child_blocks(root)) > 2 + len(pads):
            _epilogue_at(sch, root, [red, writeback] + pads, fused, params)
    if r_loops:
        init = sch.decompose_reduction(red, r_loops[0])
        _vectorize_inner(sch, sch.get_loops(init)[-1], lanes * 4)
    for pad in pads:
        _parallel_vectorize(sch, pad, params)
    return sch


# --------------------------------------------------------------------------- rule 1a
# A depthwise task: this many output rows (at most), each unrolled register tile this many.
DW_TASK_ROWS = 16
DW_TILE_ROWS = 8


def depthwise(sch, tvm_target, params: CPUParams):
    """Depthwise convolution, channels last (NHWC, or NWC in 1-D): each parallel task computes a
    column of up to 16 output rows at one output pixel (one width position), for every channel,
    in register tiles of up to 8 rows x one vector of channels that run the whole window (kh, kw)
    before the next tile. Padding is inlined; the tile accumulates in the output buffer and its
    epilogue (bias, clip) runs on each finished channel chunk.

    A depthwise convolution reuses nothing across channels, so the channel-first register tile of
    ``tile_reduction`` (rows x 2 vectors, the channels of a tile outermost) streamed the image once
    per channel tile: on the AVX-512 Xeon (model 167) MobileNet-v2's 10 depthwise kernels took
    1.72 ms that way and 0.60 with this rule (its 2,000-trial tuned best: 0.63), MobileNet-v1's
    and ShuffleNet's 2.6x and 2.4x faster too (calls-weighted, timed cold; ``python
    bench/defaults_ab.py --change depthwise``). On 7x7 images at stride 1, 4 of 6 kernels ran
    1.1-1.4x slower than tile_reduction's (0.02-0.04 ms each), with or without the channel split.
    Probed and dropped: a local accumulator tile (``cache_write``, as tile_reduction) and the
    padding copied per channel chunk, each 1.4x slower; 8-lane vectors on AVX-512, 1.1x slower.
    The rows of a task and of a tile are sampled decisions, so tuning mutates them."""
    root = sch.get_sblock("root")
    reds = [b for b in sch.get_child_blocks(root) if any(k == 2 for k in _iter_kinds(sch, b))]
    if len(reds) != 1 or not _is_depthwise(sch, reds[0]):
        return None
    red = reds[0]
    nest = _plain_reduction(sch, red)
    if nest is None or nest[1] < 2:
        return None
    blk, n_sp, extents, sp_vars = nest
    c_idx = n_sp - 1  # channels last and vectorized: the padded input and the weights run along them
    if extents[c_idx] <= 1 or not _contiguous_or_absent(blk, sp_vars[c_idx]):
        return None  # a channel multiplier > 1 (grouped): tile_reduction's group path
    row_idx = next((i for i in range(c_idx) if extents[i] > 1), None)
    if row_idx is None:
        return None
    _inline_producers(sch, red)  # the padding too: see tile_reduction
    consumers = sch.get_consumers(red)
    epilogue = consumers[0] if len(consumers) == 1 else None
    if epilogue is not None:
        _reverse_inline_consumers(sch, epilogue)

    loops = sch.get_loops(red)
    sp_loops, r_loops = list(loops[:n_sp]), list(loops[n_sp:])
    H, C, lanes = extents[row_idx], extents[c_idx], params.vector_lanes
    v = lanes if C % lanes == 0 else _vector_tile(C, lanes)
    task = _divisor_at_most(H, DW_TASK_ROWS)
    tile = _divisor_at_most(task, DW_TILE_ROWS)
    ho, hm, hi = sch.split(sp_loops[row_idx], factors=sch.sample_perfect_tile(
        sp_loops[row_idx], n=3, max_innermost_factor=16, decision=[H // task, task // tile, tile]))
    cc, cv = sch.split(sp_loops[c_idx], factors=[None, v])
    outer = [lp if i != row_idx else ho for i, lp in enumerate(sp_loops[:c_idx])]
    # Enough tasks for every core: a small image (7x7) also splits its channel chunks among them.
    tasks = math.prod(e for i, e in enumerate(extents[:c_idx]) if i != row_idx) * (H // task)
    chunks = C // v
    split = next((d for d in range(1, chunks + 1) if chunks % d == 0 and tasks * d >= 4 * params.cores), chunks)
    if split > 1:
        cco, cc = sch.split(cc, factors=[split, None])
        outer.append(cco)
    sch.reorder(*outer, hm, cc, *r_loops, hi, cv)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(fused)
    sch.unroll(hi)
    sch.vectorize(cv)
    keep = [red]
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, cc, preserve_unit_loops=True)
        _vectorize_inner(sch, sch.get_loops(epilogue)[-1], lanes)
        keep.append(epilogue)
    if len(sch.get_child_blocks(root)) > len(keep):
        _epilogue_at(sch, root, keep, cc, params)
    if r_loops:
        init = sch.decompose_reduction(red, r_loops[0])
        _vectorize_inner(sch, sch.get_loops(init)[-1], lanes)
    return sch


# L1 data caches of the x86 CPUs we target: 64 sets of 64-byte lines, 8 ways on AMD Zen (32 KB),
# 12 on Intel's 48 KB (the sets repeat every 4 KB either way).
L1_SET_PERIOD = 4096
L1_LINE = 64
# Rows of one tile per L1 set beyond which the input's pixel stride is spread: where the input
# already has a stage of its own (padding), and where a copy has to be made for it.
ROWS_PER_SET = 6
ROWS_PER_SET_COPY = 8


def _spread_rows(sch, red, pads: list, w_var, rows: int) -> list:
    """Give the input pixels of a many-row tile a stride that spreads them over the L1 sets.

    A register tile of ``rows`` output pixels broadcasts from ``rows`` input pixels per reduction
    step, one channel-row each, which the micro-kernel walks in step. When a pixel's row of
    channels is a multiple of 2 KB (512 or 1,024 float32 channels), those rows start in one or
    two of the L1's 64 sets and the 13-row tiles of 13-wide maps evict their own lines before
    they are reused. Measured on a Zen 3 (AVX2, 2 threads, cold): YOLOv3-tiny's 1x1 convolution
    of 1,024 channels at 13x13 ran at 56 GFLOP/s, and at 153 with 1,040 channels; its 3x3
    convolution of 512 channels 146 -> 168. 7-row tiles of 2,048 channels (ResNet-50) and 2-row
    ones lose nothing.

    So the stage that holds the input (the padding stage; for a convolution without padding a
    copy made here, returned to be scheduled with the padding) gets its pixel stride raised by
    one cache line (``storage_align``): 1,024 -> 1,040 floats."""
    from tvm.sym import detect_linear_equation

    blk = sch.get(red)
    out_buf = blk.writes[0].source
    for i, region in enumerate(blk.reads):
        buf = region.source
        idx = [r.min for r in region.region]
        axis = next((a for a, e in enumerate(idx[:-1])
                     if len(eq := detect_linear_equation(e, [w_var])) == 2 and _const(eq[0])), None)
        if buf.same_as(out_buf) or axis is None:
            continue
        dims = [_const(d) for d in buf.shape]
        if any(d is None for d in dims[axis + 1:]):
            return []
        stride = 1
        for d in dims[axis + 1:]:
            stride *= d
        item = tvm_dtype_bytes(buf.dtype)
        nbytes = stride * item
        sets = L1_SET_PERIOD // math.gcd(nbytes, L1_SET_PERIOD)
        pad = next((p for p in pads if sch.get(p).writes[0].source.same_as(buf)), None)
        if L1_LINE % item or nbytes % L1_LINE or \
                rows <= (ROWS_PER_SET if pad is not None else ROWS_PER_SET_COPY) * sets:
            return []
        made = []
        if pad is None:
            pad = sch.cache_read(red, i, "global")
            made = [pad]
        sch.storage_align(pad, 0, axis, stride, L1_LINE // item)
        return made
    return []


def tvm_dtype_bytes(dtype) -> int:
    import tvm

    t = tvm.runtime.DataType(str(dtype))
    return max(1, t.bits * t.lanes // 8)


def _parallel_vectorize(sch, block, params: CPUParams) -> None:
    """Fuse a spatial block's outer loops into a parallel loop and vectorize the innermost."""
    loops = sch.get_loops(block)
    exts = [_const(sch.get(lp).extent) for lp in loops]
    if not loops or any(e is None for e in exts):
        return
    inner = loops[-1]
    if exts[-1] > 4 * params.vector_lanes:
        f = _divisor_at_most(exts[-1], params.vector_lanes * 4)
        if f > 1:
            outer_part, inner = sch.split(loops[-1], factors=[None, f])
            loops = list(loops[:-1]) + [outer_part, inner]
    if len(loops) > 1:
        fused = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        sch.parallel(fused)
    if (_const(sch.get(inner).extent) or 1) > 1:
        sch.vectorize(inner)


def _is_depthwise(sch, red) -> bool:
    """Depthwise, channel-vectorized (NHWC): the reduction is only a short window (no
    input-channel loop; at most 64 steps), and both the padded input and the weights are indexed
    by the vectorized channel in their last dimension. (Both tests matter: an NCW conv1d also
    vector-loads its input along the width; inlining its padding made it 13x slower, and 2x
    slower for an NCW depthwise conv1d.)"""
    blk = sch.get(red)
    r_volume = 1
    for iv in blk.iter_vars:
        if int(iv.iter_type) == 2:
            r_volume *= _const(iv.dom.extent) or 1
    if r_volume > 64:
        return False
    sp = [iv for iv in blk.iter_vars if int(iv.iter_type) == 0 and (_const(iv.dom.extent) or 1) > 1]
    if not sp:
        return False
    c_var = sp[-1].var
    pad_bufs = [w.source for p in sch.get_producers(red) if _is_padding(sch, p) for w in sch.get(p).writes]
    from tvm.sym import detect_linear_equation

    def last_index_is_c(region) -> bool:
        if not region.region:
            return False
        eq = detect_linear_equation(region.region[-1].min, [c_var])
        return len(eq) == 2 and _const(eq[0]) == 1

    # channel-vectorized (NHWC): the padded input AND the weights run along the vectorized axis
    pad_hit = any(last_index_is_c(r) for r in blk.reads if any(r.source.same_as(b) for b in pad_bufs))
    other_hit = any(last_index_is_c(r) for r in blk.reads if not any(r.source.same_as(b) for b in pad_bufs))
    return pad_hit and other_hit


def _floordivs(expr, var) -> list[int]:
    """Constant divisors k of every ``var // k`` inside ``expr``."""
    from tvm import tirx

    found = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, tirx.FloorDiv) and e.a.same_as(var) and _const(e.b):
            found.append(_const(e.b))
            continue
        for attr in ("a", "b"):
            sub = getattr(e, attr, None)
            if sub is not None:
                stack.append(sub)
    return found


def _group_size(blk, var) -> int | None:
    """k when every non-linear use of ``var`` in the reads is ``var // k`` (one k)."""
    ks = {k for region in blk.reads for r in region.region for k in _floordivs(r.min, var)}
    return ks.pop() if len(ks) == 1 else None


def _contiguous_or_absent(blk, var, ignore_floordiv: int | None = None) -> bool:
    """Every read indexes ``var`` only in its last dimension with coefficient 1, or not at all:
    the vectorized axis then loads contiguous vectors or broadcasts. With ``ignore_floordiv=k``,
    ``var // k`` counts as constant (a grouped convolution's input channel, tiled per group)."""
    from tvm.sym import detect_linear_equation

    def coef(expr) -> int | None:
        if ignore_floordiv:
            expr = _replace_floordiv(expr, var, ignore_floordiv)
        eq = detect_linear_equation(expr, [var])
        if len(eq) != 2:
            return None  # not linear in var
        return _const(eq[0])

    for region in blk.reads:
        idx = [r.min for r in region.region]
        for e in idx[:-1]:
            if coef(e) != 0:
                return False
        if idx and coef(idx[-1]) not in (0, 1):
            return False
    return True


def _replace_floordiv(expr, var, k):
    """``expr`` with every ``var // k`` replaced by 0 (for linearity checks only)."""
    from tvm import tirx

    if isinstance(expr, tirx.FloorDiv) and expr.a.same_as(var) and _const(expr.b) == k:
        return tirx.Sub(var, var)  # coefficient 0, same dtype
    if isinstance(expr, (tirx.Add, tirx.Sub, tirx.Mul)):
        return type(expr)(_replace_floordiv(expr.a, var, k), _replace_floordiv(expr.b, var, k))
    return expr


def _vectorize_inner(sch, loop, max_lanes: int) -> None:
    ext = _const(sch.get(loop).extent)
    if ext is None or ext <= 1:
        return
    if ext > max_lanes:
        f = _divisor_at_most(ext, max_lanes)
        if f <= 1:
            return
        _, loop = sch.split(loop, factors=[None, f])
    sch.vectorize(loop)


def _rfactor_lanes(sch, block, lanes: int):
    """A reduction (a sum, a max) over a trailing axis of n x ``lanes`` elements, rfactored into
    ``lanes`` partial results (the rfactor block; None where a primitive refuses): vectorized
    once at its row (``_vectorize_lanes``), one vector add or max a step instead of a scalar
    accumulator, the lanes combined at the end."""
    from tvm.s_tir.schedule import ScheduleError

    red = [iv for iv in sch.get(block).iter_vars if int(iv.iter_type) == 2]
    loops = sch.get_loops(block)
    ext = _const(red[0].dom.extent) if len(red) == 1 else None
    if ext is None or ext % lanes or ext < 2 * lanes or _const(sch.get(loops[-1]).extent) != ext:
        return None
    try:
        _, inner = sch.split(loops[-1], factors=[None, lanes])
        return sch.rfactor(inner, factor_axis=0)
    except ScheduleError:
        return None


def _vectorize_lanes(sch, rf, lanes: int) -> None:
    """The rfactor block's loop over its partial results innermost, vectorized (its reduction loop
    outside it); left as it is where a primitive refuses."""
    from tvm.s_tir.schedule import ScheduleError

    inner = [lp for lp in sch.get_loops(rf)[1:] if _const(sch.get(lp).extent) != 1]
    for lane in reversed([lp for lp in inner if _const(sch.get(lp).extent) == lanes]):
        try:
            sch.reorder(*[lp for lp in inner if not sch.get(lp).same_as(sch.get(lane))], lane)
            sch.vectorize(lane)
            return
        except ScheduleError:
            continue


# --------------------------------------------------------------------------- rule 2
def row_reduction(sch, tvm_target, params: CPUParams):
    """Kernels that reduce the trailing axes of rows (softmax, layer/group norm, means): every
    block is computed once per row at the row loop, rows run in parallel, elementwise parts
    are vectorized, and a reduction over whole vectors accumulates a vector of partial results
    (``_rfactor_lanes``: BERT-base's softmax 3.8x and layer norm 2.4x faster than with a scalar
    accumulator, the layer norm within 11% of its 2,000-trial tuned best; Xeon model 207,
    bench/results/defaults-rowred-x86-avx512.md). (dlight's CPU Reduction rule recomputes the reductions once per output
    element: quadratic on a 1000-way softmax.)"""

    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    reds = [b for b in blocks if any(k == 2 for k in _iter_kinds(sch, b))]
    outs = sch.get_output_blocks(root)
    if not reds or len(outs) != 1:
        return None
    out = outs[0]
    out_blk = sch.get(out)
    out_vars = [r.min for r in out_blk.writes[0].region]
    # rows = the leading output axes that every reduction keeps
    k = None
    for b in reds:
        blk = sch.get(b)
        idx = [r.min for r in blk.writes[0].region]
        sp = [iv for iv in blk.iter_vars if int(iv.iter_type) == 0]
        if len(idx) != len(sp):
            return None
        n_keep = len(sp)
        while n_keep > 1 and _const(sp[n_keep - 1].dom.extent) == 1:  # keep-dims axes of a reduction
            n_keep -= 1
        k = n_keep if k is None else min(k, n_keep)
    out_loops = sch.get_loops(out)
    if not k or k >= len(out_loops) or len(out_loops) != len(out_vars):
        return None
    rfs = [rf for rf in (_rfactor_lanes(sch, b, params.vector_lanes) for b in reds) if rf is not None]
    blocks = sch.get_child_blocks(root)  # the rfactor blocks too
    row = sch.fuse(*out_loops[:k]) if k > 1 else out_loops[0]
    for b in reversed([b for b in blocks if not sch.get(b).same_as(out_blk)]):
        sch.compute_at(b, row, preserve_unit_loops=True)
    if (_const(sch.get(row).extent) or 1) > 1:
        sch.parallel(row)
    for rf in rfs:
        _vectorize_lanes(sch, rf, params.vector_lanes)
    for b in sch.get_child_blocks(root):
        if _is_spatial_block(sch, b):
            loops = sch.get_loops(b)
            if len(loops) > 1:
                _vectorize_inner(sch, loops[-1], params.vector_lanes * 4)
    return sch


# --------------------------------------------------------------------------- rule 3
def injective(sch, tvm_target, params: CPUParams):
    """Elementwise / injective kernels: inline, then parallel outer loops and vector inner. A
    concatenation along the innermost axis copies each input in a loop of its own."""

    root = sch.get_sblock("root")
    if any(not _is_spatial_block(sch, b) for b in sch.get_child_blocks(root)):
        return None
    _inline_spatial_intermediates(sch, root)
    for b in sch.get_child_blocks(root):
        if not _split_concat(sch, b, params):
            _parallel_vectorize(sch, b, params)
    return sch


def _inner_cuts(sch, block) -> list[int]:
    """Where a block's value switches source along its innermost axis: the switch point of every
    ``if_then_else`` whose condition compares the innermost block var v with a constant
    (``_switch_point``: ``c <= v`` and the seven other forms), inside the extent. A concatenation
    along that axis: TVM's concatenate selects its input so. Any other condition: no cuts."""
    import tvm
    from tvm import tirx

    blk = sch.get(block)
    loops = sch.get_loops(block)
    if not blk.iter_vars or not isinstance(blk.body, tirx.BufferStore) or len(loops) != len(blk.iter_vars):
        return []
    v = blk.iter_vars[-1].var
    ext = _const(sch.get(loops[-1]).extent)
    if ext is None or _const(blk.iter_vars[-1].dom.extent) != ext:
        return []
    cuts, stack = set(), [blk.body.value]
    while stack:
        e = stack.pop()
        if isinstance(e, tvm.ir.Call) and str(getattr(e.op, "name", "")).endswith("if_then_else"):
            c = _switch_point(e.args[0], v)
            if c is None:
                return []  # switches on something else: not a plain concatenation
            if 0 < c < ext:
                cuts.add(c)
            stack.extend(e.args[1:])
        elif isinstance(e, tvm.ir.Call):
            stack.extend(e.args)
        else:
            stack.extend(x for x in (getattr(e, "a", None), getattr(e, "b", None), getattr(e, "value", None))
                         if isinstance(x, tvm.ir.Expr))
    return sorted(cuts)


def _switch_point(cond, v) -> int | None:
    """The s where ``cond``, a comparison of ``v`` with a constant, changes value (it holds on one
    side of v = s): c <= v, v >= c, c > v, v < c switch at c; c < v, v > c, c >= v, v <= c at c + 1.
    None for any other condition."""
    from tvm import tirx

    kinds = (tirx.LT, tirx.LE, tirx.GT, tirx.GE)
    if not isinstance(cond, kinds):
        return None
    if cond.b.same_as(v) and _const(cond.a) is not None:  # c OP v
        return _const(cond.a) + (1 if isinstance(cond, (tirx.LT, tirx.GE)) else 0)
    if cond.a.same_as(v) and _const(cond.b) is not None:  # v OP c
        return _const(cond.b) + (1 if isinstance(cond, (tirx.GT, tirx.LE)) else 0)
    return None


def _split_concat(sch, block, params: CPUParams) -> bool:
    """A concatenation along the innermost axis, in one loop, selects its source per element: the
    vectorized select loads both inputs (SqueezeNet's NHWC concatenations ran 3.5-4x slower alone,
    2.2x onnxruntime's time in the model). Partitioned at the inputs' boundaries, each part is a
    plain vectorized copy of one input (the select folds away on its part's range)."""
    cuts = _inner_cuts(sch, block)
    loops = sch.get_loops(block)
    if not cuts or any(_const(sch.get(lp).extent) is None for lp in loops):
        return False
    sizes = [b - a for a, b in zip([0] + cuts[:-1], cuts)]
    parts = sch.loop_partition(loops[-1], factors=sizes)
    if len(loops) > 1:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        if (_const(sch.get(outer).extent) or 1) > 1:
            sch.parallel(outer)
    for part in parts:
        # a part after the first starts past 0, which split refuses: vectorized whole (up to 64
        # vectors; LLVM splits the wide vector ops into native ones)
        if (_const(sch.get(part).extent) or 0) <= params.vector_lanes * 64:
            sch.vectorize(part)
    return True


# --------------------------------------------------------------------------- rule 4
def parallel_fallback(sch, tvm_target, params: CPUParams):
    """Inline spatial intermediates, then parallelize each block's leading spatial loops."""

    root = sch.get_sblock("root")
    _inline_spatial_intermediates(sch, root)
    done = False
    for b in sch.get_child_blocks(root):
        kinds = _iter_kinds(sch, b)
        loops = sch.get_loops(b)
        if len(loops) != len(kinds):
            continue
        lead = 0
        while lead < len(kinds) and kinds[lead] == 0:
            lead += 1
        if lead == len(kinds) and lead > 1:
            lead -= 1  # an all-spatial block keeps its innermost loop for vectorization
        if lead == 0:
            continue
        fused = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
        if (_const(sch.get(fused).extent) or 1) > 1:
            sch.parallel(fused)
            done = True
    return sch if done else None


# In the order they are tried; each takes a fresh tirx Schedule of one kernel and returns it
# scheduled, or None when the kernel is not its kind.
RULES = (winograd, depthwise, tile_reduction, row_reduction, injective, parallel_fallback)
