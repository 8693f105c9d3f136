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
