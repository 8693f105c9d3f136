"""Tuning runs compared by what they had picked, re-timed side by side (not by their logged times):

    python bench/retime_curve.py MODEL.onnx --reference REF.jsonl --ref-at 100,200,400,800,1200,1600,2000
                                 --runs "KIND=LOG,LOG,LOG" [--runs ...] --at 64,100,200,400
                                 [--rounds 5] [--target x86-avx512] --out bench/results/NAME

For each log and budget N, each kernel's pick after the log's first N search trials (its fastest
record so far, as the run saw it) is rebuilt; all the picks (each distinct candidate once, and
every kernel's default schedule) are timed cold in ``--rounds`` interleaved rounds
(``LocalMeasurer.measure_rounds``), the median kept. Per log and budget: the estimate (picks'
medians times their calls), and the estimate as ``tune`` would ship it (its settle keeps a
kernel's default where that re-times faster than the pick). The reference's shipped estimate at
its last budget is the best; a run reaches 95% of it at the first budget whose shipped estimate
is within best / 0.95 (budgets are checkpoints: "<= N").

Why: on a VM whose speed drifts (2-core Xeon model 207: the same default schedules of BERT logged
at 90-147 ms in runs minutes apart) and whose timings are noisy, a log's best records are the
luckiest of hundreds of timings, and runs made at different times do not compare by their logs.

Writes NAME.json and NAME.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


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
    from tvm.s_tir import meta_schedule as ms

    from deploytool import frontend, pipeline, targets
    from deploytool.measure import LocalMeasurer, MeasureSettings
    from deploytool.schedules import space
    from deploytool.tuninglog import TuningLog

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--reference", required=True)
    ap.add_argument("--ref-at", default="100,200,400,800,1200,1600,2000")
    ap.add_argument("--runs", action="append", default=[], metavar="KIND=LOG,LOG,...")
    ap.add_argument("--at", default="64,100,200,400")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", default="x86-avx512")
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    opts = ap.parse_args()
    specs = [("reference (from scratch)", 0, opts.reference, int(n)) for n in opts.ref_at.split(",")]
    for run in opts.runs:
        kind, _, logs = run.partition("=")
        if not logs:
            ap.error(f"--runs {run}: expected KIND=LOG,LOG,...")
        specs += [(kind, s, p, int(n)) for s, p in enumerate(logs.split(",")) for n in opts.at.split(",")]
    missing = [p for p in dict.fromkeys([opts.model, *(p for _, _, p, _ in specs)]) if not Path(p).is_file()]
    if missing:
        ap.error(f"no such file: {', '.join(missing)}")
    tgt = targets.load(opts.target)
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(opts.model).mod, tgt), tgt)
    tasks = pipeline.tasks(mod)
    logs = {p: TuningLog.read(p) for p in {p for _, _, p, _ in specs}}
    picks = [picks_at(logs[p], n) for _, _, p, n in specs]
    jobs, index = [], {}

    def job(ti, wmod, args, r):
        key = (ti, r.candidate)
        if key not in index:
            index[key] = len(jobs)
            jobs.append((ti, space.replay_trace(wmod, r.trace).mod, args))
        return index[key]

    slots = [[None] * len(tasks) for _ in specs]  # (pick job, default job)
    for ti, t in enumerate(tasks):
        wmod = space.tuning_module(mod[t.name], tgt)
        args = [([int(n) for n in x.shape], str(x.dtype)) for x in ms.arg_info.ArgInfo.from_prim_func(mod[t.name])]
        for si, (pk, (kind, seed, path, n)) in enumerate(zip(picks, specs)):
            if t.workload_hash not in pk:
                raise SystemExit(f"{path} has no record of kernel {t.name} after {n} trials: not a log of this model")
            r, d = pk[t.workload_hash]
            slots[si][ti] = (job(ti, wmod, args, r), job(ti, wmod, args, d) if d is not None else None)
    print(f"{len(jobs)} candidates, {opts.rounds} rounds", flush=True)
    me = LocalMeasurer(tgt, MeasureSettings())
    try:
        outs = me.measure_rounds([j[1] for j in jobs], [j[2] for j in jobs], [j[0] for j in jobs], opts.rounds)
    finally:
        me.close()
    med = [statistics.median(o.latency_s) if o.latency_s else float("inf") for o in outs]
    rows = []
    for (kind, seed, path, n), sl in zip(specs, slots):
        est = sum(med[p] * max(t.calls, 1) for (p, _), t in zip(sl, tasks)) * 1e3
        ship = sum(min(med[p], med[d] if d is not None else med[p]) * max(t.calls, 1) for (p, d), t in zip(sl, tasks)) * 1e3
        rows.append({"kind": kind, "seed": seed, "log": str(path), "trials": n, "retimed_ms": est, "shipped_ms": ship})
    untuned = sum(min(med[d] for _, d in [s[ti] for s in slots] if d is not None) * max(t.calls, 1)
                  for ti, t in enumerate(tasks)) * 1e3
    ref = [r for r in rows if r["kind"] == "reference (from scratch)"]
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
    print(markdown(res, opts.note))
    return 0


def markdown(res: dict, note: str = "") -> str:
    at = sorted({r["trials"] for r in res["rows"] if r["kind"] != "reference (from scratch)"})
    ref = [r for r in res["rows"] if r["kind"] == "reference (from scratch)"]
    lines = [f"{res['model']}, {res['target']}: every run's picks re-timed side by side ({res['candidates']} candidates, "
             f"{res['rounds']} interleaved rounds, cold, median); ms, as `tune` would ship them (a kernel's default "
             f"where it re-times faster), the picks alone in brackets. Untuned: {res['untuned_ms']:.2f} ms. "
             f"The reference's best: {res['reference_best_ms']:.2f} ms (95%: {res['reference_best_ms'] / 0.95:.2f}).",
             "", "Reference (from scratch): " + ", ".join(f"after {r['trials']}: {r['shipped_ms']:.2f} ({r['retimed_ms']:.2f})"
                                                          for r in ref) +
             f"; 95% of its best after at most {ref[0]['to_95pct_at_most']} trials.", "",
             "| run | seed | " + " | ".join(f"after {n}" for n in at) + " | 95% of the reference's best after |",
             "|---|---:|" + "---:|" * len(at) + "---:|"]
    for kind in dict.fromkeys(r["kind"] for r in res["rows"] if r["kind"] != "reference (from scratch)"):
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
