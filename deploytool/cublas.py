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

import glob
import os
import subprocess
from pathlib import Path

from deploytool.errors import ToolchainError

FUNC = "deploytool.cublas.matmul"
SOURCE = Path(__file__).parent / "native" / "cublas_gemm.cc"


def applies(target, dtype: str, cublas: bool) -> bool:
    return bool(cublas) and target.family == "cuda" and dtype == "float16"


def _static_shape(expr):
    try:
        return [int(d) for d in expr.ty.shape]
    except (AttributeError, TypeError, ValueError):
        return None


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
            sa, sb, so = _static_shape(a), _static_shape(b), _static_shape(call)
            if sa is None or sb is None or so is None or len(sa) < 2 or len(sb) < 2:
                return call
            if len(sb) > 2 and (len(sb) != len(sa) or sb[:-2] != sa[:-2]):
                return call  # broadcast batch dims: left to TVM
            return relax.call_dps_packed(FUNC, [a, b], relax.TensorType(so, out_dtype))

    return _relax_function_pass(Offload, "CublasMatmul")


def compile_object(cc: str, out_dir: str | Path) -> Path:
    """native/cublas_gemm.cc compiled (with TVM-FFI's headers) for linking into an artifact."""
    import tvm_ffi

    inc = Path(tvm_ffi.__file__).parent / "include"
    out = Path(out_dir) / "deploytool_cublas.o"
    r = subprocess.run([cc, "-std=c++17", "-O2", "-fPIC", "-c", str(SOURCE), "-I", str(inc), "-o", str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ToolchainError(f"compiling {SOURCE.name} with {cc} failed: {r.stderr.strip()[-300:]}",
                             "check that the C++ toolchain works, or build without --cublas")
    return out


def preload() -> str | None:
    """Load libcublas into this process where the artifact's dlopen would not find it by name
    alone: pip's nvidia-cublas (as torch installs it) or the CUDA toolkit. Returns the file, or
    None (the artifact then reports cuBLAS missing at its first matmul)."""
    import ctypes

    if os.environ.get("DEPLOYTOOL_CUBLAS"):
        return os.environ["DEPLOYTOOL_CUBLAS"]
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return name
        except OSError:
            pass
    from deploytool.cuda import nvidia_dirs

    dirs = [os.path.join(d, sub, "lib") for d in nvidia_dirs() for sub in ("cu*", "cublas")]  # pip's (torch's)
    dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda-*/lib64"]  # toolkits
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "libcublas.so.*")), reverse=True):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return path
            except OSError:
                continue
    return None
