"""Operations on tuning logs: show, merge, prune, check coverage, and tuning curves."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploytool.tuninglog import SETTLE, Record, TuningLog, TuningLogError, comparable, settled, write_log


@dataclass
class WorkloadStats:
    hash: str
    name: str
    flops: float
    calls: int
    records: int
    failures: int
    default_s: float | None
    best_s: float | None

    @property
    def speedup(self) -> float | None:
        if self.default_s and self.best_s:
            return self.default_s / self.best_s
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.hash, "name": self.name, "flops": self.flops, "calls": self.calls,
                "records": self.records, "failures": self.failures, "default_s": self.default_s,
                "best_s": self.best_s, "speedup": self.speedup}


@dataclass
class LogStats:
    path: str
    header: dict[str, Any]
    workloads: list[WorkloadStats]
    records: int
    skipped_lines: int
    sha256: str
    device: str = ""                                    # whose latencies the workload rows show
    devices: dict[str, int] = field(default_factory=dict)  # machine -> records it measured

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "header": self.header, "records": self.records,
                "skipped_lines": self.skipped_lines, "sha256": self.sha256, "device": self.device,
                "devices": self.devices, "workloads": [w.to_dict() for w in self.workloads]}


def stats(tlog: TuningLog, device: str | None = None) -> LogStats:
    """Per-workload statistics of one machine's records: ``device`` (a name from
    ``tlog.devices()``, or a machine's device_name matched by processor), else the header's."""
    dev = tlog.require_device(device, "--device") if device is not None else tlog.home
    per = {h: recs for (h, d), recs in tlog.by_workload_and_device().items() if d == dev}
    out = []
    for h, recs in per.items():
        w = tlog.workloads.get(h)
        every = comparable(recs)  # latencies as of the machine's latest boot
        comp = settled(every)  # what competes for the best: after a settle, its side-by-side times
        ok = [x for _, x in comp]
        defaults = {r.candidate for r in recs if r.source == "default"}
        dflt = [x for r, x in comp if r.candidate in defaults] or [x for r, x in every if r.source == "default"]
        out.append(WorkloadStats(hash=h, name=w.name if w else "?", flops=w.flops if w else 0.0,
                                 calls=_calls(w), records=len(recs), failures=sum(1 for r in recs if not r.ok),
                                 default_s=min(dflt) if dflt else None, best_s=min(ok) if ok else None))
    out.sort(key=lambda s: -(s.best_s or 0) * s.calls)
    return LogStats(path=str(tlog.path), header=tlog.header, workloads=out, records=len(tlog.records),
                    skipped_lines=tlog.skipped, sha256=tlog.sha256(), device=dev, devices=tlog.devices())


def _calls(w) -> int:
    return int(getattr(w, "calls", 1) or 1) if w is not None else 1


def merge(logs: list[TuningLog], output: str | Path) -> TuningLog:
    """Combine logs of ONE target (from several runs or machines): every distinct record is kept,
    with the machine that measured it (the first log's header names the default machine; a record
    of another machine carries its ``device``)."""
    if not logs:
        raise TuningLogError("nothing to merge", "pass two or more logs")
    key = logs[0].target_key
    for lg in logs[1:]:
        if lg.target_key != key:
            raise TuningLogError(f"'{lg.path}' is for target '{lg.target_name}', '{logs[0].path}' for "
                                 f"'{logs[0].target_name}'", "merge only logs of the same target")
    header = dict(logs[0].header)
    header["merged_from"] = [str(lg.path) for lg in logs]
    home = logs[0].device  # records of the first log's header machine need no ``device``
    workloads, seen, records = {}, set(), []
    for lg in logs:
        for h, w in lg.workloads.items():
            workloads.setdefault(h, w)
        for r in lg.records:
            machine = lg.machine_of(r)
            k = (r.workload, r.candidate, r.time, tuple(r.latency_s or ()), lg.device_of(r))
            if k not in seen:
                seen.add(k)
                records.append(dataclasses.replace(r, device=None if machine == home else machine))
    write_log(output, header, workloads.values(), records)
    return TuningLog.read(output)


def prune(tlog: TuningLog, keep: int, output: str | Path | None = None,
          device: str | None = None) -> tuple[TuningLog, int]:
    """Keep the ``keep`` best valid records per workload and machine (ranked as of the machine's
    latest boot), its default-schedule and settle records (the baseline; the side-by-side verdicts
    that pick the best) and the records of candidates measured
    in several boots (what ties the boots' latencies together, see tuninglog.comparable); failures
    go. With ``device``, only that machine's records are pruned. Returns the new log and how many
    records were dropped."""
    if keep < 1:
        raise TuningLogError(f"--keep {keep} would drop every record", "keep at least 1 record per workload")
    only = tlog.require_device(device, "--device") if device is not None else None
    kept: list[Record] = []
    for (_h, dev), recs in tlog.by_workload_and_device().items():
        if only is not None and dev != only:
            kept += recs
            continue
        best = [r for r, _ in sorted(settled(comparable(recs)), key=lambda p: p[1])[:keep]]
        ids = {id(r) for r in best}
        ids |= {id(r) for r in recs if r.source in ("default", SETTLE) and r.ok}
        boots: dict[str, set] = {}
        for r in recs:
            if r.ok:
                boots.setdefault(r.candidate, set()).add(r.boot)
        ids |= {id(r) for r in recs if r.ok and len(boots[r.candidate]) > 1}
        kept += [r for r in recs if id(r) in ids]
    order = {id(r): i for i, r in enumerate(tlog.records)}
    kept.sort(key=lambda r: order[id(r)])
    out = Path(output) if output else tlog.path
    write_log(out, tlog.header, tlog.workloads.values(), kept)
    return TuningLog.read(out), len(tlog.records) - len(kept)


@dataclass
class Coverage:
    covered: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing


def coverage(tlog: TuningLog, task_list) -> Coverage:
    best = tlog.best_by_workload()
    cov = Coverage()
    for t in task_list:
        (cov.covered if t.workload_hash in best else cov.missing).append(t.name)
    return cov


def curves(tlog: TuningLog, device: str | None = None) -> tuple[list[tuple[int, float]],
                                                                dict[str, list[tuple[int, float]]]]:
    """Tuning curves from one machine's records (``device``, else the header's), in record order:
    the estimated end-to-end latency (sum over workloads of best-so-far x calls) after each search
    trial, and per workload (best so far vs its own trials). A workload's default-schedule record
    is its starting point."""
    dev = tlog.match_device(device) if device else tlog.home
    best: dict[str, float] = {}
    per: dict[str, list[tuple[int, float]]] = {}
    n_per: dict[str, int] = {}
    total: list[tuple[int, float]] = []
    calls = {h: _calls(w) for h, w in tlog.workloads.items()}
    n = 0
    for r in tlog.records:
        if tlog.device_of(r) != dev or r.source == SETTLE:  # the curves are the search's
            continue
        cur = best.get(r.workload, math.inf)
        if r.ok and r.seconds < cur:
            best[r.workload] = r.seconds
        if r.source == "default":
            per.setdefault(r.workload, []).append((0, best.get(r.workload, math.inf)))
            continue
        n += 1
        n_per[r.workload] = n_per.get(r.workload, 0) + 1
        per.setdefault(r.workload, []).append((n_per[r.workload], best.get(r.workload, math.inf)))
        total.append((n, sum(v * calls.get(h, 1) for h, v in best.items() if v < math.inf)))
    return total, per


def plot(tlog: TuningLog, output: str | Path, top: int = 8, device: str | None = None) -> Path:
    """Draw one machine's tuning curves as a PNG: end to end (estimated) and the ``top`` heaviest
    kernels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = stats(tlog, device)
    total, per = curves(tlog, s.device)
    st = {w.hash: w for w in s.workloads}
    fig, (a, b) = plt.subplots(1, 2, figsize=(15, 4.8))
    if total:
        xs, ys = zip(*total)
        a.plot(xs, [y * 1e3 for y in ys], color="tab:blue")
    a.set_xlabel("search trials (all kernels)")
    a.set_ylabel("estimated end-to-end latency (ms)")
    a.set_title("end to end: sum of best kernel latency x calls")
    a.grid(alpha=0.3)
    heavy = sorted(per, key=lambda h: -((st[h].best_s or 0) * st[h].calls if h in st else 0))[:top]
    for h in heavy:
        pts = [(x, y) for x, y in per[h] if y < math.inf]
        if not pts:
            continue
        xs, ys = zip(*pts)
        b.step(xs, [y * 1e3 for y in ys], where="post", label=(st[h].name if h in st else h)[:40])
    b.set_yscale("log")
    b.set_xlabel("trials of the kernel (0: default schedule)")
    b.set_ylabel("best latency (ms)")
    b.set_title(f"the {len(heavy)} heaviest kernels")
    b.grid(alpha=0.3, which="both")
    b.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # outside: never over a curve
    fig.suptitle(f"{Path(str(tlog.path)).name} -- target {tlog.target_name}"
                 + (f", measured on {s.device}" if len(s.devices) > 1 else ""))
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output
