"""A held-out model's tuning runs against its 2,000-trial reference, from their logs.

    python bench/heldout.py MODEL.onnx --target x86-avx512 --reference REF.jsonl
                            --runs "KIND=LOG,LOG,LOG" [--runs ...] [--at 64,177,200,400]
                            --out bench/results/NAME

The reference is one from-scratch run (`deploytool tune M.onnx --cost-model none --trials 2000
--early-stop 0 --seed 0`); each --runs names a kind of run (e.g. "pretrained without it, 400
trials") and its logs, one per seed, each a fresh run of `deploytool tune` (a log's records in file
order are its run). Every curve is the estimated end-to-end latency (each kernel's best so far
times its calls) against search trials, as bench/pretrain.py draws them. Reported per run: the
untuned estimate, the estimate after each --at count of trials, the trials to 95% of the
reference's best ("not reached" past the run's end), and the reference run's own estimate at those
counts (the issue's "lower latency at equal budget"). The reference's trials to 95% over five
(--at's first default, 177 for BERT) is the issue's "5x fewer" line. Each run's minutes to 95% come
from its records' timestamps: the search, building and timing as they ran, a pause of over 2 minutes
between two records (a run and its later resume) counted as none of it.

Writes NAME.json, NAME.md and NAME.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pretrain import at_trials, model_tasks, plot, reference_run, run_start, trials_to, write_markdown  # noqa: E402


def untuned_ms(t, tasks) -> float | None:
    """The log's default schedules (its first run's), times their calls."""
    calls = {k.workload_hash: max(k.calls, 1) for k in tasks}
    default: dict[str, float] = {}
    for r in t.records:
        if r.source == "default" and r.ok and r.workload in calls and t.device_of(r) == t.home:
            default.setdefault(r.workload, r.seconds)
    if set(default) != set(calls):
        return None
    return sum(default[w] * c for w, c in calls.items()) * 1e3


PAUSE_S = 120  # longer between two records: the run stopped there (a resume came later)


def minutes_to(t, tasks, target_ms: float):
    """Wall-clock minutes from the run's first record until its estimate (each kernel's best so far
    times its calls) reached ``target_ms``, from the records' timestamps; None if it never did.
    Only the records of the machine that wrote the log count, and a kernel it never measured enters
    with the log's best, as in ``reference_run``."""
    calls = {k.workload_hash: max(k.calls, 1) for k in tasks}
    best = run_start(t, calls)
    elapsed, last = 0.0, None
    for r in t.records:
        if r.workload not in calls or t.device_of(r) != t.home:
            continue
        if last is not None and 0 <= r.time - last < PAUSE_S:
            elapsed += r.time - last
        last = r.time
        if r.ok and r.seconds < best.get(r.workload, float("inf")):
            best[r.workload] = r.seconds
        if len(best) == len(calls) and sum(best[w] * c for w, c in calls.items()) * 1e3 <= target_ms:
            return elapsed / 60
    return None


def main() -> int:
    from deploytool.tuninglog import TuningLog

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--reference", required=True, type=Path)
    ap.add_argument("--runs", action="append", required=True, metavar="KIND=LOG,LOG,...")
    ap.add_argument("--at", default="64,200,400", help="trial counts to report the estimates at")
    ap.add_argument("--out", required=True, type=Path, help="path without suffix")
    ap.add_argument("--note", default="", help="a paragraph for the markdown, after the table")
    args = ap.parse_args()
    tasks = model_tasks(args.model, args.target)
    ref = TuningLog.read(args.reference)
    ref_n95, ref_trials, ref_curve = reference_run(ref, tasks)
    if not ref_curve:
        raise SystemExit(f"{args.reference} has no run of {args.model.stem}'s kernels")
    ref_ms = ref_curve[-1][1]
    at = sorted({int(x) for x in args.at.split(",")} | ({ref_n95 // 5} if ref_n95 else set()))
    runs = []
    for spec in args.runs:
        kind, _, logs = spec.partition("=")
        for seed, p in enumerate(logs.split(",")):
            t = TuningLog.read(p)
            _, n, curve = reference_run(t, tasks)
            runs.append({"kind": kind, "seed": seed, "log": p, "curve_ms": curve, "trials": n,
                         "untuned_ms": untuned_ms(t, tasks), "final_ms": curve[-1][1] if curve else None,
                         "trials_to_95pct_of_reference": trials_to(curve, ref_ms / 0.95),
                         "minutes_to_95pct_of_reference": minutes_to(t, tasks, ref_ms / 0.95),
                         "at_ms": {str(k): at_trials(curve, k) if k <= n else None for k in at}})
    row = {"model": args.model.stem, "reference": str(args.reference), "reference_ms": ref_ms,
           "reference_trials": ref_trials, "reference_trials_to_95pct": ref_n95,
           "reference_minutes_to_95pct": minutes_to(ref, tasks, ref_ms / 0.95),
           "reference_curve_ms": ref_curve,
           "reference_untuned_ms": untuned_ms(ref, tasks),
           "reference_at_ms": {str(k): at_trials(ref_curve, k) for k in at}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"target": args.target, "note": args.note, "online": [row]}, indent=1) + "\n")

    def ms(v):
        return "-" if v is None else f"{v:.2f}"

    def mins(v):
        return "not reached" if v is None else f"{v:.1f}"

    five = f"{ref_n95 // 5}" if ref_n95 else "-"
    lines = [f"{row['model']}, {args.target}: the reference run (from scratch, {ref_trials} trials) went "
             f"{ms(row['reference_untuned_ms'])} -> {ms(ref_ms)} ms and reached 95% of its best "
             f"({ms(ref_ms / 0.95)} ms) after {ref_n95 or 'no'} trials; 5x fewer is {five}.", "",
             "| run | seed | untuned | " + " | ".join(f"after {k}" for k in at)
             + " | trials to 95% | minutes to 95% |",
             "|---|---:|---:|" + "---:|" * len(at) + "---:|---:|",
             "| reference run (from scratch) | 0 | " + ms(row["reference_untuned_ms"]) + " | "
             + " | ".join(ms(row["reference_at_ms"][str(k)]) for k in at)
             + f" | {ref_n95 or 'not reached'} | {mins(row['reference_minutes_to_95pct'])} |"]
    for r in runs:
        lines.append(f"| {r['kind']} | {r['seed']} | {ms(r['untuned_ms'])} | "
                     + " | ".join(ms(r["at_ms"][str(k)]) for k in at)
                     + f" | {r['trials_to_95pct_of_reference'] or 'not reached'}"
                     f" | {mins(r['minutes_to_95pct_of_reference'])} |")
    lines.append("")
    lines.append("Estimated end to end (ms): each kernel's best so far times its calls; '-': past the run's end. "
                 "Minutes to 95%: wall clock from the run's first record (search, building and timing; "
                 "a pause between a run and its resume not counted).")
    plot({"online": [row]}, args.out.with_suffix(".png"))
    write_markdown(args.out, lines, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
