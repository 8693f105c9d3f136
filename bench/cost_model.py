"""Ranking quality of deploytool's cost model vs MetaSchedule's XGBModel, on held-out records.

    python bench/cost_model.py LOG.jsonl [LOG.jsonl ...] [--target x86] [--train-frac 0.7]

Per workload, records are split in log order: the first --train-frac train both models (the
tuning situation: learn from what was measured, rank what comes next); the rest are held out.
Four random splits of the same size follow, to show the spread.
Metrics on the held-out records, per workload then pooled: pairwise accuracy (pairs whose
latencies differ by more than 1%), top-5 recall, and the regret of trusting the model's top-1
(its latency / the best held-out latency). Writes bench/results/cost_model.json and prints a
markdown table.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from deploytool import targets
from deploytool.cost_model import dataset as D
from deploytool.cost_model.model import XGBCostModel
from deploytool.tuninglog import TuningLog


def evaluate(name, groups, split, train_fn, predict_fn):
    t0 = time.perf_counter()
    train_fn([(g, slice(0, split[g.workload])) for g in groups])
    fit = time.perf_counter() - t0
    right = total = 0
    recalls, regrets = [], []
    for g in groups:
        s = split[g.workload]
        lat = g.latencies[s:]
        if (lat < 1e10).sum() < 2:
            continue
        scores = predict_fn(g, slice(s, None))
        r, t = D.pairwise_accuracy(scores, lat)
        right, total = right + r, total + t
        recalls.append(D.top_k_recall(scores, lat, 5))
        regrets.append(lat[int(np.argmax(scores))] / lat.min())
    return {"model": name, "pairwise_accuracy": right / total if total else None, "pairs": total,
            "top5_recall": float(np.mean(recalls)), "top1_regret_geomean": float(np.exp(np.mean(np.log(regrets)))),
            "train_seconds": fit, "workloads": len(recalls)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+")
    p.add_argument("--target", default=None, help="preset (default: the first log's)")
    p.add_argument("--train-frac", type=float, default=0.7)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cost_model.json"))
    args = p.parse_args()

    groups = []
    for path in args.logs:
        tlog = TuningLog.read(path)
        tgt = targets.load(args.target or tlog.target_name)
        groups += D.groups_from_log(tlog, tgt)
    rng = np.random.default_rng(0)
    splits = [("log order", {g.workload: np.arange(len(g.latencies)) for g in groups})]
    for k in range(4):
        splits.append((f"random {k + 1}", {g.workload: rng.permutation(len(g.latencies)) for g in groups}))
    from tvm.s_tir import meta_schedule as ms

    ctxs = {g.workload: D.context(g.mod, tgt) for g in groups}
    results = []
    for split_name, orders in splits:
        split = {g.workload: max(2, int(len(g.latencies) * args.train_frac)) for g in groups}
        view = [D.Group(g.workload, g.name, g.mod, [g.schedules[i] for i in orders[g.workload]],
                        g.latencies[orders[g.workload]], g.feats[orders[g.workload]]) for g in groups]
        models = [("deploytool", XGBCostModel(nthread=targets.physical_cores())),
                  ("deploytool, pairwise ranking", XGBCostModel(objective="rank:pairwise",
                                                                nthread=targets.physical_cores()))]
        for name, m in models:
            def train(parts, m=m):
                for g, sl in parts:
                    m.add(g.workload, g.feats[sl], g.latencies[sl])
                m.fit()

            results.append(dict(evaluate(name, view, split, train, lambda g, sl, m=m: m.predict(g.feats[sl])),
                                split=split_name))
        theirs = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False,
                                        num_tuning_cores=targets.physical_cores())

        def train_ms(parts, theirs=theirs):
            for g, sl in parts:
                res = [ms.runner.RunnerResult([float(x)] if x < 1e10 else None, None if x < 1e10 else "failed")
                       for x in g.latencies[sl]]
                theirs.update(ctxs[g.workload], g.candidates()[sl], res)

        results.append(dict(evaluate("MetaSchedule XGBModel", view, split, train_ms,
                                     lambda g, sl, theirs=theirs: theirs.predict(ctxs[g.workload], g.candidates()[sl])),
                            split=split_name))
        print(split_name, [(r["model"], round(r["pairwise_accuracy"], 3)) for r in results[-3:]], flush=True)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"logs": args.logs, "train_frac": args.train_frac,
                                          "results": results}, indent=1) + "\n")
    n = sum(len(g.latencies) for g in groups)
    lines = [f"{len(groups)} workloads, {n} records from {', '.join(Path(x).name for x in args.logs)}; per workload "
             f"{args.train_frac:.0%} of the records train, the rest are held out: first in log order (the tuning "
             "situation), then 4 random splits (mean +- sd over all 5).", "",
             "| model | pairwise accuracy, log order | top-5 recall | top-1 regret | pairwise accuracy, 5 splits "
             "| top-5 recall, 5 splits | train s |",
             "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["model"] for r in results):
        rs = [r for r in results if r["model"] == name]
        first = rs[0]
        pa = np.array([r["pairwise_accuracy"] for r in rs])
        tk = np.array([r["top5_recall"] for r in rs])
        lines.append(f"| {name} | {first['pairwise_accuracy']:.3f} ({first['pairs']} pairs) | {first['top5_recall']:.3f} "
                     f"| {first['top1_regret_geomean']:.3f}x | {pa.mean():.3f} +- {pa.std():.3f} | {tk.mean():.3f} +- "
                     f"{tk.std():.3f} | {np.mean([r['train_seconds'] for r in rs]):.1f} |")
    md = "\n".join(lines) + "\n"
    Path(args.out).with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
