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
