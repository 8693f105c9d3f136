"""``--cublas``: the float16 matmuls of a CUDA build on cuBLAS, everything else on TVM's kernels.

At batch 32, BERT's GEMMs (4,096 x 768 x 3,072 and the like) are where a float16 encoder spends
its time, and MetaSchedule's tensor-core schedules (WMMA fragments without a software pipeline)
reach a fraction of what cuBLAS does on them. This pass replaces each float16 ``relax.matmul`` of
static shape (A[..., M, K] @ B[K, N], or B[..., K, N] batched like A) with a call of
``deploytool.cublas.matmul``, a packed function linked into the artifact
(``native/cublas_gemm.cc``). It runs before operator fusion, so the bias, activation and
residual that followed a matmul fuse into TVM kernels of their own. The function loads cuBLAS
with dlopen at the first call: building needs no CUDA toolkit, running needs libcublas on the GPU
machine (the CUDA toolkit's, or pip's nvidia-cublas; ``DEPLOYTOOL_CUBLAS`` names a file).
"""

from __future__ import annotations

import os
from pathlib import Path

from deploytool import vendor

FUNC = "deploytool.cublas.matmul"


def applies(target, dtype: str, cublas: bool) -> bool:
    return bool(cublas) and target.family == "cuda" and dtype == "float16"


def offload_pass():
    """The module pass: float16 matmuls -> call_dps_packed(FUNC)."""
    import tvm
    from tvm import relax

    from deploytool.pipeline import _relax_function_pass

    @relax.expr_functor.mutator
    class Offload(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
                return call
            a, b = call.args
            out_dtype = str(getattr(call.ty, "dtype", ""))
            if {str(a.ty.dtype), str(b.ty.dtype)} != {"float16"} or out_dtype not in ("float16", "float32"):
                return call
            sa, sb, so = vendor.static_shape(a), vendor.static_shape(b), vendor.static_shape(call)
            if sa is None or sb is None or so is None or len(sa) < 2 or len(sb) < 2:
                return call
            if len(sb) > 2 and (len(sb) != len(sa) or sb[:-2] != sa[:-2]):
                return call  # broadcast batch dims: left to TVM
            return relax.call_dps_packed(FUNC, [a, b], relax.TensorType(so, out_dtype))

    return _relax_function_pass(Offload, "CublasMatmul")


def compile_object(cc: str, out_dir: str | Path) -> Path:
    """native/cublas_gemm.cc compiled for linking into an artifact."""
    return vendor.compile_native("cublas_gemm.cc", cc, out_dir, "--cublas")


def preload() -> str | None:
    """Load libcublas into this process where the artifact's dlopen would not find it by name
    alone: pip's nvidia-cublas (as torch installs it) or the CUDA toolkit. Returns the file, or
    None (the artifact then reports cuBLAS missing at its first matmul)."""
    from deploytool.cuda import nvidia_dirs

    dirs = [os.path.join(d, sub, "lib") for d in nvidia_dirs() for sub in ("cu*", "cublas")]  # pip's (torch's)
    dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda-*/lib64"]  # toolkits
    return vendor.preload("DEPLOYTOOL_CUBLAS", ("libcublas.so.13", "libcublas.so.12", "libcublas.so"),
                          "libcublas.so.*", dirs)
