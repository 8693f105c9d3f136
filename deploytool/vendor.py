"""What the vendor-library calls of CUDA builds share (``--cublas``: deploytool.cublas,
``--cudnn``: deploytool.cudnn): their C++ sources (``native/``) compiled into an artifact's
addons, and the libraries loaded into this process before an artifact's dlopen looks for them."""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
from pathlib import Path

from deploytool.errors import ToolchainError

NATIVE = Path(__file__).parent / "native"


def static_shape(expr) -> list[int] | None:
    """A Relax expression's shape as ints, or None where it is not static."""
    try:
        return [int(d) for d in expr.ty.shape]
    except (AttributeError, TypeError, ValueError):
        return None


def compile_native(source: str, cc: str, out_dir: str | Path, flag: str) -> Path:
    """native/``source`` compiled with ``cc`` against TVM-FFI's and TVM's headers, for linking into
    an artifact (pipeline.export's addons). ``flag`` names the option in the error."""
    import tvm
    import tvm_ffi

    src = NATIVE / source
    out = Path(out_dir) / f"deploytool_{Path(source).stem}.o"
    cmd = [cc, "-std=c++17", "-O2", "-fPIC", "-c", str(src), "-o", str(out)]
    for inc in (Path(tvm_ffi.__file__).parent / "include", Path(tvm.__file__).parent / "include"):
        cmd += ["-I", str(inc)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ToolchainError(f"compiling {src.name} with {cc} failed: {r.stderr.strip()[-300:]}",
                             f"check that the C++ toolchain works, or build without {flag}")
    return out


def _load(path: str) -> bool:
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def preload(env_var: str, sonames: tuple[str, ...], pattern: str, dirs: list[str],
            companions: str | None = None) -> str | None:
    """Load a vendor library into this process (RTLD_GLOBAL), so that an artifact's dlopen by
    soname finds it: ``$env_var`` if set (the artifact opens that itself), else the first of
    ``sonames`` the loader finds, else the newest file matching ``pattern`` in ``dirs`` (globs),
    after the ``companions`` files of its folder that it dlopens by name (loaded in rounds, each
    once its own dependencies are). Returns what was loaded, or None."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    for name in sonames:
        if _load(name):
            return name
    for d in [g for pat in dirs for g in sorted(glob.glob(pat))]:
        found = sorted(glob.glob(os.path.join(d, pattern)), reverse=True)
        if not found:
            continue
        if companions:
            left = sorted(glob.glob(os.path.join(d, companions)))
            for _ in range(4):
                still = [p for p in left if not _load(p)]
                if not still or len(still) == len(left):
                    break
                left = still
        for path in found:
            if _load(path):
                return path
    return None
