"""Kernel design space and default (untuned) schedules, per target family.

``apply_defaults(mod, target)`` schedules every PrimFunc of a partitioned Relax module that
is not scheduled yet, by rules that need no measurement. This package knows nothing of the
CLI, tuning logs or the cost model.
"""

from __future__ import annotations


def apply_defaults(mod, target):
    """Schedule every unscheduled task of ``mod`` for ``target`` with rule-based defaults."""
    family = target.family
    if family in ("x86", "arm"):
        from deploytool.schedules import cpu

        return cpu.apply(mod, target)
    return mod
