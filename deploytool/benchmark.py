"""The benchmark corpus and the untuned benchmark.

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


def run_untuned(names: list[str] | None, cache: Path, out_dir: Path, target: str = "x86", threads: int | None = None,
                repeats: int = 20, progress=print) -> dict[str, Any]:
    """Compile every corpus model untuned, check it against onnxruntime, and time both engines
    (each bench in a fresh process, onnxruntime first, same inputs and threads)."""
    import deploytool
    from deploytool.targets import load, physical_cores

    manifest = load_manifest()
    threads = threads or physical_cores()
    tgt = load(target)
    rows = []
    for entry in manifest["models"]:
        if names and entry["name"] not in names:
            continue
        row: dict[str, Any] = {"model": entry["name"]}
        try:
            path = materialize(entry, cache)
            so = out_dir / f"{entry['name']}-{target}.so"
            t0 = time.perf_counter()
            res = deploytool.compile(path, target=target, output=so)
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            row["kernels"] = len(res.tasks)
            chk = subprocess.run([sys.executable, "-m", "deploytool", "run", str(so), "--check", str(path),
                                  "--threads", str(threads)], capture_output=True, text=True)
            row["check"] = "pass" if chk.returncode == 0 else "FAIL"
            if chk.returncode:
                row["check_error"] = chk.stderr.strip().splitlines()[-1][:300]
            b = subprocess.run([sys.executable, "-m", "deploytool", "bench", str(so), "--compare", str(path), "--json",
                                "--threads", str(threads), "--repeats", str(repeats)], capture_output=True, text=True)
            if b.returncode:
                raise DeploytoolError(b.stderr.strip().splitlines()[-1][:300])
            j = json.loads(b.stdout)
            row.update(deploytool_ms=round(j["deploytool"]["median_ms"], 3),
                       onnxruntime_ms=round(j["onnxruntime"]["median_ms"], 3), ratio=round(j["ratio"], 3))
        except Exception as e:  # one model failing must not lose the others' results
            row["error"] = str(e)[:300]
        rows.append(row)
        progress(json.dumps(row))
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    return {
        "benchmark": "untuned", "target": tgt.name, "mcpu": tgt.tvm.get("mcpu"), "threads": threads,
        "host": {"cpu": _cpu_name(), "machine": platform.machine()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "geomean_ratio": round(geomean(ratios), 3) if ratios else None,
        "max_ratio": max(ratios) if ratios else None,
        "models": rows,
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Untuned, target `{result['target']}` ({result['mcpu']}), {result['threads']} threads, "
             f"{result['host']['cpu']}, {result['date']}.",
             "",
             "| model | kernels | compile s | check | deploytool ms | onnxruntime ms | ratio |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for r in result["models"]:
        if "error" in r:
            lines.append(f"| {r['model']} | | | error: {r['error'][:80]} | | | |")
            continue
        lines.append(f"| {r['model']} | {r['kernels']} | {r['compile_s']} | {r['check']} | {r['deploytool_ms']} | "
                     f"{r['onnxruntime_ms']} | {r['ratio']:.2f}x |")
    lines.append(f"| **geomean** | | | | | | **{result['geomean_ratio']:.2f}x** |")
    lines.append("")
    lines.append("ratio = deploytool median / onnxruntime median (below 1: deploytool faster); both in one run, "
                 "same inputs, same threads.")
    return "\n".join(lines) + "\n"
