"""The schedule library (schedules.transfer): other models' best traces adapted to a new model's
kernels and measured in their first round (tune --schedule-library). Real logs, TVM and builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploytool import targets
from deploytool.schedules import transfer as T
from test_cli import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]
DONOR_LOG = REPO / "tuning_logs" / "small_encoder-x86-avx512.jsonl.gz"
HERE = targets.portable_preset() or "x86"  # an x86-avx512 library serves x86-avx2 too (its nearest family)


@pytest.mark.fast
def test_adapt_tile_keeps_inner_factors_and_gives_the_rest_to_the_outer():
    assert T.adapt_tile([1, 32, 1, 4], 128) == [1, 32, 1, 4]
    assert T.adapt_tile([6, 1, 1, 64], 768) == [12, 1, 1, 64]   # 1,536-wide tile on a 3,072-wide matmul
    assert T.adapt_tile([128, 12], 3072) == [256, 12]
    assert T.adapt_tile([8, 24], 20) == [1, 20]                 # shrunk to a divisor where it does not divide
    assert T.adapt_tile([2, 8, 3], 36) == [2, 6, 3]
    for factors, extent in [([3, 5, 7], 64), ([1, 1, 64], 48), ([4, 4], 1)]:
        assert _prod(T.adapt_tile(factors, extent)) == extent


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def _donor_trace(name: str = "fused_matmul4_add2_add1"):
    """The shipped small-encoder log's best search record of kernel ``name``: (insts, decisions)."""
    from deploytool.tuninglog import TuningLog

    t = TuningLog.read(DONOR_LOG)
    w = next(h for h, wl in t.workloads.items() if wl.name == name)
    r = min((r for r in t.records if r.workload == w and r.ok and r.source == "search"), key=lambda r: r.seconds)
    return T.search_part(r.trace)


@pytest.mark.fast
def test_decision_keys_ignore_instructions_elsewhere_in_the_program():
    """A tile size keys by its block and loop, not its position: the same trace with one more
    block inlined first (BERT's FFN epilogue inlines a residual add the donor's does not) keys its
    decisions the same, and takes the donor's tile sizes."""
    insts, dec = _donor_trace()
    extra = [["GetSBlock", [], ["T_extra", "main"], ["bx0"]], ["ComputeInline", ["bx0"], [], []]]
    moved = [[i + 2, d] for i, d in dec]
    keys, keys2 = T.decision_keys(insts, dec), T.decision_keys(extra + insts, moved)
    assert sorted(keys.values()) == sorted(keys2.values()) and len(keys) == len(dec) >= 4
    assert T.signature(insts, dec) == T.signature(extra + insts, moved)
    # the kernel's own space sampled other tile sizes, at twice the extents of the donor's N and K
    tiles = [i for i, _ in moved if (extra + insts)[i][0] == T.TILE]
    sampled = [[i, [1] * (len(d) - 1) + [2 * _prod(d)] if i in tiles[-2:] else d] for i, d in moved]
    got = dict((i, d) for i, d in T.adapt(extra + insts, sampled, insts, dec))
    mine = dict(moved)
    for i in tiles[-2:]:
        assert _prod(got[i]) == 2 * _prod(mine[i]) and got[i][1:] == mine[i][1:], (got[i], mine[i])
    assert [got[i] for i in tiles[:-2]] == [mine[i] for i in tiles[:-2]]
    # a program of other tile places does not match
    other, odec = _donor_trace("fused_matmul1_multiply")
    assert T.signature(other, odec) != T.signature(insts, dec)


@pytest.mark.fast
def test_library_files_donors_by_signature_and_round_trips(tmp_path):
    insts, dec = _donor_trace()
    lib = T.ScheduleLibrary(family="x86-avx512")
    lib.add("donor", "w1", "k", [[insts, dec]], [1e-3])
    lib.add("donor", "w1", "k", [[insts, dec]], [1e-3])  # the same trace again: kept once
    assert len(lib) == 1 and len(next(iter(lib.donors.values()))[0].traces) == 1
    p = tmp_path / "lib.schedules.json.gz"
    lib.save(p)
    back = T.ScheduleLibrary.load(p)
    assert back.donors.keys() == lib.donors.keys() and back.programs == lib.programs
    # a space of the same signature gets the donor's decisions; one that tiles nothing gets none
    assert back.traces_for([[insts, dec]], k=4) == [[insts, dec]]
    assert back.traces_for([[insts[:3], []]], k=4) == []
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a deploytool schedule library"):
        T.ScheduleLibrary.load(tmp_path / "bad.json")


@pytest.mark.tuning
def test_tune_measures_adapted_donor_schedules_in_the_first_round(cli, tmp_path):
    """A library built from the shipped MiniLM-size encoder log, tuning a tiny encoder (hidden 32,
    FFN 64): every matmul kernel's first round measures donor schedules (source "transfer"), which
    build, run and pass the log's checks; a kernel with nothing to carry over gets none."""
    import onnx

    from deploytool import zoo
    from deploytool.tuninglog import TuningLog

    lib = tmp_path / "lib.schedules.json.gz"
    r = subprocess.run([sys.executable, "-m", "deploytool.cost_model.pretrain", "schedules", DONOR_LOG, "-o", lib],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "small_encoder" in r.stdout, r.stderr
    model = tmp_path / "enc.onnx"
    onnx.save(zoo.bert_encoder(seq=16, hidden=32, heads=2, layers=1, ffn=64, vocab=64, name="enc"), model)
    log = tmp_path / "enc.jsonl"
    r = cli("tune", model, "--target", HERE, "-o", log, "--cost-model", "none", "--trials-per-task", "4",
            "--batch", "2", "--repeat", "2", "--min-repeat-ms", "2", "--settle", "0", "--schedule-library", lib)
    assert r.code == 0, r
    assert "schedules of" in r.err and "other models to adapt" in r.err
    t = TuningLog.read(log)
    names = {h: w.name for h, w in t.workloads.items()}
    donated = {names[x.workload] for x in t.records if x.source == "transfer"}
    matmuls = {n for n in names.values() if n.startswith("fused_matmul")}
    assert matmuls and matmuls <= donated, (matmuls, donated)
    assert all(x.ok for x in t.records if x.source == "transfer")
    # at most --transfer-top per kernel, inside its budget
    per = {}
    for x in t.records:
        if x.source == "transfer":
            per[x.workload] = per.get(x.workload, 0) + 1
    assert max(per.values()) <= 2
    assert not {n for n in donated if n in ("take", "add1")}  # no tiles: nothing to carry over
    assert_one_line_error(cli("tune", model, "--target", HERE, "-o", tmp_path / "x.jsonl",
                              "--schedule-library", tmp_path / "nope.json.gz"), "is not a schedule library")
