"""Does pretraining the cost model pay? Leave one model out, honestly.

    python bench/pretrain.py DATA.npz --logs-dir DIR [--online squeezenet,ds_cnn_1d]
                             [--trials-per-task 8] [--seeds 0,1,2]
                             [--kinds scratch,pretrained,metaschedule,metaschedule-pretrained,probe,library]
                             [--ms-logs LOG...] [--library-logs LOG...]
                             [--predict-models ...] [--keep PREVIOUS.json] [--out bench/results]

1. Offline (TenSet-style), for every model M of the dataset: pretrain on the other models' records,
   score M's records; pairwise accuracy, top-10 recall and top-1 score per kernel, against an
   untrained (random) ranking.
2. Online, for the --online models: tune M from scratch (--cost-model none), from the model
   pretrained without M, and with MetaSchedule's own XGBModel from scratch (--cost-model
   metaschedule) and pretrained on the same records without M (metaschedule-pretrained: --ms-logs are the
   logs DATA was built from), and from the pretrained model with `tune --first-round 4` (probe: each kernel's first
   round measures only the model's top 4), and as probe with a schedule library built without M
   (library: `tune --schedule-library`, the 2 nearest adapted donors per kernel measured in its
   first round; --library-logs are the logs to build it from), in the same loop with the same seeds and budget; the curve of estimated end-to-end latency (sum of
   best kernel latencies x calls) against trials; trials to reach 95% of the reference, the best
   of M's full tuning log in DIR (M-<target>.jsonl, 64 trials per kernel); the latency at equal
   budgets.
3. Prediction only: M compiled with --predict (the model pretrained without M), vs its default
   schedules and vs its tuned build, timed in one run.

Writes pretrain.json, pretrain.md and pretrain.png to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def full_log(logs_dir, model: str, target: str) -> Path:
    """``<logs_dir>/<model>-<target>.jsonl``, or its gzipped form (as logs ship in tuning_logs/)."""
    plain = Path(logs_dir) / f"{model}-{target}.jsonl"
    gz = plain.with_suffix(".jsonl.gz")
    return gz if not plain.exists() and gz.exists() else plain


def model_tasks(onnx_path: Path, target: str) -> list:
    """The model's kernels as the pipeline makes them today."""
    from deploytool import frontend, pipeline, targets

    tgt = targets.load(target)
    return pipeline.tasks(pipeline.partition(pipeline.optimize(frontend.import_onnx(onnx_path).mod, tgt), tgt))


def reference_s(t, tasks: list, what: str) -> float:
    """The reference log ``t``'s estimate for ``tasks`` (a log that also holds kernels of an older
    graph, e.g. before a fusion change, counts only these); ``what`` names the model in errors."""
    best = t.best_by_workload()
    missing = [k.name for k in tasks if k.workload_hash not in best]
    if missing:
        raise SystemExit(f"{t.path} has no record for {len(missing)} kernels of {what} "
                         f"({', '.join(missing[:3])}...): tune it first (bench/tuned.py --models ...)")
    return sum(best[k.workload_hash].seconds * max(k.calls, 1) for k in tasks)


def run_start(t, calls) -> dict[str, float]:
    """The bests a replay of log ``t``'s own run starts from: the log's best of each kernel of
    ``calls`` that the machine which wrote the log never measured (see ``reference_run``)."""
    home = {r.workload for r in t.records if t.device_of(r) == t.home}
    logged = t.best_by_workload()
    return {w: logged[w].seconds for w in calls if w not in home and w in logged}


def reference_run(t, tasks: list) -> tuple[int | None, int, list]:
    """(search trials after which the reference log ``t``'s own run reached 95% of its final
    estimate, its search trials in all, its curve [(trials, estimate ms)] where the estimate
    changed), replaying its records in file order: meaningful when the log is one unpruned
    from-scratch run (the "2,000-trial run from scratch" the other runs are counted against). Only
    the records of the machine that wrote the log count as the run: records another machine appended
    (a shipped log gathers several) are on another scale. A kernel that run never had (the graph
    changed since) enters with the log's best for it, from the start, and its trials do not count.
    Before, SqueezeNet's x86-avx2 log, whose softmax kernel only a Zen 5 tuned (53 records at the
    end), made the run look as if it reached its best only at its end."""
    calls = {k.workload_hash: max(k.calls, 1) for k in tasks}
    best = run_start(t, calls)
    curve, n = [], 0
    for r in t.records:
        if r.workload not in calls or t.device_of(r) != t.home:
            continue
        if r.source != "default":
            n += 1
        if r.ok and r.seconds < best.get(r.workload, float("inf")):
            best[r.workload] = r.seconds
        if r.source != "default" and len(best) == len(calls):
            est = sum(best[w] * c for w, c in calls.items()) * 1e3
            if not curve or est < curve[-1][1]:
                curve.append((n, est))
    if not curve:
        return None, n, []
    return trials_to(curve, curve[-1][1] / 0.95), n, curve


def at_trials(curve, n: float):
    """The curve's value after ``n`` trials (None before its first point)."""
    vals = [v for k, v in curve if k <= n]
    return vals[-1] if vals else None


KINDS = {"scratch": "from scratch", "pretrained": "pretrained without it",
         "metaschedule": "MetaSchedule XGBModel, from scratch",
         "metaschedule-pretrained": "MetaSchedule XGBModel, pretrained without it",
         "probe": "pretrained without it, first round of 4",  # tune --first-round 4: every kernel probed first
         "transfer": "other family's model without it, first round of 4",  # --transfer-from: e.g. AVX-512 for AVX2
         "library": "pretrained without it, first round of 4, its schedules adapted"}  # probe + --schedule-library


def write_markdown(out: Path, lines: list[str], note: str = "") -> None:
    """A bench script's table: ``lines`` and the --note paragraph after them, to OUT.md and stdout."""
    lines = lines + (["", note] if note else [])
    Path(out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def trials_to(curve, target_s: float):
    for n, s in curve:
        if s <= target_s:
            return n
    return None


def markdown(res: dict, trials_per_task: int) -> str:
    models = res["dataset"]["models"]
    lines = [f"Dataset: {res['dataset']['records']} records of {res['dataset']['kernels']} kernels from "
             f"{', '.join(models)} ({res['dataset']['family']})"
             + "".join(f", plus {d['records']} records of the {d['family']} family ({', '.join(d['models'])})"
                       for d in res["dataset"].get("also", [])) + ".", ""]
    tf = res.get("transfer_from")
    if tf:
        lines += [f"Transfer: a model of the {tf['family']} family ({tf['records']} records of "
                  f"{', '.join(tf['models'])}), trained without the held-out model, scores the same records "
                  f"(columns 'other family').", ""]
    other = bool(tf) and any("transfer" in r for r in res["offline"])
    head = ["pairwise acc.", "top-10 recall", "top-1 score"]
    cols = ["this family", "other family", "random"] if other else ["pretrained", "random"]
    if res["offline"]:  # none with --no-offline
        lines += ["Offline, each model held out (pretrained on the others):", "",
                  "| held-out model | " + " | ".join(f"{h}: {c}" for h in head for c in cols) + " |",
                  "|---|" + "---:|" * (len(head) * len(cols))]
    for r in res["offline"]:
        runs = [r["pretrained"]] + ([r["transfer"]] if other else []) + [r["random"]]
        cells = [f"{x[k]:.3f}" for k in ("pairwise_accuracy", "top10_recall", "top1_score") for x in runs]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    if res["online"]:
        lines += ["", f"Online, {trials_per_task} trials per kernel (estimated end to end, ms):", "",
                  "| model | cost model | seed | untuned | after the budget | reference (best of its log) | trials to 95% of ref |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for row in res["online"]:
            for run in row["runs"]:
                lines.append(f"| {row['model']} | {run['kind']} | {run['seed']} | {run['untuned_ms']:.3f} | "
                             f"{run['final_ms']:.3f} | {row['reference_ms']:.3f} | "
                             f"{run['trials_to_95pct_of_reference'] or 'not reached'} |")
        lines += ["", "Per model and cost model, over the seeds (estimated end to end after the budget, ms; "
                  "trials to 95% of the reference: median over the seeds that reached it):", "",
                  "| model | cost model | seeds | after the budget, mean (min-max) | vs from scratch | "
                  "reached 95% of ref | trials to 95%, median | fewer than the reference run | "
                  "reference run at as many trials |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
        for row in res["online"]:
            by: dict = {}
            for run in row["runs"]:
                by.setdefault(run["kind"], []).append(run)
            base = by.get(KINDS["scratch"])
            base_ms = float(np.mean([r["final_ms"] for r in base])) if base else None
            for kind, runs in by.items():
                f = [r["final_ms"] for r in runs]
                reached = sorted(r["trials_to_95pct_of_reference"] for r in runs
                                 if r["trials_to_95pct_of_reference"] is not None)
                vs = f"{np.mean(f) / base_ms:.3f}x" if base_ms else "-"
                ref_n95 = row.get("reference_trials_to_95pct")
                if not (reached and ref_n95):
                    fewer = "-"
                elif np.median(reached) == 0:  # the default schedules were within 95% already
                    fewer = "none needed"
                else:
                    fewer = f"{ref_n95 / np.median(reached):.2f}x"
                same = at_trials(row.get("reference_curve_ms") or [], np.mean([r["trials"] for r in runs]))
                lines.append(f"| {row['model']} | {kind} | {len(runs)} | {np.mean(f):.3f} ({min(f):.3f}-{max(f):.3f}) "
                             f"| {vs} | {len(reached)} of {len(runs)} | "
                             f"{int(np.median(reached)) if reached else '-'} | {fewer} | "
                             f"{f'{same:.3f}' if same is not None else '-'} |")
        refs = [f"{row['model']} {row['reference_trials_to_95pct']} of {row['reference_trials']}"
                for row in res["online"] if row.get("reference_trials_to_95pct")]
        if refs:
            lines += ["", "The reference runs (from scratch), trials to 95% of their own best: " + ", ".join(refs)
                      + " (from their logs, replayed in order; 'fewer than the reference run' divides this by the "
                      "median above)."]
    if res["predict"]:
        lines += ["", "Prediction only (`compile --predict`, the model pretrained without the model), timed in one run:",
                  "", "| model | default ms | predicted ms (kernels changed) | tuned ms |", "|---|---:|---:|---:|"]
        for r in res["predict"]:
            lines.append(f"| {r['model']} | {r['default']['median_ms']:.3f} | {r['predicted']['median_ms']:.3f} "
                         f"({r['predicted']['predicted_kernels']}) | {r['tuned (full log)']['median_ms']:.3f} |")
    lines += [""] + [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    """The online curves per model, with the from-scratch reference run's own curve where its log
    gave one (x axis cut at the longest run's trials)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res["online"]), figsize=(6 * len(res["online"]), 4), squeeze=False)
    for ax, row in zip(axes[0], res["online"]):
        colors = {}
        longest = 0
        for run in row["runs"]:
            if not run["curve_ms"]:
                continue
            xs, ys = zip(*run["curve_ms"])
            longest = max(longest, xs[-1])
            first = run["kind"] not in colors
            c = colors.setdefault(run["kind"], f"C{len(colors)}")
            ax.plot(xs, ys, color=c, alpha=0.8, label=run["kind"] if first else None)
        ref = [(n, v) for n, v in row.get("reference_curve_ms") or [] if n <= longest]
        if ref:
            xs, ys = zip(*(ref + [(longest, ref[-1][1])]))
            ax.step(xs, ys, where="post", color="black", alpha=0.6, label="reference run (from scratch)")
        ax.axhline(row["reference_ms"], color="gray", ls="--",
                   label=f"reference's best ({row.get('reference_trials', '?')} trials)")
        ax.axhline(row["reference_ms"] / 0.95, color="gray", ls=":", label="95% of the reference")
        ax.set_title(row["model"])
        ax.set_xlabel("trials")
        ax.set_ylabel("estimated end to end (ms)")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--logs-dir", required=True)
    ap.add_argument("--target", default="x86-avx512")
    ap.add_argument("--online", default="ds_cnn_1d,squeezenet")
    ap.add_argument("--predict-models", default=None, help="models for the prediction-only section "
                    "(default: the --online ones)")
    ap.add_argument("--trials-per-task", type=int, default=8)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"cost models of the online section ({', '.join(KINDS)})")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--keep", help="a previous pretrain.json: what this run does not redo is taken from it (the "
                    "offline section with --no-offline, the online rows of other models, the prediction section "
                    "with --predict-models '')")
    ap.add_argument("--ms-logs", nargs="*", default=[], help="the tuning logs DATA was built from: kind "
                    "metaschedule-pretrained pretrains MetaSchedule's XGBModel on them (its own features), less the "
                    "held-out model, so that both pretrained models learn from the same records")
    ap.add_argument("--no-offline", action="store_true", help="skip the offline section (pretrain only the "
                    "leave-one-out models the other sections need)")
    ap.add_argument("--also", action="append", default=[], metavar="OTHER.npz", help="the pretrained models also "
                    "learn from another family's dataset, less the held-out model (pretrain train --also: the "
                    "x86-avx2 model's recipe)")
    ap.add_argument("--transfer-from", help="another family's dataset (e.g. x86-avx512.npz when DATA is "
                    "x86-avx2.npz): the offline section also scores each held-out model with a model pretrained on it "
                    "(less that model), and kind 'transfer' tunes with it: is a family's own model worth shipping "
                    "over the nearest family's?")
    ap.add_argument("--library-logs", nargs="*", default=[], help="the tuning logs kind 'library' builds its "
                    "schedule library from (pretrain schedules), less the held-out model")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if any(k not in KINDS for k in kinds):
        ap.error(f"--kinds: one of {', '.join(KINDS)}")
    if "transfer" in kinds and not args.transfer_from:
        ap.error("--kinds transfer needs --transfer-from (the other family's dataset)")
    if "metaschedule-pretrained" in kinds and not args.ms_logs:
        ap.error("--kinds metaschedule-pretrained needs --ms-logs (the logs DATA was built from)")
    if "library" in kinds and not args.library_logs:
        ap.error("--kinds library needs --library-logs (the logs to build the schedule library from)")

    import deploytool
    from deploytool import benchmark
    from deploytool.cost_model import pretrain as P
    from deploytool.tuninglog import TuningLog

    data = P.load_dataset(args.data)
    res = {"dataset": {**P.describe(data), "kernels": int(len(np.unique(data["group"])))},
           "offline": [], "online": [], "predict": []}
    models = res["dataset"]["models"]
    tmp = Path(tempfile.mkdtemp(prefix="pretrain-"))
    other = P.load_dataset(args.transfer_from) if args.transfer_from else None
    also = [P.load_dataset(p) for p in args.also]
    if also:
        res["dataset"]["also"] = [P.describe(d) for d in also]
    if other is not None:
        res["transfer_from"] = P.describe(other)
    loo, loo_other = {}, {}
    needed = {x for x in (args.online + "," + (args.predict_models or "")).split(",") if x}
    for m in needed:  # a held-out model must not be in under another name (a log named after its file)
        alias = [x for x in models + (res.get("transfer_from") or {}).get("models", [])
                 + [y for d in res["dataset"].get("also", []) for y in d["models"]] if x != m and x.startswith(m)]
        if alias:
            raise SystemExit(f"held-out model {m!r}: the dataset holds {alias[0]!r}, which looks like the same model "
                             f"under another name; rebuild the dataset from a log named {m}-<target>.jsonl")
    for m in models:
        if args.no_offline and m not in needed:
            continue
        cm = P.fit(data, exclude=[m], also=also)
        path = tmp / f"without-{m}.ubj"
        cm.save(path)
        loo[m] = path
        cm_other = None
        if other is not None:
            cm_other = P.fit(other, exclude=[m])
            loo_other[m] = tmp / f"other-without-{m}.ubj"
            cm_other.save(loo_other[m])
        if args.no_offline:
            continue
        ours = P.evaluate(cm, data, only=[m])
        rnd = P.evaluate(lambda X: np.random.default_rng(0).uniform(size=len(X)), data, only=[m])
        res["offline"].append({"model": m, "pretrained": ours, "random": rnd})
        if cm_other is not None:
            res["offline"][-1]["transfer"] = P.evaluate(cm_other, data, only=[m])
        print(f"offline {m}: {res['offline'][-1]}", flush=True)

    outside = sorted(needed - set(models))  # held out by construction: pretrained on the whole dataset
    if outside:
        path = tmp / "whole-dataset.ubj"
        P.fit(data, exclude=outside, also=also).save(path)
        loo.update({m: path for m in outside})
        if other is not None:
            path = tmp / "other-whole-dataset.ubj"
            P.fit(other, exclude=outside).save(path)
            loo_other.update({m: path for m in outside})

    entries = {e["name"]: e for e in benchmark.load_manifest()["models"]}
    cache = Path.home() / ".cache" / "deploytool" / "corpus"
    for m in [x for x in args.online.split(",") if x]:
        onnx_path = benchmark.materialize(entries[m], cache)
        ref_log = TuningLog.read(full_log(args.logs_dir, m, args.target))
        tasks = model_tasks(onnx_path, args.target)
        ref = reference_s(ref_log, tasks, onnx_path.name)
        ref_n95, ref_n, ref_curve = reference_run(ref_log, tasks)
        row = {"model": m, "reference_ms": ref * 1e3, "reference_trials": ref_n,
               "reference_trials_to_95pct": ref_n95, "reference_curve_ms": ref_curve, "runs": []}
        ms_path = None
        if "metaschedule-pretrained" in kinds:
            ms_path = tmp / f"metaschedule-without-{m}.tar"
            t0 = time.perf_counter()
            msm = P.fit_metaschedule(args.ms_logs, exclude=[m])
            msm.save(str(ms_path))
            print(f"MetaSchedule's XGBModel pretrained without {m}: {msm.data_size} records, {len(msm.data)} kernels, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            row["metaschedule_pretrained_on"] = {"records": int(msm.data_size), "kernels": len(msm.data)}
        lib_path = None
        if "library" in kinds:
            lib = P.build_library(args.library_logs, exclude=[m])
            lib_path = tmp / f"without-{m}.schedules.json.gz"
            lib.save(lib_path)
            row["library_of"] = {"kernels": len(lib)}
            print(f"schedule library without {m}: {len(lib)} kernels", flush=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            for kind in kinds:
                cm = {"scratch": "none", "pretrained": str(loo[m]), "metaschedule": "metaschedule",
                      "metaschedule-pretrained": f"metaschedule:{ms_path}", "probe": str(loo[m]),
                      "transfer": str(loo_other.get(m)), "library": str(loo[m])}[kind]
                log = tmp / f"{m}-{seed}-{kind}.jsonl"
                t0 = time.perf_counter()
                r = deploytool.tune(onnx_path, target=args.target, output=log, trials_per_task=args.trials_per_task,
                                    early_stop=0, seed=seed, cost_model=cm, settle=0,  # the curve ends before a settle
                                    first_round=4 if kind in ("probe", "transfer", "library") else 10**6,  # 10**6: a full first round
                                    schedule_library=str(lib_path) if kind == "library" else None)
                curve = [(n, s * 1e3) for n, s in r.curve]
                run = {"kind": KINDS[kind], "seed": seed, "curve_ms": curve, "final_ms": r.est_tuned_s * 1e3,
                       "untuned_ms": r.est_untuned_s * 1e3, "trials": r.trials_new,
                       "trials_to_95pct_of_reference": trials_to(curve, ref * 1e3 / 0.95),
                       "seconds": time.perf_counter() - t0}
                row["runs"].append(run)
                print(f"online {m} {KINDS[kind]} seed {seed}: {run['final_ms']:.3f} ms after {run['trials']} trials "
                      f"(reference {ref * 1e3:.3f} ms)", flush=True)
        res["online"].append(row)
    predict_models = args.online if args.predict_models is None else args.predict_models
    for m in [x for x in predict_models.split(",") if x]:
        # prediction only vs default vs tuned, timed in one run
        onnx_path = benchmark.materialize(entries[m], cache)
        times = {}
        for kind, kw in (("default", {}), ("predicted", {"predict": str(loo[m])}),
                         ("tuned (full log)", {"tuning_log": full_log(args.logs_dir, m, args.target)})):
            so = tmp / f"{m}-{kind.split()[0]}.so"
            c = deploytool.compile(onnx_path, target=args.target, output=so, **kw)
            b = deploytool.bench(so, repeats=30)
            times[kind] = {"median_ms": b.deploytool.median_ms,
                           "predicted_kernels": sum(1 for v in c.schedules.values() if v == "predicted")}
        res["predict"].append({"model": m, **times})
        print(f"predict {m}: {times}", flush=True)

    res["trials_per_task"] = args.trials_per_task
    if args.keep:
        prev = json.loads(Path(args.keep).read_text())
        if not res["offline"]:
            res["offline"] = prev.get("offline", [])
        for section in ("online", "predict"):  # merged by model: a model redone replaces its old rows
            redone = {r["model"] for r in res[section]}
            res[section] = [r for r in prev.get(section, []) if r["model"] not in redone] + res[section]
        res["notes"] = prev.get("notes", [])
        if not any(x for x in args.online.split(",")):
            res["trials_per_task"] = prev.get("trials_per_task", args.trials_per_task)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pretrain.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    md = markdown(res, res["trials_per_task"])
    (out / "pretrain.md").write_text(md)
    print(md)
    if res["online"]:
        plot(res, out / "pretrain.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
