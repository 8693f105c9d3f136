"""``--cudnn``: the float16 convolutions of a CUDA build on cuDNN, NHWC, with their epilogues.

At batch 32, ResNet-50 in float16 is all convolutions, and MetaSchedule's tensor-core schedules
(WMMA fragments, no software pipeline) reached 4.4 ms on the H200 where torch.compile got 1.9-2.5
ms from cuDNN's channels-last kernels with the pointwise ops fused after them. This pass moves
the convolutions to cuDNN in the graph:

- each float16 convolution with symmetric padding becomes a call of
  ``deploytool.cudnn.conv2d``, a packed function linked into the artifact
  (``native/cudnn_conv.cc`` over ``native/cudnn_graph.h``), taking with it the epilogue that
  cuDNN computes in the same graph: the bias add and ReLU after it, and a residual added before
  the ReLU (ResNet's ``relu(conv(x) + b + shortcut)``). A convolution with another epilogue is
  called alone and its epilogue stays a TVM kernel;
- the calls take NHWC activations and OHWI (KRSC) weights (re-laid out once, here) with
  transposes around them, and the transposes that undo each other between consecutive calls are
  dropped: activations stay NHWC from one cuDNN call to the next, pooling and the classifier keep
  the model's NCHW. (Relax's ConvertLayout to NHWC instead made ResNet-50's flatten after the
  global pooling a kernel that crashed the host process at its launch, TVM 0.27 on the H200.)

Each shape is one graph of cuDNN's backend API (conv, then pointwise add/add/ReLU on the float32
accumulator, one rounding to float16); at the first call cuDNN's heuristics list the engines for
it and the first few that finalize are timed on the GPU, the fastest kept for the process (what
``torch.backends.cudnn.benchmark`` does). The function loads cuDNN with dlopen at that first
call: building needs no CUDA toolkit or cuDNN, running needs libcudnn 8 or 9 on the GPU machine
(pip's nvidia-cudnn, as torch installs it, or the system's; ``DEPLOYTOOL_CUDNN`` names a file).
Such a build captures no CUDA graph (pipeline.build): TVM's RewriteCUDAGraph would capture the
extern calls too, and the first call's timing of engines cannot run under stream capture.

Measured (H200, cuDNN 9.19, 2026-12-02; docs/benchmarks.md): ResNet-50 b32 1.409 ms against
torch.compile max-autotune's 2.464 ms in the same run, and 4.465 ms on TVM's tuned kernels. The
first version went through cuDNN's legacy API (cudnnFindConvolutionForwardAlgorithmEx, then
cudnnConvolutionBiasActivationForward): 8.07 ms, its implicit-GEMM algorithms at 6-55 TFLOP/s.
"""

from __future__ import annotations

import os
from pathlib import Path

from deploytool import vendor
from deploytool.vendor import static_shape as _shape

FUNC = "deploytool.cudnn.conv2d"


def applies(target, dtype: str, cudnn: bool) -> bool:
    return bool(cudnn) and target.family == "cuda" and dtype == "float16"


def _dtype(expr) -> str:
    return str(getattr(expr.ty, "dtype", ""))


def _conv_params(conv) -> list[int] | None:
    """[stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups] of a convolution cuDNN
    takes here (float16, NCHW/OIHW, static shapes, symmetric padding), else None."""
    a = conv.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW"):
        return None
    x, w = conv.args
    if _dtype(x) != "float16" or _dtype(w) != "float16" or _dtype(conv) != "float16":
        return None
    if any(s is None or len(s) != 4 for s in (_shape(x), _shape(w), _shape(conv))):
        return None
    pad = [int(p) for p in a.padding]
    if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3]:
        return None  # cuDNN pads symmetrically
    return [int(a.strides[0]), int(a.strides[1]), pad[0], pad[1], int(a.dilation[0]), int(a.dilation[1]),
            int(a.groups)]


def _bias_ok(bias, channels: int) -> bool:
    """A per-channel constant of an NCHW output: [1, C, 1, 1] or [C, 1, 1]."""
    shape = _shape(bias)
    return _dtype(bias) == "float16" and shape is not None and len(shape) in (3, 4) and \
        shape[-3] == channels and all(d == 1 for i, d in enumerate(shape) if i != len(shape) - 3)


TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def offload_pass():
    """The module pass: float16 conv2d (+ bias (+ residual) (+ ReLU)) -> call_dps_packed(FUNC) on
    NHWC tensors, transposes around it; then transposes that undo each other between consecutive
    calls are dropped, so the activations stay NHWC from one cuDNN call to the next and the rest
    of the graph (pooling, the classifier) keeps the model's NCHW."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    def nhwc(e):
        if isinstance(e, tvm.ir.Constant):
            return relax.const(np.ascontiguousarray(e.value.numpy().transpose(TO_NHWC)), "float16")
        return relax.op.permute_dims(e, TO_NHWC)

    def call(conv, relu: bool, bias=None, z=None):
        params = _conv_params(conv)
        if params is None:
            return None
        n, k, p, q = _shape(conv)
        if (bias is not None and not _bias_ok(bias, k)) or (z is not None and (_shape(z) != [n, k, p, q] or
                                                                              _dtype(z) != "float16")):
            return None
        x, w = conv.args
        args = [relax.ShapeExpr(params + [int(relu), int(bias is not None), int(z is not None)]), nhwc(x), nhwc(w)]
        if bias is not None:
            args.append(relax.const(bias.value.numpy().reshape(k), "float16"))
        if z is not None:
            args.append(nhwc(z))
        y = relax.call_dps_packed(FUNC, args, relax.TensorType([n, p, q, k], "float16"))
        return relax.op.permute_dims(y, TO_NCHW)

    x, w, b, z = wildcard(), wildcard(), is_const(), wildcard()
    conv = is_op("relax.nn.conv2d")(x, w)
    biased = is_op("relax.add")(conv, b)
    summed = is_op("relax.add")(biased, z) | is_op("relax.add")(z, biased)
    residual = is_op("relax.nn.relu")(summed)
    activated = is_op("relax.nn.relu")(biased)

    def keep_or(new, orig):
        return orig if new is None else new

    rules = [  # the most fused first: what a rule takes, the next ones no longer see
        (residual, lambda orig, m: keep_or(call(m[conv], True, m[b], m[z]), orig)),
        (activated, lambda orig, m: keep_or(call(m[conv], True, m[b]), orig)),
        (biased, lambda orig, m: keep_or(call(m[conv], False, m[b]), orig)),
        (conv, lambda orig, m: keep_or(call(orig, False), orig)),
    ]
    inner = wildcard()
    once = is_op("relax.permute_dims")(inner)
    twice = is_op("relax.permute_dims")(once)

    def cancel(orig, m):
        first = [int(a) for a in m[once].attrs.axes] if m[once].attrs.axes is not None else None
        second = [int(a) for a in orig.attrs.axes] if orig.attrs.axes is not None else None
        if first is None or second is None or [first[i] for i in second] != list(range(len(first))):
            return orig
        return m[inner]

    @tvm.transform.module_pass(opt_level=0, name="CudnnConv2d")
    def transform(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                for pattern, rewriter in rules:
                    func = rewrite_call(pattern, rewriter, func)
                mod[gv] = rewrite_call(twice, cancel, func)
        return mod

    return transform


def compile_object(cc: str, out_dir: str | Path) -> Path:
    """native/cudnn_conv.cc compiled for linking into an artifact."""
    return vendor.compile_native("cudnn_conv.cc", cc, out_dir, "--cudnn")


def preload() -> str | None:
    """Load libcudnn into this process where the artifact's dlopen would not find it by name
    alone: pip's nvidia-cudnn (as torch installs it) or the system's. cuDNN 9 is a shim that
    dlopens libcudnn_{graph,ops,cnn,engines_*}.so.9 by name: those are loaded first. Returns the
    file, or None (the artifact then reports cuDNN missing at its first convolution)."""
    from deploytool.cuda import nvidia_dirs

    dirs = [os.path.join(d, "cudnn", "lib") for d in nvidia_dirs()]
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/cuda/lib64"]
    return vendor.preload("DEPLOYTOOL_CUDNN", ("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"), "libcudnn.so.*",
                          dirs, companions="libcudnn_*.so.*")
