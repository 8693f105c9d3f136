"""Does what the pretrained cost model learned transfer to a held-out model's kernels? Kernel by kernel.

    python bench/transfer.py HELDOUT.jsonl --model bert_encoder --data cost_model/data/x86-avx512.npz
                             [--alone small_encoder] [--out bench/results/transfer-bert]

HELDOUT.jsonl is a from-scratch run of the held-out model (its records: what a search proposes, each
timed). Its kernels' records are ranked by models trained on:

* "others": every model of --data but the held-out one (what `tune` starts from when it is held out);
* "--alone M": model M's records only (e.g. a smaller transformer of the same structure);
* "own half": half of the kernel's own records, scored on the other half (2-fold, both ways): the
  ceiling of what these features can tell apart in this kernel.

Per kernel (those with at least --min-records records): pairwise accuracy (pairs more than 1% apart),
the top-1 score (the normalized throughput of the model's first pick) and the best of its top 8
(what one round of 8 measurements would find among these records). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploytool.cost_model import pretrain as P  # noqa: E402
from deploytool.cost_model.dataset import pairwise_accuracy  # noqa: E402
from deploytool.cost_model.model import XGBCostModel, normalized_throughput  # noqa: E402


def scores(lat, s) -> dict:
    r, t = pairwise_accuracy(s, lat)
    nt = normalized_throughput(lat)
    order = np.argsort(-s)
    return {"pairwise": r / t if t else float("nan"), "top1": float(nt[order[0]]), "top8": float(nt[order[:8]].max())}


def own_half(X, lat, seed: int) -> dict:
    """Train on one half of the kernel's records, score the other, both ways; the means."""
    idx = np.random.default_rng(seed).permutation(len(lat))
    halves = (idx[: len(idx) // 2], idx[len(idx) // 2:])
    out = []
    for a, b in (halves, halves[::-1]):
        m = XGBCostModel(nthread=2, seed=seed)
        m.add("k", X[a], lat[a])
        m.fit()
        out.append(scores(lat[b], m.predict(X[b])))
    return {k: float(np.mean([o[k] for o in out])) for k in out[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--model", required=True, help="the held-out model's name in --data")
    ap.add_argument("--data", type=Path, default=REPO / "cost_model" / "data" / "x86-avx512.npz")
    ap.add_argument("--alone", action="append", default=[], help="also a model trained on this model's records alone")
    ap.add_argument("--min-records", type=int, default=100)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "transfer")
    ap.add_argument("--note", default="", help="a paragraph for the markdown, after the table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        held = P.build_dataset([args.log], Path(tmp) / "held.npz", args.model)
    names = {}
    with (__import__("gzip").open(args.log, "rt") if args.log.suffix == ".gz" else open(args.log)) as f:
        for line in f:
            if '"type":"workload"' in line:
                w = json.loads(line)
                names[w["hash"]] = (w["name"], w["calls"])
    data = P.load_dataset(args.data)
    trained = {"others": P.fit(data, exclude=[args.model], nthread=2)}
    for m in args.alone:
        trained[f"{m} alone"] = P.fit(P._select(data, only=[m]), nthread=2)  # noqa: SLF001
    rows = []
    for g in np.unique(held["group"]):
        sel = held["group"] == g
        X, lat = held["X"][sel], held["latency"][sel]
        if len(lat) < args.min_records or (lat < 1e10).sum() < 2:
            continue
        name, calls = names.get(str(g).rsplit(":", 1)[-1], ("?", 1))
        row = {"kernel": str(g), "name": name, "calls": calls, "records": int(sel.sum())}
        for k, m in trained.items():
            row[k] = scores(lat, m.predict(X))
        row["own half"] = own_half(X, lat, 0)
        rows.append(row)
    rows.sort(key=lambda r: -r["records"])
    kinds = [*trained, "own half"]
    lines = [f"{args.model}'s kernels with at least {args.min_records} records of `{args.log.name}`, ranked by "
             "models trained on: " + "; ".join(f"**{k}**" for k in kinds) + ". Pairwise accuracy / top-1 score / "
             "best of the top 8.", "",
             "| kernel | calls | records | " + " | ".join(kinds) + " |", "|---|---:|---:|" + "---|" * len(kinds)]
    for r in rows:
        lines.append(f"| {r['name'][:40]} | {r['calls']} | {r['records']} | "
                     + " | ".join(f"{r[k]['pairwise']:.3f} / {r[k]['top1']:.3f} / {r[k]['top8']:.3f}" for k in kinds) + " |")
    lines.append("| **mean** | | | " + " | ".join(
        " / ".join(f"{np.mean([r[k][m] for r in rows]):.3f}" for m in ("pairwise", "top1", "top8")) for k in kinds) + " |")
    if args.note:
        lines += ["", args.note]
    md = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                         "rows": rows}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
