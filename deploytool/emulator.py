"""An emulated ARM board: an aarch64 sysroot with the TVM runtime, serving RPC under qemu-user.

For tests and for users without hardware. What works (and the traps on the way):

* the sysroot comes from Debian's arm64 packages (python3.11, libstdc++6, libgomp1 and their
  dependencies), resolved by apt through a private APT_CONFIG (nothing is installed on the host),
  downloaded and unpacked with ``dpkg-deb -x``;
* Python packages come from the aarch64 wheels of apache-tvm (without its 240 MB compiler library:
  a board needs only the runtime), apache-tvm-ffi, numpy, ml_dtypes, typing_extensions,
  cloudpickle and psutil, unzipped into the board's site folder;
* the board runs ``python -m deploytool device serve --emulated qemu-aarch64`` under
  ``qemu-aarch64 -L sysroot``: the same command a real board runs;
* TVM's RPC server starts its worker with ``sys.executable``, an aarch64 binary the host can't
  exec: a ``sitecustomize`` points it at a wrapper script that runs under qemu;
* the server's port range is [port, port + 1): TVM's default end (9199) fails for ports above it;
* the board runs in its own process group and is stopped by killing the group (the server forks a
  process per session).

Emulated timings are ~100x slower than a real board and noisy: good for correctness and for
exercising the pipeline, never for judging schedules. The tuning log says so (``emulated``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from deploytool.errors import DeviceError, ToolchainError

RECIPE_VERSION = 1


@dataclass(frozen=True)
class BoardRecipe:
    name: str
    arch: str                      # what the board reports (uname -m)
    qemu: str                      # qemu-user binary
    deb_arch: str                  # Debian architecture
    python: str                    # the Debian Python the board runs
    python_version: str            # for pip's wheel selection
    packages: tuple[str, ...] = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "libgomp1")
    wheels: tuple[str, ...] = ("numpy>=1.26,<2.5", "ml_dtypes>=0.5,<0.7", "typing_extensions", "cloudpickle>=3,<4",
                               "psutil>=5.9,<8")


BOARDS = {
    "arm": BoardRecipe("arm", "aarch64", "qemu-aarch64", "arm64", "python3.11", "3.11"),
}
# Parts of the TVM wheel a board never uses (the compiler, CUDA, third-party headers).
_SKIP = ("tvm/lib/libtvm_compiler.so", "tvm/lib/libtvm_runtime_cuda.so", "tvm/3rdparty/", "tvm_ffi/include/",
         "tvm/include/")


def cache_root() -> Path:
    return Path(os.environ.get("DEPLOYTOOL_CACHE", Path.home() / ".cache" / "deploytool"))


def recipe(name: str) -> BoardRecipe:
    if name not in BOARDS:
        raise DeviceError(f"no emulated board '{name}'", f"choose one of {', '.join(BOARDS)}")
    return BOARDS[name]


def _versions() -> dict[str, str]:
    from deploytool import wheels

    return {"recipe": str(RECIPE_VERSION), **wheels.tvm_versions()}


# ----------------------------------------------------------------------------- building the sysroot
def _need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise ToolchainError(f"'{tool}' is not installed (the emulated board needs it)",
                             f"install Debian's {package} (`make toolchains` does)")
    return path


def _apt_uris(r: BoardRecipe, work: Path) -> list[tuple[str, str, int]]:
    """(url, file name, size) of the packages' dependency closure, resolved by apt against an empty
    package state, so that everything the board needs is fetched and nothing on the host changes."""
    _need("apt-get", "apt")
    apt = work / "apt"
    for d in ("state/lists/partial", "cache/archives/partial", "etc/sources.list.d", "etc/preferences.d",
              "etc/apt.conf.d", "etc/trusted.gpg.d"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "state/status").touch()
    sources = [p for p in Path("/etc/apt/sources.list.d").glob("*.sources")] + \
              [p for p in Path("/etc/apt/sources.list.d").glob("*.list")]
    if Path("/etc/apt/sources.list").exists():
        sources.append(Path("/etc/apt/sources.list"))
    for p in sources:
        shutil.copy(p, apt / "etc/sources.list.d" / p.name if p.name != "sources.list" else apt / "etc/sources.list")
    conf = apt / "apt.conf"
    conf.write_text("\n".join([
        f'Dir::State "{apt}/state";', f'Dir::State::status "{apt}/state/status";', f'Dir::Cache "{apt}/cache";',
        f'Dir::Etc "{apt}/etc";', 'Dir::Etc::Trusted "/etc/apt/trusted.gpg";',
        'Dir::Etc::TrustedParts "/etc/apt/trusted.gpg.d";', f'APT::Architecture "{r.deb_arch}";',
        f'APT::Architectures {{ "{r.deb_arch}"; }};', 'APT::Install-Recommends "false";', 'Debug::NoLocking "true";',
    ]) + "\n")
    env = dict(os.environ, APT_CONFIG=str(conf), DEBIAN_FRONTEND="noninteractive")
    upd = subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
    if upd.returncode != 0:
        raise DeviceError(f"apt-get update for the {r.deb_arch} sysroot failed: {upd.stderr.strip()[-200:]}",
                          "check the network and /etc/apt/sources.list.d")
    out = subprocess.run(["apt-get", "install", "-qq", "-y", "--print-uris", *r.packages], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise DeviceError(f"apt could not resolve {' '.join(r.packages)} for {r.deb_arch}: "
                          f"{out.stderr.strip()[-200:]}", "check /etc/apt/sources.list.d (Debian bookworm works)")
    uris = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith("'"):
            uris.append((parts[0].strip("'"), parts[1], int(parts[2])))
    return uris


def _download(url: str, dest: Path, size: int) -> None:
    for attempt in range(3):
        try:
            with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as f:
                shutil.copyfileobj(resp, f)
            if size and dest.stat().st_size != size:
                raise OSError(f"{dest.name}: {dest.stat().st_size} bytes, expected {size}")
            return
        except OSError as e:
            if attempt == 2:
                raise DeviceError(f"downloading {url} failed ({e})", "check the network and retry") from None
            time.sleep(1 + attempt)


def _wheels(r: BoardRecipe, dest: Path) -> list[Path]:
    from deploytool import wheels

    return wheels.download(r.arch, wheels.tvm_requirements() + list(r.wheels), dest, error=DeviceError,
                           python_version=r.python_version)


def _unzip(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if any(info.filename.startswith(s) for s in _SKIP):
                continue
            z.extract(info, site)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(site / info.filename, mode & 0o777 | 0o600)


def board_dir(name: str = "arm") -> Path:
    return cache_root() / "boards" / name


def build(name: str = "arm", *, progress=lambda msg: None, force: bool = False) -> Path:
    """Build (once; cached) the emulated board's sysroot and site folder; returns its folder."""
    r = recipe(name)
    _need(r.qemu, "qemu-user")
    _need("dpkg-deb", "dpkg")
    root = board_dir(name)
    root.parent.mkdir(parents=True, exist_ok=True)
    stamp = root / "board.json"
    with open(root.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers may ask at once
        if not force and stamp.exists() and json.loads(stamp.read_text()).get("versions") == _versions():
            return root
        t0 = time.perf_counter()
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root.parent))
        try:
            progress(f"building the emulated {r.arch} board in {root} (once)")
            uris = _apt_uris(r, work)
            debs = work / "debs"
            debs.mkdir()
            progress(f"downloading {len(uris)} Debian {r.deb_arch} packages "
                     f"({sum(s for _, _, s in uris) / 1e6:.0f} MB)")
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda u: _download(u[0], debs / u[1], u[2]), uris))
            sysroot = work / "board" / "sysroot"
            sysroot.mkdir(parents=True)
            for deb in sorted(debs.glob("*.deb")):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(sysroot)], check=True)
            progress(f"downloading the {r.arch} wheels (TVM runtime, numpy, ...)")
            site = work / "board" / "site"
            site.mkdir()
            for whl in _wheels(r, work / "wheels"):
                _unzip(whl, site)
            (site / "sitecustomize.py").write_text(
                "# TVM's RPC server starts workers with sys.executable: on the emulated board that must be the\n"
                "# wrapper that runs Python under qemu, not the aarch64 binary itself.\n"
                "import os, sys\n"
                "_w = os.environ.get('DEPLOYTOOL_BOARD_PYTHON')\n"
                "if _w:\n    sys.executable = _w\n")
            if root.exists():
                shutil.rmtree(root)
            (work / "board").rename(root)
            _write_wrapper(r, root)
            size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
            stamp.write_text(json.dumps({"versions": _versions(), "arch": r.arch, "bytes": size,
                                         "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
            progress(f"board ready: {size / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return root


def _write_wrapper(r: BoardRecipe, root: Path) -> Path:
    wrapper = root / "bin" / "python3"
    wrapper.parent.mkdir(exist_ok=True)
    text = ("#!/bin/sh\n"
            f"# Python of the emulated {r.arch} board: the Debian {r.python} binary under {r.qemu}.\n"
            f'export PYTHONPATH="${{DEPLOYTOOL_BOARD_PATH:+$DEPLOYTOOL_BOARD_PATH:}}{root}/site" PYTHONNOUSERSITE=1 '
            f'PYTHONDONTWRITEBYTECODE=1 DEPLOYTOOL_BOARD_PYTHON="{wrapper}"\n'
            f'exec {shutil.which(r.qemu) or r.qemu} -L "{root}/sysroot" "{root}/sysroot/usr/bin/{r.python}" "$@"\n')
    if not wrapper.exists() or wrapper.read_text() != text:  # never rewritten under a running board
        tmp = wrapper.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(wrapper)
    return wrapper


def _install_deploytool(root: Path) -> Path:
    """Put this deploytool's modules on the board (as `pip install deploytool` would), in a folder of
    this board's own: boards sharing the sysroot may run other checkouts at the same time."""
    import deploytool

    (root / "run").mkdir(exist_ok=True)
    inst = Path(tempfile.mkdtemp(prefix="deploytool-", dir=root / "run"))
    (inst / "deploytool").mkdir()
    for f in Path(deploytool.__file__).parent.glob("*.py"):
        shutil.copy(f, inst / "deploytool" / f.name)
    return inst


# ----------------------------------------------------------------------------- running it
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EmulatedBoard:
    """A running emulated board (its own process group); ``stop()`` kills it and its sessions."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, arch: str, files: Path | None = None):
        self.proc, self.host, self.port, self.arch, self.files = proc, host, port, arch, files
        self.lines: list[str] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.files is not None:
            shutil.rmtree(self.files, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start(name: str = "arm", *, host: str = "127.0.0.1", port: int | None = None, tracker: str | None = None,
          key: str | None = None, threads: int | None = None, progress=lambda msg: None,
          ready_timeout_s: float = 180.0) -> EmulatedBoard:
    """Start an emulated board serving RPC (built first if needed); returns once it serves."""
    r = recipe(name)
    root = build(name, progress=progress)
    files = _install_deploytool(root)
    wrapper = _write_wrapper(r, root)
    port = port or free_port(host)
    cmd = [str(wrapper), "-m", "deploytool", "device", "serve", "--host", host, "--port", str(port),
           "--emulated", r.qemu]
    if tracker:
        cmd += ["--tracker", tracker, "--key", key or name]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=root, env=dict(os.environ, DEPLOYTOOL_BOARD_PATH=str(files)))
    board = EmulatedBoard(proc, host, port, r.arch, files)
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            board.lines.append(line.rstrip())
            if line.startswith("serving on"):
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    progress(f"starting the emulated {r.arch} board on {host}:{port} (qemu; ~20 s)")
    if not ready.wait(ready_timeout_s) or not board.alive():
        tail = " | ".join(board.lines[-3:])
        board.stop()
        raise DeviceError(f"the emulated board did not start within {ready_timeout_s:.0f} s ({tail or 'no output'})",
                          "run `deploytool device emulate arm` in a terminal to see why")
    return board
