"""Pretraining the cost model on tuning logs (TenSet-style), per target family.

The tuning logs are the dataset: every record (a schedule trace and its measured latency, or its
failure) is replayed on its workload and featurized the way the tuner does, so a pretrained model
sees exactly the features it will be asked about. Labels are the tuner's: log(best / latency)
within each workload, so what transfers is the ranking inside a kernel, not absolute speed.

    python -m deploytool.cost_model.pretrain dataset LOG.jsonl ... -o DATA.npz   # build / update
    python -m deploytool.cost_model.pretrain train DATA.npz ... -o cost_model/pretrained/FAMILY.ubj
                                                     [--exclude MODEL]            # leave one model out
    python -m deploytool.cost_model.pretrain eval MODEL.json DATA.npz --only MODEL # held-out ranking
                                                     [--per-kernel]               # ... kernel by kernel
    python -m deploytool.cost_model.pretrain schedules LOG.jsonl ... -o FAMILY.schedules.json.gz
                                                     [--exclude MODEL]            # the schedule library
    python -m deploytool.cost_model.pretrain train-metaschedule LOG.jsonl ... -o MS.tar [--exclude MODEL]
                                                     # the baseline: MetaSchedule's XGBModel, same records

A dataset holds one target family (``family_of``); ``dataset`` refuses to mix families, and adding
a log that is already in it, as it is now or as it was before it grew (a resumed log: its text
then begins with the version added before), replaces its rows. ``tune`` loads
``cost_model/pretrained/<family>.ubj`` by default and fine-tunes it with the run's measurements.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from deploytool.errors import DeploytoolError

log = logging.getLogger(__name__)

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"


def family_of(target) -> str:
    """The target family a pretrained model serves: x86-avx512, x86-avx2, aarch64-neon,
    cuda-sm_XX, or the preset's family and arch otherwise."""
    if target.family == "cuda":
        return f"cuda-{target.tvm.get('arch', 'sm_90')}"
    feats = set(target.required_features)
    mattr = target.tvm.get("mattr", [])
    mattr = set(mattr if isinstance(mattr, list) else str(mattr).split(","))
    if target.arch == "x86_64":
        if "avx512f" in feats or "+avx512f" in mattr or str(target.tvm.get("mcpu", "")) in (
                "skylake-avx512", "cascadelake", "icelake-server", "sapphirerapids", "znver4", "znver5"):
            return "x86-avx512"
        return "x86-avx2"
    if target.arch == "aarch64":
        return "aarch64-neon"
    return f"{target.family}-{target.arch}"


# A family without a model of its own tunes from its nearest one's: the x86-avx512 model held out of
# SqueezeNet and tuning it for x86-avx2 on a Zen 3 stood ahead of learning from scratch at every
# budget up to 16 trials per kernel (3 seeds; 2.5-3.4x fewer trials to the from-scratch run's
# 458-trial level on two; bench/results/pretrain-transfer-avx2.md), though far from what it does on
# its own ISA. Only for tuning, which measures and fine-tunes: never for --predict. x86-avx2 ships its
# own model since 2026-12-02 (0.93x the x86-avx512 one's estimate there: bench/results/pretrain-avx2.md).
NEAREST_FAMILY = {"x86-avx2": "x86-avx512"}


def pretrained_path(target, nearest: bool = False, directory: Path = PRETRAINED_DIR) -> Path | None:
    """The family's shipped model (in ``directory``); with ``nearest``, else its nearest family's
    (NEAREST_FAMILY)."""
    family = family_of(target)
    for f in (family, NEAREST_FAMILY.get(family) if nearest else None):
        p = Path(directory) / f"{f}.ubj"
        if f and p.is_file():
            return p
    return None


def library_path(target, directory: Path = PRETRAINED_DIR) -> Path | None:
    """The family's shipped schedule library (``<family>.schedules.json.gz``), or None."""
    p = Path(directory) / f"{family_of(target)}.schedules.json.gz"
    return p if p.is_file() else None


def resolve(choice: str, target, nearest: bool = False) -> Path | None:
    """``--cost-model``: "none" (learn from scratch), "pretrained" (this family's shipped model --
    with ``nearest``, else its nearest family's -- or none when there is no such file), or a model
    file. Raises FileNotFoundError for a missing file."""
    if choice in (None, "", "none"):
        return None
    if choice == "pretrained":
        return pretrained_path(target, nearest)
    p = Path(choice)
    if not p.is_file() or not p.with_suffix(".meta.json").is_file():
        raise FileNotFoundError(choice)
    return p


# ----------------------------------------------------------------------------- dataset
def _model_name(path: Path, header: dict) -> str:
    """The model a log belongs to: its file name up to the target ("resnet50-x86-avx512.jsonl")."""
    stem = path.name.removesuffix(".jsonl")
    tname = header.get("target", {}).get("name", "")
    for sep in (f"-b1-float32-{tname}", f"-{tname}"):
        if tname and sep in stem:
            return stem.split(sep)[0]
    return stem


def rows_from_log(path: str | Path, model: str | None = None) -> dict:
    """Featurized rows of one tuning log: X (n, F), latency (n,), group (n,) workload hashes;
    ``model`` names the model they are of (default: from the log's file name)."""
    from deploytool import targets
    from deploytool.cost_model import dataset
    from deploytool.tuninglog import TuningLog, text_sha256s

    tlog = TuningLog.read(path)
    text_sha, earlier = text_sha256s(path)
    target = targets.load(tlog.target_name)
    groups = dataset.groups_from_log(tlog, target, min_records=4)
    X = np.concatenate([g.feats for g in groups]) if groups else np.zeros((0, 0), np.float32)
    return {
        "X": X.astype(np.float32),
        "latency": np.concatenate([g.latencies for g in groups]) if groups else np.zeros(0),
        "group": np.concatenate([[g.workload] * len(g.latencies) for g in groups]) if groups else np.zeros(0, "U1"),
        "family": family_of(target), "model": model or _model_name(Path(path), tlog.header), "sha256": text_sha,
        "earlier": earlier, "emulated": bool(tlog.header.get("emulated")),
    }


def load_dataset(path: str | Path) -> dict:
    d = np.load(path, allow_pickle=False)
    return {k: d[k] for k in d.files}


def build_dataset(log_paths, out: str | Path, model: str | None = None) -> dict:
    """Add the logs' rows to the dataset at ``out`` (created if missing). A log already in it
    replaces its rows, and so does a log that has grown since it was added (tuning resumed: its text
    then starts with the text added before; rows are keyed by the sha256 of the log's text, so
    gzipping it changes nothing). Emulated boards' logs are refused: their timings rank nothing.
    ``model``: the model the logs are of, where their file names say otherwise (held-out
    benchmarks leave a model out by this name: the demo's squeezenet1.0 log is the corpus's
    squeezenet)."""
    out = Path(out)
    data = load_dataset(out) if out.is_file() else None
    for p in log_paths:
        t0 = time.perf_counter()
        r = rows_from_log(p, model)
        if r["emulated"]:
            raise ValueError(f"'{p}' was measured on an emulated board: its latencies do not rank schedules")
        if data is not None and str(data["family"]) != r["family"]:
            raise ValueError(f"'{p}' is for {r['family']}, the dataset {out} for {data['family']}")
        n = len(r["latency"])
        # a group is "<workload>@<machine>" for a machine other than the log's own: never cut short
        # (a 64-character column would make "...Processor (family 6 model 207), 2 threads" and
        # "..., 4 threads" one group); model names (--model) are kept whole too
        new = {"X": r["X"], "latency": r["latency"], "group": np.asarray(r["group"], dtype=str),
               "model": np.array([r["model"]] * n, dtype=str), "log_sha": np.array([r["sha256"]] * n, "U64")}
        if data is not None:
            keep = ~np.isin(data["log_sha"], list(r["earlier"]))
            if (~keep).any():
                print(f"{p}: replaces {int((~keep).sum())} rows of this log as added before", file=sys.stderr)
            new = {k: np.concatenate([data[k][keep], new[k]]) for k in new}
        new["family"] = np.array(r["family"])
        data = new
        print(f"{p}: {n} records of {len(set(r['group']))} kernels ({r['family']}, model {r['model']}) "
              f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **data)
    return data


def _select(data: dict, exclude=(), only=()) -> dict:
    m = np.ones(len(data["latency"]), bool)
    if exclude:
        m &= ~np.isin(data["model"], list(exclude))
    if only:
        m &= np.isin(data["model"], list(only))
    return {k: (v[m] if np.ndim(v) and len(v) == len(m) else v) for k, v in data.items()}


def describe(data: dict, exclude=()) -> dict:
    """A dataset in brief (less the excluded models): family, models, records."""
    d = _select(data, exclude=exclude)
    return {"family": str(d["family"]), "models": sorted(set(d["model"].tolist())), "records": int(len(d["latency"]))}


def fit(data: dict, exclude=(), seed: int = 0, nthread: int | None = None, also=()):
    """An XGBCostModel trained on every workload of ``data`` (less the excluded models), and of the
    ``also`` datasets (another family's records: labels stay within one family's kernel, since a
    kernel's candidates are ranked against each other, so one workload timed on both families makes
    two groups)."""
    from deploytool.cost_model.model import XGBCostModel

    m = XGBCostModel(seed=seed, nthread=nthread)
    for i, part in enumerate([data, *also]):
        d = _select(part, exclude=exclude)
        for g in np.unique(d["group"]):
            sel = d["group"] == g
            m.add(f"{part['family']}:{g}" if i else str(g), d["X"][sel], d["latency"][sel])
    m.fit()
    return m


def fit_metaschedule(log_paths, exclude=(), seed: int = 0, nthread: int | None = None):
    """MetaSchedule's own XGBModel pretrained on the records of ``log_paths`` (less the excluded
    models): the baseline "MetaSchedule's XGBModel, pretrained on the same data". Our dataset keeps
    only our summarized features, while MetaSchedule's model trains on its raw per-store features,
    so the logs are replayed again (the records ``build_dataset`` takes from them: same
    ``min_records``). The records go in through ``XGBModel.update`` (its features, its labels:
    best / latency per workload) with training held back, then one training on all of them, as its
    adaptive training would end up doing. Save with ``.save(PATH)`` (a tar of the booster and the
    records, which ``XGBModel.load`` restores: the tuner's ``--cost-model metaschedule:PATH``)."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool import targets
    from deploytool.cost_model import dataset
    from deploytool.cost_model.model import metaschedule_xgb
    from deploytool.tuninglog import TuningLog

    m = metaschedule_xgb(nthread, seed)
    m.last_train_size = 1 << 62  # hold training back while the records go in
    for p in log_paths:
        tlog = TuningLog.read(p)
        if _model_name(Path(p), tlog.header) in set(exclude):
            continue
        target = targets.load(tlog.target_name)
        for g in dataset.groups_from_log(tlog, target, min_records=4, featurize=False):
            results = [ms.runner.RunnerResult([float(x)], None) if x < 1e10 else ms.runner.RunnerResult(None, "failed")
                       for x in g.latencies]
            m.update(dataset.context(g.mod, target), g.candidates(), results)
    if not m.data:
        raise ValueError("no replayable records in these logs (each kernel needs at least 4)")
    xs = [f for g in m.data.values() for f in g.features]
    with np.errstate(divide="ignore", invalid="ignore"):
        ys = np.concatenate([np.divide(g.min_cost, g.costs, out=np.zeros_like(g.costs), where=g.costs != 0)
                             for g in m.data.values()])
    m._train(xs=xs, ys=ys)  # noqa: SLF001  (MetaSchedule's own training step, as its update() calls it)
    m.last_train_size = m.data_size
    return m


def build_library(log_paths, exclude=(), top: int = 4):
    """A schedule library (``schedules.transfer``) of the logs' kernels, less the excluded models:
    each kernel's ``top`` best traces as its logging machine ranks them (the tuner's
    ``leading_records``: settle winners, not the luckiest search timings; several machines'
    rankings interleaved), default schedules left out (a kernel's own default is measured anyway).
    The logs must be of one target family, as a dataset's."""
    from deploytool import targets
    from deploytool.schedules.transfer import ScheduleLibrary
    from deploytool.tuner import leading_records
    from deploytool.tuninglog import TuningLog

    lib = None
    for p in log_paths:
        tlog = TuningLog.read(p)
        model = _model_name(Path(p), tlog.header)
        family = family_of(targets.load(tlog.target_name))
        if lib is None:
            lib = ScheduleLibrary(family=family, excluded=sorted(set(exclude)))
        elif family != lib.family:
            raise ValueError(f"{p} is a {family} log; the library is {lib.family} (one target family a library)")
        if model in set(exclude):
            continue
        for w, recs in tlog.by_workload().items():
            wl = tlog.workloads.get(w)
            best = leading_records(tlog, recs, None)
            best = [r for r in best if r.source != "default"][:top]
            if wl is not None and best:
                lib.add(model, w, wl.name, [r.trace for r in best], [r.seconds for r in best], top=top)
    if lib is None or not len(lib):
        raise ValueError("no kernel with search records in these logs")
    return lib


def evaluate(model, data: dict, only=(), k: int = 10, per_kernel: bool = False) -> dict:
    """Ranking quality on ``data`` (restricted to ``only`` models): pairwise accuracy over all
    workloads, mean top-k recall, and the mean normalized throughput of the model's top-1 pick
    (TenSet's top-1 score: 1.0 = it picks the best measured candidate of every kernel). With
    ``per_kernel``, also each kernel's row ("per_kernel", heaviest kernels first by records): its
    pairwise accuracy, top-1 score, and the best normalized throughput among the model's top 8
    (what one round of 8 measurements would find among these records)."""
    from deploytool.cost_model.dataset import pairwise_accuracy, top_k_recall
    from deploytool.cost_model.model import normalized_throughput

    d = _select(data, only=only)
    right = total = 0
    recalls, top1, rows = [], [], []
    for g in np.unique(d["group"]):
        sel = d["group"] == g
        lat = d["latency"][sel]
        if (lat < 1e10).sum() < 2:
            continue
        s = model.predict(d["X"][sel]) if hasattr(model, "predict") else model(d["X"][sel])
        r, t = pairwise_accuracy(s, lat)
        right, total = right + r, total + t
        recalls.append(top_k_recall(s, lat, k))
        nt = normalized_throughput(lat)
        order = np.argsort(-s)
        top1.append(float(nt[order[0]]))
        if per_kernel:
            rows.append({"kernel": str(g), "model": str(d["model"][sel][0]), "records": int(sel.sum()),
                         "pairwise_accuracy": r / t if t else float("nan"), "top1_score": top1[-1],
                         "best_of_top8": float(nt[order[:8]].max())})
    out = {"pairwise_accuracy": right / total if total else float("nan"), "pairs": total,
           f"top{k}_recall": float(np.mean(recalls)) if recalls else float("nan"),
           "top1_score": float(np.mean(top1)) if top1 else float("nan"), "kernels": len(top1)}
    if per_kernel:
        out["per_kernel"] = sorted(rows, key=lambda r: -r["records"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploytool.cost_model.pretrain", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("dataset", help="build or update a training set from tuning logs")
    a.add_argument("logs", nargs="+")
    a.add_argument("-o", "--output", required=True)
    a.add_argument("--model", help="the model the logs are of (default: each log's file name up to the target, "
                   "e.g. resnet50 for resnet50-x86-avx512.jsonl); `train --exclude` leaves it out by this name")
    a = sub.add_parser("train", help="pretrain a model on datasets")
    a.add_argument("data")
    a.add_argument("-o", "--output", required=True)
    a.add_argument("--exclude", action="append", default=[], help="leave this model's rows out (repeatable)")
    a.add_argument("--also", action="append", default=[], metavar="DATA.npz", help="also train on another "
                   "family's dataset (repeatable): x86-avx2's model learns from the x86-avx512 records too")
    a.add_argument("--seed", type=int, default=0)
    a = sub.add_parser("train-metaschedule", help="pretrain MetaSchedule's own XGBModel on tuning logs (the "
                       "baseline for comparisons: tune --cost-model metaschedule:FILE)")
    a.add_argument("logs", nargs="+")
    a.add_argument("-o", "--output", required=True)
    a.add_argument("--exclude", action="append", default=[], help="leave this model's logs out (repeatable)")
    a.add_argument("--seed", type=int, default=0)
    a = sub.add_parser("schedules", help="build a schedule library (each kernel's best traces) from tuning logs: "
                       "tune adapts them to kernels like theirs (--schedule-library)")
    a.add_argument("logs", nargs="+")
    a.add_argument("-o", "--output", required=True, help="FILE.schedules.json.gz")
    a.add_argument("--exclude", action="append", default=[], help="leave this model's logs out (repeatable)")
    a.add_argument("--top", type=int, default=4, help="best traces kept per kernel (default: 4)")
    a = sub.add_parser("eval", help="ranking quality of a model on (held-out) dataset rows")
    a.add_argument("model")
    a.add_argument("data")
    a.add_argument("--only", action="append", default=[])
    a.add_argument("--per-kernel", action="store_true", help="also each kernel's pairwise accuracy, top-1 score "
                   "and best of the model's top 8")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (DeploytoolError, ValueError, OSError) as e:  # bad input: one line, exit 2 (as deploytool's CLI)
        print(f"deploytool: error: {e}", file=sys.stderr)
        return 2


def _log_model(path) -> str:
    """The model a log belongs to (``_model_name``), from its header alone."""
    from deploytool.tuninglog import read_header

    return _model_name(Path(path), read_header(path))


def _check_exclude(exclude, models, what: str) -> None:
    """An ``--exclude`` that names no model of the input leaves nothing out: say so, and the names."""
    unknown = sorted(set(exclude) - set(models))
    if unknown:
        raise ValueError(f"--exclude {unknown[0]}: no model of that name in {what} (its models: "
                         f"{', '.join(sorted(set(models)))}); use one of those names")


def _run(args) -> int:
    if args.cmd in ("train", "schedules", "train-metaschedule") and args.exclude:
        if args.cmd == "train":
            names = set(load_dataset(args.data)["model"].tolist())
            names |= {m for p in args.also for m in load_dataset(p)["model"].tolist()}
            _check_exclude(args.exclude, names, "the dataset")
        else:
            _check_exclude(args.exclude, [_log_model(p) for p in args.logs], "these logs")
    if args.cmd == "dataset":
        d = build_dataset(args.logs, args.output, args.model)
        print(f"{args.output}: {len(d['latency'])} records, {len(np.unique(d['group']))} kernels, "
              f"models {', '.join(sorted(set(d['model'].tolist())))} ({d['family']})")
    elif args.cmd == "train":
        data = load_dataset(args.data)
        also = [load_dataset(p) for p in args.also]
        m = fit(data, exclude=args.exclude, seed=args.seed, also=also)
        m.save(args.output)
        meta_path = Path(args.output).with_suffix(".meta.json")
        meta = json.loads(meta_path.read_text())
        mine = describe(data, args.exclude)
        meta.update(family=mine["family"], models=mine["models"], excluded=args.exclude)
        if also:
            meta["also"] = [{k: v for k, v in describe(d, args.exclude).items() if k != "records"} for d in also]
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote {args.output}: {m.trained_on} records, {len(m.groups)} kernels ({data['family']})")
    elif args.cmd == "schedules":
        lib = build_library(args.logs, exclude=args.exclude, top=args.top)
        lib.save(args.output)
        print(f"wrote {args.output}: {len(lib)} kernels' best traces in {len(lib.donors)} signatures, "
              f"models {', '.join(sorted(lib.models))} ({lib.family})")
    elif args.cmd == "train-metaschedule":
        m = fit_metaschedule(args.logs, exclude=args.exclude, seed=args.seed)
        m.save(args.output)
        print(f"wrote {args.output}: MetaSchedule's XGBModel, {m.data_size} records, {len(m.data)} kernels")
    else:
        from deploytool.cost_model.model import XGBCostModel

        print(json.dumps(evaluate(XGBCostModel.load(args.model), load_dataset(args.data), only=args.only,
                                  per_kernel=args.per_kernel), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
