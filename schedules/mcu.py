"""Default schedules for microcontrollers (family "cortex-m"): RAM first.

A Cortex-M runs one thread with no vector units worth scheduling for (the M4/M7 DSP extension
works on int8/int16), and every byte of RAM counts: the static arena holds each kernel's
workspace on top of the tensors live at its step. Left as legalized, a fused conv + bias + ReLU
allocates a padded copy of its input and a full-size conv result in workspace. So the rule here:

* compute the padding and any other elementwise producer inline (conditional reads: no copy);
* compute the epilogue (bias, activation, ...) of each reduction right after its innermost
  spatial loop, so that the intermediate shrinks to one element (a register).

Numerics are unchanged (same arithmetic, same order); tests check them against onnxruntime.
"""

from __future__ import annotations

import logging

from deploytool.schedules.cpu import _inline_producers, _inline_spatial_intermediates, _is_spatial_block, _iter_kinds

log = logging.getLogger(__name__)


def apply(mod, target, report: dict | None = None):
    from tvm import s_tir

    from deploytool.schedules.space import unscheduled_kernels

    updated = {}
    for gv, func in unscheduled_kernels(mod):
        try:
            sch = lean(s_tir.Schedule(func))
            updated[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            rule = "mcu_lean"
        except Exception as e:  # keep the kernel as legalized
            log.debug("mcu_lean failed on %s: %s", gv.name_hint, e)
            rule = "none"
        if report is not None:
            report[gv.name_hint] = rule
    for gv, func in updated.items():
        mod[gv] = func
    return mod


def lean(sch):
    root = sch.get_sblock("root")
    reductions = [b for b in sch.get_child_blocks(root) if not _is_spatial_block(sch, b)]
    for red in reductions:
        _inline_producers(sch, red)
    _inline_spatial_intermediates(sch, root)
    for red in [b for b in sch.get_child_blocks(root) if not _is_spatial_block(sch, b)]:
        kinds = _iter_kinds(sch, red)
        n_spatial = next((i for i, k in enumerate(kinds) if k != 0), len(kinds))
        if n_spatial == 0:
            continue
        for c in sch.get_consumers(red):
            if not _is_spatial_block(sch, c):
                continue
            try:
                sch.reverse_compute_at(c, sch.get_loops(red)[n_spatial - 1], preserve_unit_loops=True)
            except Exception as e:  # e.g. a consumer that reads the reduction across its spatial loop
                log.debug("epilogue stays after %s: %s", sch.get(red).name_hint, e)
    return sch
