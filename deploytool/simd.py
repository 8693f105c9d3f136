"""Do the kernels of an artifact use the CPU's vector units? Read from its disassembly.

The emulated ARM board can't judge speed, so this is how a build proves that its schedules
vectorize: per kernel, count vector fused multiply-adds (``fmla v0.4s, ...`` on aarch64,
``vfmadd...ps`` on xmm/ymm/zmm registers on x86) against scalar ones (``fmadd s0, ...``,
``vfmadd...ss``; on 32-bit Armv7, whose NEON has no fused float FMA, vector multiplies and
multiply-accumulates on q/d registers). TVM emits each kernel as ``__tvm_ffi_<name>`` (argument unpacking) plus
``<name>_compute_`` (the body, also the parallel lambda): both count for ``<name>``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from deploytool.errors import ToolchainError

_FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
ARCHES = ("x86_64", "aarch64", "armv7l")  # the instruction sets analyze() reads
_ARM_VFMA = re.compile(r"^\s*[0-9a-f]+:\s+f(?:mla|mls)\s+v\d+\.(\d+)([sdh])")
_ARM_SFMA = re.compile(r"^\s*[0-9a-f]+:\s+f(?:n?madd|n?msub)\s+[sdh]\d+")
_ARM_VEC = re.compile(r"\bv\d+\.\d*[bhsd]\b|\bq\d+\b")
# Armv7 NEON has no IEEE fused multiply-add for floats: LLVM emits vmul + vadd (or vmla) on q registers.
_ARMV7_VMUL = re.compile(r"^\s*[0-9a-f]+:\s+v(?:mla|fma|mul)\.f32\s+([qd])\d+")
_ARMV7_SMUL = re.compile(r"^\s*[0-9a-f]+:\s+v(?:mla|fma|mul)\.f32\s+s\d+")
_X86_FMA = re.compile(r"^\s*[0-9a-f]+:\s+vf(?:n?madd|n?msub)\w*(p[sd]|s[sd])\s+.*?%([xyz])mm")
_BITS = {"x": 128, "y": 256, "z": 512}


@dataclass
class KernelSimd:
    name: str
    instructions: int = 0
    vector_fma: int = 0
    scalar_fma: int = 0
    vector_ops: int = 0        # instructions touching vector registers
    widest_bits: int = 0       # widest vector FMA seen

    @property
    def verdict(self) -> str:
        if self.vector_fma:
            return "vector"
        if self.scalar_fma:
            return "SCALAR"
        return "no FMA"

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}


def kernel_of(symbol: str) -> str | None:
    """The kernel a disassembled function belongs to (None for runtime glue)."""
    if symbol.startswith("__tvm_ffi_"):
        return symbol[len("__tvm_ffi_"):]
    m = re.match(r"(.+?)_compute_(?:_\d+)?$", symbol)
    return m.group(1) if m else None


def disassemble(path: str | Path, tool: str, apt: str = "binutils") -> str:
    exe = shutil.which(tool)
    if not exe:
        raise ToolchainError(f"'{tool}' is not installed", f"install Debian's {apt} (`make toolchains`)")
    out = subprocess.run([exe, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise ToolchainError(f"{tool} failed on {path}: {out.stderr.strip()[:200]}", "check that it is an ELF .so")
    return out.stdout


def analyze(disassembly: str, arch: str) -> list[KernelSimd]:
    kernels: dict[str, KernelSimd] = {}
    cur: KernelSimd | None = None
    for line in disassembly.splitlines():
        m = _FUNC.match(line)
        if m:
            name = kernel_of(m.group(1))
            cur = kernels.setdefault(name, KernelSimd(name)) if name else None
            continue
        if cur is None or ":\t" not in line:
            continue
        cur.instructions += 1
        if arch == "aarch64":
            v = _ARM_VFMA.match(line)
            if v:
                cur.vector_fma += 1
                cur.widest_bits = max(cur.widest_bits, 128 if int(v.group(1)) * {"s": 32, "d": 64, "h": 16}[v.group(2)] > 64 else 64)
            elif _ARM_SFMA.match(line):
                cur.scalar_fma += 1
            if _ARM_VEC.search(line):
                cur.vector_ops += 1
        elif arch == "armv7l":
            v = _ARMV7_VMUL.match(line)
            if v:
                cur.vector_fma += 1
                cur.widest_bits = max(cur.widest_bits, 128 if v.group(1) == "q" else 64)
            elif _ARMV7_SMUL.match(line):
                cur.scalar_fma += 1
            if re.search(r"\bq\d+\b|\.f32\s+d\d+", line):
                cur.vector_ops += 1
        else:
            x = _X86_FMA.match(line)
            if x:
                if x.group(1).startswith("p"):
                    cur.vector_fma += 1
                    cur.widest_bits = max(cur.widest_bits, _BITS[x.group(2)])
                else:
                    cur.scalar_fma += 1
            parts = line.split(":", 1)[1].split()
            mnemonic = parts[0] if parts else ""
            if re.search(r"%[yz]mm", line) or ("%xmm" in line and mnemonic.endswith(("ps", "pd"))):
                cur.vector_ops += 1
    return sorted(kernels.values(), key=lambda k: k.name)


def report(artifact: str | Path) -> tuple[str, list[KernelSimd]]:
    """(arch, per-kernel counts) of a compiled .so."""
    from deploytool.artifact import Artifact

    art = Artifact.open(artifact)
    toolchain = art.target.get("toolchain", {})
    if art.arch not in ARCHES or not toolchain.get("objdump"):
        raise ToolchainError(f"'{art.path}' is built for {art.arch}: the SIMD report reads {', '.join(ARCHES)} .so files",
                             "pass a .so built for an x86 or ARM Linux target")
    apt = " ".join(toolchain.get("apt", [])) or "binutils"
    return art.arch, analyze(disassemble(art.path, toolchain["objdump"], apt), art.arch)


def is_dense(name: str) -> bool:
    """Kernels whose work is multiply-adds: these must vectorize."""
    return any(k in name for k in ("conv", "matmul", "dense", "batch_matmul"))
