"""How wide must the search be for a pretrained model's first picks? Each kernel's first round alone.

    python bench/probe_population.py MODEL.onnx --target x86-avx512 --cost-model WO.ubj
                                     --reference REF.jsonl --config 256x3 --config 1024x4
                                     [--seeds 0,1,2] [--spread K] [--logs DIR] --out bench/results/NAME

With a pretrained cost model, `tune` measures only the model's top 4 of each kernel's first search
round (`--first-round`), so that round's picks are the model's alone: what the run starts from. For
each --config POPULATIONxGENERATIONS (the evolutionary search's population and genetic iterations;
the shipped x86 setting is 256x3, MetaSchedule's default 512x4) and seed, this tunes every kernel
of MODEL for that first round only (4 trials per kernel, no settle; with --spread K the round's
picks are K tile decisions apart, `api.tune(first_round_spread=K)`) and reports the estimated end
to end latency after it (each kernel's best times its calls) against REF's best (a 2,000-trial run
from scratch, as bench/heldout.py), and the round's wall clock from the records' timestamps.

A log already in --logs for a config and seed (.jsonl or .jsonl.gz) is read, not tuned again.
Writes NAME.json and NAME.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def round_one(model: Path, target: str, cost_model: str, pop: int, gen: int, seed: int, log: Path, kernels: int,
              spread: int = 0):
    from deploytool import api
    from deploytool.schedules import space

    shipped = space.search_config
    space.search_config = lambda t: dataclasses.replace(shipped(t), population=pop, genetic_iters=gen)
    try:
        api.tune(model, target=target, output=log, trials=4 * kernels, seed=seed, cost_model=cost_model,
                 settle=0, early_stop=0, first_round=4, first_round_spread=spread)
    finally:
        space.search_config = shipped


def estimate(t, tasks) -> tuple[float | None, float]:
    """(each kernel's best times its calls, ms; minutes from the log's first record to its last)."""
    calls = {k.workload_hash: max(k.calls, 1) for k in tasks}
    best: dict[str, float] = {}
    times = []
    for r in t.records:
        if r.workload in calls and t.device_of(r) == t.home:
            times.append(r.time)
            if r.ok and r.seconds < best.get(r.workload, float("inf")):
                best[r.workload] = r.seconds
    total = sum(best[w] * c for w, c in calls.items()) * 1e3 if set(best) == set(calls) else None
    return total, (max(times) - min(times)) / 60 if times else 0.0


def main() -> int:
    from deploytool.tuninglog import TuningLog
    from pretrain import model_tasks, reference_run, write_markdown

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--cost-model", required=True, help="the pretrained model, trained without MODEL")
    ap.add_argument("--reference", required=True, type=Path)
    ap.add_argument("--config", action="append", required=True, metavar="POPxGEN")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--spread", type=int, default=0, help="the first round's picks this many tile decisions apart "
                    "(tuner.first_picks; 0: the model's top 4)")
    ap.add_argument("--logs", type=Path, default=REPO / "bench" / "results" / "heldout-logs")
    ap.add_argument("--out", required=True, type=Path, help="path without suffix")
    ap.add_argument("--note", default="", help="a paragraph for the markdown, after the table")
    args = ap.parse_args()
    tasks = model_tasks(args.model, args.target)
    _, _, ref_curve = reference_run(TuningLog.read(args.reference), tasks)
    ref_ms = ref_curve[-1][1]
    args.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for cfg in args.config:
        pop, gen = (int(x) for x in cfg.lower().split("x"))
        for seed in (int(s) for s in args.seeds.split(",")):
            spread = f"-spread{args.spread}" if args.spread else ""
            log = args.logs / f"{args.model.stem}-{args.target}-first-round-{pop}x{gen}{spread}-seed{seed}.jsonl"
            if log.with_suffix(".jsonl.gz").is_file():
                log = log.with_suffix(".jsonl.gz")
            elif not log.is_file():
                round_one(args.model, args.target, args.cost_model, pop, gen, seed, log, len(tasks), args.spread)
            ms, minutes = estimate(TuningLog.read(log), tasks)
            rows.append({"population": pop, "generations": gen, "seed": seed, "log": str(log),
                         "after_round_one_ms": ms, "vs_reference_best": ms / ref_ms if ms else None,
                         "minutes": minutes})
    res = {"model": args.model.stem, "target": args.target, "kernels": len(tasks), "reference": str(args.reference),
           "spread": args.spread,
           "reference_best_ms": ref_ms, "note": args.note, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"{res['model']}, {args.target}: every kernel's first round of 4 ({4 * len(tasks)} trials, "
             f"{len(tasks)} kernels), picked by the pretrained model from the search's population. The "
             f"reference's best: {ref_ms:.2f} ms (95%: {ref_ms / 0.95:.2f}).", "",
             "| population x generations | seed | after the first round (ms) | vs the reference's best | minutes |",
             "|---|---:|---:|---:|---:|"]
    label = f", picks spread by {args.spread}" if args.spread else ""
    for cfg in dict.fromkeys((r["population"], r["generations"]) for r in rows):
        mine = [r for r in rows if (r["population"], r["generations"]) == cfg]
        for r in mine:
            lines.append(f"| {cfg[0]} x {cfg[1]}{label} | {r['seed']} | {r['after_round_one_ms']:.2f} | "
                         f"{r['vs_reference_best']:.2f}x | {r['minutes']:.1f} |")
        vals = [r["after_round_one_ms"] for r in mine]
        lines.append(f"| **{cfg[0]} x {cfg[1]}{label}, mean** | | **{sum(vals) / len(vals):.2f}** | "
                     f"{sum(vals) / len(vals) / ref_ms:.2f}x | {sum(r['minutes'] for r in mine) / len(mine):.1f} |")
    write_markdown(args.out, lines, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
