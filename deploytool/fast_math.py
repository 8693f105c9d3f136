"""Vectorizable exp, erf, tanh and sigmoid for CPU targets.

TVM's LLVM backend lowers ``exp``, ``erf``, ``tanh`` and ``sigmoid`` to calls of libm's scalar
``expf``/``erff``: a vectorized loop over them makes one call per lane. BERT's FFN up-projection
with its erf-GELU epilogue ran at 140 GFLOP/s against 257-325 for the plain matmuls beside it
(46% of the model's time, on a Zen 5, 2 threads), its softmax at 1.5 ns per element.

Here, at the end of the graph passes, each float32 call of these ops becomes TVM's own polynomial
form from topi (the forms its ``FastMathTransform`` uses), which the CPU schedules vectorize and
fuse like any other elementwise arithmetic:

- ``exp``: Cephes' expf, 2^n * p(r), the input clamped to [-88.38, 88.38]: it is 0 below about
  -87.3 (libm returns denormals down to -103.9) and +inf from 88.38 (libm: from 88.72);
- ``erf``: Eigen's rational approximation on [-4, 4] (erf(4) is 1 - 1.5e-8: the clamp is exact in
  float32), NaN passed through (the clamp would make it +-1);
- ``tanh``: Eigen's rational approximation on [-9, 9] (TVM's own lowering, from exp, cancels near
  0: ONNX's Mish cases failed by 9.5e-7 absolute with it and pass now);
- ``sigmoid(x)`` = 1 / (1 + exp(-x)) with the exp above; ``softmax`` = topi's ``fast_softmax``;
  GELU (both forms) and SiLU through the erf, tanh and sigmoid above.

Against float64 references over [-20, 20] (tests/test_schedules.py): exp within 4e-7 relative,
erf, tanh and sigmoid within 2.5e-7 absolute (onnxruntime's MLAS: erf 5e-8, tanh 2.2e-7); softmax's
error (5.6e-7) is the float32 sum's, the same as with libm. Applied to x86 and aarch64 targets,
float32; CUDA keeps its device intrinsics, microcontrollers newlib.
"""

from __future__ import annotations

FAMILIES = ("x86", "arm")


def applies(target) -> bool:
    return target.family in FAMILIES


def fast_math_pass():
    """A Relax module pass: float32 exp/erf/tanh/sigmoid/softmax/gelu/gelu_tanh/silu -> topi's fast
    forms."""
    import math

    from tvm import topi

    def erf(x):  # the clamp to [-4, 4] would turn NaN into +-1
        return topi.where(topi.isnan(x), x, topi.fast_erf(x))

    def sigmoid(x):
        return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))

    def gelu(x):
        return topi.multiply(x, topi.add(0.5, topi.multiply(0.5, erf(
            topi.multiply(x, 1.0 / math.sqrt(2.0))))))

    def gelu_tanh(x):  # ONNX Gelu(approximate="tanh")
        inner = topi.multiply(math.sqrt(2.0 / math.pi),
                              topi.add(x, topi.multiply(0.044715, topi.multiply(x, topi.multiply(x, x)))))
        return topi.multiply(x, topi.add(0.5, topi.multiply(0.5, topi.fast_tanh(inner))))

    def silu(x):
        return topi.multiply(x, sigmoid(x))

    forms = {"relax.exp": (topi.fast_exp, "fast_exp"), "relax.erf": (erf, "fast_erf"),
             "relax.tanh": (topi.fast_tanh, "fast_tanh"), "relax.sigmoid": (sigmoid, "fast_sigmoid"),
             "relax.nn.gelu": (gelu, "fast_gelu"), "relax.nn.gelu_tanh": (gelu_tanh, "fast_gelu_tanh"),
             "relax.nn.silu": (silu, "fast_silu"), "relax.nn.softmax": (topi.nn.fast_softmax, "fast_softmax")}

    def rewrite(call, bb):
        if str(getattr(call.args[0].ty, "dtype", "")) != "float32":
            return None
        fn, prim_name = forms[call.op.name]
        extra = (int(call.attrs.axis),) if call.op.name == "relax.nn.softmax" else ()
        return bb.call_te(fn, call.args[0], *extra, primfunc_name_hint=prim_name)

    from deploytool.pipeline import _op_rewrite_pass

    return _op_rewrite_pass(dict.fromkeys(forms, rewrite), "FastMath")
