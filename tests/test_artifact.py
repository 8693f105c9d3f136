"""Artifacts: metadata readable from the file alone (any arch), and loads that refuse clearly."""

import json
import shutil
import struct

import numpy as np
import pytest

import deploytool
from deploytool.artifact import read_metadata
from deploytool.errors import ArtifactError, TargetError

pytestmark = pytest.mark.fast


def _elf_machine(path):
    data = open(path, "rb").read(20)
    return struct.unpack("<H", data[18:20])[0]


def test_metadata_is_complete(tiny_so, tiny_model):
    import tvm

    from deploytool.artifact import sha256_file

    meta = read_metadata(tiny_so)
    assert meta["format"] == "deploytool-artifact/1"
    assert meta["deploytool_version"] == deploytool.__version__ and meta["tvm_version"] == tvm.__version__
    assert meta["model"]["sha256"] == sha256_file(tiny_model)
    assert meta["tuning_log_sha256"] is None
    assert meta["target"]["name"] == "x86" and meta["target"]["arch"] == "x86_64"
    assert "avx2" in meta["target"]["required_features"]
    assert [(i["name"], i["tvm_name"], i["shape"], i["dtype"]) for i in meta["inputs"]] == [
        ("in/img", "in_img", [1, 3, 8, 8], "float32"), ("in:bias", "in_bias", [1, 5], "float32")]
    assert [o["name"] for o in meta["outputs"]] == ["out/logits", "out:gate"]


def test_metadata_symbol_is_exported(tiny_so):
    import ctypes

    lib = ctypes.CDLL(str(tiny_so))
    blob = ctypes.cast(lib.deploytool_meta, ctypes.c_char_p)
    assert json.loads(blob.value.decode()) == read_metadata(tiny_so)


def test_aarch64_so_is_readable_on_x86(tmp_path, tiny_model):
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("gcc-aarch64-linux-gnu is not installed (make test installs it)")
    out = tmp_path / "tiny-arm.so"
    deploytool.compile(tiny_model, target="arm", output=out)
    assert _elf_machine(out) == 183  # EM_AARCH64
    meta = read_metadata(out)
    assert meta["target"]["arch"] == "aarch64" and meta["target"]["required_features"] == ["asimd"]
    with pytest.raises(TargetError, match="built for aarch64"):
        deploytool.run(out)


def test_missing_cpu_feature_is_refused_before_loading(tmp_path, tiny_model):
    """Build for a CPU with AMX (Sapphire Rapids): on a machine without it, loading must fail with
    a message, never SIGILL."""
    from deploytool.targets import host_cpu_flags

    if "amx_tile" in host_cpu_flags():
        pytest.skip("this CPU has AMX; the refusal cannot be shown here")
    preset = tmp_path / "spr.json"
    preset.write_text(json.dumps({"name": "spr", "family": "x86", "arch": "x86_64",
                                  "tvm": {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}}))
    out = tmp_path / "spr.so"
    deploytool.compile(tiny_model, target=str(preset), output=out)
    assert "amx_tile" in read_metadata(out)["target"]["required_features"]
    with pytest.raises(TargetError, match="lacks: .*amx_tile"):
        deploytool.run(out)


def test_not_an_artifact(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"hello")
    with pytest.raises(ArtifactError, match="not an ELF"):
        read_metadata(p)
    import glob

    libm = sorted(glob.glob("/lib/*/libm.so.6") + glob.glob("/usr/lib/*/libm.so.6"))[0]
    with pytest.raises(ArtifactError, match="no deploytool metadata"):
        read_metadata(libm)


def test_run_and_check_multi_io(tiny_so, tiny_model):
    res = deploytool.run(tiny_so, check=tiny_model, seed=3)
    assert res.ok and [c.name for c in res.comparison] == ["out/logits", "out:gate"]
    assert all(c.max_rel_err <= 1e-4 for c in res.comparison)
    assert res.outputs["out/logits"].shape == (1, 5) and np.ptp(res.outputs["out/logits"]) > 0
    again = deploytool.run(tiny_so, seed=3)
    np.testing.assert_array_equal(again.outputs["out:gate"], res.outputs["out:gate"])


def test_bench_compare(tiny_so, tiny_model):
    """Rounds alternate the engines; the ratio is the median of the rounds' ratios, the timings pool
    every round's samples."""
    import statistics

    r = deploytool.bench(tiny_so, compare=tiny_model, repeats=5, warmup=1, min_seconds=0, rounds=3)
    assert r.deploytool.repeats == 15 and r.onnxruntime.repeats == 15
    assert r.deploytool.min_ms <= r.deploytool.median_ms <= r.deploytool.p90_ms
    assert len(r.round_ratios) == 3 and r.ratio == pytest.approx(statistics.median(r.round_ratios))
    one = deploytool.bench(tiny_so, compare=tiny_model, repeats=5, warmup=1, min_seconds=0, rounds=1)
    assert one.ratio == pytest.approx(one.deploytool.median_ms / one.onnxruntime.median_ms)
    assert "samples_ms" not in r.to_dict()["deploytool"]


def test_compare_treats_matching_nans_as_equal():
    from deploytool.reference import compare

    ref = {"y": np.array([1.0, np.nan, np.inf, 2.0], np.float32)}
    assert compare({"y": ref["y"].copy()}, ref, 1e-4)[0].ok
    moved = np.array([np.nan, 1.0, np.inf, 2.0], np.float32)
    assert not compare({"y": moved}, ref, 1e-4)[0].ok
    off = np.array([1.0, np.nan, np.inf, 2.1], np.float32)
    c = compare({"y": off}, ref, 1e-4)[0]
    assert not c.ok and c.max_abs_err == pytest.approx(0.1, rel=1e-3)
