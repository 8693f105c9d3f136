"""Winograd A/B on x86: python bench/winograd.py [--models resnet50,yolov3_tiny,squeezenet] [--rounds 5]

For each model, its direct-convolution tuning log (``<log-dir>/<model>-<target>.jsonl[.gz]``; the
shipped tuning_logs/ by default) is copied and resumed with ``deploytool tune --winograd --kernels
'*winograd*'`` (only the new Winograd kernels are searched, ``--trials-per-task`` each); both logs
are built with ``--require-tuned`` and checked against onnxruntime, then timed in ``--rounds``
interleaved rounds (onnxruntime, direct, Winograd: ``deploytool bench --compare`` for each build,
the same inputs and threads) so that the ratios of a round share the machine's state.

Writes bench/results/winograd-<target>.json and .md (and the section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import time
from pathlib import Path

import deploytool
from deploytool import benchmark
from deploytool.tuninglog import TuningLog

ROOT = Path(__file__).resolve().parents[1]
LOG_NAMES = {"squeezenet": "squeezenet1.0"}   # shipped log names that differ from the corpus name


def direct_log(log_dir: Path, model: str, target: str) -> Path:
    base = log_dir / f"{LOG_NAMES.get(model, model)}-{target}.jsonl"
    for p in (base, base.with_suffix(".jsonl.gz")):
        if p.is_file():
            return p
    raise SystemExit(f"no tuning log for {model} in {log_dir} ({base.name}[.gz]): tune it first")


def plain_copy(src: Path, dst: Path) -> Path:
    if src.suffix == ".gz":
        with gzip.open(src, "rb") as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
    else:
        shutil.copyfile(src, dst)
    return dst


def estimate_ms(log: Path, tasks) -> float:
    best = TuningLog.read(log).best_by_workload()
    return sum(best[t.workload_hash].seconds * max(t.calls, 1) for t in tasks) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,yolov3_tiny,squeezenet")
    ap.add_argument("--target", default="x86-avx512")
    ap.add_argument("--log-dir", default=str(ROOT / "tuning_logs"), help="the direct logs")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "deploytool" / "winograd"),
                    help="where the Winograd logs and builds go (resumed when rerun)")
    ap.add_argument("--trials-per-task", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "deploytool" / "corpus"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)

    entries = {e["name"]: e for e in benchmark.load_manifest()["models"]}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        onnx_path = benchmark.materialize(entries[name], Path(args.cache))
        src = direct_log(Path(args.log_dir), name, args.target)
        dlog = plain_copy(src, work / f"{name}-{args.target}-direct.jsonl")
        wlog = work / f"{name}-{args.target}-winograd.jsonl"
        if not wlog.exists():
            plain_copy(src, wlog)
        t0 = time.perf_counter()
        tr = deploytool.tune(onnx_path, target=args.target, output=wlog, winograd=True, kernels="*winograd*",
                             trials_per_task=args.trials_per_task, progress=lambda m: print(f"  {m}", flush=True))
        tune_s = time.perf_counter() - t0
        builds = {}
        for kind, log, wino in (("direct", dlog, False), ("winograd", wlog, True)):
            res = deploytool.compile(onnx_path, target=args.target, tuning_log=log, require_tuned=True, winograd=wino,
                                     output=work / f"{name}-{kind}.so")
            builds[kind] = {"so": work / f"{name}-{kind}.so", "tasks": res.tasks,
                            "estimate_ms": estimate_ms(log, res.tasks),
                            "check": deploytool.run(work / f"{name}-{kind}.so", check=onnx_path)}
        wk = [t for t in builds["winograd"]["tasks"] if "winograd" in t.name]
        rounds = []
        for r in range(args.rounds):
            one = {}
            for kind in ("direct", "winograd"):
                b = deploytool.bench(builds[kind]["so"], compare=onnx_path, repeats=args.repeats)
                one[kind] = b.deploytool.median_ms
                one[f"ort_{kind}"] = b.onnxruntime.median_ms
            one["ratio_direct"] = one["direct"] / one["ort_direct"]
            one["ratio_winograd"] = one["winograd"] / one["ort_winograd"]
            rounds.append(one)
            print(f"{name} round {r}: direct {one['direct']:.3f} ms ({one['ratio_direct']:.3f}x ort), "
                  f"winograd {one['winograd']:.3f} ms ({one['ratio_winograd']:.3f}x ort)", flush=True)
        med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
        rows.append({
            "model": name, "winograd_kernels": len(wk), "kernels": len(builds["winograd"]["tasks"]),
            "winograd_trials": tr.trials_new, "tune_s": round(tune_s, 1),
            "check_direct": builds["direct"]["check"].ok, "check_winograd": builds["winograd"]["check"].ok,
            "max_rel_err_winograd": max(c.max_rel_err for c in builds["winograd"]["check"].comparison),
            "max_rel_err_direct": max(c.max_rel_err for c in builds["direct"]["check"].comparison),
            "estimate_direct_ms": builds["direct"]["estimate_ms"], "estimate_winograd_ms": builds["winograd"]["estimate_ms"],
            "so_mib_direct": builds["direct"]["so"].stat().st_size / 2**20,
            "so_mib_winograd": builds["winograd"]["so"].stat().st_size / 2**20,
            "rounds": rounds, "median": med,
        })
    out = Path(args.out)
    res = {"kind": "winograd", "target": args.target, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "trials_per_task": args.trials_per_task, "rounds": args.rounds, "rows": rows}
    path = out / f"winograd-{args.target}.json"
    old = json.loads(path.read_text()) if path.is_file() else None
    if old:  # keep rows of models this run did not redo
        res["rows"] = [r for r in old["rows"] if r["model"] not in {x["model"] for x in rows}] + rows
    path.write_text(json.dumps(res, indent=1) + "\n")
    (out / f"winograd-{args.target}.md").write_text(markdown(res) + "\n")
    print(markdown(res))
    return 0


def markdown(res) -> str:
    lines = [f"Winograd F(4x4, 3x3) against direct convolutions, target `{res['target']}`, {res['date']}: the direct "
             "build from the model's tuning log, the Winograd build from a copy of it resumed with `tune --winograd "
             f"--kernels '*winograd*' --trials-per-task {res['trials_per_task']}`; medians of {res['rounds']} interleaved "
             "rounds (onnxruntime, direct, Winograd), each ratio within its round.", "",
             "| model | Winograd kernels | trials, tune time | check (max rel err) | .so MiB | direct ms | Winograd ms | "
             "Winograd / direct | direct / ort | Winograd / ort |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        m = r["median"]
        lines.append(
            f"| {r['model']} | {r['winograd_kernels']} of {r['kernels']} | {r['winograd_trials']}, {r['tune_s'] / 60:.1f} min | "
            f"{'pass' if r['check_winograd'] else 'FAIL'} ({r['max_rel_err_winograd']:.1e}; direct {r['max_rel_err_direct']:.1e}) | "
            f"{r['so_mib_direct']:.0f} -> {r['so_mib_winograd']:.0f} | {m['direct']:.3f} | {m['winograd']:.3f} | "
            f"{m['winograd'] / m['direct']:.3f} | {m['ratio_direct']:.3f}x | {m['ratio_winograd']:.3f}x |")
    if res.get("notes"):  # what the run's author adds to the JSON by hand
        lines += [""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
