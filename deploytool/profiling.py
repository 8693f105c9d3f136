"""Where a built model's time goes: each kernel's time inside the model, next to what the tuning
log says it takes alone.

The Relax VM calls an instrument before and after every call it makes: a kernel, or one of its
builtins (allocation, shape checks, reshapes). The time between the two is the call's time inside
the model, with the caches the previous kernels left behind. The tuner times a kernel alone, call
after call, so its weights stay in cache; comparing both tells which kernels lose in the model and
how far the log's end-to-end estimate is from the model's latency. On a GPU the instrument waits
for the device before and after each call, so a kernel's time includes its launch.

The instrument is a Python callback: about a microsecond a call, shown as the difference between
the instrumented and the plain latency.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BUILTIN_PREFIX = "vm.builtin."


@dataclass
class KernelTime:
    """One function the model calls: its calls per run and time per run (all calls)."""

    name: str
    calls: int
    ms: float
    flops: float | None = None  # per call, from the artifact's kernel table
    log_ms: float | None = None  # the tuning log's best record for its workload, times its calls
    schedule: str | None = None  # "tuned", "predicted" or the default rule

    @property
    def gflops(self) -> float | None:
        return self.flops * self.calls / self.ms / 1e6 if self.flops and self.ms > 0 else None

    @property
    def vs_log(self) -> float | None:
        return self.ms / self.log_ms if self.log_ms else None


@dataclass
class Profile:
    artifact: str
    runs: int
    threads: int
    wall_ms: float  # median latency without the instrument
    instrumented_ms: float  # mean latency with it (means throughout: the kernels' times add up within it)
    kernels: list[KernelTime] = field(default_factory=list)  # by time, slowest first
    builtins_ms: float = 0.0  # the VM's builtins (allocation, shape checks, ...) per run
    log: str | None = None
    log_machine: str | None = None
    notes: list[str] = field(default_factory=list)
    stalled: int = 0  # instrumented runs left out as stalls (see steady); the means are over the others
    peak_gflops: float | None = None  # this machine's measured FP32 peak (profile --peak; deploytool.peak)

    @property
    def kernels_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    @property
    def log_estimate_ms(self) -> float | None:
        """The log's estimate for the kernels it has records of (None without a log)."""
        known = [k.log_ms for k in self.kernels if k.log_ms]
        return sum(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, row in zip(self.kernels, d["kernels"]):
            row.update(gflops=k.gflops, vs_log=k.vs_log)
            if self.peak_gflops and k.gflops:
                row["peak_pct"] = 100 * k.gflops / self.peak_gflops
        d.update(kernels_ms=self.kernels_ms, log_estimate_ms=self.log_estimate_ms)
        return d


def measure(runner, args: list, *, runs: int, warmup: int, sync=None) -> tuple[list[dict[str, list[float]]], list[float]]:
    """Per run: function name -> the seconds of each of its calls; and the runs' wall times.
    ``runner``: a LocalRunner; ``args``: its inputs on the device; ``sync``: waits for the device."""
    per_run: list[dict[str, list[float]]] = []
    walls: list[float] = []
    current: dict[str, list[float]] = {}
    start = [0.0]

    def instrument(func, symbol, before_run, ret_value, *call_args):
        if sync is not None:
            sync()
        if before_run:
            start[0] = time.perf_counter()
        else:
            current.setdefault(str(symbol), []).append(time.perf_counter() - start[0])
        return 0  # VMInstrumentReturnKind.NO_OP: go on

    runner.vm.set_instrument(instrument)
    try:
        for i in range(warmup + runs):
            current = {}
            t0 = time.perf_counter()
            runner.call(args)
            if sync is not None:
                sync()
            if i >= warmup:
                walls.append(time.perf_counter() - t0)
                per_run.append(current)
    finally:
        runner.vm.set_instrument(None)
    return per_run, walls


# A run this much slower than the median run stalled (the VM preempted, another process): one such
# run in 50 made SqueezeNet's 13x13 1x1 squeeze convolution read 0.453 ms per run, 15x its time in
# the other runs (Zen 5, 2026-12-04); the means below would carry it, so stalled runs are left out.
STALL = 1.5


def steady(per_run: list, walls: list[float]) -> tuple[list, list[float], int]:
    """The runs that did not stall (wall time within STALL x the median run's), their walls, and
    how many were left out. Whole runs go, so the kernels' means still add up within the runs'."""
    if len(walls) < 3:  # too few to tell a stall from the norm
        return per_run, walls, 0
    cut = STALL * statistics.median(walls)
    keep = [i for i, w in enumerate(walls) if w <= cut]
    return [per_run[i] for i in keep], [walls[i] for i in keep], len(walls) - len(keep)


def summarize(per_run: list[dict[str, list[float]]]) -> tuple[list[tuple[str, int, float]], float]:
    """(name, calls per run, mean ms per run) of every function, slowest first, and the mean time
    per run of the VM's builtins. Means, not medians: every call lies inside its run, so the
    kernels' means add up to at most the runs' mean (medians need not)."""
    names = {n for run in per_run for n in run}
    rows, builtins = [], [0.0] * len(per_run)
    for n in names:
        totals = [sum(run.get(n, [])) * 1e3 for run in per_run]
        if n.startswith(BUILTIN_PREFIX):
            builtins = [a + b for a, b in zip(builtins, totals)]
            continue
        calls = round(statistics.median(len(run.get(n, [])) for run in per_run))
        rows.append((n, calls, statistics.fmean(totals)))
    rows.sort(key=lambda r: -r[2])
    return rows, statistics.fmean(builtins) if per_run else 0.0


def kernel_rows(rows, tasks: list[dict], log_best: dict[str, float] | None) -> list[KernelTime]:
    """KernelTime per function, joined with the artifact's kernel table (flops, workload hash) and
    the log's best seconds per workload."""
    by_name = {t["name"]: t for t in tasks}
    out = []
    for name, calls, ms in rows:
        # a kernel whose weights were packed at compile time runs as <name>_prepacked
        # (pipeline.prepack_weights)
        if name not in by_name and name.removesuffix("_prepacked") in by_name:
            name = name.removesuffix("_prepacked")
        t = by_name.get(name, {})
        best = (log_best or {}).get(t.get("workload_hash", ""))
        out.append(KernelTime(name=name, calls=calls, ms=ms, flops=t.get("flops") or None,
                              log_ms=best * 1e3 * calls if best is not None else None,
                              schedule=t.get("schedule")))
    return out


# ----------------------------------------------------------------------------- output
def table(p: Profile, top: int = 20) -> str:
    has_log = p.log is not None
    head = f"{'kernel':<44} {'calls':>5} {'ms':>8} {'share':>6} {'GFLOP/s':>8}"
    if p.peak_gflops:
        head += f" {'% peak':>6}"
    if has_log:
        head += f" {'log ms':>8} {'model/log':>9}"
    lines = [head]
    total = p.instrumented_ms or 1.0
    for k in p.kernels[:top]:
        line = (f"{k.name[:44]:<44} {k.calls:>5} {k.ms:>8.3f} {100 * k.ms / total:>5.1f}% "
                f"{(f'{k.gflops:.0f}' if k.gflops else '-'):>8}")
        if p.peak_gflops:
            line += f" {(f'{100 * k.gflops / p.peak_gflops:.0f}%' if k.gflops else '-'):>6}"
        if has_log:
            line += f" {(f'{k.log_ms:.3f}' if k.log_ms else '-'):>8} {(f'{k.vs_log:.2f}x' if k.vs_log else '-'):>9}"
        lines.append(line)
    rest = p.kernels[top:]
    if rest:
        lines.append(f"{f'... {len(rest)} more':<44} {sum(k.calls for k in rest):>5} {sum(k.ms for k in rest):>8.3f} "
                     f"{100 * sum(k.ms for k in rest) / total:>5.1f}%")
    lines.append(f"{'VM builtins (allocation, shape checks)':<44} {'':>5} {p.builtins_ms:>8.3f} "
                 f"{100 * p.builtins_ms / total:>5.1f}%")
    lines.append("")
    lines.append(f"latency {p.wall_ms:.3f} ms (median of {p.runs} runs, {p.threads} threads); instrumented "
                 f"{p.instrumented_ms:.3f} ms (mean), of which kernels {p.kernels_ms:.3f} ms")
    if p.peak_gflops:
        lines.append(f"% peak: of {p.peak_gflops:.0f} GFLOP/s, this machine's FP32 peak as {p.threads} threads of "
                     "independent FMAs at the artifact's vector width measure it")
    if p.stalled:
        lines.append(f"{p.stalled} of {p.runs} instrumented runs left out: each took over {STALL}x the median run "
                     "(a stall of the machine); the means are over the rest")
    est = p.log_estimate_ms
    if est is not None:
        covered = [k for k in p.kernels if k.log_ms]
        in_model = sum(k.ms for k in covered)
        lines.append(f"the log's estimate for its {len(covered)} kernels: {est:.3f} ms alone, {in_model:.3f} ms in the "
                     f"model ({in_model / est:.2f}x; records of {p.log_machine})")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def plot(p: Profile, path: str | Path, top: int = 20) -> Path:
    """Horizontal bars: each of the ``top`` slowest kernels' time in the model, and the log's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(reversed(p.kernels[:top]))
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(ks) + 1.6))
    y = range(len(ks))
    h = 0.4 if p.log else 0.8
    ax.barh([i + (h / 2 if p.log else 0) for i in y], [k.ms for k in ks], height=h, label="in the model")
    if p.log:
        ax.barh([i - h / 2 for i in y], [k.log_ms or 0 for k in ks], height=h, label="tuning log (alone)")
    ax.set_yticks(list(y))
    ax.set_yticklabels([f"{k.name[:40]} x{k.calls}" for k in ks], fontsize=7)
    ax.set_xlabel("ms per run (all calls)")
    ax.set_title(f"{Path(p.artifact).name}: {p.wall_ms:.2f} ms, kernels {p.kernels_ms:.2f} ms"
                 + (f", log estimate {p.log_estimate_ms:.2f} ms" if p.log_estimate_ms else ""), fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
