"""Tuning runs compared by what they had picked, re-timed side by side (not by their logged times):

    python bench/retime_curve.py MODEL.onnx --reference REF.jsonl --ref-at 100,200,400,800,1200,1600,2000
                                 --runs "KIND=LOG,LOG,LOG" [--runs ...] --at 64,100,200,400
                                 [--rounds 5] [--target x86-avx512] --out bench/results/NAME

For each log and budget N, each kernel's pick after the log's first N search trials (its fastest
record so far, as the run saw it) is rebuilt; all the picks (each distinct candidate once, and
every kernel's default schedule) are timed cold in ``--rounds`` interleaved rounds
(bench/retiming.py), the median kept. Per log and budget: the estimate (picks'
medians times their calls), and the estimate as ``tune`` would ship it (its settle keeps a
kernel's default where that re-times faster than the pick). The reference's shipped estimate at
its last budget is the best; a run reaches 95% of it at the first budget whose shipped estimate
is within best / 0.95 (budgets are checkpoints: "<= N").

Why: on a VM whose speed drifts (2-core Xeon model 207: the same default schedules of BERT logged
at 90-147 ms in runs minutes apart) and whose timings are noisy, a log's best records are the
luckiest of hundreds of timings, and runs made at different times do not compare by their logs.

Writes NAME.json, NAME.md and NAME.png. ``--plot-only A.json [B.json ...] --out NAME`` measures
nothing: it draws earlier results (re-timings of the same runs) side by side in NAME.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import retiming

REFERENCE = "reference (from scratch)"


def picks_at(t, n: int, home_only: bool = True) -> dict:
    """workload -> (its fastest record after the log's first ``n`` search trials, its default's record)."""
    best, default, k = {}, {}, 0
    for r in t.records:
        if home_only and t.device_of(r) != t.home:
            continue
        if r.source != "default":
            if k >= n:
                break
            k += 1
        elif r.ok:
            default.setdefault(r.workload, r)
        if r.ok and r.seconds < best.get(r.workload, (float("inf"),))[0]:
            best[r.workload] = (r.seconds, r)
    return {w: (r, default.get(w)) for w, (_, r) in best.items()}


def main() -> int:
    from deploytool.tuninglog import TuningLog

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--plot-only", nargs="+", metavar="RESULT.json")
    ap.add_argument("--reference")
    ap.add_argument("--ref-at", default="100,200,400,800,1200,1600,2000")
    ap.add_argument("--runs", action="append", default=[], metavar="KIND=LOG,LOG,...")
    ap.add_argument("--at", default="64,100,200,400")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", default="x86-avx512")
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    opts = ap.parse_args()
    if opts.plot_only:
        missing = [p for p in opts.plot_only if not Path(p).is_file()]
        if missing:
            ap.error(f"no such file: {', '.join(missing)}")
        every = [json.loads(Path(p).read_text()) for p in opts.plot_only]
        plot(every[0], Path(opts.out).with_suffix(".png"), tuple(every[1:]))
        return 0
    if not (opts.model and opts.reference):
        ap.error("MODEL and --reference are needed (or --plot-only)")
    specs = [(REFERENCE, 0, opts.reference, int(n)) for n in opts.ref_at.split(",")]
    for run in opts.runs:
        kind, _, logs = run.partition("=")
        if not logs:
            ap.error(f"--runs {run}: expected KIND=LOG,LOG,...")
        specs += [(kind, s, p, int(n)) for s, p in enumerate(logs.split(",")) for n in opts.at.split(",")]
    missing = [p for p in dict.fromkeys([opts.model, *(p for _, _, p, _ in specs)]) if not Path(p).is_file()]
    if missing:
        ap.error(f"no such file: {', '.join(missing)}")
    k = retiming.kernels(opts.model, opts.target)
    tasks = k.tasks
    logs = {p: TuningLog.read(p) for p in {p for _, _, p, _ in specs}}
    picks = [picks_at(logs[p], n) for _, _, p, n in specs]
    jobs, index = [], {}

    def job(ti, r):
        key = (ti, r.candidate)
        if key not in index:
            index[key] = len(jobs)
            jobs.append((ti, k.replay(ti, r.trace)))
        return index[key]

    slots = [[None] * len(tasks) for _ in specs]  # (pick job, default job)
    for ti, t in enumerate(tasks):
        for si, (pk, (kind, seed, path, n)) in enumerate(zip(picks, specs)):
            if t.workload_hash not in pk:
                raise SystemExit(f"{path} has no record of kernel {t.name} after {n} trials: not a log of this model")
            r, d = pk[t.workload_hash]
            slots[si][ti] = (job(ti, r), job(ti, d) if d is not None else None)
    print(f"{len(jobs)} candidates, {opts.rounds} rounds", flush=True)
    med = [m if m is not None else float("inf") for m, _ in retiming.time_side_by_side(k, jobs, opts.rounds)]
    rows = []
    for (kind, seed, path, n), sl in zip(specs, slots):
        est = sum(med[p] * max(t.calls, 1) for (p, _), t in zip(sl, tasks)) * 1e3
        ship = sum(min(med[p], med[d] if d is not None else med[p]) * max(t.calls, 1) for (p, d), t in zip(sl, tasks)) * 1e3
        rows.append({"kind": kind, "seed": seed, "log": str(path), "trials": n, "retimed_ms": est, "shipped_ms": ship})
    untuned = sum(min(med[d] for _, d in [s[ti] for s in slots] if d is not None) * max(t.calls, 1)
                  for ti, t in enumerate(tasks)) * 1e3
    ref = [r for r in rows if r["kind"] == REFERENCE]
    best = ref[-1]["shipped_ms"]
    for kind in dict.fromkeys(r["kind"] for r in rows):
        for seed in dict.fromkeys(r["seed"] for r in rows if r["kind"] == kind):
            mine = [r for r in rows if r["kind"] == kind and r["seed"] == seed]
            hit = next((r["trials"] for r in mine if r["shipped_ms"] <= best / 0.95), None)
            for r in mine:
                r["to_95pct_at_most"] = hit
    res = {"benchmark": "retime_curve", "model": Path(opts.model).name, "target": opts.target,
           "rounds": opts.rounds,
           "candidates": len(jobs), "untuned_ms": untuned, "reference_best_ms": best, "rows": rows}
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(res, opts.note))
    plot(res, out.with_suffix(".png"))
    print(markdown(res, opts.note))
    return 0


def plot(res: dict, path: Path, others: tuple = ()) -> None:
    """The re-timed estimates as shipped against trials (log scale): one line per run (a colour per
    kind), the reference as a black step line to its last budget, the untuned estimate, the
    reference's best and 95% of it as horizontal lines. ``others``: more results of the same runs
    re-timed again, a panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [res, *others]
    fig, axes = plt.subplots(1, len(every), figsize=(7 * len(every), 4.5), squeeze=False, sharey=True)
    for i, (ax, one) in enumerate(zip(axes[0], every)):
        colors = {}
        for kind in dict.fromkeys(r["kind"] for r in one["rows"]):
            for seed in dict.fromkeys(r["seed"] for r in one["rows"] if r["kind"] == kind):
                pts = sorted((r["trials"], r["shipped_ms"]) for r in one["rows"] if r["kind"] == kind and r["seed"] == seed)
                if kind == REFERENCE:
                    xs, ys = zip(*pts)
                    ax.step(xs, ys, where="post", color="black", lw=2, label=kind if seed == 0 else None)
                    continue
                first = kind not in colors
                c = colors.setdefault(kind, f"C{len(colors)}")
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=c, marker="o", ms=3, alpha=0.8, label=kind if first else None)
        ax.axhline(one["untuned_ms"], color="gray", ls="--", label="untuned (default schedules)")
        ax.axhline(one["reference_best_ms"] / 0.95, color="gray", ls=":", label="95% of the reference's best")
        ax.axhline(one["reference_best_ms"], color="black", ls=":", lw=1, label="the reference's best (all its trials)")
        ax.set_title(f"{one['model']}, {one['target']}: picks re-timed" + (f" (re-timing {i + 1})" if others else ""))
        ax.set_xscale("log")
        ax.set_xlabel("trials (log scale)")
        ax.set_ylabel("estimated end to end as shipped (ms)")
        ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(res: dict, note: str = "") -> str:
    at = sorted({r["trials"] for r in res["rows"] if r["kind"] != REFERENCE})
    ref = [r for r in res["rows"] if r["kind"] == REFERENCE]
    lines = [f"{res['model']}, {res['target']}: every run's picks re-timed side by side ({res['candidates']} candidates, "
             f"{res['rounds']} interleaved rounds, cold, median); ms, as `tune` would ship them (a kernel's default "
             f"where it re-times faster), the picks alone in brackets. Untuned: {res['untuned_ms']:.2f} ms. "
             f"The reference's best: {res['reference_best_ms']:.2f} ms (95%: {res['reference_best_ms'] / 0.95:.2f}).",
             "", "Reference (from scratch): " + ", ".join(f"after {r['trials']}: {r['shipped_ms']:.2f} ({r['retimed_ms']:.2f})"
                                                          for r in ref) +
             f"; 95% of its best after at most {ref[0]['to_95pct_at_most']} trials.", "",
             "| run | seed | " + " | ".join(f"after {n}" for n in at) + " | 95% of the reference's best after |",
             "|---|---:|" + "---:|" * len(at) + "---:|"]
    for kind in dict.fromkeys(r["kind"] for r in res["rows"] if r["kind"] != REFERENCE):
        for seed in dict.fromkeys(r["seed"] for r in res["rows"] if r["kind"] == kind):
            mine = {r["trials"]: r for r in res["rows"] if r["kind"] == kind and r["seed"] == seed}
            hit = next(iter(mine.values()))["to_95pct_at_most"]
            lines.append(f"| {kind} | {seed} | " + " | ".join(
                f"{mine[n]['shipped_ms']:.2f} ({mine[n]['retimed_ms']:.2f})" if n in mine else "" for n in at)
                + f" | {'<= ' + str(hit) if hit is not None else 'not reached'} |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from deploytool.errors import DeploytoolError

    try:
        raise SystemExit(main())
    except DeploytoolError as e:
        raise SystemExit(f"retime_curve.py: {e}")
