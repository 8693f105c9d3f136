"""The CLI through a real subprocess: every command, and every error case of the foundation
issue gives one line naming the problem and the fix, exit code 2, no traceback."""

import json

import numpy as np
import pytest

from conftest import make_tiny_model

pytestmark = pytest.mark.fast


def assert_one_line_error(r, *needles, code=2):
    assert r.code == code, r
    lines = [ln for ln in r.err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r
    assert lines[0].startswith("deploytool: error: "), r
    assert "Traceback" not in r.err
    for n in needles:
        assert n in lines[0], r


def test_help_lists_every_command(cli):
    r = cli("--help")
    assert r.code == 0
    for c in ("inspect", "compile", "run", "bench", "targets", "metadata"):
        assert c in r.out


def test_targets(cli):
    r = cli("targets")
    assert r.code == 0 and "x86-avx512" in r.out and "cortex-m7" in r.out


def test_inspect(cli, tiny_model):
    r = cli("inspect", tiny_model)
    assert r.code == 0, r
    for needle in ("in/img: float32[1, 3, 8, 8]", "out:gate: float32[1, 5]", "ai.onnx 17", "Conv", "Gemm",
                   "parameters 132", "fused kernels"):
        assert needle in r.out, (needle, r.out)
    j = json.loads(cli("inspect", tiny_model, "--json").out)
    assert j["op_histogram"]["Conv"] == 1 and j["param_count"] == 132 and j["unsupported_ops"] == {}
    assert j["tasks"] and all(t["workload_hash"] for t in j["tasks"])


def test_inspect_lists_unsupported_and_dynamic(cli, tmp_path):
    p = make_tiny_model(tmp_path / "u.onnx", extra_ops=("Celu", "Det"), dynamic_batch=True)
    r = cli("inspect", p)
    assert r.code == 0, r
    assert "unsupported: 1 operator type(s): Det" in r.out  # Celu imports through its function body
    assert "Celu   (imported from its ONNX function body)" in r.out
    assert "dynamic: N" in r.out


def test_inspect_names_what_is_left_out_by_design(cli, tmp_path):
    """Training ops, string ops and sequence values are out of scope: inspect says which, and why."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["loss"]),
         helper.make_node("SequenceConstruct", ["x"], ["seq"])], "train",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_value_info("seq", helper.make_sequence_type_proto(
             helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3])))])
    p = tmp_path / "train.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    r = cli("inspect", p)
    assert r.code == 0, r
    assert "SoftmaxCrossEntropyLoss   LEFT OUT (training operator)" in r.out
    assert "output seq: sequence value at the interface" in r.out
    j = json.loads(cli("inspect", p, "--json").out)
    assert j["left_out"] == {"SoftmaxCrossEntropyLoss": "training operator",
                             "output seq": "sequence value at the interface"}


def test_compile_run_check_bench(cli, tiny_model, tmp_path):
    so = tmp_path / "tiny.so"
    r = cli("compile", tiny_model, "--target", "x86", "-o", so)
    assert r.code == 0, r
    assert so.is_file() and "wrote" in r.out and "import done" in r.err  # progress on stderr

    meta = json.loads(cli("metadata", so).out)
    assert meta["inputs"][0]["name"] == "in/img"

    out = tmp_path / "out.npz"
    r = cli("run", so, "--check", tiny_model, "--output", out)
    assert r.code == 0, r
    assert "check passed" in r.out and "out/logits" in r.out
    with np.load(out) as z:
        assert sorted(z.files) == ["out/logits", "out:gate"]

    inputs = tmp_path / "in.npz"
    rng = np.random.default_rng(7)
    np.savez(inputs, **{"in/img": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
                        "in:bias": rng.standard_normal((1, 5)).astype(np.float32)})
    r = cli("run", so, "--inputs", inputs, "--check", tiny_model, "--rtol", "1e-5")
    assert r.code == 0, r

    r = cli("bench", so, "--compare", tiny_model, "--repeats", "5", "--warmup", "1")
    assert r.code == 0, r
    assert "ratio deploytool/onnxruntime (median):" in r.out
    j = json.loads(cli("bench", so, "--compare", tiny_model, "--repeats", "5", "--json").out)
    assert j["ratio"] > 0 and j["onnxruntime"]["median_ms"] > 0 and j["threads"] >= 1


def test_threads_default_to_tvm_num_threads(cli, tiny_so):
    """Without --threads, kernels run on TVM_NUM_THREADS threads where the user exported it (TVM's
    own knob), else one per physical core; --threads wins over both."""
    from deploytool.targets import physical_cores

    def threads(*args, env):
        r = cli("bench", tiny_so, "--repeats", "2", "--warmup", "0", "--rounds", "1", "--json", *args, env=env)
        assert r.code == 0, r
        return json.loads(r.out)["threads"]

    n = physical_cores() + 1  # differs from the default on any machine
    assert threads(env={"TVM_NUM_THREADS": str(n)}) == n
    assert threads("--threads", "1", env={"TVM_NUM_THREADS": str(n)}) == 1
    assert threads(env={"TVM_NUM_THREADS": ""}) == physical_cores()


@pytest.mark.fast
def test_a_board_reads_tvm_num_threads_as_the_host_does(monkeypatch):
    """What a board tells tuners about its threads (`device serve`'s header): TVM_NUM_THREADS where
    it is a whole number >= 1, else none set. A value that is not a number stopped the board with
    an internal error (int('abc')); the host's default_threads already ignored it."""
    from deploytool import device
    from deploytool.targets import default_threads, physical_cores

    for value, expect in (("3", 3), ("abc", None), ("0", None), ("", None)):
        monkeypatch.setenv("TVM_NUM_THREADS", value)
        assert device.local_info()["threads"] == expect, value
        assert default_threads() == (expect or physical_cores()), value


def test_check_failure_exits_1_with_report(cli, tiny_model, tmp_path):
    so = tmp_path / "tiny.so"
    assert cli("compile", tiny_model, "-o", so, "-q").code == 0
    other = make_tiny_model(tmp_path / "other.onnx", seed=1)  # same I/O, other weights
    r = cli("run", so, "--check", other)
    assert_one_line_error_with_report(r)


def assert_one_line_error_with_report(r):
    assert r.code == 1, r
    assert "FAIL" in r.out
    err = [ln for ln in r.err.strip().splitlines() if ln.startswith("deploytool: error:")]
    assert len(err) == 1 and "differs from onnxruntime" in err[0]
    assert "is not the model" in err[0] and "pass the model it was built from" in err[0]


# ---------------------------------------------------------------------- error cases
def test_error_missing_file(cli, tmp_path):
    assert_one_line_error(cli("compile", tmp_path / "nope.onnx"), "not found", "check the path")
    assert_one_line_error(cli("run", tmp_path / "nope.so"), "not found")


def test_error_not_onnx(cli, tmp_path):
    p = tmp_path / "readme.onnx"
    p.write_text("# not a model\n" * 20)
    assert_one_line_error(cli("compile", p), "not an ONNX model", "pass a .onnx file")


def test_error_truncated(cli, tmp_path, tiny_model):
    p = tmp_path / "cut.onnx"
    data = tiny_model.read_bytes()
    p.write_bytes(data[: len(data) - 40])
    assert_one_line_error(cli("inspect", p), "truncated", "again")


def test_error_unsupported_operator(cli, tmp_path):
    # (ops without an ONNX function body: those with one, such as Celu, are expanded and import)
    p = make_tiny_model(tmp_path / "u.onnx", extra_ops=("RandomUniformLike", "Det", "Celu"))
    assert_one_line_error(cli("compile", p, "-o", tmp_path / "u.so"),
                          "2 unsupported operator type(s): Det, RandomUniformLike")


def test_error_unknown_target(cli, tiny_model):
    assert_one_line_error(cli("compile", tiny_model, "--target", "pdp11"), "unknown target 'pdp11'", "x86-avx2")


def test_error_target_not_available_yet(cli, tiny_model, tmp_path):
    p = tmp_path / "future.json"
    p.write_text(json.dumps({"name": "future", "family": "x86", "arch": "x86_64", "available": False,
                             "note": "lands with issue #99", "tvm": {"kind": "llvm", "mcpu": "x86-64"}}))
    assert_one_line_error(cli("compile", tiny_model, "--target", p, "-o", tmp_path / "x"), "not available yet",
                          "issue #99")


@pytest.mark.parametrize("cmd,target,dtype", [("compile", "cuda", "float32"), ("tune", "x86", "float16"),
                                               ("compile", "cortex-m4", "float32")])
def test_error_winograd_where_it_does_not_apply(cli, tiny_model, tmp_path, cmd, target, dtype):
    r = cli(cmd, tiny_model, "--target", target, "--dtype", dtype, "--winograd", "-o", tmp_path / "x")
    assert_one_line_error(r, "--winograd: Winograd convolutions are for CPU targets", "drop --winograd")
    assert not (tmp_path / "x").exists()


def test_error_dynamic_shape(cli, tmp_path):
    p = make_tiny_model(tmp_path / "d.onnx", dynamic_batch=True)
    assert_one_line_error(cli("compile", p, "-o", tmp_path / "d.so"), "dynamic dims", "--input-shape in/img:N,3,8,8")
    assert cli("compile", p, "-o", tmp_path / "d.so", "--input-shape", "in/img:2,3,8,8", "-q").code == 0
    assert_one_line_error(cli("compile", p, "--input-shape", "in/img=2,3"), "bad --input-shape")


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model, cli):
    so = tmp_path_factory.mktemp("cli") / "tiny.so"
    assert cli("compile", tiny_model, "-o", so, "-q").code == 0
    return so


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_error_npz_wrong_name(cli, built, tmp_path):
    p = _npz(tmp_path / "a.npz", **{"in/img": np.zeros((1, 3, 8, 8), np.float32), "bias": np.zeros((1, 5), np.float32)})
    assert_one_line_error(cli("run", built, "--inputs", p), "'bias', which is not a model input", "in/img, in:bias")


def test_error_npz_missing_input(cli, built, tmp_path):
    p = _npz(tmp_path / "a.npz", **{"in/img": np.zeros((1, 3, 8, 8), np.float32)})
    assert_one_line_error(cli("run", built, "--inputs", p), "lacks input(s) in:bias")


def test_error_npz_wrong_shape(cli, built, tmp_path):
    p = _npz(tmp_path / "a.npz", **{"in/img": np.zeros((1, 3, 9, 8), np.float32), "in:bias": np.zeros((1, 5), np.float32)})
    assert_one_line_error(cli("run", built, "--inputs", p), "shape [1, 3, 9, 8]", "wants [1, 3, 8, 8]")


def test_error_npz_wrong_dtype(cli, built, tmp_path):
    p = _npz(tmp_path / "a.npz", **{"in/img": np.zeros((1, 3, 8, 8), np.float64), "in:bias": np.zeros((1, 5), np.float32)})
    assert_one_line_error(cli("bench", built, "--inputs", p), "dtype float64", "astype('float32')")


def test_error_npz_not_a_file(cli, built, tmp_path):
    p = tmp_path / "junk.npz"
    p.write_text("junk")
    assert_one_line_error(cli("run", built, "--inputs", p), "not a readable .npz")


def test_verbose_shows_traceback(cli, tmp_path):
    r = cli("--verbose", "compile", tmp_path / "nope.onnx")
    assert r.code == 2 and "Traceback" in r.err and "deploytool: error:" in r.err


@pytest.mark.parametrize("cmd,flags,needle", [
    ("run", ["--threads", "0"], "--threads 0"),
    ("run", ["--rtol", "-1"], "--rtol -1.0"),
    ("bench", ["--threads", "-2"], "--threads -2"),
    ("bench", ["--repeats", "0"], "--repeats 0"),
    ("bench", ["--warmup", "-1"], "--warmup -1"),
    ("bench", ["--rounds", "0"], "--rounds 0"),
])
def test_error_bad_numeric_options(cli, built, cmd, flags, needle):
    assert_one_line_error(cli(cmd, built, *flags), needle, "pass ")


def test_a_cleanup_error_after_ctrl_c_reads_as_interrupted():
    """A tuning run stopped with Ctrl-C: its worker pools' clean-up can raise (e.g. 'release unlocked
    lock') while the KeyboardInterrupt is handled; that is an interruption, not an internal error."""
    from deploytool import cli

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock")
    except RuntimeError as e:
        assert cli._during_interrupt(e)
    assert not cli._during_interrupt(RuntimeError("a real bug"))


@pytest.mark.fast
def test_a_tvm_error_with_an_ir_dump_is_told_by_its_message():
    """TVM's VM code generator ends its error with the offending call and the script printer's
    '# Metadata omitted' line: the one-line error said only that line; now it gives the message
    and the call."""
    from deploytool.errors import describe

    e = RuntimeError("CodeGenVM cannot emit this Relax operator directly.\nOffending call:\n"
                     'R.nn.conv2d_transpose(x, w, data_layout="NHWC")\n\n'
                     "# Metadata omitted. Use show_meta=True in script() method to show it.\n")
    assert describe(e) == ('RuntimeError: CodeGenVM cannot emit this Relax operator directly. Offending call: '
                           'R.nn.conv2d_transpose(x, w, data_layout="NHWC")')
    assert describe(RuntimeError("first\nCheck failed: x == y")) == "RuntimeError: Check failed: x == y"
