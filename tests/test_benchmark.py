"""The benchmark scripts' helpers (deploytool.benchmark): machine labels, which shipped logs a
target has, and docs/benchmarks.md as the rendering of bench/results/."""

from pathlib import Path

import pytest

from deploytool import benchmark

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def _cpuinfo(vendor, family, model):
    return f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: fpu\n"


@pytest.mark.parametrize("vendor,family,model,label", [
    ("AuthenticAMD", 25, 1, "zen3"),      # EPYC Milan
    ("AuthenticAMD", 25, 0x11, "zen4"),   # EPYC Genoa
    ("AuthenticAMD", 25, 0x50, "zen3"),   # Cezanne
    ("AuthenticAMD", 26, 2, "zen5"),
    ("GenuineIntel", 6, 143, "intel-6-143"),
])
def test_cpu_label(vendor, family, model, label):
    assert benchmark.cpu_label(_cpuinfo(vendor, family, model)) == label


def test_shipped_logs_map_to_corpus_models():
    logs = benchmark.shipped_logs(REPO / "tuning_logs", "x86-avx2")
    assert {"squeezenet", "yolov3_tiny", "bert_encoder", "mobilenet_v2"} <= set(logs)
    assert logs["squeezenet"].name.startswith("squeezenet1.0-x86-avx2.jsonl")
    corpus = {e["name"] for e in benchmark.load_manifest()["models"]}
    assert set(logs) <= corpus
    # CUDA logs carry batch and dtype in their names (resnet50-b1-float16-cuda): other builds
    assert not benchmark.shipped_logs(REPO / "tuning_logs", "cuda")


def test_benchmarks_doc_is_the_rendering_of_the_results(tmp_path):
    """docs/benchmarks.md is written by benchmark.write_doc from bench/results/ (hand-made sections
    live there as .md files): an edit of the doc alone would be lost at the next benchmark run."""
    out = tmp_path / "benchmarks.md"
    benchmark.write_doc(REPO / "bench" / "results", out)
    assert out.read_text() == (REPO / "docs" / "benchmarks.md").read_text()


def test_heldout_minutes_to_95pct_count_the_run_not_the_pause_before_its_resume():
    """bench/heldout.py's wall clock to a latency: record timestamps, a long pause (a run stopped and
    resumed later) counted as none of it, only the header machine's records, None if never reached."""
    import dataclasses
    import sys
    from types import SimpleNamespace

    from deploytool.tuninglog import TuningLog

    sys.path.insert(0, str(REPO / "bench"))
    import heldout

    t = TuningLog.read(REPO / "bench/results/heldout-logs/small_encoder-x86-avx512-pretrained-seed0.jsonl.gz")
    proto = next(r for r in t.records if t.device_of(r) == t.home)

    def rec(w, ms, at, source="search", **kw):
        return dataclasses.replace(proto, workload=w, latency_s=[ms * 1e-3], time=1000.0 + at, source=source, **kw)

    tasks = [SimpleNamespace(workload_hash="a", calls=2), SimpleNamespace(workload_hash="b", calls=1)]
    t.records = [rec("a", 1.0, 0, "default"), rec("b", 1.0, 10, "default"),  # 3.0 ms
                 rec("a", 0.5, 20),                                             # 2.0 ms after 20 s
                 rec("b", 0.1, 25, device="another board"),                     # not this run's machine
                 rec("b", 0.5, 20 + heldout.PAUSE_S + 500),                     # resumed: 1.5 ms
                 rec("a", 0.25, 20 + heldout.PAUSE_S + 530)]                    # 1.0 ms, 30 s later
    assert heldout.minutes_to(t, tasks, 3.0) == pytest.approx(10 / 60)
    assert heldout.minutes_to(t, tasks, 2.0) == pytest.approx(20 / 60)
    assert heldout.minutes_to(t, tasks, 1.5) == pytest.approx(20 / 60)
    assert heldout.minutes_to(t, tasks, 1.0) == pytest.approx(50 / 60)
    assert heldout.minutes_to(t, tasks, 0.9) is None


def test_retime_curve_plots_earlier_results_and_names_a_missing_one(tmp_path):
    """bench/retime_curve.py --plot-only: earlier re-timings of the same runs drawn side by side,
    nothing measured; a result file that is not there is named in one line, exit code 2."""
    import subprocess
    import sys

    res = [REPO / "bench/results/retime-bert-zen5.json", REPO / "bench/results/retime-bert-zen5-again.json"]
    script = [sys.executable, str(REPO / "bench/retime_curve.py"), "--plot-only"]
    r = subprocess.run([*script, *map(str, res), "--out", str(tmp_path / "both")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    png = (tmp_path / "both.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    r = subprocess.run([*script, str(tmp_path / "none.json"), "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode == 2 and f"no such file: {tmp_path / 'none.json'}" in r.stderr.splitlines()[-1]
    assert not (tmp_path / "x.png").exists()
