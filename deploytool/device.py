"""Devices reached over TVM RPC: boards, trackers, sessions.

Two ways to reach a board:

* directly, ``HOST:PORT``: a board running ``deploytool device serve`` (or TVM's rpc_server);
* through a TVM RPC tracker, ``HOST:PORT`` plus a key: a farm of boards that registered under
  that key. The tracker hands out free boards; a board is held while a session is open on it.

This module is the board side too (``serve``): it imports only the TVM runtime and the standard
library, so that a board needs no compiler, no ONNX and no onnxruntime.

Security: an RPC server runs whatever is uploaded to it. ``serve`` binds to loopback unless told
otherwise, and warns when it is told otherwise.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import os
import platform
import socket
from dataclasses import dataclass, field
from typing import Any

from deploytool.errors import DeviceError, InputError

DEFAULT_PORT = 9090
DEFAULT_TRACKER_PORT = 9190
LOOPBACK = ("127.0.0.1", "localhost", "::1")
INFO_FUNC = "deploytool.device_info"


def _host_port(text: str, what: str, default_port: int | None = None) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep:
        host, port = str(text), str(default_port) if default_port else ""
    try:
        p = int(port)
        if not 0 < p < 65536:
            raise ValueError
    except ValueError:
        raise InputError(f"{what} '{text}' is not HOST:PORT", f"write it as e.g. 192.168.1.20:{default_port or 9090}") from None
    return host or "127.0.0.1", p


@dataclass(frozen=True)
class DeviceSpec:
    """Where a board is: ``host:port`` of the board itself, or of a tracker when ``key`` is set."""

    host: str
    port: int
    key: str | None = None
    connect_timeout_s: float = 10.0

    @property
    def via_tracker(self) -> bool:
        return self.key is not None

    def describe(self) -> str:
        return f"tracker {self.host}:{self.port} key '{self.key}'" if self.via_tracker else f"board {self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "key": self.key}


def parse(*, rpc: str | None = None, tracker: str | None = None, key: str | None = None,
          device: str | None = None) -> DeviceSpec | None:
    """The device of a command line: ``--rpc HOST:PORT``, ``--tracker HOST:PORT --key KEY``, or one
    string ``--device HOST:PORT`` / ``--device KEY@HOST:PORT`` (a tracker). None: run locally."""
    given = [n for n, v in (("--rpc", rpc), ("--tracker", tracker), ("--device", device)) if v]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} both name a device", "give one of them")
    if device:
        if "@" in device:
            key, _, device = device.partition("@")
            tracker = device
        else:
            rpc = device
    if rpc:
        if key:
            raise InputError("--key goes with --tracker, not --rpc", "drop --key, or use --tracker HOST:PORT --key KEY")
        return DeviceSpec(*_host_port(rpc, "--rpc", DEFAULT_PORT))
    if tracker:
        if not key:
            raise InputError("--tracker needs --key: the kind of board to ask the tracker for",
                             "add --key KEY (the key the boards registered with; see `deploytool device list`)")
        return DeviceSpec(*_host_port(tracker, "--tracker", DEFAULT_TRACKER_PORT), key=key)
    if key:
        raise InputError("--key needs --tracker HOST:PORT", "add --tracker, or drop --key")
    return None


# ----------------------------------------------------------------------------- client side
@dataclass
class Board:
    """An open RPC session on one board."""

    spec: DeviceSpec
    session: Any
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.info.get("address") or f"{self.spec.host}:{self.spec.port}"

    @property
    def emulated(self) -> str | None:
        return self.info.get("emulated")

    def alive(self) -> bool:
        try:
            self.session.get_function("tvm.rpc.server.workpath")("x")
            return True
        except Exception:
            return False

    def close(self) -> None:
        self.session = None


def _reachable(host: str, port: int, timeout: float) -> str | None:
    """None when a TCP connection opens, else why not (the message of the socket error)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e)


def _unreachable(spec: DeviceSpec, why: str) -> DeviceError:
    if spec.via_tracker:
        return DeviceError(f"cannot reach the RPC tracker at {spec.host}:{spec.port} ({why})",
                           "start it with `deploytool tracker`, and check the address")
    return DeviceError(f"cannot reach a board at {spec.host}:{spec.port} ({why})",
                       "start `deploytool device serve` on the board (or `deploytool device emulate arm`), "
                       "and check the address")


def _with_timeout(fn, timeout: float, what: str):
    """Call ``fn`` in a helper thread; TVM's RPC calls block without a deadline of their own."""
    ex = cf.ThreadPoolExecutor(1)
    try:
        return ex.submit(fn).result(timeout=timeout)
    except cf.TimeoutError:
        raise DeviceError(f"{what} did not answer within {timeout:.0f} s", "check that it is alive, then retry") from None
    finally:
        ex.shutdown(wait=False)


def device_info(session) -> dict[str, Any]:
    """What a board running `deploytool device serve` says about itself (empty for TVM's plain server)."""
    try:
        return json.loads(session.get_function(INFO_FUNC)())
    except Exception:
        return {}


def open_board(spec: DeviceSpec, *, session_timeout_s: float = 0, wait_s: float | None = None) -> Board:
    """One session on one board (for a tracker: the first free board under the key)."""
    from tvm import rpc

    why = _reachable(spec.host, spec.port, spec.connect_timeout_s)
    if why:
        raise _unreachable(spec, why)
    if spec.via_tracker:
        free, total = tracker_free(spec)
        if total == 0:
            raise DeviceError(f"no board is registered under key '{spec.key}' at tracker {spec.host}:{spec.port}",
                              "start `deploytool device serve --tracker HOST:PORT --key KEY` on a board; "
                              "`deploytool device list` shows the keys")
        wait = wait_s if wait_s is not None else 60.0
        try:
            sess = _with_timeout(lambda: rpc.connect_tracker(spec.host, spec.port).request(
                spec.key, priority=1, session_timeout=session_timeout_s, max_retry=2), wait,
                f"tracker {spec.host}:{spec.port} (no free board under key '{spec.key}': {total} registered, all busy)")
        except DeviceError:
            raise
        except Exception as e:
            raise DeviceError(f"the tracker could not give a board under key '{spec.key}' ({_short(e)})",
                              "check the boards with `deploytool device list`") from None
    else:
        try:
            sess = _with_timeout(lambda: rpc.connect(spec.host, spec.port, session_timeout=session_timeout_s),
                                 spec.connect_timeout_s + 20, f"board {spec.host}:{spec.port}")
        except DeviceError:
            raise
        except Exception as e:
            raise _unreachable(spec, _short(e)) from None
    return Board(spec, sess, device_info(sess))


def tracker_free(spec: DeviceSpec) -> tuple[int, int]:
    """(free, registered) boards under the spec's key."""
    s = tracker_summary(spec.host, spec.port)
    total = sum(1 for srv in s.get("server_info", []) if srv.get("key", "").split(":", 1)[-1] == spec.key)
    free = int(s.get("queue_info", {}).get(spec.key, {}).get("free", 0))
    return free, total


def tracker_summary(host: str, port: int) -> dict[str, Any]:
    from tvm import rpc

    spec = DeviceSpec(host, port, key="")
    why = _reachable(host, port, spec.connect_timeout_s)
    if why:
        raise _unreachable(spec, why)
    try:
        return _with_timeout(lambda: rpc.connect_tracker(host, port).summary(), 20, f"tracker {host}:{port}")
    except DeviceError:
        raise
    except Exception as e:
        raise DeviceError(f"tracker {host}:{port} did not answer ({_short(e)})", "check that it is a TVM RPC tracker") from None


def list_devices(tracker: str) -> list[dict[str, Any]]:
    """Boards registered at a tracker: one row per key (registered, free, pending) with their addresses."""
    host, port = _host_port(tracker, "--tracker", DEFAULT_TRACKER_PORT)
    s = tracker_summary(host, port)
    rows: dict[str, dict[str, Any]] = {}
    for srv in s.get("server_info", []):
        key = srv.get("key", "").split(":", 1)[-1]
        row = rows.setdefault(key, {"key": key, "registered": 0, "free": 0, "pending": 0, "addresses": []})
        row["registered"] += 1
        row["addresses"].append("%s:%s" % tuple(srv.get("addr", ("?", "?"))))
    for key, q in s.get("queue_info", {}).items():
        row = rows.setdefault(key, {"key": key, "registered": 0, "free": 0, "pending": 0, "addresses": []})
        row["free"], row["pending"] = int(q.get("free", 0)), int(q.get("pending", 0))
    return sorted(rows.values(), key=lambda r: r["key"])


def _short(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]


# ----------------------------------------------------------------------------- board side
def cpu_name(cpuinfo: str | None = None) -> str:
    """This machine's CPU, for logs and benchmark records: the model name of /proc/cpuinfo, with
    the x86 family and model numbers. Virtual machines often show a bare "AMD EPYC" or
    "Intel(R) Xeon(R) Processor" for CPUs of different generations (Zen 4 and Zen 5 alike), whose
    tuned kernels differ; the numbers tell them apart."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip(), value.strip())  # the first processor's, on x86
    name = fields.get("model name") or fields.get("Model") or fields.get("Hardware")
    if not name:
        return platform.processor() or platform.machine()
    if fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def env_threads() -> int | None:
    """``TVM_NUM_THREADS`` where it is a whole number >= 1, else None (unset, empty, 0 or not a
    number: TVM itself then sizes its pool from the cores)."""
    try:
        n = int(os.environ.get("TVM_NUM_THREADS", ""))
    except ValueError:
        return None
    return n if n >= 1 else None


def local_info(*, emulated: str | None = None, address: str = "") -> dict[str, Any]:
    """What this machine says about itself to tuners and runners (arch, CPU, cores, emulation)."""
    cpu = cpu_name()
    try:
        import tvm

        tvm_version = tvm.__version__
    except Exception:  # a board with only tvm_ffi and the runtime libraries
        tvm_version = ""
    from deploytool import __version__

    return {"arch": platform.machine(), "cpu": cpu, "cores": os.cpu_count(), "emulated": emulated or None,
            "threads": env_threads(),
            "tvm": tvm_version, "deploytool": __version__, "address": address}


def _init_server(info_json: str) -> None:
    """Runs in the RPC server process (server_init_callback), before it listens:

    * dies with the ``serve`` process that started it (TVM would leave it serving, orphaned);
    * registers ``deploytool.device_info``, which the sessions it forks inherit;
    * keeps the server alive when a session's process dies: TVM's listen loop raises (and stops
      serving for good) when a session exits non-zero, e.g. a candidate kernel that crashed. Here
      that ends only the session; the board serves the next one."""
    import logging

    import tvm_ffi
    from tvm.rpc import server as _server

    from deploytool.measure import die_with_parent

    die_with_parent(os.getppid())  # TVM runs the server in a worker process: it must die with `serve`
    tvm_ffi.register_global_func(INFO_FUNC, lambda: info_json, override=True)
    serving = _server._serving

    def _serving_survives(sock, addr, opts, load_library):
        try:
            serving(sock, addr, opts, load_library)
        except RuntimeError as e:
            logging.getLogger("deploytool.device").warning("session from %s ended badly: %s", addr, e)
            try:
                sock.close()
            except OSError:
                pass

    _server._serving = _serving_survives


def runtime_extra_library() -> str | None:
    """The TVM wheel's libtvm_runtime_extra.so (the relax VM and friends), which a session loads."""
    try:
        import tvm

        path = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_extra.so")
        return path if os.path.exists(path) else None
    except Exception:
        return None


def security_note(host: str) -> str | None:
    if host in LOOPBACK:
        return None
    return (f"binding to {host}: anyone who can reach this port can run any code on this machine "
            "(an RPC server executes whatever is uploaded to it); serve on a trusted network only")


def serve(*, host: str = "127.0.0.1", port: int = DEFAULT_PORT, tracker: str | None = None, key: str | None = None,
          threads: int | None = None, emulated: str | None = None, on_ready=print) -> None:
    """Serve this machine as a board until killed (what `deploytool device serve` runs on the board)."""
    from tvm import rpc

    if tracker and not key:
        raise InputError("--tracker needs --key: the kind of board this is (e.g. rpi4)", "add --key KEY")
    tracker_addr = _host_port(tracker, "--tracker", DEFAULT_TRACKER_PORT) if tracker else None
    if tracker_addr:
        why = _reachable(*tracker_addr, 10.0)
        if why:
            raise _unreachable(DeviceSpec(*tracker_addr, key=key), why)
    if threads:
        os.environ["TVM_NUM_THREADS"] = str(int(threads))
    note = security_note(host)
    if note:
        on_ready(f"warning: {note}")
    info = local_info(emulated=emulated, address=f"{host}:{port}")
    try:
        server = rpc.Server(host, port, port + 1, key=key or "", tracker_addr=tracker_addr,
                            load_library=runtime_extra_library(), silent=True,
                            server_init_callback=functools.partial(_init_server, json.dumps(info)))
    except Exception as e:
        raise DeviceError(f"cannot serve on {host}:{port} ({_short(e)})",
                          "pick a free port with --port, or stop what holds this one") from None
    where = f"registered at tracker {tracker} under key '{key}'" if tracker else "direct connections"
    on_ready(f"serving on {host}:{server.port} ({info['arch']}{', emulated by ' + emulated if emulated else ''}; "
             f"{where}); Ctrl-C stops")
    try:
        server.proc.join()
    finally:
        server.terminate()


def run_tracker(*, host: str = "127.0.0.1", port: int = DEFAULT_TRACKER_PORT, on_ready=print) -> None:
    """A TVM RPC tracker for a farm of boards, until killed."""
    from tvm.rpc.tracker import Tracker

    note = security_note(host)
    if note:
        on_ready(f"warning: {note.replace('run any code on this machine', 'hand out the boards registered here')}")
    try:
        tracker = Tracker(host, port, port + 1, silent=True)
    except Exception as e:
        raise DeviceError(f"cannot start a tracker on {host}:{port} ({_short(e)})",
                          "pick a free port with --port") from None
    on_ready(f"tracker on {host}:{tracker.port}; boards join with "
             f"`deploytool device serve --tracker {host}:{tracker.port} --key KEY`; Ctrl-C stops")
    try:
        tracker.proc.join()
    finally:
        tracker.terminate()
