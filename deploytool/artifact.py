"""Artifacts and their self-describing metadata.

A Linux artifact is ONE shared library. Its metadata (JSON) sits in an ELF section named
``.deploytool_meta`` and in the exported symbol ``deploytool_meta`` (NUL-terminated), so it can
be read from the file alone -- without loading it, on any host, for any architecture -- by
:func:`read_metadata`, and by native code through ``dlsym``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploytool.errors import ArtifactError

SECTION = ".deploytool_meta"
SYMBOL = "deploytool_meta"
FORMAT = "deploytool-artifact/1"


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: the ONNX name, the sanitized name TVM uses, shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    tvm_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tvm_name": self.tvm_name or self.name,
                "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(name=d["name"], shape=tuple(int(x) for x in d["shape"]), dtype=d["dtype"],
                   tvm_name=d.get("tvm_name", d["name"]))

    def describe(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Artifact:
    """A compiled model on disk and its metadata."""

    path: Path
    metadata: dict[str, Any] = field(repr=False)

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self.metadata["inputs"]]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self.metadata["outputs"]]

    @property
    def target(self) -> dict[str, Any]:
        return self.metadata["target"]

    @property
    def arch(self) -> str:
        return self.metadata["target"]["arch"]

    @property
    def required_features(self) -> list[str]:
        return list(self.metadata["target"].get("required_features", []))

    @classmethod
    def open(cls, path: str | Path) -> "Artifact":
        path = Path(path)
        return cls(path=path, metadata=read_metadata(path))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def metadata_c_source(metadata: dict[str, Any]) -> str:
    """C source that places the metadata in its own ELF section and a visible symbol."""
    blob = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode() + b"\0"
    rows = [", ".join(str(b) for b in blob[i:i + 24]) for i in range(0, len(blob), 24)]
    body = ",\n  ".join(rows)
    return (
        "/* deploytool artifact metadata (JSON, NUL-terminated). Generated; do not edit. */\n"
        f'__attribute__((section("{SECTION}"), used, visibility("default")))\n'
        f"const char {SYMBOL}[{len(blob)}] = {{\n  {body}\n}};\n"
    )


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Read the metadata of an artifact without loading it (.so of any ELF arch, or bundle dir)."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"artifact '{path}' not found", "check the path, or build it with 'deploytool compile'")
    if path.is_dir():
        meta = path / "deploytool.json"
        if not meta.is_file():
            raise ArtifactError(f"'{path}' is a folder without deploytool.json",
                                "point at a .so or a bundle made by 'deploytool compile'")
        return json.loads(meta.read_text())
    data = _elf_section(path, SECTION)
    try:
        return json.loads(data.rstrip(b"\0").decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ArtifactError(f"'{path}' has a corrupt {SECTION} section",
                            "rebuild it with 'deploytool compile'") from None


def _elf_section(path: Path, name: str) -> bytes:
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise ArtifactError(f"'{path}' is not an ELF shared library",
                                "pass a .so built by 'deploytool compile'")
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if is64:
            f.seek(0x28)
            shoff, = struct.unpack(end + "Q", f.read(8))
            f.seek(0x3A)
            shentsize, shnum, shstrndx = struct.unpack(end + "HHH", f.read(6))
            shfmt = end + "IIQQQQIIQQ"
        else:
            f.seek(0x20)
            shoff, = struct.unpack(end + "I", f.read(4))
            f.seek(0x2E)
            shentsize, shnum, shstrndx = struct.unpack(end + "HHH", f.read(6))
            shfmt = end + "IIIIIIIIII"
        size = struct.calcsize(shfmt)
        if shoff == 0 or shnum == 0 or shentsize < size:
            raise ArtifactError(f"'{path}' has no ELF section table (stripped or truncated)",
                                "rebuild it with 'deploytool compile'")
        headers = []
        for i in range(shnum):
            f.seek(shoff + i * shentsize)
            raw = f.read(size)
            if len(raw) < size:
                raise ArtifactError(f"'{path}' is truncated", "copy the file again or rebuild it")
            headers.append(struct.unpack(shfmt, raw))
        # fields: name, type, flags, addr, offset, size, ...
        strtab = headers[shstrndx]
        f.seek(strtab[4])
        names = f.read(strtab[5])
        for h in headers:
            n = names[h[0]:names.index(b"\0", h[0])].decode(errors="replace")
            if n == name:
                f.seek(h[4])
                return f.read(h[5])
    raise ArtifactError(f"'{path}' has no deploytool metadata (section {name})",
                        "it was not built by deploytool; rebuild it with 'deploytool compile'")
