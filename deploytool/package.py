"""`deploytool package`: everything a board needs to run a .so without Python or the compiler.

    NAME-bundle/
      run                   native runner (C++, built for the board's architecture): ./run model.so --inputs a.npy ...
      model.so              the artifact
      lib/                  libtvm_runtime.so, libtvm_ffi.so: TVM's runtime only, from the wheels for that architecture
      include/              tvm-ffi and DLPack headers, deploytool_model.h (load, check, run), npy.h
      example/              a C++ embedding example (CMake) using the .so's metadata for names, shapes and dtypes
      bundle.json, README.md

The runtime libraries come from the installed TVM wheels when the board has this machine's
architecture, else from the apache-tvm / apache-tvm-ffi wheels for the board's architecture (same
versions), downloaded once into the cache. The runner checks, before the TVM runtime touches the
file, that the .so is a deploytool artifact for its format, TVM and tvm-ffi versions, architecture
and CPU features (deploytool_model.h).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from deploytool import wheels
from deploytool.artifact import Artifact
from deploytool.errors import ArtifactError, DeploytoolError, ToolchainError
from deploytool.targets import host_arch

NATIVE = Path(__file__).parent / "native"


class PackageError(DeploytoolError):
    """A bundle can't be made for this artifact."""


@dataclass
class PackageResult:
    path: Path
    arch: str
    bytes: int
    files: dict[str, int] = field(default_factory=dict)   # path in the bundle -> bytes

    def to_dict(self):
        return {"path": str(self.path), "arch": self.arch, "bytes": self.bytes, "files": self.files}


def runtime_libs(arch: str, progress=lambda m: None) -> dict[str, Path]:
    """libtvm_runtime.so and libtvm_ffi.so for ``arch`` (installed wheels, or the arch's wheels)."""
    if arch == host_arch():
        import tvm
        import tvm_ffi

        libs = {"libtvm_runtime.so": Path(tvm.__file__).parent / "lib" / "libtvm_runtime.so",
                "libtvm_ffi.so": Path(tvm_ffi.__file__).parent / "lib" / "libtvm_ffi.so"}
        if all(p.is_file() for p in libs.values()):
            return libs
    if arch not in wheels.PLATFORMS:
        raise PackageError(f"TVM publishes no runtime wheels for {arch}",
                           "build libtvm_runtime and libtvm_ffi for the board from source, or target aarch64/x86_64")
    from deploytool.emulator import cache_root

    v = wheels.tvm_versions()
    dest = cache_root() / "runtime" / f"{arch}-tvm{v['apache-tvm']}-ffi{v['apache-tvm-ffi']}"
    libs = {"libtvm_runtime.so": dest / "libtvm_runtime.so", "libtvm_ffi.so": dest / "libtvm_ffi.so"}
    if all(p.is_file() for p in libs.values()):
        return libs
    progress(f"downloading the {arch} TVM runtime ({', '.join(wheels.tvm_requirements())}; once)")
    with tempfile.TemporaryDirectory() as tmp:
        found = wheels.download(arch, wheels.tvm_requirements(), Path(tmp), error=PackageError)
        dest.mkdir(parents=True, exist_ok=True)
        for whl in found:
            with zipfile.ZipFile(whl) as z:
                for name in z.namelist():
                    base = name.rsplit("/", 1)[-1]
                    if base in libs and name.split("/")[-2] == "lib":
                        with z.open(name) as src, open(libs[base], "wb") as dst:
                            shutil.copyfileobj(src, dst)
    missing = [n for n, p in libs.items() if not p.is_file()]
    if missing:
        raise PackageError(f"the {arch} wheels lack {', '.join(missing)}", "report it: the wheel layout changed")
    return libs


def _headers(dst: Path) -> None:
    import tvm_ffi

    inc = Path(tvm_ffi.__file__).parent / "include"
    for sub in ("tvm", "dlpack"):
        shutil.copytree(inc / sub, dst / sub, dirs_exist_ok=True)
    for f in ("deploytool_model.h", "npy.h"):
        shutil.copy(NATIVE / f, dst / f)
    v = wheels.tvm_versions()
    (dst / "deploytool_runtime_version.h").write_text(
        "// The runtime this bundle carries; deploytool_model.h refuses .so files built for another.\n"
        f'#define DEPLOYTOOL_TVM_VERSION "{v["apache-tvm"]}"\n'
        f'#define DEPLOYTOOL_TVM_FFI_VERSION "{v["apache-tvm-ffi"]}"\n')


def build_runner(art: Artifact, include: Path, lib: Path, out: Path, source: Path = NATIVE / "run.cc") -> Path:
    """Compile a C++ program against the bundle's headers and runtime, with the C++ compiler the
    artifact was linked with (its target's toolchain)."""
    toolchain = art.target.get("toolchain", {})
    cc = toolchain.get("cc", "g++")
    if not shutil.which(cc):
        apt = " ".join(toolchain.get("apt", [])) or "g++"
        raise ToolchainError(f"no C++ compiler for {art.arch} ('{cc}')", f"install Debian's {apt} (`make toolchains`)")
    cmd = [cc, "-std=c++17", "-O2", "-s", f"-I{include}", str(source), "-o", str(out), f"-L{lib}", "-ltvm_runtime",
           "-ltvm_ffi", "-ldl", "-Wl,-rpath,$ORIGIN/lib", "-Wl,--allow-shlib-undefined"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        err = [ln for ln in r.stderr.splitlines() if "error" in ln]
        raise PackageError(f"compiling the native runner failed: {(err or r.stderr.splitlines() or ['?'])[0][:300]}",
                           "report it with the compiler output (--verbose)")
    return out


def package(artifact: str | Path, output: str | Path | None = None, progress=lambda m: None) -> PackageResult:
    art = Artifact.open(artifact)
    meta = art.metadata
    if meta.get("target", {}).get("artifact", "so") != "so":
        raise ArtifactError(f"'{art.path}' is a {meta['target']['artifact']}, not a .so",
                            "Cortex-M bundles are C projects already; package Linux .so artifacts")
    arch = art.arch
    name = art.path.stem
    output = Path(output) if output else art.path.with_name(f"{name}-bundle.tar.gz")
    libs = runtime_libs(arch, progress)
    with tempfile.TemporaryDirectory() as tmp:
        top = output.name.removesuffix(".tar.gz").removesuffix(".tgz") or f"{name}-bundle"
        root = Path(tmp) / top
        (root / "lib").mkdir(parents=True)
        (root / "include").mkdir()
        (root / "example").mkdir()
        for n, p in libs.items():
            shutil.copy(p, root / "lib" / n)
        _headers(root / "include")
        shutil.copy(art.path, root / art.path.name)
        progress(f"building the native runner for {arch}")
        build_runner(art, root / "include", root / "lib", root / "run")
        shutil.copy(NATIVE / "example.cc", root / "example" / "main.cc")
        shutil.copy(NATIVE / "CMakeLists.example.txt", root / "example" / "CMakeLists.txt")
        (root / "README.md").write_text(_readme(art, name))
        files = {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
        v = wheels.tvm_versions()
        info = {"arch": arch, "model": art.path.name, "tvm": v["apache-tvm"], "tvm_ffi": v["apache-tvm-ffi"],
                "deploytool": meta.get("deploytool_version"), "bytes": sum(files.values()),
                "runtime_bytes": sum(v for k, v in files.items() if k.startswith("lib/")) + files["run"]}
        (root / "bundle.json").write_text(json.dumps(info, indent=1) + "\n")
        output.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(output, "w:gz") as tar:
            tar.add(root, arcname=root.name)
    return PackageResult(output, arch, output.stat().st_size, files)


def _readme(art: Artifact, name: str) -> str:
    ins = "\n".join(f"- input `{s.name}`: {s.dtype}{list(s.shape)}" for s in art.inputs)
    outs = "\n".join(f"- output `{s.name}`: {s.dtype}{list(s.shape)}" for s in art.outputs)
    npys = " ".join(f"in{i}.npy" for i in range(len(art.inputs)))
    return f"""# {name}: a deploytool bundle for {art.arch}

Runs `{art.path.name}` with TVM's runtime alone: no Python, no compiler.

{ins}
{outs}

## Run it

```sh
./run {art.path.name} --describe                   # names, shapes, dtypes (from the .so's metadata)
./run {art.path.name} --inputs {npys} --outdir out  # one .npy per input, in order; writes out/<output>.npy
./run {art.path.name} --inputs {npys} --repeat 100  # also times 100 runs
```

The runner refuses a .so built for another TVM or tvm-ffi version, another architecture or CPU
features this machine lacks, with a one-line message. TVM's CPU thread pool takes
`TVM_NUM_THREADS` threads (default: the cores it sees).

## Embed it (C++17, CMake)

`example/` loads the model, fills its inputs, runs it and prints its outputs, using
`include/deploytool_model.h`:

```sh
cmake -S example -B build && cmake --build build && ./build/example {art.path.name}
```

Link with `lib/libtvm_runtime.so` and `lib/libtvm_ffi.so`; ship `lib/` next to your program (rpath
`$ORIGIN/lib`) or on `LD_LIBRARY_PATH`.
"""
