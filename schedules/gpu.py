"""Default (untuned) schedules for NVIDIA GPUs: TVM's dlight rules, per kernel.

dlight ("default light") schedules need no measurement. Per kernel, the rules below are tried in
order and the first that applies wins; a rule that raises on a kernel is skipped for that kernel
only (it then falls through to the next, ``Fallback`` last: every loop nest bound to blocks and
threads, so no kernel is left unbound -- an unbound kernel cannot run on a GPU at all).

1. ``TensorCoreMatmul`` (ours) then ``Matmul``: tiled GEMMs, tensor-core MMA for float16 on sm_70+
   (batched matmuls, dense layers, convolutions that normalize to a GEMM). dlight's ``Matmul`` uses
   tensor cores only when every GEMM dimension is above 64, which leaves ResNet-50's whole first
   stage (64 channels in or out, 23% of its FLOPs) and BERT's attention products (head size 64) on
   the CUDA cores; ``TensorCoreMatmul`` takes those when the 128x128x64 tiles waste at most
   ``MAX_PAD_WASTE`` of the work in padding;
2. ``GEMV`` / ``LowBatchGEMV``: matrix-vector products (batch-1 dense layers);
3. ``Reduction`` / ``GeneralReduction``: softmax, norms, means (cross-thread reductions);
4. ``Transpose``: shared-memory tiled transposes;
5. ``VectorizedElementwise`` (ours): elementwise kernels (no reduction) that inline into one loop
   nest, each thread loading and storing 16 bytes (8 float16 values): dlight's ``Fallback`` moves
   one scalar per thread, and in a --cublas BERT at batch 32 its elementwise kernels (bias + GELU,
   bias + residual, casts) ran at about 1 TB/s, half of the model's time;
6. ``Fallback``: anything else.

The same rules give the tuning search its starting point (``schedules.space``): a tuned kernel is
never slower than this.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


MAX_PAD_WASTE = 4.0   # padded / real multiply-adds; tensor cores are ~8x the CUDA cores' float16 rate
_TILE = (128, 128, 64)  # dlight MatmulTensorization's block tile: I, J, K


def gemm_extents(func, in_dtype: str | None = None):
    """(S, I, J, K) of ``func``'s main reduction once normalized to C[S, I, J] += A[S, I, K] *
    B[S, J, K], as dlight's matmul rules see it; None when it is no GEMM (or a dynamic one), or
    when ``in_dtype`` is given and the GEMM reads other types."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_in_out_dtypes, get_index_map, get_reduction_blocks

    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        reduction = get_reduction_blocks(sch, blocks)
        if not reduction:
            return None
        main = reduction[0]
        if in_dtype and str(get_in_out_dtypes(sch.get(main))[0]) != in_dtype:
            return None
        maps = get_index_map(sch.get(main))
        if maps is None:
            return None
        sch.transform_block_layout(main, maps[0])
        extents = [iv.dom.extent for iv in sch.get(main).iter_vars]
    except Exception:  # not a GEMM these helpers understand
        return None
    if len(extents) != 4 or not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    return tuple(int(e) for e in extents)


def pad_waste(extents) -> float:
    """Multiply-adds of the GEMM padded to whole tensor-core tiles, over the real ones."""
    _, i, j, k = extents
    padded = 1.0
    for n, t in zip((i, j, k), _TILE):
        padded *= -(-n // t) * t / n
    return padded


class TensorCoreMatmul:
    """dlight's MatmulTensorization for float16 GEMMs that dlight's ``Matmul`` leaves on the CUDA
    cores (a dimension <= 64), when the padding to its tiles costs at most ``MAX_PAD_WASTE``."""

    def apply(self, func, target, _tunable=False):
        from tvm.s_tir.dlight.gpu.matmul import MatmulTensorization, check_sm_version

        if target.kind.name != "cuda" or check_sm_version(str(target.attrs.get("arch", ""))) < 70:
            return None
        ext = gemm_extents(func, "float16")
        if ext is None or min(ext[1:]) > 64 or min(ext[1:]) < 16 or pad_waste(ext) > MAX_PAD_WASTE:
            return None  # dlight's Matmul tensorizes the large ones itself
        return MatmulTensorization().apply(func, target, False)


def _contains(expr, pred) -> bool:
    """Whether ``pred`` holds for ``expr`` or a sub-expression of it (an index expression)."""
    if pred(expr):
        return True
    return any(_contains(getattr(expr, f), pred) for f in ("a", "b", "value", "condition", "true_value", "false_value")
               if hasattr(expr, f) and not isinstance(getattr(expr, f), (int, float, str)))


def _loads(expr) -> bool:
    """Whether an index expression reads a tensor."""
    return _contains(expr, lambda e: "Load" in type(e).__name__)


def _coef(expr, var):
    """The coefficient of ``var`` in an index expression linear in it; None if it is not linear
    (a // or % of it, as reshapes leave)."""
    from tvm import tirx

    if expr.same_as(var):
        return 1
    if not _contains(expr, lambda e: e.same_as(var)):
        return 0
    if isinstance(expr, (tirx.Add, tirx.Sub)):
        a, b = _coef(expr.a, var), _coef(expr.b, var)
        return None if a is None or b is None else a + b if isinstance(expr, tirx.Add) else a - b
    if isinstance(expr, tirx.Mul):
        for x, y in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(y, tirx.IntImm):
                c = _coef(x, var)
                return None if c is None else c * int(y)
    if isinstance(expr, tirx.Cast):
        return _coef(expr.value, var)
    return None


class VectorizedElementwise:
    """Elementwise kernels: every block inlined into the last, its loops fused and split into
    [blocks, THREADS threads, V lanes], V = 16 bytes of the output's type (fewer if the size asks)."""

    THREADS = 256

    def apply(self, func, target, _tunable=False):
        import tvm
        from tvm import s_tir, tirx
        from tvm.s_tir.dlight.analysis import get_root_block

        if target.kind.name != "cuda":
            return None
        sch = s_tir.Schedule(func)
        root = get_root_block(sch)
        blocks = sch.get_child_blocks(root)
        if not blocks or any(iv.iter_type != tirx.IterVar.DataPar for b in blocks for iv in sch.get(b).iter_vars):
            return None
        for b in blocks[:-1]:
            sch.compute_inline(b)  # raises where it cannot: the next rule takes the kernel
        (block,) = sch.get_child_blocks(root)
        writes = sch.get(block).writes
        if len(writes) != 1:
            return None
        for region in sch.get(block).reads:  # one element per iteration each, at an index computed
            for r in region.region:            # from the loops (not read from a tensor, as take does)
                if not isinstance(r.extent, tirx.IntImm) or int(r.extent) != 1 or _loads(r.min):
                    return None
        last = sch.get(block).iter_vars[-1].var  # the lanes' axis
        contiguous = [_coef(region.region[-1].min, last) == 1
                      and all(_coef(r.min, last) == 0 for r in region.region[:-1])
                      for region in sch.get(block).reads]
        loops = sch.get_loops(block)
        extents = [sch.get(loop).extent for loop in loops]
        if not loops or not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        lanes = max(1, 128 // tvm.DataType(str(writes[0].source.dtype)).bits)
        inner = int(extents[-1])
        while lanes > 1 and inner % lanes:
            lanes //= 2
        total = 1
        for e in extents:
            total *= int(e)
        if lanes == 1 or total < lanes * self.THREADS:
            return None  # no gain over Fallback
        # the lanes come from the innermost axis, so that each thread's 16 bytes are contiguous in
        # the output and in every input read along that axis: register copies of those, loaded
        # and stored whole (the arithmetic, calls such as erf included, runs on the copies)
        outer, vec = sch.split(loops[-1], [None, lanes])
        fused = sch.fuse(*loops[:-1], outer)
        bx, tx = sch.split(fused, [None, self.THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        for i in range(len(sch.get(block).reads)):
            cached = sch.cache_read(block, i, "local")
            sch.compute_at(cached, tx)
            copy = sch.get_loops(cached)[2:]  # below blockIdx, threadIdx
            size = 1
            for loop in copy:
                e = sch.get(loop).extent
                size = size * int(e) if isinstance(e, tirx.IntImm) else -1
            if not 0 < size <= lanes:  # more than the thread's lanes: not an elementwise read
                return None
            if copy and contiguous[i]:  # one 16-byte load (TVM's CUDA codegen breaks on strided
                sch.vectorize(copy[-1])  # float16 vector loads: those stay a loop of scalar ones)
        store = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(store, tx)
        sch.vectorize(sch.get_loops(store)[-1])
        return sch


def rules():
    from tvm.s_tir import dlight as dl

    return [TensorCoreMatmul(), dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Transpose(), VectorizedElementwise(), dl.gpu.Fallback()]


def schedule_sch(func, tvm_target):
    """(Schedule, rule name) of the first dlight rule that schedules ``func``; (None, "none")."""
    from tvm import s_tir

    from deploytool.schedules.space import import_tensor_intrinsics

    if any(str(getattr(p, "dtype", "")) in ("float16", "int8") for p in func.params):
        import_tensor_intrinsics()  # dlight's tensor-core rules import them, 6x slower
    for rule in rules():
        try:
            with tvm_target:
                out = rule.apply(func, tvm_target, False)
        except Exception as e:  # this rule does not fit this kernel: try the next
            log.debug("dlight %s failed: %s", type(rule).__name__, e)
            continue
        if isinstance(out, list):
            out = out[0] if out else None
        if isinstance(out, s_tir.Schedule):
            return out, type(rule).__name__
    return None, "none"


def apply(mod, target, report: dict | None = None):
    """Schedule every unscheduled PrimFunc of ``mod``; ``report`` gets kernel name -> rule name."""
    from deploytool.schedules.space import unscheduled_kernels

    tvm_target = target.tvm_target()
    updated = {}
    for gv, func in unscheduled_kernels(mod):
        sch, rule = schedule_sch(func, tvm_target)
        if report is not None:
            report[gv.name_hint] = rule
        if sch is not None:
            updated[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    for gv, func in updated.items():
        mod[gv] = func
    return mod


def schedule_fn(target):
    """A MetaSchedule ScheduleFn body: the dlight schedule of a one-kernel module, replayed on the
    search's own (traced) schedule so that its trace can be logged and replayed later."""
    tvm_target = target.tvm_target()

    def fn(sch):
        func = sch.mod["main"]
        out, _ = schedule_sch(func, tvm_target)
        if out is None:
            return sch
        out.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch

    return fn
