import numpy as np
import pytest

from conftest import make_tiny_model
from deploytool import frontend
from deploytool.errors import ModelError, ShapeError, UnsupportedOperatorError

pytestmark = pytest.mark.fast


def test_sanitize_gives_unique_c_identifiers(tmp_path):
    import onnx

    m = onnx.load(make_tiny_model(tmp_path / "t.onnx"))
    mapping = frontend.sanitize_names(m)
    assert mapping["in/img"] == "in_img" and mapping["in:bias"] == "in_bias" and mapping["out/logits"] == "out_logits"
    names = {i.name for i in m.graph.input} | {o.name for o in m.graph.output} | {t.name for t in m.graph.initializer}
    for n in names | {x for node in m.graph.node for x in list(node.input) + list(node.output)}:
        assert n.isidentifier(), n
    onnx.checker.check_model(m)


def test_sanitize_resolves_collisions(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["a/b"], ["a_b"]), helper.make_node("Relu", ["a_b"], ["1x"])], "g",
                          [helper.make_tensor_value_info("a/b", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("1x", TensorProto.FLOAT, [2])])
    m = helper.make_model(g)
    mapping = frontend.sanitize_names(m)
    assert mapping == {"a/b": "a_b_1", "1x": "v_1x"}
    assert [n.output[0] for n in m.graph.node] == ["a_b", "v_1x"]


def test_import_keeps_original_names_for_io(tmp_path):
    imported = frontend.import_onnx(make_tiny_model(tmp_path / "t.onnx"))
    assert [s.name for s in imported.inputs] == ["in/img", "in:bias"]
    assert [s.tvm_name for s in imported.inputs] == ["in_img", "in_bias"]
    assert [(s.name, s.shape) for s in imported.outputs] == [("out/logits", (1, 5)), ("out:gate", (1, 5))]


def test_unsupported_ops_are_listed_all_at_once(tmp_path):
    p = make_tiny_model(tmp_path / "t.onnx", extra_ops=("RandomUniformLike", "Det", "RandomUniformLike", "Celu",
                                                          "LpNormalization"))
    with pytest.raises(UnsupportedOperatorError) as e:
        frontend.import_onnx(p)
    # Celu has a function body (expanded); LpNormalization is decomposed by deploytool
    assert e.value.ops == {"RandomUniformLike": 2, "Det": 1}
    assert "Det, RandomUniformLike (x2)" in str(e.value)


def test_own_decompositions_match_onnxruntime(tmp_path):
    """LpNormalization and Swish (no TVM converter, no ONNX function body): rewritten by deploytool."""
    import deploytool
    from deploytool.runner import LocalRunner
    from deploytool.reference import compare, ort_run, ort_session

    p = make_tiny_model(tmp_path / "t.onnx", extra_ops=("LpNormalization", "Swish"))
    import onnx

    m = onnx.load(p)
    m.opset_import[0].version = 24  # Swish is opset 24
    onnx.save(m, p)
    so = deploytool.compile(p, target="x86", output=tmp_path / "t.so").artifact
    feed = {"in/img": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32),
            "in:bias": np.random.default_rng(1).standard_normal((1, 5)).astype(np.float32)}
    got = LocalRunner(so).run(feed)
    ref = ort_run(ort_session(p), feed)
    assert all(c.ok for c in compare(got, ref, 1e-5))


def test_dynamic_dims_need_input_shape(tmp_path):
    p = make_tiny_model(tmp_path / "t.onnx", dynamic_batch=True)
    with pytest.raises(ShapeError) as e:
        frontend.import_onnx(p)
    assert "in/img" in str(e.value) and "--input-shape in/img:N,3,8,8" in str(e.value)
    imported = frontend.import_onnx(p, {"in/img": (2, 3, 8, 8)})
    assert imported.inputs[0].shape == (2, 3, 8, 8)
    assert imported.outputs[0].shape == (2, 5)


@pytest.mark.parametrize("spec,ok", [("x:1,3,224,224", True), ("gpu_0/data:0:1,3", True), ("x", False),
                                     ("x:1,a", False), ("x:0,3", False), (":1,2", False)])
def test_parse_input_shapes(spec, ok):
    if ok:
        name, _, dims = spec.rpartition(":")
        assert frontend.parse_input_shapes([spec]) == {name: tuple(int(d) for d in dims.split(","))}
    else:
        with pytest.raises(ShapeError):
            frontend.parse_input_shapes([spec])


def test_input_shape_errors(tmp_path):
    p = make_tiny_model(tmp_path / "t.onnx", dynamic_batch=True)
    with pytest.raises(ShapeError, match="unknown input"):
        frontend.import_onnx(p, {"nope": (1,)})
    with pytest.raises(ShapeError, match="rank 2"):
        frontend.import_onnx(p, {"in/img": (1, 3)})


def test_bad_files(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        frontend.load_onnx(tmp_path / "missing.onnx")
    text = tmp_path / "notes.onnx"
    text.write_text("these are my notes, not a model\n" * 10)
    with pytest.raises(ModelError, match="not an ONNX model"):
        frontend.load_onnx(text)
    good = make_tiny_model(tmp_path / "t.onnx").read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelError, match="truncated"):
        frontend.load_onnx(cut)


def test_if_with_a_constant_condition_is_inlined(tmp_path):
    """An If whose condition is known at compile time (an exporter's constant, or a bound input) is
    replaced by the branch it takes; one depending on data is a one-line error."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import deploytool
    from deploytool.reference import compare, ort_run, ort_session
    from deploytool.runner import LocalRunner

    def branch(op, name):
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2, 3])])

    def model(cond_is_input: bool):
        nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu", "then"),
                                  else_branch=branch("Sigmoid", "else"))]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
        inits = []
        if cond_is_input:
            inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
        else:
            inits.append(numpy_helper.from_array(np.array(False), "c"))
        g = helper.make_graph(nodes, "if", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    p = tmp_path / "if.onnx"
    onnx.save(model(False), p)
    so = deploytool.compile(p, target="x86", output=tmp_path / "if.so").artifact
    feed = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    assert all(c.ok for c in compare(LocalRunner(so).run(feed), ort_run(ort_session(p), feed), 1e-6))
    q = tmp_path / "if_data.onnx"
    onnx.save(model(True), q)
    with pytest.raises(UnsupportedOperatorError, match="inlines If when its condition is known"):
        frontend.import_onnx(q)


def _spectral_model(path, dynamic_length: bool = False):
    """x (N, 1, 16, 12) -> Resize nearest on axes [2, 3] to at most 24 x 20 (keep_aspect_ratio_policy
    not_larger: scale 1.5, 24 x 18) -> DFT of length 20 along axis 2 (one-sided) -> y; both are rewritten by deploytool's converters
    once --input-shape fixes N."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([24, 20], np.int64), "sizes"),
             numpy_helper.from_array(np.array(2, np.int64), "axis")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 16, 12])]
    if dynamic_length:
        inputs.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(20, np.int64), "n"))
    nodes = [
        helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="nearest", axes=[2, 3],
                         keep_aspect_ratio_policy="not_larger"),
        helper.make_node("Unsqueeze", ["r", "last"], ["c"]),
        helper.make_node("DFT", ["c", "n", "axis"], ["y"], onesided=1),
    ]
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "last"))
    g = helper.make_graph(nodes, "spectral", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 11, 18, 2])],
                          initializer=inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def test_shape_dependent_converters_match_onnxruntime(tmp_path):
    """Resize (axes + keep_aspect_ratio_policy) and DFT are converted by deploytool once the input
    shapes are known (from --input-shape), and compute what onnxruntime computes."""
    import deploytool
    from deploytool.reference import compare, ort_run, ort_session
    from deploytool.runner import LocalRunner

    p = _spectral_model(tmp_path / "s.onnx")
    res = deploytool.compile(p, target="x86", output=tmp_path / "s.so", input_shapes={"x": (2, 1, 16, 12)})
    x = np.random.default_rng(0).standard_normal((2, 1, 16, 12)).astype(np.float32)
    got = LocalRunner(res.artifact).run({"x": x})
    ref = ort_run(ort_session(p), {"x": x})
    assert got["y"].shape == ref["y"].shape == (2, 1, 11, 18, 2)  # 16x12 -> 24x18 (scale 1.5), 20 // 2 + 1 bins
    assert all(c.ok for c in compare(got, ref, 1e-4))


def test_converter_needing_a_runtime_value_names_the_fix(tmp_path):
    p = _spectral_model(tmp_path / "s.onnx", dynamic_length=True)
    with pytest.raises(UnsupportedOperatorError) as e:
        frontend.import_onnx(p, {"x": (1, 1, 16, 12)})
    assert e.value.ops == {"DFT": 1} and "--bind-input" in str(e.value)


def test_half_precision_matmul_accumulates_in_float32(tmp_path):
    """A float16 MatMul rounds once, like numpy and onnxruntime (TVM's default rounds every step)."""
    import onnx
    from onnx import TensorProto, helper

    import deploytool
    from deploytool.runner import LocalRunner

    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT16, [16, 512]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT16, [512, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [16, 8])])
    p = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 512)).astype(np.float16), rng.standard_normal((512, 8)).astype(np.float16)
    got = LocalRunner(deploytool.compile(p, target="x86", output=tmp_path / "mm.so").artifact).run({"a": a, "b": b})
    np.testing.assert_array_equal(got["y"], a @ b)


@pytest.mark.models
def test_gather_out_of_range_indices_do_not_crash(tmp_path, cli):
    """An embedding lookup (ONNX Gather) fed an index past the table read out of bounds in TVM's
    "fast" take (a crash, or other memory on a Cortex-M); on CPUs the indices are clipped: the
    process lives, in-range indices match onnxruntime, negative ones count from the end."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "embed",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])],
                          [numpy_helper.from_array(table, "table")])
    model = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    so = tmp_path / "embed.so"
    assert cli("compile", model, "--target", "x86", "-o", so, "-q").code == 0
    ok = tmp_path / "ok.npz"
    np.savez(ok, ids=np.array([0, 3, 9, -1, -10, 5], dtype=np.int64))
    r = cli("run", so, "--inputs", ok, "--check", model)
    assert r.code == 0, r
    bad, out = tmp_path / "bad.npz", tmp_path / "out.npz"
    np.savez(bad, ids=np.array([1, 10, 1 << 40, -11, -(1 << 40), 2], dtype=np.int64))
    r = cli("run", so, "--inputs", bad, "--output", out)   # in a child process: a crash is a failure here
    assert r.code == 0, r
    y = np.load(out)["y"]
    np.testing.assert_array_equal(y[[0, 5]], table[[1, 2]])
    assert all(any(np.array_equal(row, t) for t in table) for row in y)   # every row is a row of the table


@pytest.mark.parametrize("op,gates,per_step", [("LSTM", 4, 1), ("GRU", 3, 2), ("RNN", 1, 1)])
def test_an_unrolled_cell_projects_its_whole_input_in_one_matmul(op, gates, per_step):
    """The input projection x_t W^T + Wb of every step is one MatMul over the whole sequence;
    per step only the recurrent MatMuls stay (a GRU's reset gate has its own; a 49-step LSTM: 98
    MatMuls -> 50, 0.84x its time on the Zen 3). The unrolled graph matches onnxruntime's own cell. (Batch-first layouts are
    among the conformance cases: onnxruntime's GRU refuses them.)"""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import onnx_unroll

    T, B, I, H = 5, 2, 3, 4
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, s).astype(np.float32), n) for n, s in
             (("W", (1, gates * H, I)), ("R", (1, gates * H, H)), ("B", (1, 2 * gates * H)))]
    shape = [T, B, I]
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y", "yh"], hidden_size=H)
    g = helper.make_graph([node], "cell", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("yh", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    x = rng.normal(0, 1, shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert onnx_unroll.unroll(model) == 1
    assert sum(n.op_type == "MatMul" for n in model.graph.node) == per_step * T + 1
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
