"""Does a held-out model's ranking of one kind of kernel (depthwise convolutions) improve with a model
of that kind alone, and how well does it rank its own first picks? Offline, from committed logs.

    python bench/kind_transfer.py --model mobilenet_v2 --reference REF.jsonl[.gz] --cost-model WO.ubj
                                  --first-rounds LOG [LOG ...] [--data cost_model/data/x86-avx512.npz]
                                  --out bench/results/NAME [--note TEXT]

A kernel's kind comes from its block names in the logs' traces (tuning_logs/*-<family>.jsonl*, the
reference and the first-round logs): "dw" for a grouped or depthwise convolution (group_conv2d,
depthwise), "conv" for another convolution, "other". Two tables:

* ranking the reference run's records of the held-out model's "dw" kernels (at least --min-records
  each) with models trained on the dataset less the held-out model: everything; the "dw" groups
  alone; the "dw" and "conv" groups; everything with the "dw" groups weighted 5x (repeated);
* ranking the candidates of the --first-rounds logs (the pretrained model's own first picks, runs of
  `bench/probe_population.py`) with --cost-model, per kind: how well it orders its favourites.

Metrics per kernel, as bench/transfer.py: pairwise accuracy, top-1 score, best of the top 8; means.
Writes NAME.json and NAME.md.
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
sys.path.insert(0, str(REPO / "bench"))

from pretrain import write_markdown  # noqa: E402
from transfer import scores  # noqa: E402

from deploytool.cost_model import pretrain as P  # noqa: E402
from deploytool.cost_model.model import FAILED, XGBCostModel  # noqa: E402

METRICS = ("pairwise", "top1", "top8")


def kinds_of(log_paths) -> dict[str, str]:
    """workload hash -> "dw", "conv" or "other", from the block names its records' traces get (all of
    them: a default schedule's trace may name fewer blocks than a searched one's)."""
    from deploytool.tuninglog import TuningLog

    blocks: dict[str, set] = {}
    for p in log_paths:
        for r in TuningLog.read(p).records:
            if r.trace:
                blocks.setdefault(r.workload, set()).update(i[2][0] for i in r.trace[0] if i[0] == "GetSBlock")
    return {w: ("dw" if any("group_conv2d" in b or "depthwise" in b for b in bs) else
                "conv" if any("conv" in b for b in bs) else "other") for w, bs in blocks.items()}


def workload_of(group) -> str:
    """A dataset group ("<hash>" or "<hash>@<machine>", maybe "<family>:"-prefixed) -> the hash."""
    return str(group).rsplit(":", 1)[-1].split("@")[0]


def train(data: dict, keep, repeat=None) -> XGBCostModel:
    m = XGBCostModel(seed=0, nthread=2)
    for g in np.unique(data["group"][keep]):
        sel = (data["group"] == g) & keep
        for r in range(repeat(g) if repeat else 1):
            m.add(f"{g}#{r}", data["X"][sel], data["latency"][sel])
    m.fit()
    return m


def features(log_paths, model: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        parts = [P.build_dataset([p], Path(tmp) / f"{i}.npz", model) for i, p in enumerate(log_paths)]
    return {"X": np.concatenate([p["X"] for p in parts]), "latency": np.concatenate([p["latency"] for p in parts]),
            "workload": np.array([workload_of(g) for p in parts for g in p["group"]])}


def mean(rows: list[dict]) -> dict:
    return {m: float(np.mean([r[m] for r in rows])) for m in METRICS} if rows else {}


def main() -> int:
    import xgboost as xgb

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the held-out model's name in --data")
    ap.add_argument("--reference", required=True, type=Path, help="its run from scratch")
    ap.add_argument("--cost-model", required=True, type=Path, help="the pretrained model without it")
    ap.add_argument("--first-rounds", nargs="+", required=True, type=Path)
    ap.add_argument("--data", type=Path, default=REPO / "cost_model" / "data" / "x86-avx512.npz")
    ap.add_argument("--min-records", type=int, default=20)
    ap.add_argument("--out", required=True, type=Path, help="path without suffix")
    ap.add_argument("--note", default="", help="a paragraph for the markdown, after the tables")
    args = ap.parse_args()
    data = P._select(P.load_dataset(args.data), exclude=[args.model])  # noqa: SLF001
    family = str(data["family"])
    kind = kinds_of([*sorted((REPO / "tuning_logs").glob(f"*-{family}.jsonl*")), args.reference, *args.first_rounds])
    gk = np.array([kind.get(workload_of(g), "?") for g in data["group"]])
    dw = {str(g) for g in np.unique(data["group"][gk == "dw"])}
    models = {"everything": train(data, np.ones(len(gk), bool)),
              "dw alone": train(data, gk == "dw"),
              "dw and conv": train(data, (gk == "dw") | (gk == "conv")),
              "everything, dw x5": train(data, np.ones(len(gk), bool), lambda g: 5 if str(g) in dw else 1)}
    ref = features([args.reference], args.model)
    held = []
    for w in np.unique(ref["workload"]):
        sel = (ref["workload"] == w) & (ref["latency"] < FAILED)
        if kind.get(w) == "dw" and sel.sum() >= args.min_records:
            held.append({"workload": str(w), "records": int(sel.sum()),
                         **{k: scores(ref["latency"][sel], m.predict(ref["X"][sel])) for k, m in models.items()}})
    fr = features(args.first_rounds, args.model)
    s = xgb.Booster(model_file=str(args.cost_model)).predict(xgb.DMatrix(fr["X"]))
    own: dict[str, list] = {}
    for w in np.unique(fr["workload"]):
        sel = (fr["workload"] == w) & (fr["latency"] < FAILED)
        if sel.sum() >= 8:
            own.setdefault(kind.get(w, "?"), []).append(scores(fr["latency"][sel], s[sel]))
    res = {"model": args.model, "reference": str(args.reference), "cost_model": str(args.cost_model),
           "first_rounds": [str(p) for p in args.first_rounds], "dataset_records": int(len(gk)),
           "dw_records": int((gk == "dw").sum()),
           "dw_models": sorted(set(data["model"][gk == "dw"].tolist())),
           "reference_dw": {"kernels": held, "means": {k: mean([h[k] for h in held]) for k in models}},
           "own_first_picks": {k: {"kernels": len(v), **mean(v)} for k, v in own.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    f = lambda d: " / ".join(f"{d[m]:.3f}" for m in METRICS)  # noqa: E731
    lines = [f"{args.model}'s depthwise kernels with at least {args.min_records} records of its run from scratch "
             f"(`{args.reference.name}`, {len(held)} kernels), ranked by models trained on the dataset less "
             f"{args.model} ({res['dataset_records']} records; the depthwise and grouped convolutions' "
             f"{res['dw_records']}, of {', '.join(res['dw_models'])}). Pairwise accuracy / top-1 score / best of "
             "the top 8, means over the kernels:", "",
             "| trained on | reference's records |", "|---|---|"]
    for k in models:
        lines.append(f"| {k} | {f(res['reference_dw']['means'][k])} |")
    lines += ["", f"The pretrained model without {args.model} (`{args.cost_model.name}`) on its own first picks "
              f"({len(args.first_rounds)} first-round runs, kernels with at least 8 candidates):", "",
              "| kind | kernels | pairwise / top-1 / best of 8 |", "|---|---:|---|"]
    for k, v in sorted(res["own_first_picks"].items()):
        lines.append(f"| {k} | {v['kernels']} | {f(v)} |")
    write_markdown(args.out, lines, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
