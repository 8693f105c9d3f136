"""Target presets and host detection.

A preset is a JSON data file in this folder (``<name>.json``). It says which TVM target to
build for, which host compiles for it, which cross toolchain links the artifact, how a device
is reached, and what kind of artifact ships. The code here only loads presets and detects the
host CPU; it knows nothing of the CLI, the search or how measuring works.

Preset fields::

    name, description
    family          schedule family used by schedules/ ("x86", "arm", "cuda", "cortex-m")
    arch            ELF machine the artifact runs on ("x86_64", "aarch64", "armv7em")
    tvm             TVM target as a JSON dict (TVM 0.27 rejects target strings)
    host            TVM host target (device targets such as CUDA), or null
    required_features  CPU flags (as /proc/cpuinfo names them) the artifact needs at load time
    toolchain       {"cc": compiler that links the artifact, "cross": bool, "objdump": ...}
    device          how a device is reached: {"kind": "local" | "rpc" | "qemu-user" | "qemu-system"}
    artifact        "so" (self-describing shared library) or "c-bundle" (Cortex-M C project)
    detect          "host-cpu": fill mcpu, features and cores from this machine at load time;
                    "cuda-gpu": take arch and limits from this machine's NVIDIA GPU, if it has one
    available       false for presets whose issue has not landed yet; "note" says which
"""

from __future__ import annotations

import copy
import json
import os
import platform
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from deploytool.errors import TargetError

# LLVM feature names -> /proc/cpuinfo flag names, for the ISA extensions that change code
# generation. Only these become "required features" of an artifact.
_X86_FEATURES = {
    "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma",
    "f16c": "f16c", "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avxvnni": "avx_vnni", "amx-tile": "amx_tile",
    "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}
_ARM_FEATURES = {
    "neon": "asimd", "dotprod": "asimddp", "fullfp16": "asimdhp", "i8mm": "i8mm",
    "sve": "sve", "sve2": "sve2", "bf16": "bf16",
}


@dataclass(frozen=True)
class Target:
    """A resolved target preset."""

    name: str
    family: str
    arch: str
    tvm: dict[str, Any]
    description: str = ""
    host: dict[str, Any] | None = None
    required_features: tuple[str, ...] = ()
    toolchain: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=lambda: {"kind": "local"})
    artifact: str = "so"
    available: bool = True
    note: str = ""

    @property
    def vector_bits(self) -> int:
        """SIMD register width the schedules should assume."""
        feats = set(self.required_features)
        if "avx512f" in feats:
            return 512
        if "avx2" in feats or "avx" in feats:
            return 256
        if self.arch in ("x86_64", "aarch64") or "asimd" in feats or "neon" in feats:
            return 128
        return 32

    @property
    def num_cores(self) -> int:
        return int(self.tvm.get("num-cores", 1))

    def tvm_target(self):
        """The ``tvm.target.Target`` (with its host, when the target has one)."""
        import tvm

        if self.host:
            return tvm.target.Target(self.tvm, host=self.host)
        return tvm.target.Target(self.tvm)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "family": self.family, "arch": self.arch, "tvm": self.tvm,
            "host": self.host, "required_features": list(self.required_features),
            "toolchain": self.toolchain, "device": self.device, "artifact": self.artifact,
        }


def preset_names() -> list[str]:
    """Names of all presets shipped in this folder."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def load(name_or_path: str, *, cpuinfo: str | None = None) -> Target:
    """Load a preset by name (``x86``, ``x86-avx512``...) or from a JSON file path."""
    if name_or_path.endswith(".json") or os.sep in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise TargetError(f"target file '{name_or_path}' not found", "check the path")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise TargetError(f"target file '{name_or_path}' is not valid JSON ({e})",
                              "fix the file; see targets/x86-avx2.json for the format") from None
    else:
        names = preset_names()
        if name_or_path not in names:
            raise TargetError(f"unknown target '{name_or_path}'",
                              f"choose one of {', '.join(names)}, or pass a preset .json file")
        data = json.loads(resources.files(__name__).joinpath(f"{name_or_path}.json").read_text())
    return from_dict(data, cpuinfo=cpuinfo)


def from_dict(data: dict[str, Any], *, cpuinfo: str | None = None) -> Target:
    data = copy.deepcopy(data)
    missing = [k for k in ("name", "family", "arch", "tvm") if k not in data]
    if missing:
        raise TargetError(f"target preset lacks field(s) {', '.join(missing)}",
                          "add them; see targets/x86-avx2.json for the format")
    if not isinstance(data["tvm"], dict) or "kind" not in data["tvm"]:
        raise TargetError(f"target preset '{data['name']}' has no TVM target dict with a 'kind'",
                          'write it as {"kind": "llvm", "mcpu": ...}')
    detect = data.pop("detect", None)
    if detect == "host-cpu":
        data = _detect_host(data, cpuinfo)
    elif detect == "cuda-gpu":
        from deploytool import cuda

        data = cuda.detect_into(data)
    elif detect is not None:
        raise TargetError(f"target preset '{data['name']}' has unknown detect '{detect}'",
                          "use \"host-cpu\", \"cuda-gpu\" or remove it")
    if "required_features" not in data and data["tvm"].get("kind") == "llvm" and data["tvm"].get("mcpu"):
        data["required_features"] = llvm_required_features(data["tvm"])
    known = set(Target.__dataclass_fields__)
    extra = set(data) - known - {"$comment"}
    if extra:
        raise TargetError(f"target preset '{data['name']}' has unknown field(s) {', '.join(sorted(extra))}",
                          f"use only {', '.join(sorted(known))}")
    data.pop("$comment", None)
    data["required_features"] = tuple(data.get("required_features", ()))
    return Target(**data)


def llvm_required_features(tvm_target: dict[str, Any]) -> list[str]:
    """CPU flags (cpuinfo names) that code built for this LLVM target may use."""
    import tvm
    from tvm.target import codegen

    feats = codegen.llvm_get_cpu_features(tvm.target.Target(tvm_target))
    triple = tvm_target.get("mtriple", "")
    table = _ARM_FEATURES if triple.startswith(("aarch64", "arm")) else _X86_FEATURES
    enabled = {str(k) for k in feats}
    for attr in tvm_target.get("mattr", []) or []:
        if attr.startswith("+"):
            enabled.add(attr[1:])
    return sorted({table[f] for f in enabled if f in table})


def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def cpu_name(cpuinfo: str | None = None) -> str:
    """This machine's CPU, for logs and benchmark records (see deploytool.device.cpu_name, which
    boards run with no more of deploytool than that module)."""
    from deploytool.device import cpu_name as _cpu_name

    return _cpu_name(cpuinfo)


def host_cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU flags of this machine (x86 'flags', aarch64 'Features')."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def physical_cores() -> int:
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
        if n:
            return int(n)
    except Exception:  # pragma: no cover - psutil is a dependency, but stay robust
        pass
    return os.cpu_count() or 1


def default_threads() -> int:
    """Threads to run kernels on when none are asked for: ``TVM_NUM_THREADS`` where it is set to a
    whole number >= 1 (TVM's own knob, which a user exports to share a machine), else one per
    physical core."""
    from deploytool.device import env_threads

    return env_threads() or physical_cores()


def _detect_host(data: dict[str, Any], cpuinfo: str | None) -> dict[str, Any]:
    """Fill mcpu, features and cores from this machine. TVM's mcpu=native silently falls back
    to a generic CPU in 0.27, so the CPU name comes from LLVM's host detection instead."""
    from tvm.target import codegen

    arch = host_arch()
    if arch != data["arch"]:
        raise TargetError(f"target '{data['name']}' detects the host CPU, but this machine is {arch}",
                          f"use a named preset for {data['arch']} (e.g. x86-avx2)")
    mcpu = str(codegen.llvm_get_system_cpu())
    tvm_t = dict(data["tvm"])
    tvm_t["mcpu"] = mcpu if mcpu and mcpu != "generic" else tvm_t.get("mcpu", "x86-64")
    tvm_t["num-cores"] = physical_cores()
    # Never require more than this CPU actually has (LLVM's model of a CPU name can exceed
    # what a VM exposes): features = what LLVM enables for mcpu, intersected with /proc/cpuinfo.
    feats = set(llvm_required_features(tvm_t))
    flags = host_cpu_flags(cpuinfo)
    if flags:
        lacking = feats - flags
        if lacking:
            tvm_t["mattr"] = sorted(set(tvm_t.get("mattr", [])) | {f"-{_llvm_name(f)}" for f in lacking})
            feats -= lacking
    data["tvm"] = tvm_t
    data["required_features"] = sorted(feats)
    data["description"] = f"{data.get('description', '')} (detected: {mcpu}, {tvm_t['num-cores']} cores)".strip()
    return data


def _llvm_name(cpuinfo_flag: str) -> str:
    for llvm, flag in {**_X86_FEATURES, **_ARM_FEATURES}.items():
        if flag == cpuinfo_flag:
            return llvm
    return cpuinfo_flag


def missing_features(required: list[str] | tuple[str, ...], arch: str, cpuinfo: str | None = None) -> list[str]:
    """Features an artifact needs that this machine lacks ([] when it can run it)."""
    if arch != host_arch():
        return [f"arch {arch}"]
    flags = host_cpu_flags(cpuinfo)
    if not flags:  # cannot tell (no /proc/cpuinfo): let the loader try
        return []
    return sorted(f for f in required if f not in flags)


# Portable presets, most capable first: the first one this machine runs is the one whose shipped
# tuning logs it replays (`make demo`, tests/test_tuning.py::test_shipped_log_replays).
PORTABLE_X86 = ("x86-avx512", "x86-avx2")


def portable_preset(cpuinfo: str | None = None) -> str | None:
    """The most capable portable x86 preset this machine can run (None: not x86-64, or no AVX2)."""
    if host_arch() != "x86_64":
        return None
    for name in PORTABLE_X86:
        if not missing_features(load(name).required_features, "x86_64", cpuinfo):
            return name
    return None
