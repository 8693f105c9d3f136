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
    spatial size or stride. 1-D convolutions likewise run NWC with WIO weights: in NCW the
    vectorized axis was the width (98 frames in the DS-CNN: loops of 7 lanes), and the untuned
    DS-CNN ran 4.3x slower (0.70 -> 0.16 ms on a Zen 3). Transposed convolutions keep ONNX's
    layout: TVM 0.27 lowers them in NCHW/NCW only, and left to follow a convolution's NHWC
    output they reached VM code generation unlowered (a decoder's build failed). Pooling and
    elementwise ops follow the convolutions' layout."""
    if target.family in ("x86", "arm"):
        return {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv1d": ["NWC", "WIO"],
                "relax.nn.conv2d_transpose": ["NCHW", "IOHW"], "relax.nn.conv1d_transpose": ["NCW", "IOW"]}
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
