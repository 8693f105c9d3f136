"""The benchmark corpus, and the untuned and tuned benchmarks.

The corpus is frozen in ``bench/corpus.json``: each entry says how its ONNX file is made (a light
model of the onnx wheel with seeded He-scaled weights, or a model of deploytool.zoo) and pins the
file's SHA-256, so that the tuning, CUDA and cost-model benchmarks measure the same bytes.
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deploytool.artifact import sha256_file
from deploytool.errors import DeploytoolError

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "bench" / "corpus.json"


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def materialize(entry: dict[str, Any], cache: Path) -> Path:
    """Write a corpus model to ``cache`` (once) and check its hash against the manifest."""
    import onnx

    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{entry['name']}.onnx"
    if not out.is_file():
        kind, _, what = entry["source"].partition(":")
        if kind == "onnx-light":
            from deploytool.corpus import light_model_path, randomize_weights

            model = randomize_weights(onnx.load(light_model_path(what)), seed=entry.get("seed", 0))
        elif kind == "zoo":
            from deploytool import zoo

            model = zoo.BUILDERS[what](seed=entry.get("seed", 0))
        else:
            raise DeploytoolError(f"corpus entry {entry['name']} has unknown source {entry['source']}",
                                  "use onnx-light:NAME or zoo:NAME")
        tmp = out.with_suffix(".tmp")
        onnx.save(model, tmp)
        tmp.replace(out)
    want = entry.get("sha256")
    if want and sha256_file(out) != want:
        raise DeploytoolError(f"corpus model {out} does not match the manifest's hash",
                              "delete it to regenerate it; if the generator changed on purpose, update bench/corpus.json")
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _over_corpus(names: list[str] | None, cache: Path, one, progress) -> list[dict[str, Any]]:
    """Rows of ``one(entry, onnx_path) -> dict`` over the corpus (or the ``names`` subset); a model
    that fails gets an error row and never loses the others' results."""
    rows = []
    for entry in load_manifest()["models"]:
        if names and entry["name"] not in names:
            continue
        row: dict[str, Any] = {"model": entry["name"]}
        try:
            row.update(one(entry, materialize(entry, cache)))
        except Exception as e:
            row["error"] = str(e)[:300]
        rows.append(row)
        progress(json.dumps(row))
    return rows


def _summary(kind: str, tgt, threads: int, rows: list[dict[str, Any]], **extra) -> dict[str, Any]:
    from deploytool.targets import cpu_name

    ratios = [r["ratio"] for r in rows if "ratio" in r]
    return {
        "benchmark": kind, "target": tgt.name, "mcpu": tgt.tvm.get("mcpu"), "threads": threads, **extra,
        "host": {"cpu": cpu_name(), "machine": platform.machine()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "geomean_ratio": round(geomean(ratios), 3) if ratios else None,
        "max_ratio": max(ratios) if ratios else None,
        "models": rows,
    }


def run_untuned(names: list[str] | None, cache: Path, out_dir: Path, target: str = "x86", threads: int | None = None,
                repeats: int = 20, progress=print) -> dict[str, Any]:
    """Compile every corpus model untuned, check it against onnxruntime, and time both engines
    (each bench in a fresh process, onnxruntime first, same inputs and threads)."""
    import deploytool
    from deploytool.targets import default_threads, load

    threads = threads or default_threads()
    tgt = load(target)

    def one(entry, path):
        so = out_dir / f"{entry['name']}-{target}.so"
        t0 = time.perf_counter()
        res = deploytool.compile(path, target=target, output=so)
        row = {"compile_s": round(time.perf_counter() - t0, 2), "kernels": len(res.tasks)}
        row.update(check_and_time(so, path, threads, repeats))
        return row

    return _summary("untuned", tgt, threads, _over_corpus(names, cache, one, progress))


def _cli(*args: str, what: str = "") -> subprocess.CompletedProcess:
    """Run ``deploytool ARGS`` in a fresh process; with ``what``, a failure raises its last error
    line, named ``what``."""
    r = subprocess.run([sys.executable, "-m", "deploytool", *args], capture_output=True, text=True)
    if r.returncode and what:
        raise DeploytoolError(f"{what}: " + (r.stderr.strip().splitlines() or ["?"])[-1][:300])
    return r


def check_and_time(so: Path, path: Path, threads: int, repeats: int, rounds: int | None = None) -> dict[str, Any]:
    """Check an artifact against onnxruntime, then time both (fresh processes, onnxruntime first;
    ``rounds``: that many alternating rounds, their ratios kept)."""
    row: dict[str, Any] = {}
    chk = _cli("run", str(so), "--check", str(path), "--threads", str(threads))
    row["check"] = "pass" if chk.returncode == 0 else "FAIL"
    if chk.returncode:
        row["check_error"] = (chk.stderr.strip().splitlines() or ["?"])[-1][:300]
    j = json.loads(_cli("bench", str(so), "--compare", str(path), "--json", "--threads", str(threads),
                        "--repeats", str(repeats), *(["--rounds", str(rounds)] if rounds else []), what="bench").stdout)
    row.update(deploytool_ms=round(j["deploytool"]["median_ms"], 3),
               onnxruntime_ms=round(j["onnxruntime"]["median_ms"], 3), ratio=round(j["ratio"], 3))
    if rounds:
        row["round_ratios"] = [round(x, 3) for x in j["round_ratios"]]
    return row


def fma_flop_per_cycle(cpuinfo: str) -> int:
    """FP32 FLOP per cycle and core from /proc/cpuinfo's text: 64 where AVX-512 runs on two full
    512-bit FMA pipes (AMD Zen 5, family 26; Intel's server cores), else 32 (two 256-bit pipes:
    AVX2 machines, and Zen 4, which runs AVX-512 as two halves)."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "avx512f" not in fields.get("flags", "").split():
        return 32
    if fields.get("vendor_id") == "AuthenticAMD":
        return 64 if int(fields.get("cpu family", "0") or 0) >= 26 else 32
    return 64


def nominal_peak_gflops(threads: int, clock_ghz: float | None = None) -> tuple[float, str]:
    """FP32 peak of an x86 machine: threads x clock x FLOP/cycle (``fma_flop_per_cycle``). The clock
    defaults to /proc/cpuinfo's, which a VM may report as the base clock while the cores boost
    higher: pass the boost clock."""
    mhz, text = 0.0, ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("cpu MHz"):
                mhz = max(mhz, float(line.split(":", 1)[1]))
    except (OSError, ValueError):
        pass
    ghz = clock_ghz or mhz / 1e3
    per_cycle = fma_flop_per_cycle(text)
    return threads * ghz * per_cycle, f"{threads} x {ghz:.2f} GHz x {per_cycle} FLOP/cycle"


def machine_peak_gflops(threads: int, tgt, clock_ghz: float | None = None) -> tuple[float, str]:
    """The FP32 peak the % of peak is taken of, and how it was had: measured here
    (``measured_peak_gflops``, at the target's vector width), unless ``clock_ghz`` is given or it
    can't be measured; then nominal (``nominal_peak_gflops``)."""
    from deploytool.peak import measured_peak_gflops

    if clock_ghz is None and tgt.family == "x86":
        wide = tgt.vector_bits >= 512
        got = measured_peak_gflops(threads, wide)
        if got:
            return got, f"measured: {threads} threads of independent {'AVX-512' if wide else 'AVX2'} FMAs"
    return nominal_peak_gflops(threads, clock_ghz)


def run_tuned(names: list[str] | None, cache: Path, out_dir: Path, log_dir: Path, target: str = "x86-avx512",
              trials_per_task: int = 64, threads: int | None = None, repeats: int = 20,
              clock_ghz: float | None = None, progress=print) -> dict[str, Any]:
    """Tune every corpus model (resuming its log in ``log_dir``), build from the log, check it
    against onnxruntime and time both engines."""
    from deploytool.targets import default_threads, load

    threads = threads or default_threads()
    tgt = load(target)
    peak, peak_how = machine_peak_gflops(threads, tgt, clock_ghz)

    def one(entry, path):
        log = log_dir / f"{entry['name']}-{target}.jsonl"
        t0 = time.perf_counter()
        summary = json.loads(_cli("tune", str(path), "--target", target, "-o", str(log), "--trials-per-task",
                                  str(trials_per_task), "--json", "-q", what="tune").stdout)
        heavy = sorted(summary["tasks"], key=lambda t: -(t["best_s"] or 0) * t["calls"])[:3]
        row = {"tune_s": round(time.perf_counter() - t0, 1),
               "tune_seconds": {k: round(v, 1) for k, v in summary["seconds"].items()},
               "trials_new": summary["trials_new"], "kernels": len(summary["tasks"]),
               "est_speedup": round(summary["est_untuned_s"] / summary["est_tuned_s"], 3),
               "heavy": [{"name": t["name"], "gflops": round(t["flops"] / t["best_s"] / 1e9, 1),
                          "share_pct": round(100 * t["best_s"] * t["calls"] / summary["est_tuned_s"], 1)}
                         for t in heavy if t["best_s"]]}
        so = out_dir / f"{entry['name']}-{target}-tuned.so"
        _cli("compile", str(path), "--target", target, "--tuning-log", str(log), "--require-tuned", "-q",
             "-o", str(so), what="compile")
        row.update(check_and_time(so, path, threads, repeats))
        return row

    return _summary("tuned", tgt, threads, _over_corpus(names, cache, one, progress),
                    trials_per_task=trials_per_task, peak_gflops=round(peak, 1), peak=peak_how)


def cpu_label(cpuinfo: str | None = None) -> str:
    """A short name of this machine's CPU generation for file names: zen3, zen4, zen5, or
    intel-FAMILY-MODEL / the architecture where it is not known."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.machine()
    fields = {}
    for line in cpuinfo.splitlines():
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return platform.machine()
    if fields.get("vendor_id") == "AuthenticAMD":
        if family == 25:  # Zen 3: 0x00-0x0f, 0x20-0x2f, 0x40-0x5f; the rest Zen 4
            return "zen3" if model < 0x10 or 0x20 <= model < 0x30 or 0x40 <= model < 0x60 else "zen4"
        return {23: "zen2", 26: "zen5"}.get(family, f"amd-{family}-{model}")
    return f"intel-{family}-{model}" if fields.get("vendor_id") == "GenuineIntel" else platform.machine()


def shipped_logs(log_dir: Path, target: str) -> dict[str, Path]:
    """The corpus models that ``log_dir`` holds a log for, for ``target``: corpus name -> log
    (a log is named MODEL-TARGET.jsonl[.gz]; squeezenet1.0's is the corpus' squeezenet)."""
    corpus = [e["name"] for e in load_manifest()["models"]]
    out = {}
    for log in sorted(log_dir.glob(f"*-{target}.jsonl*")):
        stem = log.name.split(f"-{target}.jsonl")[0]
        # a version suffix is the same model; a batch or dtype (resnet50-b1-float16) is another build
        name = stem if stem in corpus else next((c for c in corpus if stem.startswith(c)
                                                 and not stem[len(c):].startswith("-")), None)
        if name is not None and log.name.endswith((".jsonl", ".jsonl.gz")):
            out[name] = log
    return out


def run_shipped(target: str, log_dir: Path, cache: Path, out_dir: Path, names: list[str] | None = None,
                rounds: int = 5, repeats: int = 20, threads: int | None = None, progress=print) -> dict[str, Any]:
    """Build each corpus model from its shipped log for ``target`` (``--require-tuned``, no
    tuning), check it against onnxruntime and time both engines in alternating rounds."""
    from deploytool.targets import default_threads, load

    threads = threads or default_threads()
    tgt = load(target)
    logs = shipped_logs(log_dir, target)
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(entry, path):
        log = logs[entry["name"]]
        so = out_dir / f"{entry['name']}-{target}-shipped.so"
        t0 = time.perf_counter()
        _cli("compile", str(path), "--target", target, "--tuning-log", str(log), "--require-tuned", "-q",
             "-o", str(so), what="compile")
        row: dict[str, Any] = {"log": log.name, "compile_s": round(time.perf_counter() - t0, 1)}
        meta = json.loads(_cli("metadata", str(so), what="metadata").stdout)
        row["kernels"] = len(meta.get("kernel_table") or [])
        row.update(check_and_time(so, path, threads, repeats, rounds=rounds))
        return row

    chosen = [n for n in logs if not names or n in names]
    res = _summary("shipped", tgt, threads, _over_corpus(chosen, cache, one, progress), rounds=rounds)
    res["host"]["family"] = cpu_label()
    return res


def markdown_shipped(result: dict[str, Any]) -> str:
    lines = [f"Every model built from its log in tuning_logs/ (`--require-tuned`, no tuning), target "
             f"`{result['target']}` ({result['mcpu']}), {result['threads']} threads, {result['host']['cpu']} "
             f"({result['host'].get('family', '?')}), {result['date']}. One `deploytool bench --compare` each: "
             f"{result['rounds']} rounds alternating onnxruntime and deploytool; the ratio is the median of the "
             "rounds' ratios.", ""]
    lines += _table(result, [("model", "l", lambda r: r["model"]), ("log", "l", lambda r: r["log"]),
                             ("kernels", "r", lambda r: str(r["kernels"])),
                             ("compile s", "r", lambda r: str(r["compile_s"])),
                             ("check", "l", lambda r: r["check"]),
                             ("deploytool ms", "r", lambda r: str(r["deploytool_ms"])),
                             ("onnxruntime ms", "r", lambda r: str(r["onnxruntime_ms"])),
                             ("ratio", "r", lambda r: f"{r['ratio']:.2f}x"),
                             ("rounds", "l", lambda r: ", ".join(f"{x:.2f}" for x in r["round_ratios"]))])
    lines.append("")
    lines += [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def markdown_tuned(result: dict[str, Any]) -> str:
    def heavy(r):
        return "; ".join(f"{h['gflops']} ({100 * h['gflops'] / result['peak_gflops']:.0f}%, {h['share_pct']}%)"
                         for h in r["heavy"])

    def parts(r):
        return " / ".join(f"{r['tune_seconds'].get(k, 0):.0f}s" for k in ("search", "build", "measure", "cost_model"))

    lines = [f"Tuned with up to {result['trials_per_task']} trials per kernel, target `{result['target']}` "
             f"({result['mcpu']}), {result['threads']} threads, {result['host']['cpu']}, {result['date']}. "
             f"Peak used for %: {result['peak_gflops']} GFLOP/s ({result['peak']}).", ""]
    lines += _table(result, [("model", "l", lambda r: r["model"]), ("kernels", "r", lambda r: str(r["kernels"])),
                             ("tune time", "r", lambda r: f"{r['tune_s'] / 60:.1f} min"),
                             ("of it: search / build / measure / cost model", "l", parts),
                             ("check", "l", lambda r: r["check"]),
                             ("deploytool ms", "r", lambda r: str(r["deploytool_ms"])),
                             ("onnxruntime ms", "r", lambda r: str(r["onnxruntime_ms"])),
                             ("ratio", "r", lambda r: f"{r['ratio']:.2f}x"),
                             ("heaviest kernels: GFLOP/s (% peak, % of time)", "l", heavy)])
    lines.append("")
    lines += [f"- {r['model']}: {r['note']}" for r in result["models"] if r.get("note")]
    return "\n".join(lines) + "\n"


def markdown_mcu(result: dict[str, Any]) -> str:
    kib = lambda n: f"{n / 1024:.1f}"  # noqa: E731
    lines = [f"C bundles, default schedules, {result['date']}; run once under QEMU (mps2-an386 for M4, mps2-an500 for "
             "M7, mps3-an547 for M55) and checked against onnxruntime. Flash = code (executor, runtime shim, kernels) + weights, objects "
             "only (libc/libm come on top: see the image). Arena: one static buffer for every intermediate tensor and "
             "workspace, vs the most bytes live at any step. Instructions: QEMU -icount (1 ns per instruction, "
             "counted by SysTick: +-40); LLVM-built kernels vs TVM's C compiled by arm-none-eabi-gcc -O2.", ""]
    lines += _table(dict(result, geomean_ratio=None), [
        ("model", "l", lambda r: r["model"]), ("target", "l", lambda r: r["target"]),
        ("flash KiB (code + weights)", "r", lambda r: f"{kib(r['flash_code'] + r['flash_weights'])} "
                                                      f"({kib(r['flash_code'])} + {kib(r['flash_weights'])})"),
        ("arena KiB", "r", lambda r: kib(r["arena"])), ("arena / bound", "r", lambda r: f"{r['arena_ratio']:.3f}"),
        ("stack B (measured)", "r", lambda r: str(r["stack_measured"])),
        ("instructions", "r", lambda r: f"{r['instructions']:,}"),
        ("with C kernels", "r", lambda r: f"{r['instructions_c_kernels']:,}"),
        ("image text KiB", "r", lambda r: kib(r["image"].get("text", 0))),
        ("max rel err", "r", lambda r: f"{r['max_rel_err']:.1e}")])
    return "\n".join(lines) + "\n"


def markdown_simd(result: dict[str, Any]) -> str:
    lines = [f"Default schedules, cross-compiled for `{result['target']}`, {result['date']}; read from each build's "
             "disassembly (`deploytool simd`): conv/matmul kernels with vector fused multiply-adds (`fmla v.4s` / "
             "`v.2s`), and their vector vs scalar FMA instructions.", ""]
    lines += _table(dict(result, geomean_ratio=None), [
        ("model", "l", lambda r: r["model"]), ("kernels", "r", lambda r: str(r["kernels"])),
        ("conv/matmul kernels", "r", lambda r: str(r["dense"])),
        ("with vector FMAs", "r", lambda r: str(r["dense_vector"])),
        ("vector FMA instrs", "r", lambda r: str(r["vector_fma"])), ("scalar FMA instrs", "r", lambda r: str(r["scalar_fma"])),
        ("vector widths (bits)", "l", lambda r: ", ".join(map(str, r["widths"]))),
        ("scalar kernels", "l", lambda r: ", ".join(r["scalar_kernels"]) or "none")])
    return "\n".join(lines) + "\n"


def _table(result: dict[str, Any], columns) -> list[str]:
    """Markdown table lines of a benchmark result. ``columns``: (title, "l" or "r" alignment,
    cell(row) -> str). A model that failed shows its error in the "check" column; the last row
    is the geomean of the "ratio" column."""
    titles = [c[0] for c in columns]

    def line(cells):
        return "| " + " | ".join(cells) + " |"

    lines = [line(titles), "|" + "|".join("---:" if c[1] == "r" else "---" for c in columns) + "|"]
    for r in result["models"]:
        if "error" in r:
            lines.append(line([r["model"] if t == "model" else f"error: {r['error'][:80]}" if t == "check" else ""
                               for t in titles]))
        else:
            lines.append(line([c[2](r) for c in columns]))
    if result["geomean_ratio"]:
        lines.append(line(["**geomean**" if t == "model" else f"**{result['geomean_ratio']:.2f}x**" if t == "ratio"
                           else "" for t in titles]))
    return lines


def merge_results(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the rows of ``old`` it did not rerun (same benchmark settings), geomean redone."""
    if not old or {k: old.get(k) for k in ("target", "trials_per_task", "threads")} != \
            {k: new.get(k) for k in ("target", "trials_per_task", "threads")}:
        return new
    done = {r["model"] for r in new["models"]}
    order = [e["name"] for e in load_manifest()["models"]]
    rows = [r for r in old["models"] if r["model"] not in done] + new["models"]
    rows.sort(key=lambda r: order.index(r["model"]) if r["model"] in order else len(order))
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    return dict(new, models=rows, geomean_ratio=round(geomean(ratios), 3) if ratios else None,
                max_ratio=max(ratios) if ratios else None)


# bench/pretrain.py's results (and the cost-model experiments around it), in the order docs/benchmarks.md shows them
PRETRAIN_SECTIONS = [
    ("pretrain.md", "## Pretrained cost model, leave one model out: `python bench/pretrain.py`"),
    ("pretrain-first-round.md", "### A first round of 4 per kernel: `python bench/pretrain.py --kinds pretrained,probe`"),
    ("pretrain-baselines.md", "### Against MetaSchedule's XGBModel, from scratch and pretrained on the same logs: "
     "`python bench/pretrain.py --kinds probe,metaschedule,metaschedule-pretrained --ms-logs ...`"),
    ("pretrain-baselines-more.md", "### The same for DS-CNN and BERT held out (a second machine): "
     "`python bench/pretrain.py --online ds_cnn_1d,bert_encoder ...`"),
    ("pretrain-transfer-avx2.md", "### Across ISAs: the x86-avx512 model tuning for x86-avx2: "
     "`python bench/pretrain.py cost_model/data/x86-avx512.npz --target x86-avx2 ...`"),
    ("pretrain-avx2.md", "### x86-avx2's own model (AVX2 logs plus the x86-avx512 records) against the x86-avx512 "
     "one: `python bench/pretrain.py cost_model/data/x86-avx2.npz --also cost_model/data/x86-avx512.npz "
     "--transfer-from cost_model/data/x86-avx512.npz --target x86-avx2 ...`"),
    ("pretrain-zen5-bert.md", "### BERT held out, against a from-scratch reference run of 1,630 trials (Zen 5): "
     "`python bench/pretrain.py --online bert_encoder --kinds scratch,probe,metaschedule ...`"),
    ("pretrain-bert-m167.md", "### BERT held out, against the 2,000-trial run from scratch (Xeon model 167), at 133 "
     "and 400 trials: `python bench/pretrain.py --online bert_encoder ...` and `deploytool tune --trials 400`"),
    ("pretrain-fixes-squeezenet.md", "### The 2026-12-07 cost-model fixes, SqueezeNet tuned with and without them: "
     "`deploytool tune --trials-per-task 8`"),
    ("finetune_sim.md", "### How a pretrained model learns from the run, replayed offline: "
     "`python bench/finetune_sim.py`"),
    ("pretrain-bert-m167-400.md", "### BERT held out, 400 trials, with and without the small encoder in the pretraining "
     "data: `deploytool tune --trials 400` and `python bench/heldout.py`"),
    ("pretrain-mobilenet-m167.md", "### MobileNetV2 held out, against the 2,000-trial run from scratch (Xeon model "
     "167), 400 trials: `deploytool tune --trials 400` and `python bench/heldout.py`"),
    ("pretrain-mobilenet-m167-defaults.md", "### MobileNetV2 held out again, with the 2026-12-07 default schedules "
     "(the depthwise rule, AVX-512's taller tiles) on both sides: `deploytool tune --trials 400` and "
     "`python bench/heldout.py`"),
    ("retime-bert-m207-library.md", "### BERT held out on a Xeon model 207, with and without the schedule library, "
     "every run's picks re-timed side by side: `python bench/retime_curve.py`"),
    ("retime-bert-zen5.md", "### BERT held out on a Zen 5, against a 2,000-trial run from scratch, five cost models, "
     "every run's picks re-timed side by side: `python bench/pretrain.py --kinds scratch,probe,library,metaschedule,"
     "metaschedule-pretrained ...` and `python bench/retime_curve.py`"),
    ("retime-bert-zen5-again.md", "### The same picks re-timed again: `python bench/retime_curve.py`"),
    ("pretrain-bert-zen5-2000.md", "### The same runs by their logs (the VM drifted): `python bench/pretrain.py "
     "--online bert_encoder --kinds scratch,probe,library,metaschedule,metaschedule-pretrained ...`"),
    ("retime-mobilenet-zen5.md", "### MobileNetV2 held out on a Zen 5, against a 2,000-trial run from scratch, 400 "
     "trials, the picks re-timed side by side: `deploytool tune --trials 400` and `python bench/retime_curve.py`"),
    ("retime-mobilenet-zen5-again.md", "### The same picks re-timed again: `python bench/retime_curve.py`"),
    ("pretrain-small-encoder-m167.md", "### The MiniLM-sized encoder held out, against a 2,000-trial run from "
     "scratch (Xeon model 167), 200 trials: `deploytool tune --trials 200` and `python bench/heldout.py`"),
    ("transfer-bert.md", "### Why BERT's matmuls barely transfer: held-out ranking kernel by kernel: "
     "`python bench/transfer.py`"),
    ("pretrain-squeezenet-m167.md", "### SqueezeNet held out, against a 2,000-trial run from scratch (Xeon model "
     "167), 300 trials: `deploytool tune --trials 300` and `python bench/heldout.py`"),
    ("pretrain-squeezenet-first-round-m167.md", "### The first round of 4 against a full one, in trials and minutes "
     "(SqueezeNet held out): `deploytool tune --first-round 16` and `python bench/heldout.py`"),
    ("probe-population-mobilenet.md", "### A wider search for the pretrained model's first picks (MobileNetV2 held "
     "out): `python bench/probe_population.py`"),
    ("first-round-mobilenet-depthwise.md", "### MobileNetV2's depthwise convolutions in the first round: picks spread "
     "over tilings, and MobileNet-v1 in the pretraining data: `python bench/probe_population.py`"),
    ("kind-transfer-mobilenet.md", "### MobileNetV2's depthwise convolutions, offline: a model of that kind alone, "
     "and the model on its own first picks: `python bench/kind_transfer.py`"),
]


def write_doc(results_dir: Path, doc: Path) -> None:
    """docs/benchmarks.md from the latest results of each benchmark."""
    parts = ["# Benchmarks\n", "Made by the scripts in `bench/`; raw numbers in `bench/results/`. Ratios are "
             "deploytool median / onnxruntime median (below 1: deploytool faster), both timed in one run with the "
             "same inputs and threads, onnxruntime first.\n"]
    # bench/untuned.py [--target T]: the x86 (this machine's preset) run first
    for i, f in enumerate(sorted(results_dir.glob("untuned-*.json"), key=lambda f: (f.stem != "untuned-x86", f.stem))):
        res = json.loads(f.read_text())
        cmd = "python bench/untuned.py" + (f" --target {res['target']}" if res["target"] != "x86" else "")
        title = "## Untuned (default schedules)" if i == 0 else f"### Untuned, {res['target']}"
        parts.append(f"{title}: `{cmd}`\n\n" + markdown(res))
    # bench/tuned.py [--target T] [--label LABEL]: the x86-avx512 run first
    tuned = sorted(results_dir.glob("tuned-*.json"), key=lambda f: (not f.stem.startswith("tuned-x86-avx512"), f.stem))
    for i, f in enumerate(tuned):
        res = json.loads(f.read_text())
        label = f.stem[len(f"tuned-{res['target']}"):].lstrip("-")
        cmd = "python bench/tuned.py" + (f" --target {res['target']}" if res["target"] != "x86-avx512" else "") \
            + (f" --label {label}" if label else "")
        title = "## Tuned" if i == 0 else f"### Tuned, {res['target']}" + (f", budget '{label}'" if label else "")
        parts.append(f"{title}: `{cmd}`\n\n" + markdown_tuned(res))
    # bench/shipped.py --target T: the shipped logs replayed on a machine (a .md: a hand-made section)
    for f in sorted(results_dir.glob("shipped-*")):
        if f.suffix == ".json":
            res = json.loads(f.read_text())
            fam = res["host"].get("family", "?")  # zen3; an Intel's label (intel-6-207) reads better as its name
            machine = f"a Zen {fam[3:]}" if fam.startswith("zen") else f"an {res['host'].get('cpu', fam)}"
            parts.append(f"### The shipped {res['target']} logs on {machine}: "
                         f"`python bench/shipped.py --target {res['target']}`\n\n" + markdown_shipped(res))
        elif f.suffix == ".md":
            parts.append(f.read_text())
    f = results_dir / "gpu.json"
    if f.is_file():
        parts.append("## NVIDIA GPU: `python bench/gpu.py` (on the GPU machine)\n\n" + markdown_gpu(json.loads(f.read_text())))
    f = results_dir / "gpu-cold-l2.json"
    if f.is_file():
        parts.append("### Timing tuning candidates with a cold L2: `python bench/gpu.py --alt-log-dir`\n\n"
                     + markdown_gpu(json.loads(f.read_text())))
    f = results_dir / "gpu-cudnn.json"
    if f.is_file():
        parts.append("### Convolutions on cuDNN: `python bench/gpu.py --cudnn`\n\n" + markdown_gpu(json.loads(f.read_text())))
    f = results_dir / "cudnn_convs.md"
    if f.is_file():
        parts.append("### ResNet-50's convolutions one by one, batch 32, float16: `python bench/cudnn_convs.py`\n\n"
                     + f.read_text())
    f = results_dir / "gpu_profile.md"
    if f.is_file():
        parts.append("### Where the GPU time goes: `python bench/gpu_profile.py`\n\n" + f.read_text())
    f = results_dir / "gpu-rules.md"
    if f.is_file():
        parts.append("### Default schedules, ours vs dlight alone: `python bench/gpu_rules.py`\n\n" + f.read_text())
    for f in sorted(results_dir.glob("simd-*.json")):
        res = json.loads(f.read_text())
        parts.append(f"## NEON, shown: `python bench/neon.py` (target `{res['target']}`)\n\n" + markdown_simd(res))
    f = results_dir / "mcu.json"
    if f.is_file():
        parts.append("## Microcontrollers: `python bench/mcu.py`\n\n" + markdown_mcu(json.loads(f.read_text())))
    f = results_dir / "cost_model.md"
    if f.is_file():
        parts.append("## Cost model ranking quality: `python bench/cost_model.py`\n\n" + f.read_text())
    for name, heading in PRETRAIN_SECTIONS:
        f = results_dir / name
        if f.is_file():
            parts.append(f"{heading}\n\n" + f.read_text())
    for f in sorted(results_dir.glob("winograd-*.md")):
        parts.append("## Winograd convolutions on CPUs: `python bench/winograd.py`\n\n" + f.read_text())
    for f in sorted(results_dir.glob("defaults-*.md")):
        parts.append(f"## A change to the default CPU schedules, before and after: `python bench/defaults_ab.py "
                     f"--change {f.stem.split('-')[1]}`\n\n" + f.read_text())
    doc.write_text("\n".join(parts))


def markdown_gpu(result: dict[str, Any]) -> str:
    """The table of bench/gpu.py: deploytool vs torch eager / torch.compile / onnxruntime-CUDA."""
    engines = []
    for r in result["rows"]:
        for k in r:
            if isinstance(r[k], dict) and k not in engines:
                engines.append(k)
    head = ["model", "batch", "dtype", "check", *[f"{e} ms" for e in engines], "vs eager", "vs best torch.compile"]
    lines = [f"GPU: {result['gpu']['name']} ({result['gpu']['arch']}), torch {result['torch']}, {result['date']}.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        d = r.get("deploytool", {})

        def ms(e):
            v = r.get(e, {})
            return f"{v['median_ms']:.3f}" if "median_ms" in v else "-"
        dm = d.get("median_ms")
        eager = r.get("torch_eager", {}).get("median_ms")
        comp = [v["median_ms"] for k, v in r.items() if k.startswith("torch_compile") and isinstance(v, dict)
                and "median_ms" in v]
        chk = d.get("check", d.get("error", "-"))
        if d.get("tuned_kernels"):
            chk += f", {d['tuned_kernels']}/{d['kernels']} tuned"
        lines.append("| " + " | ".join([r["model"], str(r["batch"]), r["dtype"], chk, *[ms(e) for e in engines],
                                         f"{eager / dm:.2f}x" if dm and eager else "-",
                                         f"{min(comp) / dm:.2f}x" if dm and comp else "-"]) + " |")
    lines += ["", "vs eager / vs torch.compile: the other engine's median over deploytool's (above 1: deploytool "
              "faster). float32 rows: TF32 off."]
    lines += [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Untuned, target `{result['target']}` ({result['mcpu']}), {result['threads']} threads, "
             f"{result['host']['cpu']}, {result['date']}.", ""]
    lines += _table(result, [("model", "l", lambda r: r["model"]), ("kernels", "r", lambda r: str(r["kernels"])),
                             ("compile s", "r", lambda r: str(r["compile_s"])), ("check", "l", lambda r: r["check"]),
                             ("deploytool ms", "r", lambda r: str(r["deploytool_ms"])),
                             ("onnxruntime ms", "r", lambda r: str(r["onnxruntime_ms"])),
                             ("ratio", "r", lambda r: f"{r['ratio']:.2f}x")])
    lines.append("")
    lines.append("ratio = deploytool median / onnxruntime median (below 1: deploytool faster); both in one run, "
                 "same inputs, same threads.")
    lines += [f"- {n}" for n in result.get("notes", [])]  # a subset rerun's dates, the machine's state
    return "\n".join(lines) + "\n"
