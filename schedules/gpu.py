"""Default (untuned) schedules for NVIDIA GPUs: TVM's dlight rules, per kernel.

dlight ("default light") schedules need no measurement. Per kernel, the rules below are tried in
order and the first that applies wins; a rule that raises on a kernel is skipped for that kernel
only (it then falls through to the next, ``Fallback`` last: every loop nest bound to blocks and
threads, so no kernel is left unbound -- an unbound kernel cannot run on a GPU at all).

1. ``Matmul``: tiled GEMMs, tensor-core MMA for float16 on sm_80+ (batched matmuls, dense layers,
   convolutions that normalize to a GEMM);
2. ``GEMV`` / ``LowBatchGEMV``: matrix-vector products (batch-1 dense layers);
3. ``Reduction`` / ``GeneralReduction``: softmax, norms, means (cross-thread reductions);
4. ``Transpose``: shared-memory tiled transposes;
5. ``Fallback``: anything else, elementwise included.

The same rules give the tuning search its starting point (``schedules.space``): a tuned kernel is
never slower than this.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def rules():
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Transpose(), dl.gpu.Fallback()]


def schedule_sch(func, tvm_target):
    """(Schedule, rule name) of the first dlight rule that schedules ``func``; (None, "none")."""
    from tvm import s_tir

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
