"""The pretrained cost model: a dataset from tuning logs, pretraining, tuning from a pretrained model
(--cost-model) and prediction-only compiles (--predict). Real logs, real TVM builds and runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploytool import targets
from test_cli import assert_one_line_error

pytestmark = pytest.mark.tuning

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "tuning_logs" / "squeezenet1.0-x86-avx512.jsonl"
# tuning times kernels here: the portable preset this machine runs (the shipped log and the
# pretrained model in these tests are x86-avx512's; a model ranks candidates of any x86 preset)
HERE = targets.portable_preset() or "x86"
TINY = ["--trials-per-task", "2", "--batch", "2", "--repeat", "2", "--min-repeat-ms", "2"]


def _pretrain(*args):
    return subprocess.run([sys.executable, "-m", "deploytool.cost_model.pretrain", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A dataset from the shipped squeezenet log, and a model trained on it."""
    d = tmp_path_factory.mktemp("pretrain")
    data, model = d / "x86-avx512.npz", d / "sq.ubj"
    r = _pretrain("dataset", SHIPPED, "-o", data)
    assert r.returncode == 0, r.stderr
    r = _pretrain("train", data, "-o", model)
    assert r.returncode == 0, r.stderr
    return data, model


# the tests that share the fixture run on one xdist worker, so it is built once (~25 s)
_PRETRAINED = pytest.mark.xdist_group("pretrained")


@_PRETRAINED
def test_dataset_is_rebuilt_not_duplicated_and_model_ranks(pretrained):
    from deploytool.cost_model import pretrain as P

    data, model = pretrained
    d = P.load_dataset(data)
    n = len(d["latency"])
    assert n > 100 and str(d["family"]) == "x86-avx512" and set(d["model"].tolist()) == {"squeezenet1.0"}
    assert d["X"].shape == (n, 657)
    r = _pretrain("dataset", SHIPPED, "-o", data)  # the same log again replaces its rows
    assert r.returncode == 0 and len(P.load_dataset(data)["latency"]) == n
    meta = json.loads(model.with_suffix(".meta.json").read_text())
    assert meta["family"] == "x86-avx512" and meta["trained_on"] == n
    ev = json.loads(_pretrain("eval", model, data).stdout)
    # on its own training rows the model must rank far better than chance
    assert ev["pairwise_accuracy"] > 0.7 and ev["kernels"] >= 10
    # --per-kernel: one row per kernel scored, the same kernels as the summary, heaviest first
    ek = json.loads(_pretrain("eval", model, data, "--per-kernel").stdout)
    rows = ek["per_kernel"]
    assert len(rows) == ev["kernels"] and sum(r["records"] for r in rows) <= n
    assert [r["records"] for r in rows] == sorted((r["records"] for r in rows), reverse=True)
    assert all(0 < r["top1_score"] <= r["best_of_top8"] <= 1 for r in rows), rows[:3]
    assert ek["top1_score"] == pytest.approx(sum(r["top1_score"] for r in rows) / len(rows))
    # --also: another dataset's kernels join as kernels of their own (here the same rows again, so
    # every kernel twice: labels must never rank one machine's candidates against another's)
    both = model.with_name("both.ubj")
    r = _pretrain("train", data, "--also", data, "-o", both)
    assert r.returncode == 0, r.stderr
    meta2 = json.loads(both.with_suffix(".meta.json").read_text())
    assert meta2["trained_on"] == 2 * n and meta2["groups"] == 2 * meta["groups"], meta2
    assert meta2["also"] == [{"family": "x86-avx512", "models": ["squeezenet1.0"]}]


@_PRETRAINED
def test_a_log_that_grew_replaces_its_earlier_rows(pretrained, tmp_path):
    """A resumed log is the log as added before plus new lines: adding it again must replace the
    earlier version's rows, not add them twice (whole-file sha256 keys did), gzipped or not."""
    import gzip

    from deploytool.cost_model import pretrain as P

    n = len(P.load_dataset(pretrained[0])["latency"])  # the full log's rows alone
    lines = SHIPPED.read_bytes().splitlines(keepends=True)
    earlier = tmp_path / "old" / SHIPPED.name
    earlier = earlier.with_name(earlier.name + ".gz")
    earlier.parent.mkdir()
    with gzip.open(earlier, "wb") as f:
        f.writelines(lines[: len(lines) // 3])
    data = tmp_path / "grown.npz"
    assert _pretrain("dataset", earlier, "-o", data).returncode == 0
    n1 = len(P.load_dataset(data)["latency"])
    assert 0 < n1 < n
    r = _pretrain("dataset", SHIPPED, "-o", data, "--model", "squeezenet")  # the corpus's name for it
    assert r.returncode == 0, r.stderr
    assert f"replaces {n1} rows" in r.stderr
    d = P.load_dataset(data)
    assert len(d["latency"]) == n and set(d["model"].tolist()) == {"squeezenet"}


@_PRETRAINED
def test_tune_starts_from_a_pretrained_model(cli, tiny_model, tmp_path, pretrained):
    _, model = pretrained
    log = tmp_path / "t.jsonl"
    r = cli("tune", tiny_model, "--target", HERE, "-o", log, *TINY, "--cost-model", model)
    assert r.code == 0, r
    assert f"cost model: {model.name} (pretrained" in r.err
    r = cli("tune", tiny_model, "--target", HERE, "-o", tmp_path / "u.jsonl", *TINY, "--cost-model", "none")
    assert r.code == 0 and "learned from scratch" in r.err, r
    assert_one_line_error(cli("tune", tiny_model, "--target", HERE, "-o", log, "--cost-model",
                              tmp_path / "nope.ubj"), "is not a cost model file")


def test_tune_with_metaschedules_own_cost_model_and_resume(cli, tiny_model, tmp_path):
    """The baseline of the cost-model benchmarks: MetaSchedule's XGBModel in deploytool's loop; a
    resumed run feeds it the logged records (no warm-start warning) and measures new candidates."""
    log = tmp_path / "ms.jsonl"

    def searched():
        return sum(1 for line in log.read_text().splitlines() if '"source":"search"' in line.replace(" ", ""))

    small = ["--batch", "2", "--repeat", "2", "--min-repeat-ms", "2", "--cost-model", "metaschedule"]
    r = cli("tune", tiny_model, "--target", HERE, "-o", log, "--trials-per-task", "2", *small)
    assert r.code == 0 and "cost model: MetaSchedule's XGBModel" in r.err, r
    first = searched()
    assert first > 0
    r = cli("tune", tiny_model, "--target", HERE, "-o", log, "--trials-per-task", "4", *small)
    assert r.code == 0 and "could not warm-start" not in r.err, r
    assert searched() > first


def test_metaschedules_cost_model_pretrained_on_the_same_logs(cli, tiny_model, tmp_path):
    """The other baseline: MetaSchedule's XGBModel pretrained on the same records (its own features),
    saved as MetaSchedule saves it (booster + records), loaded by tune --cost-model metaschedule:FILE."""
    import numpy as np

    from deploytool import targets
    from deploytool.cost_model import dataset
    from deploytool.cost_model.dataset import pairwise_accuracy
    from deploytool.cost_model.model import metaschedule_xgb
    from deploytool.tuninglog import TuningLog

    path = tmp_path / "ms.tar"
    r = _pretrain("train-metaschedule", SHIPPED, "-o", path)
    assert r.returncode == 0, r.stderr
    m = metaschedule_xgb()
    m.load(str(path))
    assert m.booster is not None and m.data_size > 100
    # it learned: on its own training records it ranks the biggest kernel's candidates far better than chance
    target = targets.load("x86-avx512")
    g = max(dataset.groups_from_log(TuningLog.read(SHIPPED), target, min_records=8, featurize=False),
            key=lambda g: len(g.latencies))
    right, total = pairwise_accuracy(np.asarray(m.predict(dataset.context(g.mod, target), g.candidates())), g.latencies)
    assert total > 20 and right / total > 0.7, (right, total)
    log = tmp_path / "t.jsonl"
    r = cli("tune", tiny_model, "--target", HERE, "-o", log, *TINY, "--cost-model", f"metaschedule:{path}")
    assert r.code == 0 and "MetaSchedule's XGBModel, pretrained (ms.tar)" in r.err, r
    assert_one_line_error(cli("tune", tiny_model, "--target", HERE, "-o", log, "--cost-model",
                              f"metaschedule:{tmp_path / 'nope.tar'}"), "no such file")


@_PRETRAINED
def test_predict_compiles_checks_and_refuses_unknown_families(cli, tiny_model, tmp_path, pretrained):
    _, model = pretrained
    so = tmp_path / "p.so"
    r = cli("compile", tiny_model, "--target", HERE, "--predict", model, "-o", so)
    assert r.code == 0, r
    assert "nothing measured" in r.err and "schedules:" in r.out
    r = cli("run", so, "--check", tiny_model)
    assert r.code == 0 and "check passed" in r.out, r
    assert_one_line_error(cli("compile", tiny_model, "--target", "arm", "--predict", "-o", tmp_path / "a.so"),
                          "no pretrained cost model for aarch64-neon")


def test_pretrain_bad_input_is_one_line(tmp_path):
    r = _pretrain("dataset", tmp_path / "nope.jsonl", "-o", tmp_path / "d.npz")
    assert r.returncode == 2, r
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("deploytool: error: ") and "does not exist" in lines[0], r.stderr
    assert not (tmp_path / "d.npz").exists()


@pytest.mark.fast
def test_exclude_naming_no_model_is_one_line_with_the_names(tmp_path):
    """An --exclude that names no model of the input would leave nothing out, silently (a held-out
    benchmark that is not held out): refused, with the names there are. A log's model is its file
    name's (squeezenet1.0-x86-avx512.jsonl: squeezenet1.0); nothing is written."""
    logs = [REPO / "tuning_logs" / "squeezenet1.0-x86-avx512.jsonl", REPO / "tuning_logs" / "ds_cnn_1d-x86-avx512.jsonl.gz"]
    for cmd, inputs in (("schedules", logs), ("train-metaschedule", logs),
                        ("train", [REPO / "cost_model" / "data" / "x86-avx2.npz"])):
        out = tmp_path / f"{cmd}.out"
        r = _pretrain(cmd, *inputs, "--exclude", "squeezenet" if cmd != "train" else "squeezenet1.0", "-o", out)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (cmd, r.stderr)
        assert "no model of that name" in lines[0] and ("squeezenet1.0" if cmd != "train" else "squeezenet,") in lines[0]
        assert not out.exists()
    # a log that is not there is named as such, --exclude or not
    r = _pretrain("schedules", tmp_path / "nope.jsonl", "--exclude", "x", "-o", tmp_path / "s.out")
    assert r.returncode == 2 and "tuning log" in r.stderr and "does not exist" in r.stderr, r.stderr


def test_target_families():
    from deploytool import targets
    from deploytool.cost_model.pretrain import family_of

    assert family_of(targets.load("x86-avx512")) == "x86-avx512"
    assert family_of(targets.load("x86-avx2")) == "x86-avx2"
    assert family_of(targets.load("arm")) == "aarch64-neon"
    assert family_of(targets.load("cuda-sm80")) == "cuda-sm_80"


def test_a_family_without_a_model_tunes_from_its_nearest_and_predicts_from_none(cli, tiny_model, tmp_path):
    """A family without a model of its own (x86-avx2 until 2026-12-02) tunes from its nearest family's
    and says so; --predict, which measures nothing, does not take another ISA's model. x86-avx2 now
    ships its own model, which both take."""
    import shutil

    from deploytool.cost_model import pretrain as P

    avx2 = targets.load("x86-avx2")
    assert P.resolve("pretrained", avx2, nearest=True) == P.PRETRAINED_DIR / "x86-avx2.ubj"
    assert P.resolve("pretrained", avx2) == P.PRETRAINED_DIR / "x86-avx2.ubj"
    only512 = tmp_path / "models"  # the shipped models as they were before the x86-avx2 one
    only512.mkdir()
    for f in ("x86-avx512.ubj", "x86-avx512.meta.json"):
        shutil.copy(P.PRETRAINED_DIR / f, only512 / f)
    assert P.pretrained_path(avx2, nearest=True, directory=only512) == only512 / "x86-avx512.ubj"
    assert P.pretrained_path(avx2, directory=only512) is None
    assert P.resolve("pretrained", targets.load("arm"), nearest=True) is None  # --predict's refusal of it:
    # test_predict_compiles_checks_and_refuses_unknown_families
    if targets.missing_features(avx2.required_features, avx2.arch):
        pytest.skip("this machine cannot time x86-avx2 kernels")
    r = cli("tune", tiny_model, "--target", "x86-avx2", "-o", tmp_path / "t.jsonl", *TINY)
    assert r.code == 0, r
    assert "cost model: x86-avx2.ubj (pretrained, fine-tuned" in r.err, r.err
    r = cli("tune", tiny_model, "--target", "x86-avx2", "-o", tmp_path / "u.jsonl", *TINY,
            "--cost-model", only512 / "x86-avx512.ubj")
    assert r.code == 0, r
    assert "cost model: x86-avx512.ubj (pretrained on x86-avx512 logs, this target is x86-avx2" in r.err, r.err


@_PRETRAINED
def test_each_machines_records_rank_as_a_kernel_of_their_own(pretrained):
    """The shipped log holds five machines' records of each kernel, and latencies rank only within
    one machine: a kernel of a machine other than the log's own is the group "<hash>@<machine>",
    its machine named whole (the column was cut at 64 characters, which would make two machines
    whose names differ only at the end, e.g. in their thread count, one group)."""
    from deploytool.cost_model import pretrain as P
    from deploytool.tuninglog import TuningLog

    d = P.load_dataset(pretrained[0])
    machines = {g.split("@", 1)[1] for g in set(d["group"].tolist()) if "@" in g}
    devices = set(TuningLog.read(SHIPPED).devices())
    assert len(machines) >= 3 and machines <= devices, (machines, devices)


def test_a_pretrained_model_ranks_kernels_the_run_has_not_measured_by_itself():
    """Fine-tuning blends per kernel: a kernel without records of this run is ranked by the pretrained
    model alone, however much the run's model learned from other kernels; one with BLEND_RECORDS
    records by the run's model alone; in between, a mix of the two."""
    import numpy as np
    import xgboost as xgb

    from deploytool.cost_model import features as F
    from deploytool.cost_model.model import BLEND_RECORDS, XGBCostModel

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(64, F.LENGTH)).astype(np.float32)
    pre = XGBCostModel(nthread=1)
    pre.add("other model's kernel", X, 1.0 + X[:, 0])  # pretrained: feature 0 is slow
    pre.fit()
    run = XGBCostModel(nthread=1)
    run.base = pre.booster
    seen = X[:BLEND_RECORDS]
    run.add("measured", seen, 1.0 + 5 * seen[:, 1] - seen[:, 0])  # this run: feature 1 is slow
    run.fit()
    base, own = pre.booster.predict(xgb.DMatrix(X)), run.booster.predict(xgb.DMatrix(X))
    assert not np.allclose(base, own)
    assert np.allclose(run.predict(X, "not measured yet"), base)
    assert np.allclose(run.predict(X, "measured"), own)
    run.groups["half"] = ([], [1.0] * (BLEND_RECORDS // 2))
    assert np.allclose(run.predict(X, "half"), (base + own) / 2)


def test_search_scores_compare_across_calls(tiny_candidates):
    """The evolutionary search keeps one heap of candidates over its generations, each scored in a
    call of its own: a candidate's score must not depend on what else is in the call (until
    2026-12-07 each call was shifted by its own minimum)."""
    import numpy as np

    from deploytool.cost_model.model import XGBCostModel, make_tuner_cost_model

    ctx, cands = tiny_candidates
    model = XGBCostModel(nthread=1)
    cm = make_tuner_cost_model(model)
    model.add("k", cm.features(ctx, cands), 1.0 + np.arange(len(cands)) % 3)  # distinct latencies, scores
    model.fit()
    whole = cm.predict(ctx, cands)
    assert (whole > 0).all()
    assert whole.min() < whole.max()
    rest = [i for i in range(len(cands)) if whole[i] > whole.min()]  # the lowest left out (and its twins)
    assert np.allclose(cm.predict(ctx, [cands[i] for i in rest]), whole[rest])
