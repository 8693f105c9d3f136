"""Default schedules for CPUs (x86 AVX2/AVX-512, aarch64 NEON)."""

from __future__ import annotations


def apply(mod, target):
    """Apply TVM's dlight CPU rules where they match; other kernels stay as legalized."""
    import tvm
    from tvm.s_tir import dlight as dl

    rules = []
    for name in ("GEMV", "Reduction"):
        cpu_ns = getattr(dl, "cpu", None)
        rule = getattr(cpu_ns, name, None) if cpu_ns is not None else None
        if rule is not None:
            rules.append(rule())
    if not rules:
        return mod
    with target.tvm_target():
        return dl.ApplyDefaultSchedule(*rules)(mod)
