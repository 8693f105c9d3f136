"""Wheels of other architectures, fetched with pip: the TVM runtime for a board (the emulated
board's site folder, `deploytool package`'s runtime libraries)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# pip platform tags per architecture (uname -m), newest first
PLATFORMS = {"aarch64": ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"),
             "x86_64": ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")}


def tvm_versions() -> dict[str, str]:
    """The installed apache-tvm and apache-tvm-ffi versions: a board's runtime must match them."""
    from importlib.metadata import version

    return {"apache-tvm": version("apache-tvm"), "apache-tvm-ffi": version("apache-tvm-ffi")}


def tvm_requirements() -> list[str]:
    return [f"{name}=={v}" for name, v in tvm_versions().items()]


def download(arch: str, requirements: list[str], dest: Path, *, error, python_version: str = "3.11") -> list[Path]:
    """Binary wheels of ``requirements`` for ``arch`` into ``dest`` (no dependencies resolved);
    a failure raises ``error(problem, fix)``."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
           "--no-deps", "--python-version", python_version, "-d", str(dest)]
    for p in PLATFORMS[arch]:
        cmd += ["--platform", p]
    out = subprocess.run(cmd + list(requirements), capture_output=True, text=True)
    if out.returncode != 0:
        raise error(f"pip could not download the {arch} wheels: "
                    f"{(out.stderr.strip().splitlines() or ['?'])[-1][:200]}", "check the network (PyPI)")
    return sorted(Path(dest).glob("*.whl"))
