"""The tuning log: one versioned, append-only JSON-lines file per model and target.

    {"type": "header", "format": "deploytool-tuning-log", "version": 1, "target": {...}, "target_key": "...",
     "device": {...}, "measure": {...}, "emulated": false, "deploytool": "...", "tvm": "...", "created": "..."}
    {"type": "workload", "hash": "<structural hash>", "name": "fused_conv2d_add_relu", "flops": 1.2e8,
     "args": [[[1, 56, 56, 64], "float32"], ...], "ir": "<TVM JSON of the unscheduled kernel>"}
    {"type": "record", "workload": "<hash>", "target_key": "...", "candidate": "<hash of the scheduled kernel>",
     "source": "default" | "search" | "transfer" | "settle", "trace": [...], "latency_s": [..] | null, "error": null | "...", "time": 1.7e9}

* Each workload is stored once; records point to it by hash, so one log can serve every model
  that shares the kernel on the same target.
* Failed candidates are records too (``latency_s`` null, ``error`` set): a resumed run does not
  retry them.
* Lines are appended and flushed one by one; a line cut short by a kill is skipped (with a
  warning) on reading, and the next append starts on a fresh line.

Which targets are compatible: a log serves a build whose TVM target has the same kind, triple,
CPU and attributes (``target_key``). The core count is not part of the key: the schedules are
valid anywhere, and the header records the machine the latencies were measured on.

One log, several machines: latencies are only comparable on the machine that measured them (the
same x86-avx512 kernels rank differently on an AMD EPYC and on an Intel Xeon). A record's machine
is its ``device`` field (a name, see ``device_name``), else the header's device. ``tune`` resuming a
log on another machine writes its records with ``device`` set; ``merge`` sets it on every record
when its inputs come from different machines. The best record of a kernel is chosen among one
machine's records: the preferred machine's when it has any for that kernel (``compile`` prefers
the host it runs on), else the header's machine, else any.

How a CPU latency was timed matters as much as where: records timed cold (``"timing": "cold"``,
one call per cache flush, see deploytool.measure) never rank with records timed warm (everything
before 2026-12-01, or --no-cache-flush), whose machine ``device_of`` names with ", warm caches".

One machine, several boots: records carry the measuring host's boot id (``"boot"``), and latencies
of different boots compare through the candidates measured in both (see ``comparable``).

Records of ``"source": "transfer"`` are search trials too: another model's best schedule adapted to
this kernel (``schedules.transfer``, ``tune --schedule-library``).

Settled records (``"source": "settle"``): at the end of a run, ``tune`` times each kernel's default
and best few candidates again, in interleaved rounds, and logs them with one shared ``time``. On
a noisy machine the search's best records are the luckiest of hundreds of draws, timed minutes
apart; the settle compares the leaders side by side. From then on the kernel's best is chosen
among that settle and the records measured after it (see ``settled``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deploytool.errors import DeploytoolError

log = logging.getLogger(__name__)

FORMAT = "deploytool-tuning-log"
VERSION = 1
SETTLE = "settle"  # the source of records timed in a settle (see the module's docstring)
TRANSFER = "transfer"  # the source of records of another model's schedule adapted (schedules.transfer)


class TuningLogError(DeploytoolError):
    """A tuning log is unreadable, from another target, or does not cover a model."""


def target_key(tvm_target: dict[str, Any]) -> str:
    """The part of a TVM target that decides whether a schedule is valid and fast: kind, triple,
    CPU and attributes. (num-cores is left out: see the module docstring.)"""
    keep = {k: v for k, v in tvm_target.items() if k not in ("num-cores", "tag", "keys")}
    if isinstance(keep.get("mattr"), list):
        keep["mattr"] = sorted(keep["mattr"])
    return json.dumps(keep, sort_keys=True, separators=(",", ":"))


@dataclass
class Workload:
    hash: str
    name: str
    flops: float
    args: list
    ir: str
    calls: int = 1          # how often the model it was tuned for calls it

    def to_dict(self) -> dict[str, Any]:
        return {"type": "workload", "hash": self.hash, "name": self.name, "flops": self.flops,
                "calls": self.calls, "args": self.args, "ir": self.ir}


@dataclass
class Record:
    workload: str
    candidate: str
    trace: Any
    latency_s: list[float] | None
    error: str | None = None
    source: str = "search"
    target_key: str = ""
    time: float = 0.0
    device: str | None = None   # the machine that measured it (device_name), when not the header's
    timing: str | None = None   # "cold": a CPU record timed one cold call at a time (measure.cpu_timing)
    boot: str | None = None     # the measuring host's boot (this_boot()), for records timed on it

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.latency_s)

    @property
    def seconds(self) -> float:
        """The median latency; inf for a failed candidate."""
        if not self.ok:
            return math.inf
        xs = sorted(self.latency_s)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    def to_dict(self) -> dict[str, Any]:
        d = {"type": "record", "workload": self.workload, "target_key": self.target_key,
             "candidate": self.candidate, "source": self.source, "trace": self.trace,
             "latency_s": self.latency_s, "error": self.error, "time": self.time}
        if self.device:
            d["device"] = self.device
        if self.timing:
            d["timing"] = self.timing
        if self.boot:
            d["boot"] = self.boot
        return d


def this_boot() -> str | None:
    """This host's boot id (Linux), or None. Records measured here carry it: a cloud VM of the same
    type and name can be a different host, or the same one on a slower day, after a restart (see
    tuner: records of an earlier boot are re-measured before they count)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8] or None
    except OSError:
        return None


def device_name(device: dict[str, Any] | None) -> str:
    """The machine a latency was measured on, as a name: the GPU's on a GPU, else the CPU model
    (the board's over RPC) with the thread count the kernels ran on."""
    d = device or {}
    if d.get("gpu"):
        return str(d["gpu"])
    cpu = str(d.get("cpu") or d.get("arch") or "unknown machine")
    return f"{cpu}, {d['threads']} threads" if d.get("threads") else cpu


WARM = ", warm caches"  # see timed_name


def timed_name(machine: str, timing: str | None, cpu: bool) -> str:
    """A machine's name as latencies compare: on CPUs, records not timed cold (see
    measure.cpu_timing: before 2026-12-01 every record, or --no-cache-flush) are another
    machine's, since their latencies are not comparable with cold ones."""
    return machine + WARM if cpu and timing != "cold" else machine


def _processor(name: str) -> str:
    return name.split(", ", 1)[0]


def _vendor(name: str) -> str:
    return _processor(name).split(" ", 1)[0]


@dataclass
class TuningLog:
    """A log read into memory. ``records`` keep file order; ``skipped`` counts corrupted lines."""

    path: Path | None
    header: dict[str, Any]
    workloads: dict[str, Workload] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    skipped: int = 0

    # ------------------------------------------------------------------ reading
    @classmethod
    def read(cls, path: str | Path) -> TuningLog:
        path = _existing(path)
        header = None
        workloads: dict[str, Workload] = {}
        records: list[Record] = []
        bad: list[int] = []
        with _open_text(path, "r") as f:
            for no, line in enumerate(_lines(f, path), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    kind = obj["type"]
                    if kind == "header":
                        if header is None:
                            header = obj
                    elif kind == "workload":
                        w = Workload(obj["hash"], obj["name"], float(obj["flops"]), obj["args"], obj["ir"],
                                     int(obj.get("calls", 1)))
                        workloads.setdefault(w.hash, w)
                    elif kind == "record":
                        records.append(Record(workload=obj["workload"], candidate=obj["candidate"], trace=obj["trace"],
                                              latency_s=obj["latency_s"], error=obj.get("error"),
                                              source=obj.get("source", "search"),
                                              target_key=obj.get("target_key", ""), time=obj.get("time", 0.0),
                                              device=obj.get("device") or None, timing=obj.get("timing") or None,
                                              boot=obj.get("boot") or None))
                    else:
                        raise ValueError(kind)
                except (ValueError, KeyError, TypeError):
                    bad.append(no)
        if header is None:
            raise TuningLogError(f"'{path}' is not a deploytool tuning log (no header line)",
                                 "pass a log written by `deploytool tune`")
        if header.get("format") != FORMAT or int(header.get("version", 0)) > VERSION:
            raise TuningLogError(f"'{path}' is a {header.get('format')} v{header.get('version')} log; this "
                                 f"deploytool reads {FORMAT} v{VERSION}", "upgrade deploytool, or retune")
        if bad:
            log.warning("tuning log %s: skipped %d corrupted line(s) (line %s%s)", path, len(bad), bad[0],
                        ", ..." if len(bad) > 1 else "")
        return cls(path=path, header=header, workloads=workloads, records=records, skipped=len(bad))

    @property
    def target_key(self) -> str:
        return self.header.get("target_key", "")

    @property
    def target_name(self) -> str:
        return self.header.get("target", {}).get("name", "?")

    def sha256(self) -> str:
        return sha256_of(self.path)

    def check_target(self, target) -> None:
        """Raise TuningLogError unless this log was made for a target compatible with ``target``."""
        key = target_key(target.tvm)
        if key != self.target_key:
            raise TuningLogError(
                f"tuning log '{self.path}' was made for target '{self.target_name}' ({_short(self.target_key)}), "
                f"not '{target.name}' ({_short(key)})",
                f"use --target {self.target_name}, or tune for {target.name} with `deploytool tune`")

    # ------------------------------------------------------------------ queries
    def by_workload(self) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = {}
        for r in self.records:
            out.setdefault(r.workload, []).append(r)
        return out

    def by_workload_and_device(self) -> dict[tuple[str, str], list[Record]]:
        """(workload, machine) -> its records, in log order: the sets whose latencies compare."""
        out: dict[tuple[str, str], list[Record]] = {}
        for r in self.records:
            out.setdefault((r.workload, self.device_of(r)), []).append(r)
        return out

    @property
    def device(self) -> str:
        """The header's machine (device_name): the one a record without its own ``device`` came from."""
        return device_name(self.header.get("device"))

    @property
    def cpu(self) -> bool:
        return (self.header.get("target") or {}).get("family") != "cuda"

    @property
    def home(self) -> str:
        """The machine (as device_of names it) of the run that wrote the header."""
        cold = (self.header.get("measure") or {}).get("cpu_timing") == "cold"
        return timed_name(self.device, "cold" if cold else None, self.cpu)

    def machine_of(self, r: Record) -> str:
        """The machine that measured a record (its device_name, however it was timed)."""
        return r.device or self.device

    def device_of(self, r: Record) -> str:
        """The machine a record's latency compares within: machine_of, plus how it was timed."""
        return timed_name(self.machine_of(r), r.timing, self.cpu)

    def devices(self) -> dict[str, int]:
        """Machine name -> how many records it measured, header's machine first."""
        out: dict[str, int] = {self.home: 0}
        for r in self.records:
            d = self.device_of(r)
            out[d] = out.get(d, 0) + 1
        return {d: n for d, n in out.items() if n} or {self.home: 0}

    def match_device(self, name: str | None) -> str | None:
        """The machine of this log that ``name`` (device_name of a machine) should take its records
        from: the same name, else the same processor with another thread count; None if neither."""
        if not name:
            return None
        devs = self.devices()
        if name in devs:
            return name
        same = [d for d in devs if _processor(d) == _processor(name)]
        return max(same, key=lambda d: (not d.endswith(WARM), devs[d])) if same else None

    def nearest_device(self, name: str | None) -> str | None:
        """The machine of this log whose records should serve ``name``: match_device's, else, for a
        machine the log has no records of, the nearest one: records timed cold before warm ones
        (older logs; their schedules predate the cold timing), then the same processor vendor, then
        the same CPU family, then the most records. None if ``name`` is None."""
        dev = self.match_device(name)
        if dev is not None or not name:
            return dev
        devs = self.devices()
        vendor = _vendor(name)
        fam = re.search(r"\(family (\d+) ", name)

        def key(d: str):
            return (not d.endswith(WARM), _vendor(d) == vendor,
                    bool(fam) and f"(family {fam.group(1)} " in d, devs[d])

        return max(devs, key=key)

    def require_device(self, name: str, option: str = "") -> str:
        """match_device(name), or a TuningLogError naming the log's machines (``option``: the
        command-line option that named it, for the message)."""
        dev = self.match_device(name)
        if dev is None:
            where = Path(str(self.path)).name if self.path else "the tuning log"
            raise TuningLogError(f"{option + ' ' if option else ''}'{name}': tuning log {where} has no records "
                                 "from that machine", "pick one of: " + "; ".join(f"'{d}'" for d in self.devices()))
        return dev

    def best(self, workload: str, device: str | None = None) -> Record | None:
        """The best valid record of a workload (lowest median latency, earliest on ties) among one
        machine's records: ``device``'s if it has any, else the header's machine's, else any."""
        return self.best_by_workload(device).get(workload)

    def best_by_workload(self, device: str | None = None) -> dict[str, Record]:
        """Per workload, the record ``best`` picks: among its latest settle and the records after
        it, where it has been settled (see ``settled``). Its latency is as of its machine's latest
        boot (see comparable): a record of an earlier boot comes back as a copy with its latency
        scaled."""
        prefs = [d for d in (device, self.home) if d]
        best: dict[str, tuple[int, float, int, Record]] = {}
        order = {id(r): i for i, r in enumerate(self.records)}
        for (h, d), recs in self.by_workload_and_device().items():
            rank = prefs.index(d) if d in prefs else len(prefs)
            for r, s in settled(comparable(recs)):
                key = (rank, s, order[id(r)])
                cur = best.get(h)
                if cur is None or key < cur[:3]:
                    best[h] = (*key, r if s == r.seconds else replace(r, latency_s=[x * s / r.seconds
                                                                                     for x in r.latency_s]))
        return {h: v[3] for h, v in best.items()}


def comparable(recs: list[Record]) -> list[tuple[Record, float]]:
    """One machine's valid records of one workload, each with its latency as of the machine's latest
    boot. A machine can run slower or faster after a restart (a cloud VM: another host, or the same
    one on a slower day: ResNet-50's best candidates re-timed 1.16-1.36x their records one session
    later), so latencies of two boots compare only through candidates measured in both, which the
    tuner provides: on resuming in a new boot it measures the default and the best candidates of the
    earlier boots again. Boots are taken from the latest back; an earlier boot's latencies are scaled
    by the median ratio, over the candidates a later boot measured again, of the later (scaled)
    latency to its own. A candidate measured in several boots counts with its latest measurement
    only. A boot that shares no candidate with a later one keeps its latencies (nothing tells them
    apart); records without a boot id (older, or a board's over RPC) form one boot of their own."""
    boots: dict[str | None, list[Record]] = {}
    for r in recs:
        boots.setdefault(r.boot, []).append(r)
    if len(boots) == 1:
        return [(r, r.seconds) for r in recs if r.ok]
    order = sorted(boots, key=lambda b: max(r.time for r in boots[b]), reverse=True)
    latest: dict[str, float | None] = {}   # candidate -> its scaled latency in the latest boot that measured it
    out = []
    for b in order:
        mine = boots[b]
        ratios = sorted(latest[r.candidate] / r.seconds for r in mine
                        if r.ok and latest.get(r.candidate) is not None)
        n = len(ratios)
        scale = 1.0 if not n else ratios[n // 2] if n % 2 else 0.5 * (ratios[n // 2 - 1] + ratios[n // 2])
        seen = {}
        for r in mine:
            if r.candidate in latest:  # measured again in a later boot
                continue
            s = r.seconds * scale if r.ok else None
            seen[r.candidate] = s if seen.get(r.candidate) is None else min(seen[r.candidate], s or math.inf)
            if s is not None:
                out.append((r, s))
        latest.update(seen)
    return out


def settled(pairs: list[tuple[Record, float]]) -> list[tuple[Record, float]]:
    """The (record, latency) pairs of one machine's workload (``comparable``'s) that compete for
    its best. Where the workload was settled, its latest settle's records and the records measured
    after it: the settle re-timed the leaders of everything before it side by side, so their older
    (luckier) records no longer count. Records after it come from a run stopped before its own
    settle. Without a settle, all of them."""
    times = [r.time for r, _ in pairs if r.source == SETTLE]
    if not times:
        return pairs
    last = max(times)
    return [(r, s) for r, s in pairs if (r.time == last if r.source == SETTLE else r.time > last)]


def _short(key: str) -> str:
    try:
        d = json.loads(key)
    except ValueError:
        return key
    return " ".join(f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in d.items())


def is_compressed(path) -> bool:
    """A ``.jsonl.gz`` log: the same JSON lines, gzip-compressed (CUDA logs shrink ~35x: their traces
    repeat serialized index maps). Read everywhere; written whole (merge, prune), never appended."""
    return str(path).endswith(".gz")


def require_appendable(path) -> None:
    """Tuning appends record by record, flushed, which a gzip file cannot take safely."""
    if is_compressed(path):
        raise TuningLogError(f"cannot append to the compressed tuning log '{path}'",
                             f"decompress it first (gunzip -k {path}) and tune into the .jsonl; gzip it again to "
                             "ship it")


def _existing(path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise TuningLogError(f"tuning log '{path}' does not exist",
                             "check the path, or create one with `deploytool tune`")
    return path


def read_header(path) -> dict[str, Any]:
    """A log's header alone ({} if it has none), without reading its records."""
    with _open_text(_existing(path), "r") as f:
        for line in _lines(f, path):
            try:
                obj = json.loads(line) if line.strip() else {}
            except ValueError:
                continue  # as ``read`` does: a bad line (one cut short) is skipped
            if isinstance(obj, dict) and obj.get("type") == "header":
                return obj
    return {}


def _open_text(path, mode: str, compressed: bool | None = None):
    if is_compressed(path) if compressed is None else compressed:
        return gzip.open(path, mode + "t", encoding="utf-8", errors="replace")
    return open(path, mode, encoding="utf-8", errors="replace")  # noqa: SIM115 (the caller's with closes it)


def _lines(f, path):
    """The lines of a log; a compressed one cut short (a copy interrupted) yields what it holds."""
    try:
        yield from f
    except (EOFError, OSError) as e:
        log.warning("tuning log %s ends early (%s): reading what it holds", path, e)


def sha256_of(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def text_sha256s(path) -> tuple[str, set[str]]:
    """The sha256 of a log's text (decompressed if it is a .jsonl.gz) and the sha256s of every
    earlier version it may have had: logs are append-only, so each of those is its text up to a line
    end. A compressed log's raw sha256 is among them too (what an older dataset row may have keyed
    on; a plain log's is its text's)."""
    compressed = is_compressed(path)
    h, earlier = hashlib.sha256(), {sha256_of(path)} if compressed else set()
    with (gzip.open if compressed else open)(path, "rb") as f:
        for line in f:
            h.update(line)
            if line.endswith(b"\n"):
                earlier.add(h.copy().hexdigest())
    text = h.hexdigest()
    earlier.add(text)
    return text, earlier


def make_header(target, *, device: dict[str, Any], measure: dict[str, Any], emulated: bool = False,
                model: dict[str, Any] | None = None) -> dict[str, Any]:
    import tvm

    from deploytool import __version__

    return {"type": "header", "format": FORMAT, "version": VERSION, "deploytool": __version__,
            "tvm": tvm.__version__, "target": target.to_dict(), "target_key": target_key(target.tvm),
            "device": device, "measure": measure, "emulated": emulated, "model": model,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


class LogWriter:
    """Appends lines to a log, flushing each one. Writes the header when the file is new, each
    workload once, and starts on a fresh line after a line cut short by a kill."""

    def __init__(self, path: str | Path, header: dict[str, Any], known_workloads=()):
        self.path = Path(path)
        require_appendable(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        needs_newline = False
        if not new:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for appends)
        if needs_newline:
            self._f.write("\n")
        self._workloads = set(known_workloads)
        if new:
            self._write(header)

    def _write(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()

    def workload(self, w: Workload) -> None:
        if w.hash not in self._workloads:
            self._workloads.add(w.hash)
            self._write(w.to_dict())

    def record(self, r: Record) -> None:
        if not r.time:
            r.time = time.time()
        self._write(r.to_dict())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_log(path: str | Path, header: dict[str, Any], workloads, records) -> None:
    """Write a whole log at once (merge, prune), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with _open_text(tmp, "w", compressed=is_compressed(path)) as f:
        f.write(json.dumps(header, separators=(",", ":")) + "\n")
        for w in workloads:
            f.write(json.dumps(w.to_dict(), separators=(",", ":")) + "\n")
        for r in records:
            f.write(json.dumps(r.to_dict(), separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def to_py(obj):
    """A TVM FFI value (Array, Map, IntImm, FloatImm, String) as plain JSON-able Python."""
    from tvm import tirx

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tirx.IntImm):
        return int(obj.value)
    if isinstance(obj, tirx.FloatImm):
        return float(obj.value)
    if hasattr(obj, "items"):
        return {str(k): to_py(v) for k, v in obj.items()}
    return [to_py(x) for x in obj]
