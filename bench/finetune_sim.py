"""How should a pretrained cost model learn from a run's measurements? A replayed search, offline.

    python bench/finetune_sim.py cost_model/data/x86-avx512.npz [--models mobilenet_v2,bert_encoder,...]
                                 [--first 4] [--batch 8] [--trials 28] [--seeds 0,1,2] [--out bench/results]

For each held-out model M: a cost model pretrained on the other models' records; then M's kernels
(groups of at least --min-records records) are "tuned" by replaying their logged records as the
candidate pool: round robin over the kernels, each round measures the model's top picks among the
kernel's unmeasured records (the first round --first of them, then --batch), their logged
latencies revealed; the online model learns from them and refits as the tuner's does (when its data
grew by a fifth, from 16 records on). The pool is what an earlier search measured (biased towards
good candidates), so this ranks learning strategies against each other, not against the search.

Strategies: "scratch" (no pretraining: random picks until 16 records, then a model of this run's
records), "frozen" (the pretrained model, never refit), and pretrained models refit in these ways:
"boost-R-E" (R more trees at learning rate E on this run's records, continuing the pretrained
booster: the tuner's way until 2026-12-07 with R=50, E=0.2), "blend-W" (a model of this run's
records alone, its scores, z-normalized per kernel, added to the frozen model's with weight W per
record of the kernel / 16, capped at 1) and "blendl-W" (the same with the predicted labels
unnormalized: the tuner's way since, W=0.5, cost_model.model.BLEND_RECORDS = 32). Metric per kernel: the best latency found after t trials over the best
of the pool (1.0: found it); per model: the sum of the kernels' found latencies over the sum of
their pool bests (an end-to-end estimate with every kernel called once), and the mean trials to
reach 95% of the pool's best throughput.

Writes finetune_sim.json and finetune_sim.md to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploytool.cost_model import pretrain as P  # noqa: E402
from deploytool.cost_model.model import FAILED, XGBCostModel  # noqa: E402


class Online:
    """An online cost model under one strategy: learns from (kernel, features, latency) as it comes."""

    def __init__(self, strategy: str, base, seed: int):
        self.strategy, self.base, self.seed = strategy, base, seed
        self.m = XGBCostModel(seed=seed, nthread=2)
        if strategy.startswith("boost-"):
            _, r, e = strategy.split("-")
            self.rounds, self.m.params["eta"] = int(r), float(e)
            self.m.base = base
        self.w = float(strategy.split("-")[1]) if strategy.startswith("blend") else 0.0
        self.n_kernel: dict[str, int] = {}

    def add(self, g: str, X, lat) -> None:
        self.m.add(g, X, lat)
        self.n_kernel[g] = self.n_kernel.get(g, 0) + len(lat)
        if self.strategy == "frozen":
            return
        if self.m.size >= 16 and self.m.size - self.m.trained_on >= max(1, self.m.trained_on // 5):
            if self.strategy.startswith("boost-"):
                import xgboost as xgb

                Xm, y, _ = self.m._matrix()  # noqa: SLF001
                self.m.booster = xgb.train(self.m.params, xgb.DMatrix(Xm, label=y), num_boost_round=self.rounds,
                                           xgb_model=self.base)
                self.m.trained_on = self.m.size
            else:
                self.m.fit()

    def scores(self, g: str, X, rng) -> np.ndarray:
        if self.strategy == "frozen" or (self.strategy.startswith("boost-") and self.m.booster is None):
            return self.base.predict(_dm(X))
        if self.strategy == "scratch":
            return self.m.predict(X) if self.m.booster is not None else rng.uniform(0, 1, len(X))
        if self.strategy.startswith("boost-"):
            return self.m.booster.predict(_dm(X))
        # blend: z-normalized scores ("blend-W") or the predicted labels themselves ("blendl-W")
        norm = _z if self.strategy.startswith("blend-") else np.asarray
        b = norm(self.base.predict(_dm(X)))
        if self.m.booster is None:
            return b
        a = min(1.0, self.w * self.n_kernel.get(g, 0) / 16)
        return (1 - a) * b + a * norm(self.m.predict(X))


def _dm(X):
    import xgboost as xgb

    return xgb.DMatrix(np.asarray(X, dtype=np.float32))


def _z(s):
    s = np.asarray(s, dtype=np.float64)
    sd = s.std()
    return (s - s.mean()) / sd if sd > 0 else s * 0


def simulate(groups: dict, base, strategy: str, seed: int, first: int, batch: int, trials: int) -> dict:
    """Replayed tuning of ``groups`` ({kernel: (X, latency)}); per kernel the found-best curve."""
    rng = np.random.default_rng(seed)
    online = Online(strategy, base, seed)
    measured = {g: np.zeros(len(lat), bool) for g, (_, lat) in groups.items()}
    curves = {g: [] for g in groups}
    best = {g: np.inf for g in groups}
    while True:
        moved = False
        for g, (X, lat) in groups.items():
            done = int(measured[g].sum())
            if done >= min(trials, len(lat)):
                continue
            k = min(first if done == 0 else batch, trials - done, int((~measured[g]).sum()))
            idx = np.flatnonzero(~measured[g])
            s = online.scores(g, X[idx], rng) + rng.uniform(0, 1e-9, len(idx))
            pick = idx[np.argsort(-s)[:k]]
            measured[g][pick] = True
            online.add(g, X[pick], lat[pick])
            for i in pick:
                best[g] = min(best[g], lat[i])
                curves[g].append(best[g])
            moved = True
        if not moved:
            return curves


def summarize(groups: dict, curves: dict, checkpoints) -> dict:
    pool = {g: lat[lat < FAILED].min() for g, (_, lat) in groups.items()}
    out = {}
    for t in checkpoints:
        found = sum(c[min(t, len(c)) - 1] for c in curves.values())
        out[f"e2e@{t}"] = float(found / sum(pool.values()))
    reach = []
    for g, c in curves.items():
        hit = [i + 1 for i, v in enumerate(c) if pool[g] / v >= 0.95]
        reach.append(hit[0] if hit else len(c) + 1)
    out["mean_trials_to_95"] = float(np.mean(reach))
    out["kernels_at_95_by_first_round"] = float(np.mean([r <= checkpoints[0] for r in reach]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--models", default="squeezenet,mobilenet_v2,bert_encoder,resnet50,inception_v1,shufflenet")
    ap.add_argument("--strategies", default="scratch,frozen,boost-50-0.2,blend-0.5,blendl-0.5")
    ap.add_argument("--first", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--trials", type=int, default=28)
    ap.add_argument("--min-records", type=int, default=32)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    data = P.load_dataset(args.data)
    checkpoints = sorted({args.first, args.first + args.batch, args.first + 2 * args.batch, args.trials})
    rows = []
    for model in args.models.split(","):
        t0 = time.perf_counter()
        base = P.fit(data, exclude=[model], nthread=2).booster
        d = P._select(data, only=[model])  # noqa: SLF001
        groups = {}
        for g in np.unique(d["group"]):
            sel = d["group"] == g
            lat = d["latency"][sel]
            if len(lat) >= args.min_records and (lat < FAILED).sum() >= 2:
                groups[str(g)] = (d["X"][sel], lat)
        for strategy in args.strategies.split(","):
            for seed in map(int, args.seeds.split(",")):
                s = summarize(groups, simulate(groups, base, strategy, seed, args.first, args.batch, args.trials),
                              checkpoints)
                rows.append({"model": model, "strategy": strategy, "seed": seed, "kernels": len(groups), **s})
        print(f"{model}: {len(groups)} kernels, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    keys = [f"e2e@{t}" for t in checkpoints] + ["mean_trials_to_95", "kernels_at_95_by_first_round"]
    lines = ["| model | strategy | kernels | " + " | ".join(keys) + " |", "|---|---|---:|" + "---:|" * len(keys)]
    for model in args.models.split(","):
        for strategy in args.strategies.split(","):
            rs = [r for r in rows if r["model"] == model and r["strategy"] == strategy]
            lines.append(f"| {model} | {strategy} | {rs[0]['kernels']} | "
                         + " | ".join(f"{np.mean([r[k] for r in rs]):.3f}" for k in keys) + " |")
    for strategy in args.strategies.split(","):
        rs = [r for r in rows if r["strategy"] == strategy]
        lines.append(f"| **mean** | {strategy} | | " + " | ".join(f"{np.mean([r[k] for r in rs]):.3f}" for k in keys) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "finetune_sim.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                              "rows": rows}, indent=1) + "\n")
    (args.out / "finetune_sim.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
