"""NVIDIA GPUs. Compiling for CUDA needs no GPU and runs in CI: every preset builds real cubins
(NVRTC), tuning candidates build in the persistent pool, float16 numerics hold. The tests marked
``gpu`` run a model, tune and replay on the GPU; they skip where there is none (CI has none)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import make_tiny_model
from test_cli import assert_one_line_error

CUDA_PRESETS = ("cuda", "cuda-sm80", "cuda-sm86", "cuda-sm89", "jetson-orin")


def _gpu():
    from deploytool import cuda

    return cuda.local_gpu()


needs_gpu = pytest.mark.skipif(_gpu() is None, reason="no NVIDIA GPU on this machine (CI has none): the gpu tests "
                               "run where one is, e.g. `pytest -m gpu` on the GPU machine")
no_gpu_only = pytest.mark.skipif(_gpu() is not None, reason="checks the message of a machine without a GPU")


# ----------------------------------------------------------------------------- CI: no GPU needed
@pytest.mark.models
@pytest.mark.parametrize("preset", CUDA_PRESETS)
def test_every_cuda_preset_compiles_to_a_cubin_of_its_arch(cli, tiny_model, tmp_path, preset):
    from deploytool import cuda, targets
    from deploytool.artifact import Artifact

    out = tmp_path / f"tiny-{preset}.so"
    r = cli("compile", tiny_model, "--target", preset, "-o", out)
    assert r.code == 0, r
    t = targets.load(preset)
    for k in ("max_threads_per_block", "max_shared_memory_per_block", "thread_warp_size", "registers_per_block"):
        assert k in t.tvm, k  # MetaSchedule refuses a CUDA target without them
    assert cuda.cubin_archs(out) == [t.tvm["arch"]]  # machine code for the GPU, not CUDA source
    art = Artifact.open(out)
    assert art.metadata["target"]["family"] == "cuda" and art.arch == t.arch
    if preset == "jetson-orin":
        assert art.arch == "aarch64" and t.host["mtriple"].startswith("aarch64")
    assert "Fallback" in r.out or "Matmul" in r.out  # dlight rules scheduled every kernel
    assert "no default schedule" not in r.err


@pytest.mark.models
def test_cuda_squeezenet_default_schedules_bind_every_kernel(tmp_path):
    import deploytool
    from deploytool import corpus

    res = deploytool.compile(corpus.default_model(), target="cuda-sm80", output=tmp_path / "sq.so")
    assert set(res.schedules.values()) <= {"Matmul", "GEMV", "LowBatchGEMV", "Reduction", "GeneralReduction",
                                           "Transpose", "Fallback"}
    convs = [k for k in res.schedules if "conv2d" in k]
    assert len(convs) >= 18 and all(res.schedules[k] == "Matmul" for k in convs)  # every conv as a tiled GEMM
    # the launches between planned buffers are captured as a CUDA graph (replayed after the first call)
    assert b"vm.builtin.cuda_graph.run_or_capture" in (tmp_path / "sq.so").read_bytes()


@pytest.mark.models
def test_cuda_tuning_candidates_build_here(tiny_model):
    """The tuning build path without a GPU: candidates sampled from the CUDA design space build to
    .so files with cubins in the persistent pool (on the GPU machine the same pool feeds the GPU)."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool import cuda, frontend, pipeline, targets
    from deploytool.measure import LocalMeasurer, MeasureSettings
    from deploytool.schedules import space

    tgt = targets.load("cuda-sm80")
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(tiny_model).mod, tgt), tgt)
    conv = next(t for t in pipeline.tasks(mod) if "conv2d" in t.name)
    ctx = ms.TuneContext(mod=space.workload_module(mod[conv.name]), target=tgt.tvm_target(),
                         space_generator=space.space_generator(tgt), search_strategy=ms.search_strategy.ReplayTrace(),
                         task_name=conv.name, rand_state=1, num_threads=1)
    ctx.pre_tuning(max_trials=6, num_trials_per_iter=6, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=None)
    cands = ctx.generate_measure_candidates()
    assert len(cands) >= 3
    # the dlight default is one of the design spaces: the search starts from it
    assert len(ctx.generate_design_space()) >= 2
    m = LocalMeasurer(tgt, MeasureSettings(), workers=2)
    try:
        built = m.build([c.sch.mod for c in cands])
        paths = [b for b in built if isinstance(b, str)]
        assert len(paths) == len(cands), [b.error for b in built if not isinstance(b, str)]
        assert all(cuda.cubin_archs(p) == ["sm_80"] for p in paths)
    finally:
        m.close()


@pytest.mark.fast
def test_cuda_unroll_depth_is_bounded():
    from deploytool.schedules import space

    assert max(space.CUDA_UNROLL_STEPS) <= 256


@pytest.mark.models
def test_float16_numerics_hold_on_the_cpu(cli, tmp_path):
    """--dtype float16 is checked here on x86 (same graph rewrite as on GPUs): float32 interface,
    float16 inside, within the float16 tolerance of onnxruntime's float32 result."""
    from deploytool import corpus
    from deploytool.artifact import Artifact

    model = corpus.default_model()
    out = tmp_path / "sq16.so"
    r = cli("compile", model, "--target", "x86", "--dtype", "float16", "-o", out, "-q")
    assert r.code == 0, r
    art = Artifact.open(out)
    assert art.metadata["dtype"] == "float16" and art.inputs[0].dtype == "float32"
    r = cli("run", out, "--check", model)
    assert r.code == 0 and "check passed" in r.out and "tol 0.03" in r.out, r
    assert cli("run", out, "--check", model, "--rtol", "1e-7").code == 1  # float16 is not float32
    assert_one_line_error(cli("compile", model, "--dtype", "float64"), "--dtype")


@pytest.mark.fast
@no_gpu_only
def test_running_or_tuning_cuda_without_a_gpu_says_so(cli, tiny_model, tmp_path):
    out = tmp_path / "t.so"
    assert cli("compile", tiny_model, "--target", "cuda", "-o", out, "-q").code == 0
    assert_one_line_error(cli("run", out), "needs an NVIDIA GPU", "compiling (--target cuda) works anywhere")
    assert_one_line_error(cli("bench", out), "needs an NVIDIA GPU")
    assert_one_line_error(cli("tune", tiny_model, "--target", "cuda", "-o", tmp_path / "t.jsonl"),
                          "tuning for cuda needs an NVIDIA GPU")
    assert not (tmp_path / "t.jsonl").exists()


# ----------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@needs_gpu
def test_gpu_squeezenet_runs_and_matches_onnxruntime(cli, tmp_path):
    from deploytool import corpus

    model = corpus.default_model()
    out = tmp_path / "sq.so"
    assert cli("compile", model, "--target", "cuda", "-o", out, "-q").code == 0
    r = cli("run", out, "--check", model)
    assert r.code == 0 and "check passed" in r.out, r
    r = cli("bench", out, "--compare", model, "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["deploytool"]["median_ms"] > 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_cuda_graph_replays_with_new_inputs(tmp_path):
    """The first call captures the CUDA graph, later ones replay it: each call must still answer
    for its own input (a stale capture would repeat the first answer)."""
    import numpy as np

    import deploytool
    from deploytool import corpus
    from deploytool.reference import compare, ort_run, ort_session
    from deploytool.runner import LocalRunner

    model = corpus.default_model()
    runner = LocalRunner(deploytool.compile(model, target="cuda", output=tmp_path / "sq.so").artifact)
    sess = ort_session(model)
    spec = runner.artifact.inputs[0]
    outs = []
    for seed in range(3):
        feed = {spec.name: np.random.default_rng(seed).standard_normal(spec.shape).astype(np.float32)}
        got = runner.run(feed)
        assert all(c.ok for c in compare(got, ort_run(sess, feed), 1e-3)), seed
        outs.append(next(iter(got.values())))
    assert not np.allclose(outs[1], outs[2])


@pytest.mark.gpu
@needs_gpu
def test_gpu_float16_matches_onnxruntime(cli, tmp_path):
    from deploytool import corpus

    model = corpus.default_model()
    out = tmp_path / "sq16.so"
    assert cli("compile", model, "--target", "cuda", "--dtype", "float16", "-o", out, "-q").code == 0
    r = cli("run", out, "--check", model)
    assert r.code == 0 and "check passed" in r.out, r


@pytest.mark.gpu
@needs_gpu
def test_gpu_tune_resume_and_replay(cli, tmp_path):
    model = make_tiny_model(tmp_path / "tiny.onnx")
    log = tmp_path / "tiny-cuda.jsonl"
    r = cli("tune", model, "--target", "cuda", "--trials-per-task", "4", "--batch", "4", "-o", log, "-q")
    assert r.code == 0, r
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["target"]["tvm"]["kind"] == "cuda" and header["device"].get("gpu")
    # candidates are timed with a cold L2, one launch per sample, 3 samples per record
    assert header["measure"]["gpu_timing"] == "cold L2" and header["measure"]["l2_flush_bytes"] > 0
    recs = [r for r in map(json.loads, lines) if r["type"] == "record"]
    assert any(x.get("source") == "search" for x in recs)
    assert all(len(x["latency_s"]) == 3 for x in recs if x.get("latency_s"))
    r = cli("tune", model, "--target", "cuda", "--trials-per-task", "4", "--batch", "4", "-o", log, "-q")
    assert r.code == 0, r
    assert len(log.read_text().splitlines()) == len(lines)  # resumed: nothing measured again
    out = tmp_path / "t.so"
    r = cli("compile", model, "--target", "cuda", "--tuning-log", log, "--require-tuned", "-o", out, "-q")
    assert r.code == 0, r
    r = cli("run", out, "--check", model)
    assert r.code == 0 and "check passed" in r.out, r


@pytest.mark.gpu
@needs_gpu
def test_gpu_arch_mismatch_is_refused(cli, tiny_model, tmp_path):
    if _gpu().arch.startswith("sm_8"):
        pytest.skip("needs a GPU outside the sm_8x family (an sm_80 cubin loads on sm_86/87/89)")
    out = tmp_path / "other.so"
    assert cli("compile", tiny_model, "--target", "cuda-sm80", "-o", out, "-q").code == 0
    assert_one_line_error(cli("run", out), "is built for sm_80")


@pytest.mark.models
def test_cuda_float16_tensor_core_candidates_build_and_replay(tmp_path):
    """float16 convolutions get tensor-core sketches (WMMA/MMA tiling through shared memory) beside
    the plain tiling; their candidates build to sm_80 cubins here, and a logged tensor-core trace
    replays in a fresh process (which must register the intrinsics the trace names first)."""
    import subprocess
    import sys

    import tvm
    from tvm.s_tir import meta_schedule as ms

    from deploytool import corpus, cuda, frontend, pipeline, targets
    from deploytool.measure import LocalMeasurer, MeasureSettings
    from deploytool.schedules import space
    from deploytool.tuninglog import to_py

    tgt = targets.load("cuda-sm80")
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(corpus.default_model()).mod, tgt,
                                               dtype="float16"), tgt)
    conv = next(t for t in pipeline.tasks(mod) if "conv2d" in t.name)
    ctx = ms.TuneContext(mod=space.workload_module(mod[conv.name]), target=tgt.tvm_target(),
                         space_generator=space.space_generator(tgt), search_strategy=ms.search_strategy.ReplayTrace(),
                         task_name=conv.name, rand_state=1, num_threads=1)
    spaces = ctx.generate_design_space()
    tc = [s for s in spaces if "meta_schedule.auto_tensorize" in str(s.trace)]
    assert len(tc) >= 2, [str(s.trace)[-300:] for s in spaces]  # WMMA and MMA sketches
    ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=tc, database=ms.database.MemoryDatabase(),
                   cost_model=None)
    cands = ctx.generate_measure_candidates()
    assert cands and all("sch.tensorize(" in str(c.sch.trace) for c in cands)
    m = LocalMeasurer(tgt, MeasureSettings(), workers=2)
    try:
        built = m.build([c.sch.mod for c in cands])
        ok = [(c, b) for c, b in zip(cands, built) if isinstance(b, str)]
        assert ok, [b.error for b in built]
        assert all(cuda.cubin_archs(b) == ["sm_80"] for _, b in ok)
    finally:
        m.close()
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(to_py(ok[0][0].sch.trace.as_json(remove_postproc=False))))
    assert '"Tensorize"' in trace.read_text()  # what replay_trace looks for before it registers the intrinsics
    (tmp_path / "wl.json").write_text(tvm.ir.save_json(space.workload_module(mod[conv.name])))
    code = ("import json, sys, tvm; from deploytool.schedules import space; "
            "wmod = tvm.ir.load_json(open(sys.argv[1]).read()); "
            "sch = space.replay_trace(wmod, json.load(open(sys.argv[2]))); "
            "ir = str(sch.mod); assert 'tvm_mma_sync' in ir or 'ptx_mma' in ir, ir[-1000:]; print('replayed')")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "wl.json"), str(trace)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "replayed" in r.stdout, r.stderr[-2000:]



# ----------------------------------------------------------------------------- split-K (CI: CPU only)
@pytest.mark.fast
def test_split_k_chooses_splits_only_for_small_outputs():
    """Batch-1 shapes get K split until about two waves of 64x64 tiles cover the SMs (chunks of at
    least 128 steps); batch-32 shapes and short reductions are left alone."""
    from deploytool.splitk import choose_split

    assert choose_split(128, 768, 3072, 132) == 8  # BERT b1 FFN down-projection: 24 tiles
    assert choose_split(49, 512, 4608, 132) == 16  # ResNet-50 b1 last stage 3x3: 8 tiles
    assert choose_split(49, 512, 4608, 16) == 4  # the same on a 16-SM Orin
    assert choose_split(128 * 32, 768, 3072, 132) == 1  # BERT at batch 32: 768 tiles
    assert choose_split(3136, 64, 256, 132) == 1  # a short reduction
    assert choose_split(128, 768, 768 + 64, 132) in (1, 2, 4) and 832 % choose_split(128, 768, 832, 132) == 0


@pytest.mark.models
def test_split_k_rewrite_computes_the_same_conv_and_matmul():
    """The rewrite (partial products in float32 over K chunks, then their sum fused with what
    followed) gives the operator's result: a strided, padded float16 conv + ReLU and a float16
    matmul, built for the CPU with and without it, against a float64 numpy reference. The split
    build is at least as close as the unsplit one (which accumulates in float16)."""
    import numpy as np
    import tvm
    from tvm import relax

    from deploytool import splitk

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((32, 64, 3, 3)) * 0.1).astype("float16")
    b = (rng.standard_normal((1024, 48)) * 0.1).astype("float16")
    xs = rng.standard_normal((1, 64, 9, 9)).astype("float16")
    ys = rng.standard_normal((1, 16, 1024)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, 9, 9), "float16"))
    y = relax.Var("y", relax.TensorType((1, 16, 1024), "float16"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(w), strides=[2, 2], padding=[1, 1, 1, 1]))
            c = bb.emit(relax.op.nn.relu(c))
            m = bb.emit(relax.op.matmul(y, relax.const(b)))
            out = bb.emit_output(relax.Tuple([c, m]))
        bb.emit_func_output(out)
    mod = bb.get()
    split = splitk.split_k_pass(132)(mod)
    names = {gv.name_hint for gv in split.functions}
    assert {"conv2d_splitk", "matmul_splitk"} <= names, names

    xp = np.pad(xs.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref_c = np.zeros((1, 32, 5, 5))
    for i in range(5):
        for j in range(5):
            ref_c[0, :, i, j] = np.einsum("ochw,chw->o", w.astype("float64"), xp[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3])
    ref = [np.maximum(ref_c, 0), ys.astype("float64") @ b.astype("float64")]
    errs = []
    for m in (mod, split):
        vm = relax.VirtualMachine(tvm.compile(m, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ys))
        errs.append([float(np.abs(g.numpy().astype("float64") - r).max() / np.abs(r).max()) for g, r in zip(got, ref)])
    assert all(e < 2e-3 for e in errs[1]), errs  # float16 output rounding only
    assert all(s <= u for s, u in zip(errs[1], errs[0])), errs


@pytest.mark.models
def test_split_k_kernels_are_gemms_for_dlight_and_the_tensor_core_space(tmp_path, cli):
    """On a float16 CUDA build the split kernels get a tensor-core default schedule (their 49-row
    output is below dlight's own threshold: schedules.gpu.TensorCoreMatmul takes them) and tensor-core sketches in the tuning space; the sum is fused with the epilogue, and
    --no-split-k keeps one kernel per operator."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tvm.s_tir import meta_schedule as ms

    import numpy as np

    from deploytool import frontend, pipeline, targets
    from deploytool.schedules import gpu, space

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((256, 512, 3, 3)) * 0.02).astype("float32"), "w")
    bias = numpy_helper.from_array(rng.standard_normal(256).astype("float32"), "bias")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "bias"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 7, 7])], [w, bias])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)

    tgt = targets.load("cuda")
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(path).mod, tgt, "float16"), tgt)
    names = [t.name for t in pipeline.tasks(mod)]
    part = next(n for n in names if n.startswith("conv2d_splitk"))
    assert any(n.startswith("fused_sum_splitk") and "relu" in n for n in names), names
    sch, rule = gpu.schedule_sch(mod[part], tgt.tvm_target())
    assert rule == "TensorCoreMatmul" and "wmma.matrix_a" in str(sch.mod), rule
    ctx = ms.TuneContext(mod=space.workload_module(mod[part]), target=tgt.tvm_target(),
                         space_generator=space.space_generator(tgt, with_default=False), task_name=part)
    assert any("meta_schedule.auto_tensorize" in str(s.trace) for s in ctx.generate_design_space())

    plain = pipeline.partition(pipeline.optimize(frontend.import_onnx(path).mod, tgt, "float16", split_k=False), tgt)
    assert not any("splitk" in t.name for t in pipeline.tasks(plain))
    # float32 builds split too (CUDA-core GEMMs have the same tail: ResNet-50 b1 3.11 -> 1.10 ms)
    f32 = pipeline.partition(pipeline.optimize(frontend.import_onnx(path).mod, tgt, "float32"), tgt)
    assert any(t.name.startswith("conv2d_splitk") for t in pipeline.tasks(f32))
    out = tmp_path / "conv.so"
    r = cli("compile", str(path), "--target", "cuda", "--dtype", "float16", "-o", str(out))
    assert r.code == 0, r
    from deploytool.artifact import Artifact

    assert Artifact.open(out).metadata["split_k"] is True
    r = cli("compile", str(path), "--target", "cuda", "--dtype", "float16", "--no-split-k", "-o", str(out))
    assert r.code == 0, r
    assert Artifact.open(out).metadata["split_k"] is False


@pytest.mark.models
def test_small_gemm_dimensions_still_get_tensor_cores(tmp_path):
    """dlight's Matmul keeps a GEMM with a dimension <= 64 on the CUDA cores (ResNet's 64-channel
    first stage, attention with 64-wide heads); in float16 our default rule tensorizes it when the
    padding to the 128x128x64 tiles is cheap, and leaves float32 and wasteful shapes to dlight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import numpy as np

    from deploytool import frontend, pipeline, targets
    from deploytool.schedules import gpu

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((64, 64, 3, 3)) * 0.05).astype("float32"), "w")
    wfc = numpy_helper.from_array((rng.standard_normal((64 * 28 * 28, 10)) * 0.01).astype("float32"), "wfc")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "wfc"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], [w, wfc])
    path = tmp_path / "conv64.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)

    tgt = targets.load("cuda")
    for dtype, want in (("float16", "TensorCoreMatmul"), ("float32", "Matmul")):
        mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(path).mod, tgt, dtype, split_k=False), tgt)
        conv = next(t.name for t in pipeline.tasks(mod) if "conv2d" in t.name)
        assert gpu.gemm_extents(mod[conv]) == (1, 4 * 28 * 28, 64, 64 * 9)
        sch, rule = gpu.schedule_sch(mod[conv], tgt.tvm_target())
        assert rule == want, (dtype, rule)
        assert ("wmma.matrix_a" in str(sch.mod)) == (dtype == "float16")
        # 4 x 10 outputs padded to a 128 x 128 tile: 400x the work, not worth it
        fc = next(t.name for t in pipeline.tasks(mod) if "matmul" in t.name)
        assert gpu.pad_waste(gpu.gemm_extents(mod[fc])) > gpu.MAX_PAD_WASTE
        assert gpu.schedule_sch(mod[fc], tgt.tvm_target())[1] != "TensorCoreMatmul"
    import deploytool
    from deploytool import cuda

    out = tmp_path / "conv64.so"  # and it compiles to machine code
    res = deploytool.compile(path, target="cuda", output=out, dtype="float16", split_k=False)
    assert "TensorCoreMatmul" in res.schedules.values() and cuda.cubin_archs(out) == ["sm_90"]


def _matmul_model(path):
    """Y = relu(X @ W + b) with X [2, 4, 16, 32] and W [32, 24]; Z = Y @ Y^T per batch and head
    (a batched matmul of two activations, as attention has)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 24)).astype(np.float32) * 0.2, "w")
    b = numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["xwb"]),
             helper.make_node("Relu", ["xwb"], ["y"]), helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["y", "yt"], ["z"])]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 16, 32])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4, 16, 16])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8  # what the GPU machine's onnxruntime reads
    onnx.save(m, path)
    return path


@pytest.mark.models
def test_cublas_builds_here_and_is_refused_where_it_does_not_apply(cli, tmp_path):
    """--cublas (CUDA, float16): both matmuls become calls of deploytool.cublas.matmul, linked into
    the artifact, built on this machine with no CUDA toolkit or cuBLAS; elsewhere a one-line error."""
    model = _matmul_model(tmp_path / "mm.onnx")
    plain, offl = tmp_path / "plain.so", tmp_path / "cublas.so"
    assert cli("compile", model, "--target", "cuda", "--dtype", "float16", "-o", plain, "-q").code == 0
    r = cli("compile", model, "--target", "cuda", "--dtype", "float16", "--cublas", "-o", offl, "-q")
    assert r.code == 0, r
    m0, m1 = (json.loads(cli("metadata", p).out) for p in (plain, offl))
    assert m1["cublas"] is True and m0["cublas"] is False
    names = {t["name"] for t in m1["kernel_table"]}
    assert not any("matmul" in n for n in names) and any("matmul" in t["name"] for t in m0["kernel_table"])
    assert b"deploytool.cublas.matmul" in offl.read_bytes() and b"deploytool.cublas.matmul" not in plain.read_bytes()
    for args in (["--target", "x86"], ["--target", "cuda"]):  # not CUDA; CUDA in float32
        r = cli("compile", model, *args, "--cublas", "-o", tmp_path / "x.so")
        assert_one_line_error(r, "--cublas")


def _conv_block_model(path):
    """A residual block: relu(bn(conv3x3)) -> bn(conv3x3), + bn(conv1x1 shortcut) -> relu, then a
    2x2 convolution padded on one side only (cuDNN pads symmetrically) and a sigmoid."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name, a):
        inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def conv(x, y, cin, cout, k, pads, bn=True):
        w = const(y + "_w", rng.standard_normal((cout, cin, k, k)) * (2 / (cin * k * k)) ** 0.5)
        nodes.append(helper.make_node("Conv", [x, w], [y + "_c" if bn else y], pads=pads, kernel_shape=[k, k]))
        if bn:
            stats = [rng.uniform(0.5, 1.5, cout), rng.standard_normal(cout) * 0.1, rng.standard_normal(cout) * 0.1,
                     rng.uniform(0.5, 1.5, cout)]
            nodes.append(helper.make_node("BatchNormalization", [y + "_c"] + [const(f"{y}_{i}", v) for i, v in
                                                                               enumerate(stats)], [y]))

    conv("x", "a", 16, 32, 3, [1, 1, 1, 1])
    nodes.append(helper.make_node("Relu", ["a"], ["ar"]))
    conv("ar", "b", 32, 32, 3, [1, 1, 1, 1])
    conv("x", "s", 16, 32, 1, [0, 0, 0, 0])
    nodes += [helper.make_node("Add", ["b", "s"], ["r"]), helper.make_node("Relu", ["r"], ["rr"])]
    conv("rr", "d", 32, 8, 2, [0, 0, 1, 1], bn=False)
    nodes.append(helper.make_node("Sigmoid", ["d"], ["y"]))
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 12, 12])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.mark.models
def test_cudnn_takes_each_convolution_with_its_epilogue_builds_here_and_is_refused_elsewhere(cli, tmp_path):
    """--cudnn (CUDA, float16): the convolutions become calls of deploytool.cudnn.conv2d on NHWC
    tensors with what cuDNN fuses after them (bias + ReLU; bias + residual + ReLU; the shortcut's
    bias), the transposes between consecutive calls cancel (one NCHW -> NHWC at the input, one
    back before the TVM convolution), the one-sided padding stays a TVM kernel, and the build
    captures no CUDA graph (cuDNN times its algorithms at the first call). Built on this machine,
    with no CUDA toolkit or cuDNN; elsewhere a one-line error."""
    from tvm import relax

    from deploytool import cudnn, pipeline, targets
    from deploytool.frontend import import_model

    model = _conv_block_model(tmp_path / "block.onnx")
    mod = pipeline.optimize(import_model(model).mod, targets.load("cuda"), "float16", cudnn=True)
    calls = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    offloaded = [c for c in calls if len(c.args) == 2 and isinstance(c.args[0], relax.ExternFunc)
                 and c.args[0].global_symbol == cudnn.FUNC]
    # [..., relu, has_bias, has_z] per call, and the convolutions left to TVM
    assert sorted(tuple(int(v) for v in c.args[1].fields[0].values[7:]) for c in offloaded) == \
        [(0, 1, 0), (1, 1, 0), (1, 1, 1)]
    left = [c for c in calls if getattr(c.op, "name", "") == "relax.nn.conv2d"]
    assert [[int(p) for p in c.attrs.padding] for c in left] == [[0, 0, 1, 1]]
    permutes = [[int(a) for a in c.attrs.axes] for c in calls if getattr(c.op, "name", "") == "relax.permute_dims"]
    assert sorted(permutes) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    out = tmp_path / "block.so"
    r = cli("compile", model, "--target", "cuda", "--dtype", "float16", "--cudnn", "-o", out, "-q")
    assert r.code == 0, r
    meta = json.loads(cli("metadata", out).out)
    assert meta["cudnn"] is True and b"deploytool.cudnn.conv2d" in out.read_bytes()
    assert len([t for t in meta["kernel_table"] if "conv2d" in t["name"]]) == 1
    # two such artifacts in one process: each carries the call, and only the first registers it (a
    # second registration of a global made TVM-FFI abort the process at the second dlopen)
    twin = tmp_path / "twin.so"
    shutil.copy(out, twin)
    load_both = ("import ctypes, sys, tvm; [ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL) for p in sys.argv[1:]]; "
                 f"assert tvm.get_global_func({cudnn.FUNC!r}, allow_missing=True) is not None")
    r2 = subprocess.run([sys.executable, "-c", load_both, str(out), str(twin)], capture_output=True, text=True)
    assert r2.returncode == 0, r2.stderr[-800:]
    plain = tmp_path / "plain.so"
    assert cli("compile", model, "--target", "cuda", "--dtype", "float16", "-o", plain, "-q").code == 0
    assert b"cuda_graph" in plain.read_bytes() and b"cuda_graph" not in out.read_bytes()
    for args in (["--target", "x86"], ["--target", "cuda"]):  # not CUDA; CUDA in float32
        assert_one_line_error(cli("compile", model, *args, "--cudnn", "-o", tmp_path / "x.so"), "--cudnn")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("flag, make", [("--cublas", _matmul_model), ("--cudnn", _conv_block_model)])
def test_gpu_vendor_library_calls_match_onnxruntime(cli, tmp_path, flag, make):
    """--cublas's matmuls, --cudnn's convolutions with their fused epilogues, run on the GPU."""
    model = make(tmp_path / "m.onnx")
    out = tmp_path / "m.so"
    assert cli("compile", model, "--target", "cuda", "--dtype", "float16", flag, "-o", out, "-q").code == 0
    r = cli("run", out, "--check", model)
    assert r.code == 0 and "check passed" in r.out, r


@pytest.mark.fast
def test_float16_builds_take_clip(cli, tmp_path):
    """Clip with constant bounds (ReLU6: MobileNetV2) under --dtype float16: TVM's Clip converter
    emits TE calls that its mixed-precision pass cannot type; deploytool's converts it to Max/Min."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    lo, hi = (numpy_helper.from_array(np.array([v], np.float32), n) for v, n in ((0.0, "lo"), (6.0, "hi")))
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], "relu6",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [w, lo, hi])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "relu6.onnx")
    r = cli("compile", tmp_path / "relu6.onnx", "--target", "cuda", "--dtype", "float16", "-o", tmp_path / "a.so", "-q")
    assert r.code == 0, r
    r = cli("compile", tmp_path / "relu6.onnx", "--target", "x86", "-o", tmp_path / "b.so", "-q")
    assert r.code == 0, r
    assert cli("run", tmp_path / "b.so", "--check", tmp_path / "relu6.onnx").code == 0
