"""Default CPU schedules: every kernel class gets one, and numerics still match onnxruntime."""

import onnx
import pytest

import deploytool
from deploytool import zoo
from deploytool.schedules import cpu


@pytest.mark.fast
@pytest.mark.parametrize("C,W,lanes,regs,expect", [
    (64, 56, 16, 32, (32, 8)),     # AVX-512: two vectors x 8 rows
    (64, 56, 8, 16, (16, 4)),      # AVX2: half the registers, half the rows
    (1000, 13, 16, 32, (8, 13)),   # 1000 = 8 x 125 lanes; prime width 13: all 13 rows, one vector
    (3, 224, 16, 32, (3, 14)),     # tiny channel counts: one part-vector, many rows
])
def test_register_tile(C, W, lanes, regs, expect):
    ci, wi = cpu._register_tile(C, W, lanes, regs)
    assert (ci, wi) == expect
    assert C % ci == 0 and W % wi == 0
    vectors = -(-ci // lanes)
    assert wi * vectors + vectors + 1 < regs  # accumulators + weight vectors + broadcast fit


def _tiny_bert():
    return zoo.bert_encoder(seq=16, hidden=64, heads=4, layers=2, ffn=128, vocab=100)


@pytest.mark.models
@pytest.mark.parametrize("name,build", [
    ("ds_cnn_1d", zoo.ds_cnn_1d),
    ("tiny_bert", _tiny_bert),
    ("mobilenet_v2", zoo.mobilenet_v2),
])
def test_every_kernel_is_scheduled_and_correct(name, build, tmp_path):
    src = tmp_path / f"{name}.onnx"
    onnx.save(build(), src)
    res = deploytool.compile(src, output=tmp_path / f"{name}.so")
    assert res.schedules and all(rule != "none" for rule in res.schedules.values()), res.schedules
    # convolutions and matmuls get the register-blocked rule itself, not the safety net (a bug in
    # the rule would otherwise degrade silently to parallel_fallback)
    heavy = {k: v for k, v in res.schedules.items() if "conv" in k or "matmul" in k}
    assert heavy and all(v == "tile_reduction" for v in heavy.values()), heavy
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
