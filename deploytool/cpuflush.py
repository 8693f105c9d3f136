"""The cache flush between cold CPU timings, fast on Intel servers.

Cold timing (measure.py, COLD_CALLS) evicts a candidate's weights, bias and output before every
timed call. TVM's built-in hook, ``cache_flush_cpu_non_first_arg``, does it with CLFLUSH, one line at
a time and ordered, which costs ~145 ns a line on a Xeon Emerald Rapids VM: 360 ms for ZFNet-512's
151 MB fully connected weight, ~11 s of flushing per candidate at 30 timed calls, where the kernel
itself runs 30 x 12 ms. CLFLUSHOPT evicts the same lines ~60x faster there (6 ms). Timings do not
change: the same lines leave the caches before each call, and the flush is never inside the timed
region. Where the CPU lacks CLFLUSHOPT, or no C compiler is at hand, TVM's hook is used as before.

The helper (native/cpu_flush.c) is compiled once per source version into the cache
(DEPLOYTOOL_CACHE, ~/.cache/deploytool) with the host's C compiler.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

TVM_HOOK = "cache_flush_cpu_non_first_arg"
HOOK = "deploytool.flush_cpu_non_first_arg"
_LIB: dict = {}


def has_clflushopt(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return "clflushopt" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def _compile(cache: Path) -> Path | None:
    src = resources.files("deploytool.native").joinpath("cpu_flush.c").read_bytes()
    out = cache / f"cpu_flush-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if out.exists():
        return out
    cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as d:
        c, so = Path(d) / "cpu_flush.c", Path(d) / "cpu_flush.so"
        c.write_bytes(src)
        r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(so), str(c)], capture_output=True)
        if r.returncode != 0:
            return None
        os.replace(so, out)  # atomic: parallel workers may compile it at once
    return out


def library(cache: Path | None = None):
    """The compiled helper, or None where it can't help (no CLFLUSHOPT, no compiler)."""
    if "lib" not in _LIB:
        lib = None
        if has_clflushopt():
            from deploytool.emulator import cache_root

            path = _compile(cache or cache_root())
            if path is not None:
                lib = ctypes.CDLL(str(path))
                lib.deploytool_flush.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.c_int]
                lib.deploytool_flush.restype = None
        _LIB["lib"] = lib
    return _LIB["lib"]


def _nbytes(t) -> int:
    return int(t.numel()) * ((t.dtype.bits * t.dtype.lanes + 7) // 8)


def hook_for(tensors: list) -> str:
    """The name of the f_preproc hook that flushes every tensor but the first (the input activation,
    which the kernel before has just written), registered for these tensors in this process."""
    lib = library()
    if lib is None:
        return TVM_HOOK
    import tvm

    rest = tensors[1:]
    ptrs = (ctypes.c_void_p * len(rest))(*[t.data_ptr() for t in rest])
    sizes = (ctypes.c_size_t * len(rest))(*[_nbytes(t) for t in rest])
    n = len(rest)

    def flush(*_):  # returns nothing: the evaluator refuses an object as the hook's result
        lib.deploytool_flush(ptrs, sizes, n)

    tvm.register_global_func(HOOK, flush, override=True)
    return HOOK
