"""A/B of a change to the default CPU schedules: python bench/defaults_ab.py --change depthwise|tiles|both|rowred
                                         [--models a,b] [--target x86-avx512] [--rounds 5] [--e2e]

The changes (2026-12-07, schedules/cpu.py):

* ``depthwise``: the ``depthwise`` rule. "before" schedules the kernels it takes as they were
  scheduled without it (``tile_reduction``), "after" with it.
* ``tiles``: ``tile_reduction``'s register tile on AVX-512 (3-4 vectors a row with 4+ rows) and
  its vectorized loop (``_tile_vector``: never a non-native vector such as 24 lanes). "before"
  uses ``_register_tile`` with ``tall=False`` (as it was) and the earlier ``_tile_vector``, kept below.
* ``both``: the two together, "before" as the defaults were at the start of 2026-12-07.
* ``rowred`` (later that day): ``row_reduction``'s reductions (layer norm, softmax) into one
  vector of partial results (``_rfactor_lanes``); "before" reduces with a scalar.

Every kernel of each model whose default schedule the change alters is built both ways (weights
laid out as in a compiled model) and timed cold as tuning times candidates
(``LocalMeasurer.measure_rounds``: ``--rounds`` interleaved rounds, a kernel's two schedules back
to back), the median of a kernel's rounds kept. Reported per kernel and per model (calls-weighted).
With ``--e2e``, each model is also compiled untuned both ways, checked against onnxruntime and timed
end to end (3 alternating rounds of ``deploytool bench --compare``).

Writes bench/results/defaults-<change>-<target>.json and .md (and their section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"depthwise": "mobilenet_v2,mobilenet_v1,shufflenet",
          "tiles": "mobilenet_v2,shufflenet,squeezenet,resnet50,bert_encoder",
          "both": "mobilenet_v2,mobilenet_v1,shufflenet",
          "rowred": "bert_encoder,small_encoder"}


def _tile_vector_before(ci: int, lanes: int) -> int:
    """schedules.cpu._tile_vector before 2026-12-07: a tile of 24 channels was one 24-lane vector."""
    return min(ci, lanes) if ci % min(ci, lanes) == 0 else ci


@contextlib.contextmanager
def before(change: str):
    """The default schedules as they were before ``change``."""
    from deploytool.schedules import cpu

    saved = cpu.RULES, cpu._register_tile, cpu._tile_vector, cpu._rfactor_lanes
    if change in ("depthwise", "both"):
        cpu.RULES = tuple(r for r in cpu.RULES if r is not cpu.depthwise)
    if change in ("tiles", "both"):
        cpu._register_tile = functools.partial(cpu._register_tile, tall=False)  # at most 2 vectors x 4+ rows
        cpu._tile_vector = _tile_vector_before
    if change == "rowred":
        cpu._rfactor_lanes = lambda sch, block, lanes: None
    try:
        yield
    finally:
        cpu.RULES, cpu._register_tile, cpu._tile_vector, cpu._rfactor_lanes = saved


def changed_kernels(path: Path, tgt, change: str):
    """(task, args, {"before": schedule, "after": schedule}) of the model's kernels whose default
    schedule ``change`` alters."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool import frontend, pipeline
    from deploytool.schedules import space

    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(path).mod, tgt), tgt)
    out = []
    for t in pipeline.tasks(mod):
        wmod = space.tuning_module(mod[t.name], tgt)
        after = space.default_candidate(tgt, wmod)
        with before(change):
            old = space.default_candidate(tgt, wmod)
        if space.kernel_hash(old.mod) == space.kernel_hash(after.mod):
            continue
        args = [([int(x) for x in a.shape], str(a.dtype)) for a in ms.arg_info.ArgInfo.from_prim_func(mod[t.name])]
        out.append((t, args, {"before": old, "after": after}))
    return out


def untuned_e2e(model: str, path: Path, target: str, change: str, out_dir: Path) -> dict:
    """Compile ``model`` untuned before and after ``change``; check and time both."""
    import deploytool
    from deploytool import benchmark
    from deploytool.targets import default_threads

    row = {}
    for name in ("before", "after"):
        so = out_dir / f"{model}-{target}-{change}-{name}.so"
        with before(change) if name == "before" else contextlib.nullcontext():
            deploytool.compile(path, target=target, output=so)
        row[name] = benchmark.check_and_time(so, path, default_threads(), 20, rounds=3)
    return row


def markdown(res: dict) -> str:
    lines = [f"`--change {res['change']}`: {res['what']}", "",
             f"{res['target']}, {res['host']}, {res['date']}; each kernel timed cold, {res['rounds']} interleaved rounds, "
             "median (ms); 'calls': how many times the model runs it; only the kernels the change alters.", "",
             "| model | kernel | output | calls | before | after | speed-up |", "|---|---|---|---:|---:|---:|---:|"]
    for m in res["models"]:
        for k in m["kernels"]:
            lines.append(f"| {m['model']} | {k['name']} | {'x'.join(map(str, k['output'][1:]))} | {k['calls']} | "
                         f"{k['before_ms']:.4f} | {k['after_ms']:.4f} | {k['speedup']:.2f}x |")
        if m["kernels"]:
            lines.append(f"| **{m['model']}** | all {len(m['kernels'])}, x calls | | | **{m['before_ms']:.3f}** | "
                         f"**{m['after_ms']:.3f}** | **{m['speedup']:.2f}x** |")
    if any("e2e" in m for m in res["models"]):
        lines += ["", "Untuned end to end (`deploytool bench --compare`, 3 alternating rounds with onnxruntime; "
                  "each build checked against it):", "",
                  "| model | before ms | after ms | onnxruntime ms | ratio to onnxruntime, before -> after |",
                  "|---|---:|---:|---:|---|"]
        for m in res["models"]:
            e = m.get("e2e")
            if e:
                a, b = e["before"], e["after"]
                lines.append(f"| {m['model']} | {a['deploytool_ms']:.2f} | {b['deploytool_ms']:.2f} | "
                             f"{b['onnxruntime_ms']:.2f} | {a['ratio']:.2f}x -> {b['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


WHAT = {"depthwise": "the `depthwise` rule for depthwise convolutions (before: `tile_reduction`).",
        "tiles": "`tile_reduction`'s AVX-512 register tiles of 3-4 vectors x 4+ rows, and no non-native vector "
                 "(before: at most 2 vectors a row with 4+ rows; a 24-channel tile one 24-lane vector).",
        "both": "the `depthwise` rule and `tile_reduction`'s new tiles together (before: the default schedules "
                "at the start of 2026-12-07).",
        "rowred": "`row_reduction`'s reductions (layer norm, softmax) into a vector of partial results "
                  "(rfactor; before: one scalar accumulator)."}


def main() -> int:
    from deploytool import benchmark, targets
    from deploytool.measure import LocalMeasurer, MeasureSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--change", required=True, choices=sorted(MODELS))
    ap.add_argument("--models", help="comma-separated corpus models (default: per change)")
    ap.add_argument("--target", default="x86-avx512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--e2e", action="store_true", help="also untuned end to end against onnxruntime")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "deploytool" / "corpus")
    args = ap.parse_args()
    tgt = targets.load(args.target)
    names = (args.models or MODELS[args.change]).split(",")
    entries = {e["name"]: e for e in benchmark.load_manifest()["models"]}
    unknown = [m for m in names if m not in entries]
    if unknown:
        ap.error(f"not in the corpus (bench/corpus.json): {', '.join(unknown)}; one of {', '.join(entries)}")
    jobs, kernels, paths = [], [], {}
    for model in names:
        paths[model] = benchmark.materialize(entries[model], args.cache)
        for t, a, schs in changed_kernels(paths[model], tgt, args.change):
            kernels.append((model, t, a))
            for side, sch in schs.items():
                jobs.append((len(kernels) - 1, side, sch.mod, a))
    print(f"{len(kernels)} kernels changed, {args.rounds} rounds", flush=True)
    ms_of: dict[tuple[int, str], float] = {}
    if jobs:
        measurer = LocalMeasurer(tgt, MeasureSettings())
        try:
            outs = measurer.measure_rounds([j[2] for j in jobs], [j[3] for j in jobs], [j[0] for j in jobs],
                                           args.rounds)
        finally:
            measurer.close()
        for (ki, side, _, _), o in zip(jobs, outs):
            if o.latency_s is None:
                raise SystemExit(f"{kernels[ki][1].name} ({side}) failed: {o.error}")
            ms_of[ki, side] = statistics.median(o.latency_s) * 1e3
    models = []
    for model in names:
        rows = []
        for ki, (m, t, a) in enumerate(kernels):
            if m == model:
                old, new = ms_of[ki, "before"], ms_of[ki, "after"]
                rows.append({"name": t.name, "output": a[-1][0], "calls": max(t.calls, 1), "before_ms": round(old, 4),
                             "after_ms": round(new, 4), "speedup": round(old / new, 3)})
        old = sum(r["before_ms"] * r["calls"] for r in rows)
        new = sum(r["after_ms"] * r["calls"] for r in rows)
        entry = {"model": model, "kernels": rows, "before_ms": round(old, 4), "after_ms": round(new, 4),
                 "speedup": round(old / new, 3) if new else None}
        if args.e2e:
            out_dir = args.cache.parent / "artifacts"
            out_dir.mkdir(parents=True, exist_ok=True)
            entry["e2e"] = untuned_e2e(model, paths[model], args.target, args.change, out_dir)
        models.append(entry)
        print(f"{model}: {len(rows)} kernels {old:.3f} -> {new:.3f} ms", flush=True)
    res = {"benchmark": "defaults_ab", "change": args.change, "what": WHAT[args.change], "target": args.target,
           "host": benchmark.cpu_label(), "rounds": args.rounds,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "models": models}
    out = ROOT / "bench" / "results" / f"defaults-{args.change}-{args.target}"
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    benchmark.write_doc(ROOT / "bench" / "results", ROOT / "docs" / "benchmarks.md")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
