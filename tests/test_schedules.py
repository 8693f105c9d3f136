"""Default CPU schedules: every kernel class gets one, and numerics still match onnxruntime."""

import onnx
import pytest

import deploytool
from deploytool import zoo
from deploytool.schedules import cpu


@pytest.mark.fast
@pytest.mark.parametrize("C,W,lanes,regs,expect", [
    (64, 56, 16, 32, (64, 4)),     # AVX-512: four vectors x 4 rows (3-4 vectors a row with 4+ rows: AVX-512 only)
    (24, 56, 16, 32, (24, 8)),     # 24 channels on AVX-512: 3 part-vectors of 8 lanes x 8 rows
    (64, 56, 4, 32, (8, 8)),       # NEON: 32 registers, but at most 2 vectors a row with 4+ rows
    (64, 56, 8, 16, (16, 4)),      # AVX2: half the registers, half the rows
    (1000, 13, 16, 32, (8, 13)),   # 1000 = 8 x 125 lanes; prime width 13: all 13 rows, one vector
    (1024, 13, 16, 32, (32, 13)),  # prime width 13: all 13 rows, two vectors (two registers spare)
    (64, 14, 16, 32, (32, 7)),     # 14 x 2 would leave none: 7 x 2
    (3, 224, 16, 32, (3, 14)),     # tiny channel counts: one part-vector, many rows
])
def test_register_tile(C, W, lanes, regs, expect):
    ci, wi = cpu._register_tile(C, W, lanes, regs)
    assert (ci, wi) == expect
    assert C % ci == 0 and W % wi == 0
    v = cpu._tile_vector(ci, lanes)
    assert v <= lanes and ci % v == 0  # whole native vectors or part-vectors, never a 24-lane one
    vectors = ci // v
    assert wi * vectors + vectors + 1 < regs  # accumulators + weight vectors + broadcast fit


def _tiny_bert():
    return zoo.bert_encoder(seq=16, hidden=64, heads=4, layers=2, ffn=128, vocab=100)


@pytest.mark.models
@pytest.mark.parametrize("name,build", [
    ("ds_cnn_1d", zoo.ds_cnn_1d),
    ("tiny_bert", _tiny_bert),
    ("mobilenet_v2", zoo.mobilenet_v2),
    ("mobilenet_v1", zoo.mobilenet_v1),
    ("small_yolov3_tiny", lambda: zoo.yolov3_tiny(size=64, num_classes=3)),  # the box decoding's slices, exp, concat
])
def test_every_kernel_is_scheduled_and_correct(name, build, tmp_path):
    src = tmp_path / f"{name}.onnx"
    onnx.save(build(), src)
    res = deploytool.compile(src, output=tmp_path / f"{name}.so")
    assert res.schedules and all(rule != "none" for rule in res.schedules.values()), res.schedules
    # convolutions and matmuls get the register-blocked rule itself, not the safety net (a bug in
    # the rule would otherwise degrade silently to parallel_fallback)
    heavy = {k: v for k, v in res.schedules.items() if "conv" in k or "matmul" in k}
    assert heavy and all(v in ("tile_reduction", "depthwise") for v in heavy.values()), heavy
    # the depthwise convolutions (and only they) get their own rule
    assert ("depthwise" in heavy.values()) == (name in ("ds_cnn_1d", "mobilenet_v2", "mobilenet_v1")), heavy
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_resnet_graph_is_fused(tmp_path):
    """BatchNorm folded into the convs and residual adds fused: 31 kernels (TVM's own pipeline: 49)."""
    from deploytool.corpus import light_model_path

    res = deploytool.compile(light_model_path("resnet50"), output=tmp_path / "r.so")
    names = [t.name for t in res.tasks]
    assert len(names) == 31
    assert not any("batch_norm" in n or "stack" in n for n in names)
    assert sum("conv2d" in n and n.count("add") >= 2 for n in names) >= 4  # bias + residual in the conv kernel


def _bn_model(path):
    """Conv -> BatchNorm -> Relu -> Conv(bias) -> BatchNorm: what BatchNorm folding and the layout
    conversion turn into constant chains (scalar eps, sqrt, divide, reshape, multiply, subtract,
    layout_transform of the weights)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = 24

    def bn(name):
        return [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{name}_g"),
                numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), f"{name}_b"),
                numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), f"{name}_m"),
                numpy_helper.from_array(rng.uniform(0.1, 2.0, c).astype(np.float32), f"{name}_v")]

    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (c, c, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.2, c).astype(np.float32), "b2"), *bn("bn1"), *bn("bn2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "bn1_g", "bn1_b", "bn1_m", "bn1_v"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"]),
             helper.make_node("BatchNormalization", ["c2", "bn2_g", "bn2_b", "bn2_m", "bn2_v"], ["y"])]
    g = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 16, 16])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.models
@pytest.mark.parametrize("preset,dtype", [("x86-avx512", "float32"), ("x86-avx2", "float16"), ("cuda", "float16")])
def test_weights_folded_in_numpy_are_tvms_bit_for_bit(tmp_path, monkeypatch, preset, dtype):
    """deploytool.const_fold computes the weight preparation (BatchNorm folding, layout changes, float16
    casts) in numpy instead of one LLVM build per call in TVM's FoldConstant (ResNet-50's optimize:
    19.8 -> 1.9 s). The graph it leaves is TVM's, constants equal bit for bit."""
    import tvm

    from deploytool import const_fold, frontend, pipeline, targets

    tgt = targets.load(preset)
    mod = frontend.import_onnx(_bn_model(tmp_path / "bn.onnx")).mod
    ours = pipeline.optimize(mod, tgt, dtype=dtype)
    with monkeypatch.context() as m:   # the reference: TVM's FoldConstant alone
        m.setattr(const_fold, "fold_pass", lambda: tvm.transform.Sequential([]))
        theirs = pipeline.optimize(mod, tgt, dtype=dtype)
    tvm.ir.assert_structural_equal(ours, theirs)   # compares the constants' bytes too
    consts = []
    from tvm import relax

    relax.analysis.post_order_visit(ours["main"], lambda e: consts.append(e) if isinstance(e, tvm.ir.GenericConst)
                                    else None)
    assert len(consts) >= 4 and {str(c.ty.dtype) for c in consts} >= {dtype}


def _per_channel_scale_model(path):
    """Conv -> Mul(scale (C,1,1)) -> Add(shift (C,1,1)) -> Relu -> MaxPool -> Conv: Inception v2's
    BatchNorm-as-Mul/Add shape, constants of lower rank than the NCHW activations."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = 16
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.normal(0, 0.1, (c, 1, 1)).astype(np.float32), "shift"),
             numpy_helper.from_array(rng.normal(0, 0.2, (8, c, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "scale"], ["m"]), helper.make_node("Add", ["m", "shift"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    g = helper.make_graph(nodes, "per_channel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.fast
def test_index_arithmetic_folded_in_numpy_is_tvms_bit_for_bit():
    """The index arithmetic around Gather/Shape/Concat (shape_to_tensor of a static shape, integer
    ops that wrap around, comparisons, where, take in each mode, concat, integer casts) folds in
    numpy to the constants TVM's FoldConstant builds and runs one LLVM module each for."""
    import numpy as np
    import tvm
    from tvm import relax

    from deploytool import const_fold

    def c(v, dtype):
        return relax.const(np.array(v, dtype=dtype), dtype)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3, 5], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(x))))
            i = c(-1, "int64")
            norm = bb.emit(relax.op.where(relax.op.less(i, c(0, "int64")), relax.op.add(i, c(3, "int64")), i))
            outs = [
                relax.op.take(s, norm, axis=0, mode="fast"),
                relax.op.take(s, c([-4, 1, 7], "int64"), axis=0, mode="wrap"),
                relax.op.take(s, c([-4, 1, 7], "int64"), axis=0, mode="clip"),
                relax.op.concat([s, c([-1], "int64")], axis=0),
                relax.op.multiply(c([2**31 - 1, -7], "int32"), c([3, 5], "int32")),  # wraps
                relax.op.subtract(c([0, 200], "uint8"), c([1, 100], "uint8")),
                relax.op.maximum(c([[1], [-2]], "int16"), c([0, 3, -9], "int16")),  # broadcasts
                relax.op.astype(c([2**40 + 5, -1], "int64"), "int32"),
                relax.op.astype(c([2**53 + 1, -3], "int64"), "float32"),
                relax.op.astype(c([True, False], "bool"), "int8"),
                relax.op.equal(c([np.nan, 1.0, -0.0], "float32"), c([np.nan, 1.0, 0.0], "float32")),
                relax.op.greater_equal(c([3, -3], "int64"), c([3, 3], "int64")),
            ]
            out = bb.emit_output(relax.Tuple([bb.emit(o) for o in outs]))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = relax.transform.FoldConstant()
    theirs = folded(mod)
    ours = const_fold.fold_pass()(mod)
    bindings = ours["main"].body.blocks[0].bindings
    consts = [b.value for b in bindings[1:-1]]  # after the shape_of, before the output tuple
    assert all(isinstance(v, tvm.ir.GenericConst) for v in consts), [type(v).__name__ for v in consts]
    tvm.ir.assert_structural_equal(folded(ours), theirs)   # compares the constants' bytes too
    values = [v.value.numpy().tolist() for v in consts[-len(outs):]]
    assert values[:5] == [5, [5, 3, 3], [2, 3, 5], [2, 3, 5, -1], [2**31 - 3, -35]], values

@pytest.mark.models
def test_per_channel_constants_keep_the_graph_in_one_layout(tmp_path):
    """A (C,1,1) scale next to NCHW activations once made TVM's layout inference give up on the
    Mul/Add/Relu/MaxPool between two convs (a transpose on each side of them: 138 in Inception v2);
    now only the model's input and output are transposed, and the numbers still match onnxruntime."""
    from deploytool import frontend, pipeline, targets

    src = _per_channel_scale_model(tmp_path / "pc.onnx")
    mod = pipeline.optimize(frontend.import_onnx(src).mod, targets.load("x86"))
    assert mod["main"].script(show_meta=False).count("R.permute_dims") == 2
    res = deploytool.compile(src, output=tmp_path / "pc.so")
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_leaky_relu_fuses_into_the_convolution(tmp_path):
    """Conv -> LeakyRelu -> MaxPool -> Conv -> LeakyRelu: the LeakyReLUs fuse into their convolutions
    in the x86 NCHWc layout, with no transpose back to NCHW around them (TVM's layout conversion
    has no rule for leaky_relu); the numbers match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (16, 16, 3, 3)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
             helper.make_node("MaxPool", ["l1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c2"], ["y"], alpha=0.1)]
    g = helper.make_graph(nodes, "leaky", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    src = tmp_path / "leaky.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    res = deploytool.compile(src, output=tmp_path / "leaky.so")
    names = [t.name for t in res.tasks]
    assert not any("leaky" in n for n in names), names
    convs = [n for n in names if "conv2d" in n]
    assert len(convs) == 2 and all("maximum" in n for n in convs), names
    assert sum("transpose" in n or "layout_transform" in n for n in names) <= 2, names  # in and out only
    assert deploytool.run(res.artifact.path, check=src).ok


def _conv_chain(tmp_path, name: str, channels: int, size: int, layers: list) -> tuple:
    """A chain of convolutions on a [1, channels, size, size] input, each layer (out channels,
    kernel size, weight scale), padded to keep the size; scheduled by the x86-avx2 defaults.
    Returns the .onnx path and {kernel name: its TIR script} of the convolutions."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets

    rng = np.random.default_rng(0)
    inits, nodes, c, x = [], [], channels, "x"
    for i, (out, k, scale) in enumerate(layers):
        inits.append(numpy_helper.from_array(rng.normal(0, scale, (out, c, k, k)).astype(np.float32), f"w{i}"))
        y = "y" if i == len(layers) - 1 else f"c{i}"
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [y], pads=[k // 2] * 4))
        c, x = out, y
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])], inits)
    src = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    target = targets.load("x86-avx2")
    mod = pipeline.schedule(pipeline.partition(pipeline.optimize(frontend.import_onnx(src).mod, target), target),
                            target)
    return src, {gv.name_hint: f.script() for gv, f in mod.functions.items() if "conv2d" in gv.name_hint}


def test_a_convolution_without_padding_reads_its_input_in_place(tmp_path):
    """Legalization gives every convolution a padding stage, a plain copy of the input where it
    pads nothing (a 1x1): the default schedule reads the input in place (that copy was a pass over
    MobileNetV2's activations before each of its 1x1 convolutions), and keeps a real padding
    stage (a 3x3 with padding 1) as its own stage. The numbers match onnxruntime."""
    src, kernels = _conv_chain(tmp_path, "pads", 16, 14, [(32, 1, 0.3), (16, 3, 0.3)])
    assert len(kernels) == 2, list(kernels)
    one, three = (kernels[k] for k in sorted(kernels))  # conv2d (the 1x1), conv2d1 (the 3x3)
    assert "pad_temp" not in one and "pad_temp" in three, (one, three)
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "pads.so")
    assert deploytool.run(res.artifact.path, check=src).ok


def test_many_row_tiles_read_their_input_at_a_stride_that_spreads_the_l1_sets(tmp_path):
    """A 13-row register tile broadcasts from 13 input pixels per reduction step. At 1,024 (or
    512) float32 channels a pixel is 4 (2) KB, so those rows fall into one (two) of the L1's sets
    and evict each other (YOLOv3-tiny's 1x1 convolution of 1,024 channels at 13x13 ran at a third
    of its speed). The default schedule gives the input a stage whose pixel stride is one cache
    line longer: a copy for the 1x1, the padding stage it already has for the 3x3. The numbers
    match onnxruntime."""
    # the last: 16 channels, 64 B a pixel, nothing to spread
    src, kernels = _conv_chain(tmp_path, "rows", 1024, 13, [(512, 1, 0.05), (16, 3, 0.05), (16, 1, 0.05)])
    assert len(kernels) == 3, list(kernels)
    one, three, last = (kernels[k] for k in sorted(kernels))  # conv2d, conv2d1, conv2d2
    # [buffer, axis (the width), factor, offset]: the pixel stride becomes 1,024 + 16 and 512 + 16
    assert '"buffer_dim_align": [[0, 2, 1024, 16]]' in one, one
    assert '"buffer_dim_align": [[0, 2, 512, 16]]' in three, three
    assert "buffer_dim_align" not in last and "pad_temp" not in last, last
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "rows.so")
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
@pytest.mark.parametrize("form", ["j < 10", "10 <= j", "j >= 10", "10 > j", "j > 9", "9 < j", "j <= 9", "9 >= j"])
def test_a_concatenations_switch_point_is_read_from_any_comparison(form):
    """Where a select on the innermost axis switches source (10 here), whichever way its
    comparison is written; a condition on anything else gives no cut."""
    from tvm import s_tir, te, tirx

    a, b = te.placeholder((4, 10), name="a"), te.placeholder((4, 6), name="b")
    lhs, op, rhs = form.split()
    lo = {"<": True, "<=": True, ">": False, ">=": False}[op] == (lhs == "j")  # holds below the switch

    def cond(j):
        x, y = (j if t == "j" else tirx.IntImm("int32", int(t)) for t in (lhs, rhs))
        return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]

    def body(i, j):
        first, second = a[i, j], b[i, j - 10]
        return tirx.if_then_else(cond(j), first if lo else second, second if lo else first)

    for compute, cuts in ((body, [10]), (lambda i, j: tirx.if_then_else(i < 2, a[i, j % 10], b[i, j % 6]), [])):
        sch = s_tir.Schedule(te.create_prim_func([a, b, te.compute((4, 16), compute, name="c")]))
        assert cpu._inner_cuts(sch, sch.get_child_blocks(sch.get_sblock("root"))[0]) == cuts


def test_a_channel_concatenation_copies_each_input_in_its_own_loop(tmp_path):
    """A concatenation along the innermost (NHWC channel) axis is one loop that selects its input
    per element, which vectorizes as loads of every input and a select (SqueezeNet's ran 3.5-4x
    slower alone). The default schedule partitions the loop at the inputs' boundaries (16, 40 of
    16 + 24 + 8 channels): one vectorized copy per input. Its trace replays as the tuner's default
    candidate, and the model matches onnxruntime."""
    import json

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets
    from deploytool.schedules import space
    from deploytool.tuninglog import to_py

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name) for name, shape in
             (("wa", (16, 8, 1, 1)), ("wb", (24, 8, 3, 3)), ("wc", (8, 8, 1, 1)), ("wd", (8, 48, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"]),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wc"], ["c"]),
             helper.make_node("Concat", ["a", "b", "c"], ["abc"], axis=1),
             helper.make_node("Conv", ["abc", "wd"], ["y"])]
    g = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    src = tmp_path / "concat.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    target = targets.load("x86-avx2")
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(src).mod, target), target)
    name = next(gv.name_hint for gv in mod.functions if "concatenate" in gv.name_hint)
    wmod = space.tuning_module(mod[name], target)  # before pipeline.schedule, which updates mod
    scheduled = pipeline.schedule(mod, target)[name].script()
    assert scheduled.count("_partition") == 3 and scheduled.count("T.vectorized") == 3, scheduled
    trace = json.loads(json.dumps(to_py(space.default_candidate(target, wmod).trace.as_json(remove_postproc=False))))
    assert "LoopPartition" in json.dumps(trace)
    assert space.replay_trace(wmod, trace).mod.script() == space.default_candidate(target, wmod).mod.script()
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "concat.so")
    assert res.schedules[name] == "injective"
    assert deploytool.run(res.artifact.path, check=src).ok


def test_depthwise_convolutions_get_their_rule_and_match_onnxruntime(tmp_path):
    """The ``depthwise`` rule (columns of output rows per task, row x channel-vector register tiles)
    on the shapes that exercise its choices: 14 rows (tasks of 14, tiles of 7), stride 2 onto a
    7x7 image (few tasks: channel chunks are split among them too), 136 channels (not a multiple
    of AVX-512's 16 lanes), a residual add and a clip in the epilogue. The grouped convolution
    with two channels per group is not depthwise: tile_reduction's. The numbers match
    onnxruntime's."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name) for name, shape in
             (("d1", (24, 1, 3, 3)), ("p1", (136, 24, 1, 1)), ("d2", (136, 1, 3, 3)), ("b2", (136,)),
              ("d3", (136, 1, 3, 3)), ("g4", (136, 2, 3, 3)))]
    inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
              numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "d1"], ["c1"], group=24, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "p1"], ["c2"]),
             helper.make_node("Conv", ["c2", "d2", "b2"], ["c3"], group=136, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["c3", "d3"], ["c4"], group=136, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c4", "c3"], ["a4"]),
             helper.make_node("Conv", ["a4", "g4"], ["y"], group=68, pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 136, 7, 7])], inits)
    src = tmp_path / "dw.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    res = deploytool.compile(src, output=tmp_path / "dw.so")
    convs = {k: v for k, v in res.schedules.items() if "conv" in k}
    assert sorted(convs.values()) == ["depthwise"] * 3 + ["tile_reduction"] * 2, convs
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_row_reductions_accumulate_in_a_vector_and_match_onnxruntime(tmp_path):
    """Layer norm over 96 and softmax over 64 (whole vectors: rfactor into a vector of partial
    sums or maxima) and softmax over 40 (not: a scalar accumulator), in one encoder layer; the
    numbers match onnxruntime's."""
    import re

    from deploytool import frontend, pipeline, targets
    from deploytool.schedules import space

    tgt = targets.load("x86-avx512")
    lanes = 16
    for seq, vectorized in ((64, True), (40, False)):
        src = tmp_path / f"enc{seq}.onnx"
        onnx.save(zoo.bert_encoder(seq=seq, hidden=96, heads=2, layers=1, ffn=128, vocab=50), src)
        mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(src).mod, tgt), tgt)
        rf = {}
        for t in pipeline.tasks(mod):
            if t.name in ("layer_norm", "fast_softmax"):
                sch = space.default_candidate(tgt, space.tuning_module(mod[t.name], tgt))
                text = sch.mod.script()
                rf[t.name] = "_rf" in text and re.search(rf"T\.vectorized\((T\.int64\()?{lanes}\)", text) is not None
        assert rf == {"layer_norm": True, "fast_softmax": vectorized}, (seq, rf)
        res = deploytool.compile(src, output=tmp_path / f"enc{seq}.so")
        assert res.schedules["layer_norm"] == "row_reduction"
        assert deploytool.run(res.artifact.path, check=src).ok


def test_clips_fuse_into_the_convolutions_and_pass_nan_through(tmp_path):
    """Conv -> Clip(0, 6) -> depthwise Conv -> Clip -> HardSwish -> Conv, MobileNet's shapes: each
    Clip (where ops once imported, and TVM's layout conversion has no rule for where or clip) and
    the HardSwish fuse into their convolutions, with no transpose back to NCHW around them
    (MobileNetV2 had 17 such kernels, 13% of its time). The numbers match onnxruntime's, NaN included:
    a NaN input stays NaN through the clips, as in onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 8, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (16, 1, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 16, 1, 1)).astype(np.float32), "w3"),
             numpy_helper.from_array(np.array([0.0], np.float32), "lo"),  # (1,): as exporters write them
             numpy_helper.from_array(np.array([6.0], np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("HardSwish", ["r2"], ["h"]),
             helper.make_node("Conv", ["h", "w3"], ["y"])]
    g = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    src = tmp_path / "relu6.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "relu6.so")
    names = [t.name for t in res.tasks]
    assert len(names) <= 3 + 2, names  # three convolutions, the input's and the output's transposes
    assert not any("where" in n or "clip" in n for n in names), names
    assert sum("transpose" in n or "layout_transform" in n for n in names) <= 2, names
    assert sum("conv2d" in n and "maximum" in n and "minimum" in n for n in names) == 2, names
    x = (rng.normal(0, 3, (1, 8, 16, 16))).astype(np.float32)
    x[0, :, 5, 5] = np.nan
    np.savez(tmp_path / "x.npz", x=x)
    out = deploytool.run(res.artifact.path, inputs=tmp_path / "x.npz", check=src)
    y = next(iter(out.outputs.values()))
    assert out.ok and 0 < np.isnan(y).sum() < y.size, np.isnan(y).sum()


def test_constant_powers_become_roots_and_match_onnxruntime(tmp_path):
    """LRN's x^0.75 (and Pow by 0.5 or 2) leave no pow call in the kernels (a scalar libm call per
    element: Inception v1's LRN ran at 1.2 GFLOP/s); the numbers still match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets

    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [helper.make_node("LRN", ["x"], ["l"], size=5, alpha=1e-2, beta=0.75, bias=1.0),
             helper.make_node("Relu", ["l"], ["r"]), helper.make_node("Pow", ["r", "half"], ["s"]),
             helper.make_node("Pow", ["s", "two"], ["y"])]
    g = helper.make_graph(nodes, "roots", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    src = tmp_path / "lrn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    mod = pipeline.optimize(frontend.import_onnx(src).mod, targets.load("x86"))
    text = mod["main"].script(show_meta=False)
    assert "R.power" not in text and text.count("R.sqrt") == 3
    res = deploytool.compile(src, output=tmp_path / "lrn.so")
    assert deploytool.run(res.artifact.path, check=src).ok


def test_transcendentals_are_vectorizable_polynomials(tmp_path):
    """Exp, Erf, Tanh, Sigmoid, Softmax and Gelu (erf and tanh forms) compile to polynomial
    arithmetic (deploytool.fast_math): the .so imports none of libm's scalar expf/erff/tanhf, which
    LLVM called once per vector lane (BERT's erf-GELU matmul ran at half the speed of the plain
    ones). Over [-20, 20] the values stay within 4e-7 of float64 references (exp: relative; erf,
    tanh, sigmoid: absolute; GELU: absolute, times |x|; softmax: as with libm), NaN stays NaN, and
    the model matches onnxruntime."""
    import math
    import subprocess

    import numpy as np
    from onnx import TensorProto, helper

    n = 2048
    unary = {"exp": ("Exp", {}), "erf": ("Erf", {}), "tanh": ("Tanh", {}), "sigmoid": ("Sigmoid", {}),
             "gelu": ("Gelu", {}), "gelu_tanh": ("Gelu", {"approximate": "tanh"})}
    nodes = [helper.make_node(op, ["x"], [y], **attrs) for y, (op, attrs) in unary.items()]
    nodes.append(helper.make_node("Softmax", ["xs"], ["softmax"], axis=-1))
    outs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [n]) for y in unary] + \
        [helper.make_tensor_value_info("softmax", TensorProto.FLOAT, [32, 64])]
    g = helper.make_graph(nodes, "fm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n]),
                                       helper.make_tensor_value_info("xs", TensorProto.FLOAT, [32, 64])], outs)
    src = tmp_path / "fm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), src)
    res = deploytool.compile(src, target="x86", output=tmp_path / "fm.so")
    assert sorted(t.name for t in res.tasks) == sorted(f"fast_{y}" for y in [*unary, "softmax"]), res.tasks
    imported = subprocess.run(["nm", "-D", "--undefined-only", str(res.artifact.path)], capture_output=True,
                              text=True, check=True).stdout
    assert not {"expf", "erff", "tanhf", "exp", "erf", "tanh"} & {s.split("@")[0] for s in imported.split()}

    x = np.concatenate([np.linspace(-20, 20, n - 2), [np.nan, 0.0]]).astype(np.float32)
    xs = np.random.default_rng(0).normal(0, 5, (32, 64)).astype(np.float32)
    out = deploytool.run(res.artifact.path, inputs={"x": x, "xs": xs}).outputs
    xd = x[:-2].astype(np.float64)
    erf = np.vectorize(math.erf)
    want = {"exp": np.exp(xd), "erf": erf(xd), "tanh": np.tanh(xd), "sigmoid": 1 / (1 + np.exp(-xd)),
            "gelu": xd * 0.5 * (1 + erf(xd / math.sqrt(2))),
            "gelu_tanh": xd * 0.5 * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))}
    scale = {"exp": want["exp"], "gelu": np.maximum(1.0, np.abs(xd)), "gelu_tanh": np.maximum(1.0, np.abs(xd))}
    for y in unary:
        got = np.asarray(out[y], np.float64)
        assert np.isnan(got[-2]), y
        err = np.abs(got[:-2] - want[y]) / scale.get(y, 1.0)
        assert err.max() < 4e-7, (y, err.max())
    e = np.exp(xs - xs.max(-1, keepdims=True).astype(np.float64))
    # 5.6e-7 with libm's expf too: the float32 sum's rounding, not the exponential's
    assert np.abs(np.asarray(out["softmax"], np.float64) - e / e.sum(-1, keepdims=True)).max() < 1e-6
    assert deploytool.run(res.artifact.path, check=src).ok


def test_chains_of_selects_are_not_inlined_into_one_exponential_expression(tmp_path):
    """Clip (as two Wheres, each reading its input directly and through its comparison) twice
    after a MatMul: inlined into one expression it would double at each Where (QLinearMatMul's
    requantization chain took 114 s to build a 2x3 output). The default schedule materializes the
    chain where it would pass the limits, and the numbers match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from tvm import s_tir, tirx

    from deploytool import frontend, pipeline, targets
    from deploytool.schedules import space

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (8, 6)).astype(np.float32), "w")]
    nodes, cur = [helper.make_node("MatMul", ["x", "w"], ["m"])], "m"
    for i in range(2):
        inits += [numpy_helper.from_array(np.array(-2.0 + 0.3 * i, np.float32), f"lo{i}"),
                  numpy_helper.from_array(np.array(2.0 - 0.3 * i, np.float32), f"hi{i}")]
        nodes += [helper.make_node("Clip", [cur, f"lo{i}", f"hi{i}"], [f"c{i}"]),
                  helper.make_node("Mul", [f"c{i}", f"c{i}"], [f"s{i}"])]
        cur = f"s{i}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "clips", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])], inits)
    src = tmp_path / "clips.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)

    tgt = targets.load("x86")
    mod = cpu.apply(pipeline.partition(pipeline.optimize(frontend.import_onnx(src).mod, tgt), tgt), tgt)
    biggest = (0, 0)
    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            sch = s_tir.Schedule(func)
            for b in sch.get_child_blocks(sch.get_sblock("root")):
                body = sch.get(b).body
                if type(body).__name__ == "BufferStore":
                    nodes, selects = space.expr_size(body.value)
                    biggest = (max(biggest[0], nodes), max(biggest[1], selects))
    assert biggest[0] <= space.MAX_INLINED_NODES and biggest[1] <= space.MAX_INLINED_SELECTS, biggest
    res = deploytool.compile(src, output=tmp_path / "clips.so")
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.parametrize("relu_after", [False, True])
def test_a_lone_pool_accumulates_in_its_output(tmp_path, relu_after):
    """A max pool with nothing fused after it accumulates straight into its output (through a
    local tile SqueezeNet's 3x3 max pools ran 3.3x slower on a Zen 3); with an epilogue it keeps the
    local tile, whose write-back the epilogue rides. Both match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from tvm import tirx

    from deploytool import frontend, pipeline, targets

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (32, 8, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p" if relu_after else "y"], kernel_shape=[3, 3], strides=[2, 2])]
    if relu_after:
        nodes.append(helper.make_node("Relu", ["p"], ["y"]))
    g = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 23, 23])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 11, 11])], inits)
    src = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)

    tgt = targets.load("x86")
    mod = cpu.apply(pipeline.partition(pipeline.optimize(frontend.import_onnx(src).mod, tgt), tgt), tgt)
    pools = [f.script() for gv, f in mod.functions_items()
             if isinstance(f, tirx.PrimFunc) and "pool" in gv.name_hint]
    assert len(pools) == 1, [gv.name_hint for gv, _ in mod.functions_items()]
    assert ('scope="local"' in pools[0]) == relu_after, pools[0]
    res = deploytool.compile(src, output=tmp_path / "pool.so")
    assert res.schedules[next(k for k in res.schedules if "pool" in k)] == "tile_reduction", res.schedules
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_odd_channel_counts_are_padded_to_whole_vectors(tmp_path):
    """Convolutions to 100 output channels (no multiple of 16 or 8: part-vectors) compute 112 on
    AVX-512, 104 on AVX2, with zero weights, where the slice back to 100 is cheap: after the bias,
    ReLU and global mean of one (a slice of 112 values), before the output's transpose of another.
    Two whose sum is the third output stay at 100 (a slice there would cost a pass over the
    tensor). Each slice is a kernel of its own; the numbers match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pad_channels, pipeline, targets

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name) for name, shape in
             (("w1", (100, 16, 1, 1)), ("b1", (100,)), ("w2", (100, 16, 3, 3)), ("w3", (100, 16, 1, 1)),
              ("w4", (100, 16, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["pooled"]),
             helper.make_node("Conv", ["x", "w2"], ["y2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w3"], ["c3"]),
             helper.make_node("Conv", ["x", "w4"], ["c4"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c3", "c4"], ["y3"])]
    out = [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 100, 1, 1])] + \
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 100, 12, 12]) for y in ("y2", "y3")]
    g = helper.make_graph(nodes, "odd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                          out, inits)
    src = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    target = targets.load("x86")
    kp = pad_channels.padded(100, target.vector_bits // 32)
    assert kp in (104, 112)
    text = pipeline.optimize(frontend.import_onnx(src).mod, target)["main"].script(show_meta=False)
    for channels in (kp, 100):
        assert text.count(f"R.Tensor((1, 12, 12, {channels}), dtype=\"float32\") = R.nn.conv2d") == 2, text
    assert f"R.Tensor((1, 1, 1, {kp}), dtype=\"float32\") = R.mean" in text, text
    res = deploytool.compile(src, target="x86", output=tmp_path / "odd.so")
    assert sum(t.name.startswith("channel_slice") for t in res.tasks) == 2, [t.name for t in res.tasks]
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_grouped_convolutions_pad_each_group_to_whole_vectors(tmp_path):
    """ShuffleNet's unit: a 1x1 convolution in 4 groups of 34 output channels (vectors of 2 lanes,
    before) computes 4 groups of 40 on AVX2 with zero weights, its bias padded group by group, and
    the slice back fuses into what follows it (the channel shuffle; the residual add and ReLU),
    not into the convolution; a depthwise convolution is left as it is; the numbers match
    onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name) for name, shape in
             (("w1", (136, 34, 1, 1)), ("b1", (136,)), ("wd", (136, 1, 3, 3)), ("w2", (136, 34, 1, 1)),
              ("b2", (136,)))] + [numpy_helper.from_array(np.array(s, np.int64), n) for n, s in
                                  (("split", [1, 4, 34, 8, 8]), ("flat", [1, 136, 8, 8]))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Reshape", ["r1", "split"], ["s1"]),  # the channel shuffle
             helper.make_node("Transpose", ["s1"], ["t1"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t1", "flat"], ["sh"]),
             helper.make_node("Conv", ["sh", "wd"], ["d"], group=136, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w2", "b2"], ["c2"], group=4),
             helper.make_node("Add", ["c2", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 136, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 136, 8, 8])], inits)
    src = tmp_path / "shuffle.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    text = pipeline.optimize(frontend.import_onnx(src).mod, targets.load("x86-avx2"))["main"].script(show_meta=False)
    assert text.count('R.Tensor((1, 8, 8, 160), dtype="float32") = R.nn.conv2d') == 2, text
    assert text.count('R.Tensor((1, 8, 8, 136), dtype="float32") = R.nn.conv2d') == 1, text  # the depthwise one
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "shuffle.so")
    names = [t.name for t in res.tasks]
    slices = [n for n in names if "channel_slice" in n]
    assert len(slices) == 2 and not any("conv2d" in n for n in slices), names
    assert any("transpose" in n for n in slices) and any("add" in n and "relu" in n for n in slices), names
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_one_d_convolutions_vectorize_their_channels(tmp_path):
    """On CPUs 1-D convolutions run channels-last (NWC, weights WIO), as 2-D ones run NHWC: in
    ONNX's NCW the innermost axis is the width, and a width of 50 (98 in the DS-CNN) was vectorized
    in loops of 10 or 29 lanes (7 and 14 in the DS-CNN). Now every convolution kernel, the
    pointwise and the depthwise one, vectorizes whole 8-lane vectors of channels, and the numbers
    match onnxruntime."""
    import re

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name) for name, shape in
             (("w1", (32, 16, 3)), ("b1", (32,)), ("wd", (32, 1, 9)), ("w2", (32, 32, 1)), ("b2", (32,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd"], ["d"], group=32, pads=[4, 4]),
             helper.make_node("Conv", ["d", "w2", "b2"], ["c2"]),
             helper.make_node("Relu", ["c2"], ["y"])]
    g = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 50])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 50])], inits)
    src = tmp_path / "conv1d.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    target = targets.load("x86-avx2")
    opt = pipeline.optimize(frontend.import_onnx(src).mod, target)
    text = opt["main"].script(show_meta=False)
    assert text.count('data_layout="NWC", kernel_layout="WIO"') == 3, text
    mod = pipeline.schedule(pipeline.partition(opt, target), target)
    convs = [gv.name_hint for gv in mod.functions if "conv1d" in gv.name_hint]
    assert len(convs) == 3, convs
    for name in convs:
        lanes = [int(n) for n in re.findall(r"for \w+ in T\.vectorized\((?:T\.int64\()?(\d+)", mod[name].script())]
        assert lanes and all(n % 8 == 0 for n in lanes), (name, lanes, mod[name].script())
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "conv1d.so")
    assert sorted(res.schedules[n] for n in convs) == ["depthwise", "tile_reduction", "tile_reduction"], res.schedules
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
@pytest.mark.parametrize("dims", [1, 2])
def test_transposed_convolutions_between_convolutions_build_and_match(dims, tmp_path):
    """A decoder's ConvTranspose after a convolution: the layout conversion gave it its producer's
    channels-last layout, which TVM 0.27 cannot lower (conv2d_transpose is legalized for NCHW
    only), so the build failed in VM code generation. The transposed convolutions keep ONNX's
    layout now, and the numbers match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    k = [3] * dims
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name) for name, shape in
             (("w1", (16, 8, *k)), ("t", (16, 8, *[4] * dims)), ("tb", (8,)), ("w2", (8, 8, *k)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 2 * dims),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "t", "tb"], ["u"], strides=[2] * dims, pads=[1] * 2 * dims),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1] * 2 * dims)]
    g = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, *[6] * dims])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, *[12] * dims])], inits)
    src = tmp_path / "decoder.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "decoder.so")
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_transposed_convolutions_become_subpixel_convolutions(tmp_path):
    """On CPUs a ConvTranspose with constant weights (one group, no dilation) is one stride-1
    convolution with s^d x C_out channels and a pixel shuffle (deploytool.deconv): strides 1-3,
    kernels that strides do and do not divide, asymmetric pads, output paddings, 1-D and 2-D. A
    grouped and a dilated one stay transposed convolutions. Every output matches onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets

    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []

    def const(name, shape):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name))
        return name

    nodes.append(helper.make_node("Conv", ["x", const("w0", (8, 4, 3, 3))], ["c"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Conv", ["x1", const("w1", (8, 4, 3))], ["c1"], pads=[1, 1]))
    cases = [  # (input, kernel, attributes)
        ("c", (4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
        ("c", (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
        ("c", (3, 5), dict(strides=[2, 3], pads=[0, 1, 2, 0])),
        ("c", (2, 2), dict(strides=[2, 2])),
        ("c", (3, 3), dict(strides=[1, 1], pads=[1, 1, 1, 1])),
        ("c", (5, 5), dict(strides=[3, 3], pads=[2, 2, 2, 2], output_padding=[2, 1])),
        ("c", (3, 3), dict(strides=[2, 2], group=2)),        # stays transposed
        ("c", (3, 3), dict(strides=[2, 2], dilations=[2, 2])),  # stays transposed
        ("c1", (4,), dict(strides=[2], pads=[1, 1])),
        ("c1", (3,), dict(strides=[3], output_padding=[2])),
    ]
    for i, (src_name, k, attrs) in enumerate(cases):
        cout_per_group = 6 // attrs.get("group", 1)
        w = const(f"t{i}", (8, cout_per_group, *k))
        nodes.append(helper.make_node("ConvTranspose", [src_name, w, const(f"b{i}", (6,))], [f"y{i}"], **attrs))
        outs.append(f"y{i}")
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 9]),
         helper.make_tensor_value_info("x1", TensorProto.FLOAT, [1, 4, 11])]
    g = helper.make_graph(nodes, "deconvs", x, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                          inits)
    src = tmp_path / "deconvs.onnx"
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(onnx.shape_inference.infer_shapes(model), src)
    text = pipeline.optimize(frontend.import_onnx(src).mod, targets.load("x86-avx2"))["main"].script(show_meta=False)
    assert text.count("R.nn.conv2d_transpose(") == 2 and "R.nn.conv1d_transpose(" not in text, text
    res = deploytool.compile(src, target="x86-avx2", output=tmp_path / "deconvs.so")
    assert deploytool.run(res.artifact.path, check=src).ok


@pytest.mark.models
def test_weights_are_laid_out_as_the_kernels_read_them(tmp_path):
    """A convolution's and a matmul's constant weights are marked layout-free, an activation is
    not; RewriteLayout lays them out in the order the default schedule reads them, the packing is
    done at compile time (no packing function left in the graph, the kernel takes a tiled constant);
    a weight passed at run time is packed at run time; a candidate is measured alone on packed
    random weights; the mark does not change a candidate's hash; the numbers match onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from deploytool import frontend, pipeline, targets
    from deploytool.measure import LocalMeasurer, MeasureSettings
    from deploytool.schedules import space

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, shape).astype(np.float32), name) for name, shape in
             (("w", (256, 32, 3, 3)), ("b", (256,)), ("m", (48, 64)))] + \
        [numpy_helper.from_array(np.array([1], np.int64), "axis")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("MatMul", ["p", "m"], ["pm"]),        # a constant weight
             helper.make_node("MatMul", ["p", "q"], ["pq"]),        # two activations
             helper.make_node("ReduceSum", ["r", "axis"], ["rs"])]  # rows of an activation reduced
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "w", [helper.make_tensor_value_info("x", f, [1, 32, 10, 10]),
                                       helper.make_tensor_value_info("p", f, [4, 16, 48]),
                                       helper.make_tensor_value_info("q", f, [4, 48, 40]),
                                       helper.make_tensor_value_info("r", f, [16, 48])],
                          [helper.make_tensor_value_info("y", f, [1, 256, 10, 10]),
                           helper.make_tensor_value_info("pm", f, [4, 16, 64]),
                           helper.make_tensor_value_info("pq", f, [4, 16, 40]),
                           helper.make_tensor_value_info("rs", f, [16, 1])], inits)
    src = tmp_path / "w.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)

    target = targets.load("x86")
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(src).mod, target), target)
    kernels = {t.name: mod[t.name] for t in pipeline.tasks(mod)}
    conv = next(n for n in kernels if n.startswith("fused_conv2d"))
    weight_mm = next(n for n in kernels if "matmul" in n and len(kernels[n].params[1].shape) == 2)
    act_mm = next(n for n in kernels if "matmul" in n and len(kernels[n].params[1].shape) == 3)
    assert cpu.layout_free_params(kernels[conv]) == [1]          # (data, weight, bias, out)
    assert cpu.layout_free_params(kernels[weight_mm]) == [1]
    assert cpu.layout_free_params(kernels[act_mm]) == []
    assert [n for n in kernels if n.startswith("sum")] and \
        all(cpu.layout_free_params(kernels[n]) == [] for n in kernels if n.startswith("sum"))

    f_conv = kernels[conv]
    assert space.kernel_hash(space.tuning_module(f_conv, target)) == space.kernel_hash(space.workload_module(f_conv))
    cand = space.default_candidate(target, space.tuning_module(f_conv, target))
    assert cpu.PREPACK in str(cand.mod)
    with LocalMeasurer(target, MeasureSettings(), workers=1) as m:
        args = [([int(x) for x in p.shape], "float32") for p in f_conv.params]
        out, = m.measure([cand.mod], [args])
    assert out.error is None and min(out.latency_s) > 0, out

    scheduled = pipeline.prepack_weights(pipeline.schedule(mod, target, {}))
    names = [gv.name_hint for gv, _ in scheduled.functions_items()]
    assert not any(n.endswith("_weight_prepack") for n in names), names
    assert f"{conv}_prepacked" in names and f"{weight_mm}_prepacked" in names, names
    packed = scheduled[f"{conv}_prepacked"].params[1]
    shape = [int(x) for x in packed.shape]  # [output-channel tiles][3][3][32][vectors][lanes]
    assert len(shape) >= 5 and shape[1:4] == [3, 3, 32] and shape[0] * int(np.prod(shape[4:])) == 256, shape

    # the same graph with the matmul's weight passed at run time: packed on each call, still right
    g.input.append(helper.make_tensor_value_info("m", f, [48, 64]))
    del g.initializer[2]  # "m"
    src2 = tmp_path / "w_input.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src2)
    mod2 = pipeline.partition(pipeline.optimize(frontend.import_onnx(src2).mod, target), target)
    text = pipeline.prepack_weights(pipeline.schedule(mod2, target, {}))["main"].script(show_meta=False)
    assert "_weight_prepack" in text
    for path in (src, src2):
        res = deploytool.compile(path, target="x86", output=tmp_path / f"{path.stem}.so")
        assert deploytool.run(res.artifact.path, check=path).ok
