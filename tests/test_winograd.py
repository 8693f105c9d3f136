"""Winograd convolutions (deploytool.winograd): the TE computation against a direct convolution,
the graph rewrite's choice of convolutions, a whole model against onnxruntime, and a tuned
Winograd build replayed from its log."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest


def direct_conv_nhwc(x: np.ndarray, w: np.ndarray, pad: tuple[int, int, int, int]) -> np.ndarray:
    """Reference: NHWC input, HWIO 3x3 weights, stride 1, float64."""
    pt, pl, pb, pr = pad
    xp = np.pad(x.astype("float64"), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, h, wd, _ = xp.shape
    out = np.zeros((n, h - 2, wd - 2, w.shape[3]))
    for kh in range(3):
        for kw in range(3):
            out += np.einsum("nhwc,co->nhwo", xp[:, kh:kh + h - 2, kw:kw + wd - 2, :], w[kh, kw].astype("float64"))
    return out


def make_conv_model(path, convs, seed=0):
    """NCHW input (1, 16, 21, 19) through the listed convolutions (out channels, kernel, stride,
    pads), each + bias + Relu."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, last, ch, h, w = [], [], "x", 16, 21, 19
    for i, (co, k, stride, pads) in enumerate(convs):
        h, w = (h + pads[0] + pads[2] - k) // stride + 1, (w + pads[1] + pads[3] - k) // stride + 1
        inits += [numpy_helper.from_array(rng.normal(0, 0.2, (co, ch, k, k)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, (co,)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [last, f"w{i}", f"b{i}"], [f"c{i}"], pads=list(pads), strides=[stride] * 2),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        last, ch = f"r{i}", co
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 21, 19])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ch, h, w])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


# 3x3 pad 1 (rewritten: 6x5 output tiles), 3x3 asymmetric pad (rewritten), 1x1 (kept), 3x3 stride 2
# (kept), 3x3 on the 11x10 map after it (kept: 3x3 tiles, fewer than winograd.MIN_TILES)
CONVS = [(16, 3, 1, (1, 1, 1, 1)), (24, 3, 1, (0, 1, 2, 0)), (16, 1, 1, (0, 0, 0, 0)), (16, 3, 2, (1, 1, 1, 1)),
         (16, 3, 1, (1, 1, 1, 1))]


@pytest.mark.fast
@pytest.mark.parametrize("tile", [2, 4])
def test_te_winograd_matches_a_direct_convolution(tile):
    import tvm
    from tvm import te

    from deploytool import winograd

    rng = np.random.default_rng(tile)
    x = rng.normal(0, 1, (1, 13, 11, 16)).astype("float32")
    w = rng.normal(0, 0.2, (3, 3, 16, 24)).astype("float32")
    pad = (1, 0, 2, 1)
    u = winograd.transform_weights(w, tile)
    assert u.shape == (tile + 2, tile + 2, 16, 24)
    xt = te.placeholder(x.shape, "float32", name="x")
    ut = te.placeholder(u.shape, "float32", name="u")
    out = winograd.conv2d_nhwc(xt, ut, pad, tile)
    lib = tvm.compile(te.create_prim_func([xt, ut, out]), target=tvm.target.Target({"kind": "llvm"}))
    ref = direct_conv_nhwc(x, w, pad)
    got = tvm.runtime.tensor(np.zeros(ref.shape, "float32"))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(u), got)
    got = got.numpy()
    assert got.shape == ref.shape
    # float32 against float64: F(2x2) rounds like a direct convolution, F(4x4) loses ~1 more digit
    np.testing.assert_allclose(got, ref, rtol=0, atol=(2e-5 if tile == 2 else 1e-4) * np.abs(ref).max())


@pytest.mark.fast
def test_tuning_estimate_counts_a_convolution_tuned_both_ways_once():
    """tune --winograd auto times a direct and a Winograd kernel for one convolution; the live
    end-to-end estimate counts the one compile would take (Winograd at most AUTO_MARGIN of the
    direct time), and the untuned estimate the direct one."""
    from deploytool import winograd
    from deploytool.tuner import TaskState, _estimate

    def task(name, w, default_s, best_s, calls=2):
        args = [([1, 28, 28, 128], "float32"), ([w, w, 128, 128], "float32"), ([1, 1, 1, 128], "float32"),
                ([1, 28, 28, 128], "float32")]
        return TaskState(name=name, workload=name, flops=1.0, calls=calls, args=args, default_s=default_s,
                         best_s=best_s)

    other = TaskState(name="fused_matmul", workload="m", flops=1.0, calls=1, args=[([4, 4], "float32")] * 3,
                      default_s=0.5, best_s=0.25)
    direct = task("fused_conv2d_add_relu", 3, 4.0, 2.0)
    fast = task("fused_conv2d_winograd_add_relu", 6, 3.0, 2.0 * winograd.AUTO_MARGIN)
    assert _estimate([direct, fast, other], "best_s") == pytest.approx(2 * 1.6 + 0.25)
    assert _estimate([direct, fast, other], "default_s") == pytest.approx(2 * 4.0 + 0.5)
    slow = task("fused_conv2d_winograd_add_relu", 6, 3.0, 1.9)  # faster, but not by the margin
    assert _estimate([direct, slow, other], "best_s") == pytest.approx(2 * 2.0 + 0.25)
    untimed = task("fused_conv2d_winograd_add_relu", 6, 3.0, float("inf"))  # only its default's time
    assert _estimate([direct, untimed, other], "best_s") == pytest.approx(2 * 2.0 + 0.25)
    f2 = task("fused_conv2d_winograd_add_relu_w", 4, 3.0, 1.5)  # F(2x2): 4x4 transformed weights, the fastest
    assert _estimate([direct, fast, f2, other], "best_s") == pytest.approx(2 * 1.5 + 0.25)
    assert _estimate([direct, slow, f2, other], "default_s") == pytest.approx(2 * 4.0 + 0.5)
    assert _estimate([fast, other], "best_s") == pytest.approx(2 * 1.6 + 0.25)  # --winograd: no pair


@pytest.mark.models
def test_winograd_build_matches_onnxruntime_and_rewrites_only_3x3_stride_1(tmp_path, cli):
    import deploytool

    model = make_conv_model(tmp_path / "convs.onnx", CONVS)
    res = deploytool.compile(model, target="x86", winograd=True, output=tmp_path / "w.so")
    names = [t.name for t in res.tasks]
    assert sum("winograd" in n for n in names) == 2, names   # the two 3x3 stride-1 convolutions
    assert sum("conv2d" in n and "winograd" not in n for n in names) == 3, names
    assert [res.schedules[n] for n in names if "winograd" in n] == ["winograd"] * 2, res.schedules  # schedules/cpu.py
    r = cli("run", tmp_path / "w.so", "--check", model)
    assert r.code == 0 and "check passed" in r.out, r
    assert json.loads(cli("metadata", tmp_path / "w.so").out)["winograd"] is True
    plain = cli("compile", model, "--target", "x86", "-o", tmp_path / "d.so")
    assert plain.code == 0, plain
    assert json.loads(cli("metadata", tmp_path / "d.so").out)["winograd"] is False


@pytest.mark.tuning
def test_winograd_log_replays_and_a_build_without_it_is_told(tmp_path, cli):
    """A log tuned with --winograd replays with it; compile without the flag builds as the log was
    tuned (Winograd here); --winograd off builds direct kernels the log lacks, and is told why."""
    model = make_conv_model(tmp_path / "convs.onnx", CONVS[:2])
    log = tmp_path / "w.jsonl"
    tune = ("tune", model, "--target", "x86", "--winograd", "--batch", "2", "-o", log, "-q")
    t = cli(*tune, "--trials-per-task", "2", "--kernels", "*winograd*")   # the Winograd kernels only
    assert t.code == 0, t
    cov = json.loads(cli("logs", "check", log, model, "--target", "x86", "--winograd", "--json").out)
    assert cov["covered"] and all("winograd" in k for k in cov["covered"]), cov
    assert cov["missing"] and not any("winograd" in k for k in cov["missing"]), cov   # the layout transposes
    t = cli(*tune, "--trials-per-task", "1")   # resumes: the rest (their default schedules are records too)
    assert t.code == 0, t
    ok = cli("compile", model, "--target", "x86", "--winograd", "--tuning-log", log, "--require-tuned",
             "-o", tmp_path / "w.so")
    assert ok.code == 0, ok
    assert cli("run", tmp_path / "w.so", "--check", model).code == 0
    same = cli("compile", model, "--target", "x86", "--tuning-log", log, "--require-tuned", "-o", tmp_path / "s.so")
    assert same.code == 0, same
    meta = json.loads(cli("metadata", tmp_path / "s.so").out)
    assert meta["winograd"] is True and sum("winograd" in k["name"] for k in meta["kernel_table"]) == 2, meta
    bad = cli("compile", model, "--target", "x86", "--winograd", "off", "--tuning-log", log, "--require-tuned",
              "-o", tmp_path / "d.so")
    assert bad.code == 2, bad
    assert "tuned with --winograd" in bad.err + bad.out and "drop --winograd off" in bad.err + bad.out, bad


@pytest.mark.tuning
def test_winograd_auto_builds_each_convolution_the_way_its_log_times_faster(tmp_path, cli):
    """--winograd auto: tuning gives each eligible convolution its kernels, direct and Winograd
    F(2x2) and F(4x4) (paired by shape); compile builds each convolution with the one its log
    times fastest. The log's Winograd timings are then set from its direct kernel's best, the
    16-channel convolution's F(2x2) at half of it and the rest at twice it, so that the choice is
    known whatever this machine measured (scaling the measured times 10x was not enough on a CI
    machine where a 1-trial F(2x2) kernel ran over 8x slower than the direct one)."""
    import dataclasses

    import deploytool
    import deploytool.errors
    from deploytool import winograd
    from deploytool.tuninglog import TuningLog, write_log

    model = make_conv_model(tmp_path / "convs.onnx", CONVS[:2])
    log = tmp_path / "auto.jsonl"
    t = cli("tune", model, "--target", "x86", "--winograd", "auto", "--trials-per-task", "1", "--batch", "2",
            "--settle", "0", "-o", log, "-q")
    assert t.code == 0, t
    tlog = TuningLog.read(log)
    assert tlog.header["model"]["winograd"] == "auto"
    sigs = {h: winograd.kernel_signature(w.name, [a[0] for a in w.args]) for h, w in tlog.workloads.items()}
    pairs = {}
    for h, sig in sigs.items():
        if sig is not None:
            pairs.setdefault(sig[0], {})[sig[1]] = h
    assert len(pairs) == 2 and all(set(p) == {0, 2, 4} for p in pairs.values()), (pairs, sigs)  # every way
    # rerun with a settle: each convolution's three kernels (one candidate each for the Winograd
    # ones, so no settle of their own) are timed together, in one settle
    t = cli("tune", model, "--target", "x86", "--winograd", "auto", "--trials-per-task", "1", "--batch", "2",
            "--settle", "2", "-o", log, "-q")
    assert t.code == 0, t
    settled = TuningLog.read(log)
    when = {r.workload: r.time for r in settled.records if r.source == "settle"}
    assert all(len({when.get(h) for h in p.values()}) == 1 and None not in {when.get(h) for h in p.values()}
               for p in pairs.values()), (when, pairs)
    best = tlog.best_by_workload()   # what compile compares, the direct kernel's time included
    direct = {p[0]: best[p[0]].seconds for p in pairs.values()}
    assert all(math.isfinite(d) for d in direct.values()), direct
    set_s = {p[m]: direct[p[0]] * (0.5 if (sig[4], m) == (16, 2) else 2.0) for sig, p in pairs.items() for m in (2, 4)}
    recs = [dataclasses.replace(r, latency_s=[set_s[r.workload]] * len(r.latency_s))
            if r.workload in set_s and r.latency_s else r for r in tlog.records]
    log2 = tmp_path / "scaled.jsonl"
    write_log(log2, tlog.header, tlog.workloads.values(), recs)
    out = tmp_path / "auto.so"
    c = cli("compile", model, "--target", "x86", "--winograd", "auto", "--tuning-log", log2, "--require-tuned",
            "-o", out)
    assert c.code == 0, c
    assert "Winograd for 1 of 2 eligible convolutions" in c.out + c.err and "F(2x2)" in c.out + c.err, c
    meta = json.loads(cli("metadata", out).out)
    assert meta["winograd"] is True and meta["winograd_auto"] == 1, meta
    kernels = {k["name"]: k["workload_hash"] for k in meta["kernel_table"]}
    wino = [h for n, h in kernels.items() if "winograd" in n]
    assert wino == [p[2] for sig, p in pairs.items() if sig[4] == 16], (kernels, pairs)
    assert [p[0] for sig, p in pairs.items() if sig[4] == 24][0] in kernels.values()
    assert all(meta_s == "tuned" for meta_s in (k["schedule"] for k in meta["kernel_table"])), meta["kernel_table"]
    r = cli("run", out, "--check", model)
    assert r.code == 0 and "check passed" in r.out, r
    cov = json.loads(cli("logs", "check", log, model, "--target", "x86", "--winograd", "auto", "--json").out)
    assert not cov["missing"], cov   # the direct build, every convolution's fallback, is covered
    bad = cli("compile", model, "--target", "x86", "--winograd", "auto", "-o", tmp_path / "x.so")
    assert bad.code == 2 and "--winograd auto" in bad.err and "--tuning-log" in bad.err, bad
    bad = cli("compile", model, "--target", "x86", "--winograd", "always", "-o", tmp_path / "x.so")
    assert bad.code == 2 and "'always' is not auto, off or all" in bad.err, bad
    with pytest.raises(deploytool.errors.InputError, match="--winograd always"):   # the API says it too
        deploytool.compile(model, target="x86", winograd="always", output=tmp_path / "x.so")


@pytest.mark.fast
def test_tuning_winograd_kernels_alone_settles_their_direct_kernel_with_them(tmp_path, cli):
    """--kernels '*winograd*' on a log tuned directly: the convolution's direct kernel is not
    searched again, but the settle times it with the Winograd kernels, so that compile --winograd
    auto compares the three within one settle, not against a direct timing of another run."""
    from deploytool import winograd
    from deploytool.tuninglog import TuningLog

    model = make_conv_model(tmp_path / "conv.onnx", CONVS[:1])
    log = tmp_path / "log.jsonl"
    t = cli("tune", model, "--target", "x86", "--winograd", "off", "--trials-per-task", "2", "--batch", "2",
            "--settle", "2", "-o", log, "-q")
    assert t.code == 0, t
    first = TuningLog.read(log)
    direct = [h for h, w in first.workloads.items() if winograd.kernel_signature(w.name, [a[0] for a in w.args])]
    assert len(direct) == 1, first.workloads
    t0 = max(r.time for r in first.records if r.source == "settle" and r.workload == direct[0])
    searched = sum(1 for r in first.records if r.workload == direct[0] and r.source != "settle")
    t = cli("tune", model, "--target", "x86", "--winograd", "auto", "--kernels", "*winograd*",
            "--trials-per-task", "1", "--batch", "2", "--settle", "2", "-o", log, "-q")
    assert t.code == 0, t
    tlog = TuningLog.read(log)
    ways = {winograd.kernel_signature(w.name, [a[0] for a in w.args])[1]: h for h, w in tlog.workloads.items()
            if winograd.kernel_signature(w.name, [a[0] for a in w.args])}
    assert set(ways) == {0, 2, 4}, ways
    last = {how: max((r.time for r in tlog.records if r.source == "settle" and r.workload == h), default=None)
            for how, h in ways.items()}
    assert last[0] > t0 and len(set(last.values())) == 1, (last, t0)   # one settle, the direct kernel's too
    assert sum(1 for r in tlog.records if r.workload == direct[0] and r.source != "settle") == searched  # not searched


@pytest.mark.fast
def test_a_winograd_kernel_is_searched_over_its_gemm_tile(tmp_path, cli):
    """The Winograd kernel's design space is its default schedule with the batched GEMM's register
    tile as sampled decisions (schedules/cpu.py rule ``winograd``): tuning measures candidates
    other than the default, each a different tile, and a build from the log passes the onnxruntime
    check."""
    from deploytool.tuninglog import TuningLog

    model = make_conv_model(tmp_path / "conv.onnx", [(32, 3, 1, (1, 1, 1, 1))])
    log = tmp_path / "log.jsonl"
    t = cli("tune", model, "--target", "x86", "--winograd", "all", "--kernels", "*winograd*",
            "--trials-per-task", "3", "--batch", "3", "--settle", "0", "-o", log, "--json")
    assert t.code == 0, t
    task = [k for k in json.loads(t.out)["tasks"] if "winograd" in k["name"]]
    assert len(task) == 1 and task[0]["new_trials"] >= 2, task   # not "search space measured (1 candidate)"
    tlog = TuningLog.read(log)
    recs = [r for r in tlog.records if r.workload == task[0]["workload"] and r.ok]
    assert len({r.candidate for r in recs}) >= 2, recs
    c = cli("compile", model, "--target", "x86", "--winograd", "all", "--tuning-log", log, "-o", tmp_path / "w.so")
    assert c.code == 0, c
    r = cli("run", tmp_path / "w.so", "--check", model)
    assert r.code == 0 and "check passed" in r.out, r
