"""NVIDIA GPUs: the CUDA compiler (NVRTC) and the GPU of this machine.

Compiling for CUDA needs no GPU: TVM generates CUDA C and compiles it to a cubin with NVRTC (the
``cuda-bindings`` package and NVIDIA's pip wheels of NVRTC, the CUDA runtime headers and CCCL:
``pip install 'deploytool[cuda]'``), or with nvcc where a CUDA toolkit is installed. Running,
benchmarking and tuning need the GPU and its driver.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from deploytool.errors import TargetError, ToolchainError

INSTALL_HINT = "pip install 'deploytool[cuda]' (NVRTC and the CUDA headers as pip wheels), or install a CUDA toolkit"


def nvidia_dirs() -> list[Path]:
    """The folders of the ``nvidia`` namespace package that NVIDIA's pip wheels (and torch's) install."""
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return []
    return [Path(base) for base in getattr(nvidia, "__path__", [])]


def _pip_cuda_root() -> Path | None:
    """The CUDA headers NVIDIA's pip wheels install (site-packages/nvidia/cu13), if any."""
    for base in nvidia_dirs():
        for sub in sorted(base.glob("cu*"), reverse=True):
            if (sub / "include" / "cuda_runtime.h").is_file():
                return sub
    return None


@functools.lru_cache(maxsize=None)
def ensure_compiler() -> str:
    """Make TVM's CUDA compile callback work here; returns the CUDA root it will use.

    TVM compiles with NVRTC (through cuda-bindings) and looks for the CUDA headers under CUDA_PATH,
    else next to ``nvcc``. Without a toolkit, CUDA_PATH is pointed at the pip wheels' headers."""
    def has_headers(root) -> bool:
        return bool(root) and (Path(root) / "include" / "cuda_runtime.h").is_file()

    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_PATH"), nvcc and str(Path(nvcc).resolve().parent.parent), "/usr/local/cuda",
                  _pip_cuda_root()]
    root = next((str(c) for c in candidates if has_headers(c)), None)
    if root is None:
        raise ToolchainError("compiling for CUDA needs NVRTC and the CUDA headers, and neither a CUDA toolkit nor "
                             "NVIDIA's pip wheels were found", INSTALL_HINT)
    os.environ["CUDA_PATH"] = root
    # TVM passes NVRTC <root>/include and <root>/targets/<arch>/include(/cccl); the pip wheels keep
    # CCCL (cuda/std/...) in <root>/include/cccl instead
    cccl = Path(root) / "include" / "cccl"
    extra = os.environ.get("TVM_CUDA_NVRTC_EXTRA_OPTS", "")
    if (cccl / "cuda" / "std").is_dir() and str(cccl) not in extra:
        os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"] = f"{extra} -I{cccl}".strip()
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        raise ToolchainError("compiling for CUDA needs NVRTC's Python bindings (cuda-bindings)", INSTALL_HINT) from None
    # Importing it registers TVM's compile callback. Without it TVM silently ships the CUDA *source*
    # in the module, which no driver can load.
    import tvm.support.nvcc  # noqa: F401

    _load_tvm_cuda_runtime(root)
    return root


# The CUDA driver functions TVM's CUDA runtime library links against (nm -D --undefined-only).
_DRIVER_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString", "cuLaunchKernelEx",
                   "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload", "cuTensorMapEncodeTiled")


def _load_tvm_cuda_runtime(root: str) -> None:
    """TVM compiles CUDA to a cubin only when its CUDA runtime library (libtvm_runtime_cuda.so) is
    loaded; otherwise it silently keeps the CUDA source, compiled by NVRTC when the .so is loaded on
    the GPU (so every device would need NVRTC). That library links the driver (libcuda.so.1), which a
    machine without a GPU lacks, so TVM skips it there. Here: load the CUDA runtime (libcudart) from
    the toolkit or the pip wheel, and, with no driver, a stub libcuda.so.1 whose functions all fail
    (nothing calls them while compiling), then TVM's library. With a real driver, only the latter."""
    import ctypes

    import tvm
    import tvm_ffi

    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is not None:
        return
    lib_dir = Path(tvm.__file__).parent / "lib"
    for name, where in (("libcudart.so.13", [Path(root) / "lib", Path(root) / "lib64"]),):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            path = next((d / name for d in where if (d / name).is_file()), None)
            if path is None:
                raise ToolchainError(f"compiling for CUDA needs the CUDA runtime library ({name})", INSTALL_HINT) from None
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        ctypes.CDLL(str(_driver_stub()), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(lib_dir / "libtvm_runtime_cuda.so"), mode=ctypes.RTLD_GLOBAL)
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        raise ToolchainError("TVM's CUDA runtime library did not register its CUDA module",
                             "reinstall apache-tvm; compiling for CUDA needs tvm/lib/libtvm_runtime_cuda.so")


def _driver_stub() -> Path:
    """A libcuda.so.1 that defines the driver functions TVM's CUDA runtime links against, each
    returning CUDA_ERROR_NO_DEVICE. Built once with the host's C compiler, cached."""
    import subprocess

    from deploytool.emulator import cache_root

    out = cache_root() / "cuda-stub" / "libcuda.so.1"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name("stub.c")
    src.write_text("/* deploytool: a CUDA driver stub for compiling on machines without a GPU */\n"
                   + "".join(f"int {s}(void) {{ return 100; }}\n" for s in _DRIVER_SYMBOLS))
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ToolchainError("compiling for CUDA on a machine without a GPU needs a C compiler (for a driver stub)",
                             "install gcc")
    tmp = out.with_suffix(".tmp")
    r = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(src), "-o", str(tmp)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ToolchainError(f"building the CUDA driver stub failed: {r.stderr.strip()[:200]}", "check that gcc works")
    os.replace(tmp, out)
    return out


@dataclass(frozen=True)
class GPU:
    """The NVIDIA GPU of this machine, as the driver reports it."""

    name: str
    arch: str                 # "sm_90"
    multiprocessors: int
    max_threads_per_block: int
    max_shared_memory_per_block: int
    warp_size: int
    l2_bytes: int = 0         # L2 cache size (the tuner's cold-L2 timing flushes twice this)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@functools.lru_cache(maxsize=None)
def local_gpu() -> GPU | None:
    """This machine's first NVIDIA GPU, or None (no GPU, no driver)."""
    try:
        import tvm

        dev = tvm.cuda(0)
        if not dev.exist:
            return None
        major, minor = str(dev.compute_version).split(".")
        return GPU(name=str(dev.device_name), arch=f"sm_{major}{minor}", multiprocessors=int(dev.multi_processor_count),
                   max_threads_per_block=int(dev.max_threads_per_block),
                   max_shared_memory_per_block=int(dev.max_shared_memory_per_block), warp_size=int(dev.warp_size),
                   l2_bytes=int(dev.l2_cache_size_bytes or 0))
    except Exception:  # no libcuda, driver too old...
        return None


def detect_into(data: dict) -> dict:
    """Preset hook (``"detect": "cuda-gpu"``): take the arch and limits of this machine's GPU when it
    has one; keep the preset's values (sm_90) when it has none, so compiling works anywhere."""
    gpu = local_gpu()
    if gpu is None:
        return data
    data = dict(data)
    tvm_t = dict(data["tvm"])
    tvm_t.update(arch=gpu.arch, max_threads_per_block=gpu.max_threads_per_block,
                 max_shared_memory_per_block=gpu.max_shared_memory_per_block, thread_warp_size=gpu.warp_size)
    data["tvm"] = tvm_t
    data["description"] = f"{gpu.name} ({gpu.arch}), this machine's GPU"
    return data


def require_gpu(arch: str | None, what: str) -> GPU:
    """This machine's GPU, checked against the arch an artifact or a tuning run is built for."""
    gpu = local_gpu()
    if gpu is None:
        raise TargetError(f"{what} needs an NVIDIA GPU, and this machine has none (or no working driver)",
                          "run it on a machine with an NVIDIA GPU; compiling (--target cuda) works anywhere")
    if arch and arch != gpu.arch:
        # A cubin runs only on its own major arch, and never on an older minor one.
        want, have = int(arch.split("_")[1]), int(gpu.arch.split("_")[1])
        if want // 10 != have // 10 or want > have:
            raise TargetError(f"{what} is built for {arch}, and this machine's {gpu.name} is {gpu.arch}",
                              f"rebuild with --target cuda on this machine (it detects {gpu.arch}), or pick the matching preset")
    return gpu


def cubin_archs(path: str | Path) -> list[str]:
    """The SM archs of the cubins embedded in a built .so ("sm_90", ...): CUDA ELF images
    (e_machine 190, EM_CUDA) whose e_flags hold the SM version in bits 8-15."""
    import re
    import struct

    data = Path(path).read_bytes()
    archs = []
    for m in re.finditer(rb"\x7fELF\x02\x01\x01", data):
        i = m.start()
        if i + 52 <= len(data) and struct.unpack_from("<H", data, i + 18)[0] == 190:
            archs.append(f"sm_{(struct.unpack_from('<I', data, i + 48)[0] >> 8) & 0xFF}")
    return archs
