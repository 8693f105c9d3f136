"""Kernel design space and default (untuned) schedules, per target family.

``apply_defaults(mod, target)`` schedules every PrimFunc of a partitioned Relax module that
is not scheduled yet, by rules that need no measurement. This package knows nothing of the
CLI, tuning logs or the cost model.
"""

from __future__ import annotations


def desired_layouts(target) -> dict[str, list[str]]:
    """Data layouts the family's default schedules are written for (Relax ConvertLayout form).

    CPUs: NHWC activations with HWIO weights, so that output channels -- a multiple of the
    vector width in nearly every CNN layer -- are the vectorized, contiguous axis whatever the
    spatial size or stride. Pooling and elementwise ops follow the convolutions' layout."""
    if target.family in ("x86", "arm"):
        return {"relax.nn.conv2d": ["NHWC", "HWIO"]}
    return {}


def apply_defaults(mod, target, report: dict | None = None):
    """Schedule every unscheduled task of ``mod`` for ``target`` with rule-based defaults.
    ``report``, if given, receives kernel name -> the rule that scheduled it (or "none")."""
    family = target.family
    if family in ("x86", "arm"):
        from deploytool.schedules import cpu

        return cpu.apply(mod, target, report)
    if family == "cuda":
        from deploytool.schedules import gpu

        return gpu.apply(mod, target, report)
    if family == "cortex-m":
        from deploytool.schedules import mcu

        return mcu.apply(mod, target, report)
    return mod
