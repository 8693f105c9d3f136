"""The compilation pipeline, one function per stage:

    optimize  -> graph passes on Relax (BatchNorm decomposition, constant folding)
    partition -> legalize + fuse: one TIR PrimFunc per fused kernel (a "task")
    schedule  -> per task: the tuning log's best record, else the target family's default schedule
    build     -> TVM codegen for the target, then export ONE .so with the metadata linked in
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploytool.artifact import FORMAT, Artifact, TensorSpec, metadata_c_source
from deploytool.errors import BuildError, TargetError, ToolchainError, describe
from deploytool.targets import Target


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One fused kernel: a TIR PrimFunc the runtime calls, identified by its structural hash."""

    name: str
    workload_hash: str
    flops: float
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "workload_hash": self.workload_hash, "flops": self.flops, "calls": self.calls}


DTYPES = ("float32", "float16")


def optimize(mod, target: Target, dtype: str = "float32", split_k: bool = True, winograd=False,
             cublas: bool = False, cudnn: bool = False):
    """Graph-level passes: fold BatchNorm into convolutions, fold constants, and convert to the
    data layouts the target family's schedules want (weights are re-laid out once, here).

    ``dtype="float16"``: mixed precision (TVM's ToMixedPrecision) after BatchNorm folding:
    convolutions and matmuls take float16 operands, activations between them are float16 (half the
    memory traffic; tensor cores on GPUs), the weights are converted once here, and the model's
    inputs and outputs keep their float32 interface. On CUDA, float16 and float32 matmuls and
    convolutions whose output is too small to fill the GPU are split along K (deploytool.splitk)
    unless ``split_k`` is False. ``winograd``: on CPUs, float32 3x3 stride-1 convolutions in
    Winograd F(m x m, 3x3) (deploytool.winograd; after the layout conversion, which it needs): True
    for every eligible one by F(4x4), a tile m (2 or 4) for every eligible one by F(m x m), a
    mapping signature (winograd.call_signature) -> tile for those alone (--winograd auto's choice),
    or a set of signatures for those alone by F(4x4).
    ``cublas``: CUDA, float16: matmuls on cuBLAS (deploytool.cublas), before split-K.
    ``cudnn``: CUDA, float16: convolutions in NHWC on cuDNN with their bias/residual/ReLU
    (deploytool.cudnn), before split-K (which then sees no convolution). Last, on CPUs, float32
    exp/erf/tanh/sigmoid/softmax become polynomials that vectorize (deploytool.fast_math)."""
    import tvm
    from tvm import relax

    from deploytool import const_fold as _const_fold
    from deploytool import cublas as _cublas
    from deploytool import cudnn as _cudnn
    from deploytool import deconv as _deconv
    from deploytool import fast_math as _fast_math
    from deploytool import schedules, splitk

    fold = [_const_fold.fold_pass(), relax.transform.FoldConstant()]  # numpy first: no LLVM build per weight
    passes = [
        *([_take_clipped()] if target.family != "cuda" else []),
        _accumulate_half_in_float32(),
        *fold,
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        *fold,
        _power_by_roots(),
        _leaky_relu_as_max(),
        _clip_as_max_min(),
        *([_deconv.subpixel_pass()] if _deconv.applies(target) else []),
    ]
    if dtype == "float16":
        # CanonicalizeBindings first: a BatchNorm left unfolded (after a convolution with a bias)
        # decomposes into a tuple of its outputs, which ToMixedPrecision fails on ("The type is not
        # populated") until the tuple's [0] is bound directly
        passes += [relax.transform.CanonicalizeBindings(), relax.transform.ToMixedPrecision(out_dtype="float16"),
                   *fold]
    elif dtype != "float32":
        raise TargetError(f"unknown --dtype '{dtype}'", f"use one of {', '.join(DTYPES)}")
    if target.family == "cuda" and dtype == "float16":  # one cast of a tensor, not one per consumer
        passes.append(relax.transform.EliminateCommonSubexpr())
    if _cublas.applies(target, dtype, cublas):
        passes.append(_cublas.offload_pass())
    if _cudnn.applies(target, dtype, cudnn):
        passes.append(_cudnn.offload_pass())
    if splitk.applies(target, dtype, split_k):
        passes.append(splitk.split_k_pass(splitk.sm_count(target)))
    mod = _run_passes(tvm.transform.Sequential(passes), mod, target, "graph optimization")
    layouts = schedules.desired_layouts(target)
    if layouts:
        try:
            with target.tvm_target():
                mod = tvm.transform.Sequential([_full_rank_broadcast_constants(),
                                                relax.transform.ConvertLayout(layouts), *fold])(mod)
        except Exception as e:  # TVM's layout inference misses some graphs: keep the ONNX layout
            log.info("layout conversion skipped: %s", describe(e))
    mod = _run_passes(_nan_passes_max_min(), mod, target, "graph optimization")
    if winograd_applies(target, dtype, winograd):
        from deploytool import winograd as _winograd

        if winograd is True or isinstance(winograd, int):
            wpass = _winograd.winograd_pass(4 if winograd is True else winograd)
        else:  # --winograd auto's choice: signature -> tile (or a set of signatures, by F(4x4))
            wpass = _winograd.winograd_pass(only=dict(winograd) if isinstance(winograd, dict) else frozenset(winograd))
        mod = _run_passes(wpass, mod, target, "Winograd rewrite")
    if target.family in ("x86", "arm") and layouts:
        from deploytool import pad_channels

        mod = _run_passes(pad_channels.pad_pass(max(1, target.vector_bits // 32)), mod, target,
                          "channel padding")
    if _fast_math.applies(target) and dtype == "float32":
        mod = _run_passes(_fast_math.fast_math_pass(), mod, target, "fast math")
    tidy = tvm.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                     relax.transform.DeadCodeElimination(["main"])])
    return _run_passes(tidy, mod, target, "graph optimization")


def winograd_applies(target: Target, dtype: str, winograd) -> bool:
    """Whether ``--winograd`` changes the kernels: CPU targets, float32. ``winograd``: True (every
    eligible convolution), a tile, or the signatures of those to rewrite (deploytool.winograd.choose;
    empty: none)."""
    return bool(winograd) and target.family in ("x86", "arm") and dtype == "float32"


_WIDE_ACCUMULATE = {"relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"}


def _accumulate_half_in_float32():
    """Matmuls and convolutions of float16/bfloat16 operands in the imported model accumulate in
    float32 and round once (TVM's default accumulates in the operand type, rounding at every step):
    what numpy, ONNX's reference and onnxruntime compute. Runs before ToMixedPrecision, so it only
    touches models that are half precision in the ONNX file."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Widen(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _WIDE_ACCUMULATE:
                return call
            dtype = getattr(call.ty, "dtype", None)
            if dtype not in ("float16", "bfloat16") or str(call.attrs.out_dtype) not in ("None", "void", "", dtype):
                return call
            if call.op.name == "relax.matmul":
                wide = relax.op.matmul(call.args[0], call.args[1], out_dtype="float32")
            else:
                a = call.attrs
                fn = {"relax.nn.conv1d": relax.op.nn.conv1d, "relax.nn.conv2d": relax.op.nn.conv2d,
                      "relax.nn.conv3d": relax.op.nn.conv3d}[call.op.name]
                wide = fn(call.args[0], call.args[1], strides=a.strides, padding=a.padding, dilation=a.dilation,
                          groups=a.groups, data_layout=a.data_layout, kernel_layout=a.kernel_layout,
                          out_layout=a.out_layout, out_dtype="float32")
            return relax.op.astype(self.builder_.normalize(wide), dtype)

    return _relax_function_pass(Widen, "AccumulateHalfInFloat32")


def _relax_function_pass(mutator, name: str):
    """A module pass that runs the PyExprMutator class ``mutator`` over every Relax function. The
    mutator works on the module, so PrimFuncs it adds (``builder_.call_te``) join it."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod, ctx):
        m = mutator(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                m.builder_.update_func(gv, m.visit_expr(func))
        return m.builder_.get()

    return run


def _op_rewrite_pass(rewrites: dict, name: str):
    """A pass that replaces each call of a Relax operator named in ``rewrites`` (its arguments
    already rewritten) by ``rewrites[op name](call, builder)``, or keeps it where that returns None.
    The builder is the pass's BlockBuilder (for ``call_te``)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in rewrites:
                return call
            out = rewrites[call.op.name](call, self.builder_)
            return call if out is None else self.builder_.normalize(out)

    return _relax_function_pass(Rewrite, name)


_BROADCAST_BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
                     "relax.power"}


def _full_rank_broadcast_constants():
    """A per-channel constant operand of a broadcasting binary op on image tensors gets the other
    operand's rank ((C, 1, 1) -> (1, C, 1, 1): the same values by numpy's broadcasting rules). ONNX
    exporters write per-channel scales as (C, 1, 1) next to NCHW activations; TVM's layout inference
    gives up on operands of different ranks, so every such op stayed NCHW with a transpose on each
    side of it (Inception v2: 138 transposes)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class FullRank(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.builder_.normalize(super().visit_call_(call))
            if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _BROADCAST_BINARY:
                return call
            ranks = [getattr(a.ty, "ndim", -1) for a in call.args]
            if min(ranks) < 0 or ranks[0] == ranks[1] or max(ranks) < 4:  # only image layouts convert
                return call
            args = list(call.args)
            for i, a in enumerate(args):
                if isinstance(a, tvm.ir.Constant) and ranks[i] < max(ranks):
                    data = a.value.numpy()
                    shape = (1,) * (max(ranks) - data.ndim) + data.shape
                    if shape[1] > 1 and all(d == 1 for j, d in enumerate(shape) if j != 1):  # per channel
                        args[i] = relax.const(data.reshape(shape), str(data.dtype))
            if all(x.same_as(y) for x, y in zip(args, call.args)):
                return call
            return self.builder_.normalize(getattr(relax.op, call.op.name.split(".")[1])(*args))

    return _relax_function_pass(FullRank, "FullRankBroadcastConstants")


# power(x, c) for a constant c: the same values from multiplies and square roots, which every
# backend vectorizes (LLVM keeps pow a scalar libm call)
_ROOTS = {2.0: "xx", 3.0: "xxx", 0.5: "s", 0.25: "q", 0.75: "sq", 1.5: "xs"}


def _power_by_roots():
    """``power(x, c)`` by a scalar constant c in 0.25, 0.5, 0.75, 1.5, 2, 3 becomes products of
    x, sqrt(x) and sqrt(sqrt(x)) (x^0.75 = sqrt(x) * sqrt(sqrt(x))). Inception v1's LRN (x^0.75)
    ran at 1.2 GFLOP/s, 9% of its tuned time, through one powf call per element. Equal to pow
    within 2 ulp for x >= 0 and any finite x for 2 and 3; pow(-inf, 0.5) is inf where sqrt gives
    NaN, and pow(-0, 0.5) is +0 where sqrt gives -0."""
    import tvm
    from tvm import relax

    def rewrite(call, _bb):
        x, c = call.args
        if not isinstance(c, tvm.ir.Constant) or str(getattr(x.ty, "dtype", "")) not in ("float32", "float16") \
                or getattr(c.ty, "ndim", -1) > getattr(x.ty, "ndim", -1):
            return None
        data = c.value.numpy()
        exponent = float(data.reshape(-1)[0]) if data.size == 1 else None
        if exponent not in _ROOTS:
            return None
        parts = {"x": x, "s": relax.op.sqrt(x)}
        parts["q"] = relax.op.sqrt(parts["s"])
        out = None
        for f in _ROOTS[exponent]:
            out = parts[f] if out is None else relax.op.multiply(out, parts[f])
        return out

    return _op_rewrite_pass({"relax.power": rewrite}, "PowerByRoots")


def _take_clipped():
    """Gathers (ONNX Gather: TVM's importer emits ``take`` in "fast" mode, after normalizing
    negative indices) clip their indices on CPUs: an index out of range (a BERT token id past the
    vocabulary) read out of bounds and crashed the process (or, on a Cortex-M, read other memory).
    Clipped, it reads the last row; onnxruntime refuses such an input. One min/max per index."""
    from tvm import relax

    def rewrite(call, bb):
        if str(call.attrs.mode) != "fast":
            return None
        axis = call.attrs.axis
        return relax.op.take(call.args[0], call.args[1], None if axis is None else int(axis), mode="clip")

    return _op_rewrite_pass({"relax.take": rewrite}, "TakeClipped")


def _leaky_relu_as_max():
    """``leaky_relu(x, a)`` with 0 <= a <= 1 becomes ``maximum(x, x * a)`` (the same numbers: the
    same product, picked by the same comparison). TVM's layout conversion has no rule for
    leaky_relu, so on x86 (NCHWc) every LeakyReLU went back to NCHW through a transpose and its own
    kernel, and the max pool after it through another (YOLOv3-tiny: 11 LeakyReLU kernels and 8
    transposes, ~2.5 of its 32 ms); multiply and maximum convert and fuse into the convolution."""
    from tvm import relax

    def rewrite(call, _bb):
        x = call.args[0]
        alpha = float(call.attrs.alpha)
        dtype = str(getattr(x.ty, "dtype", ""))
        if dtype not in ("float32", "float16") or not 0.0 <= alpha <= 1.0:
            return None
        return relax.op.maximum(x, relax.op.multiply(x, relax.const(alpha, dtype)))

    return _op_rewrite_pass({"relax.nn.leakyrelu": rewrite}, "LeakyReluAsMax")


def _clip_as_max_min():
    """Clips as ``maximum``/``minimum`` of the tensor and a constant number, which TVM's layout
    conversion converts like any broadcasting op (it has no rule for where or clip):

    - ``where(x < c, c, x)`` -> ``maximum(x, c)``, ``where(x > c, c, x)`` -> ``minimum(x, c)``: how a
      Clip with constant bounds imports (onnx_converters.clip), and how exporters write ReLU6;
    - a float ``clip(x, lo, hi)`` (TVM's HardSigmoid and HardSwish) -> ``minimum(maximum(x, lo), hi)``.

    On CPUs each ReLU6 of MobileNetV2 went back to NCHW through a transpose on each side, in a
    kernel of its own (17 kernels, 13% of its time); now it fuses into its convolution. The tensor
    comes first because layout inference follows the first operand; ``_nan_passes_max_min`` puts
    the constant first after the conversion, for the same numbers as where, NaN included."""
    import math

    import numpy as np
    import tvm
    from tvm import relax

    by_test = {"relax.less": relax.op.maximum, "relax.greater": relax.op.minimum}

    def where(call, bb):
        cond, c, x = call.args
        if not isinstance(cond, relax.Var) or not _is_tensor_const(c):
            return None
        test = bb.lookup_binding(cond)
        if not isinstance(test, relax.Call) or not isinstance(test.op, tvm.ir.Op) or test.op.name not in by_test:
            return None
        tx, tc = test.args
        dtype = str(getattr(x.ty, "dtype", ""))
        if not (tx.same_as(x) and _is_tensor_const(tc) and dtype in _FLOATS
                and tc.value.dtype == c.value.dtype == dtype and c.value.numpy().size == 1
                and np.array_equal(tc.value.numpy(), c.value.numpy())):
            return None
        return by_test[test.op.name](x, relax.const(c.value.numpy().reshape(()), dtype))

    def clip(call, _bb):
        x, lo, hi = call.args
        dtype = str(getattr(x.ty, "dtype", ""))
        if dtype not in _FLOATS or not all(isinstance(getattr(b, "value", None), (int, float)) for b in (lo, hi)):
            return None
        lo, hi = (float(b.value) for b in (lo, hi))
        if math.isfinite(lo):
            x = relax.op.maximum(x, relax.const(lo, dtype))
        if math.isfinite(hi):
            x = relax.op.minimum(x, relax.const(hi, dtype))
        return x

    return _op_rewrite_pass({"relax.where": where, "relax.clip": clip}, "ClipAsMaxMin")


_FLOATS = ("float32", "float16")


def _is_tensor_const(e) -> bool:
    """A constant tensor (TVM 0.27's scalar PrimValues are Constants too, of a Python number)."""
    import tvm

    return isinstance(e, tvm.ir.Constant) and hasattr(e.value, "numpy")


def _nan_passes_max_min():
    """``maximum(x, c)`` and ``minimum(x, c)`` of a float tensor and a constant number become
    ``maximum(c, x)`` and ``minimum(c, x)``. TVM lowers ``maximum(a, b)`` to ``a > b ? a : b``, so
    with the constant first a NaN in x passes through, as in where, numpy and onnxruntime (second,
    it became the constant). Other values are the same either way. The constant becomes a scalar,
    which lowers to an immediate in the kernel (a (1, 1, 1, 1) tensor was a buffer argument)."""
    from tvm import relax

    ops = {"relax.maximum": relax.op.maximum, "relax.minimum": relax.op.minimum}

    def swap(call, _bb):
        x, c = call.args
        if not (_is_tensor_const(c) and c.value.numpy().size == 1 and not _is_tensor_const(x)
                and str(getattr(x.ty, "dtype", "")) in _FLOATS):
            return None
        return ops[call.op.name](relax.const(c.value.numpy().reshape(()), c.value.dtype), x)  # an immediate in TIR

    return _op_rewrite_pass({name: swap for name in ops}, "NanPassesMaxMin")


def _run_passes(seq, mod, target: Target, what: str):
    try:
        with target.tvm_target():
            return seq(mod)
    except Exception as e:
        raise BuildError(f"{what} failed: {describe(e)}",
                         "rerun with --verbose and file an issue with the model attached") from e


def partition(mod, target: Target):
    """Legalize to TIR and fuse: afterwards every PrimFunc in the module is a task."""
    import tvm
    from tvm import relax

    passes = [
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(["main"]),
    ]
    return _run_passes(tvm.transform.Sequential(passes), mod, target, "lowering to kernels")


def tasks(mod) -> list[Task]:
    """The tasks of a partitioned module, with how often main calls each."""
    import tvm
    from tvm import relax, tirx
    from tvm.s_tir.analysis import estimate_tir_flops
    calls: dict[str, int] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op == tvm.ir.Op.get("relax.call_tir"):
            gv = expr.args[0]
            calls[gv.name_hint] = calls.get(gv.name_hint, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    out = []
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            try:
                flops = float(estimate_tir_flops(tvm.IRModule({"main": func})))
            except Exception:
                flops = 0.0
            out.append(Task(name=gv.name_hint, workload_hash=workload_hash(func), flops=flops,
                            calls=calls.get(gv.name_hint, 0)))
    out.sort(key=lambda t: -t.flops * max(t.calls, 1))
    return out


def workload_hash(func) -> str:
    """A kernel's identity: the structural hash of its unscheduled TIR (name excluded)."""
    from deploytool.schedules.space import kernel_hash

    return kernel_hash(func.without_attr("global_symbol"))


def apply_tuning_log(mod, target: Target, tuning_log, report: dict | None = None, require_tuned: bool = False,
                     device: str | None = None):
    """Schedule every task that has a record in ``tuning_log`` with its best record's trace (among
    the records of machine ``device`` where it has some: see TuningLog.best_by_workload).
    ``report`` gets kernel name -> "tuned". With ``require_tuned``, a task without a record is a
    TuningLogError naming every such kernel (CI mode)."""
    from deploytool.schedules.space import as_scheduled, replay_trace, unscheduled_kernels, workload_module
    from deploytool.tuninglog import TuningLogError

    tuning_log.check_target(target)
    best = tuning_log.best_by_workload(device)
    missing, updated = [], {}
    for gv, func in unscheduled_kernels(mod):
        rec = best.get(workload_hash(func))
        if rec is None:
            missing.append(gv.name_hint)
            continue
        try:
            sch = replay_trace(workload_module(func), rec.trace)
        except Exception as e:
            log.warning("record for %s does not apply (%s): default schedule used", gv.name_hint, describe(e))
            missing.append(gv.name_hint)
            continue
        updated[gv] = as_scheduled(func, sch)
        if report is not None:
            report[gv.name_hint] = "tuned"
    if missing and require_tuned:
        raise TuningLogError(
            f"{len(missing)} kernel(s) have no record in tuning log '{tuning_log.path}': "
            + ", ".join(sorted(missing)[:8]) + (" ..." if len(missing) > 8 else ""),
            "tune them (`deploytool tune` with the same log resumes it), or drop --require-tuned")
    for gv, func in updated.items():
        mod[gv] = func
    return mod, sorted(missing)


def schedule(mod, target: Target, report: dict | None = None, tuning_log=None, require_tuned: bool = False,
             predict_model=None, device: str | None = None):
    """Apply schedules to every task: the tuning log's best record where it has one, then (with
    ``predict_model``) the schedule the cost model ranks first (deploytool.predict), else the
    default (untuned) schedule from schedules/. ``report`` receives kernel name -> "tuned",
    "predicted", or the default rule that scheduled it ("none": left as legalized)."""
    from deploytool import schedules

    if tuning_log is not None:
        mod, _ = apply_tuning_log(mod, target, tuning_log, report, require_tuned, device)
    if predict_model is not None:
        from deploytool.predict import predict_schedules

        mod = predict_schedules(mod, target, predict_model, report=report)
    return schedules.apply_defaults(mod, target, report)


def prepack_weights(mod):
    """Move the weight-packing stages that schedules put in kernels (blocks marked
    ``schedules.cpu.PREPACK``: weights laid out as the kernel reads them, see
    ``cpu.layout_free_params``) out of them, and run them now on constant weights.

    TVM's SplitLayoutRewritePreproc splits each such kernel into ``<name>_weight_prepack`` (the
    packing) and ``<name>_prepacked`` (the kernel reading the packed layout), called one after
    the other. Where the packing reads a constant, it is done here, in numpy (``_pack``: no code
    generation), and its result becomes the kernel's constant argument; the packing functions
    left unused are dropped. One that reads anything else (a weight passed at run time)
    stays in the graph and runs on each call: correct, slower."""
    import tvm
    from tvm import relax, tirx

    if not any(isinstance(f, tirx.PrimFunc) and _has_prepack(f) for _, f in mod.functions_items()):
        return mod
    mod = relax.transform.SplitLayoutRewritePreproc()(mod)
    maps = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and gv.name_hint.endswith("_weight_prepack"):
            maps[gv.name_hint] = _prepack_index_map(func)

    @relax.expr_functor.mutator
    class Fold(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(tvm.ir.Op.get("relax.call_tir")) and maps.get(call.args[0].name_hint) is not None:
                args = call.args[1].fields
                w = args[0] if len(args) == 1 else None
                while isinstance(w, relax.Var) and self.lookup_binding(w) is not None:
                    w = self.lookup_binding(w)
                if isinstance(w, tvm.ir.GenericConst):
                    x = _pack(maps[call.args[0].name_hint], w.value.numpy(), [int(d) for d in call.ty.shape])
                    return relax.const(x, str(x.dtype))
            return call

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mod[gv] = Fold().visit_expr(func)
    return relax.transform.DeadCodeElimination()(mod)


def _has_prepack(func) -> bool:
    import tvm

    from deploytool.schedules.cpu import PREPACK

    try:
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        return any(PREPACK in sch.get(b).annotations for b in sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # no root block (not a schedulable kernel)
        return False


def _pack(index_map, x, shape):
    """``x`` moved to ``shape`` by ``index_map``, in numpy: its final indices evaluated for every
    element at once. (TVM's IndexMap.map_tensor evaluates them element by element: 29 s for
    YOLOv3-tiny's 8.8 M weights.)"""
    import numpy as np
    from tvm import tirx

    env = {v: g for v, g in zip(index_map.initial_indices, np.indices(x.shape, sparse=True))}
    ops = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply, tirx.FloorDiv: np.floor_divide,
           tirx.FloorMod: np.mod}

    def ev(e):
        for v, g in env.items():
            if e.same_as(v):
                return g
        if isinstance(e, tirx.IntImm):
            return int(e.value)
        if isinstance(e, tirx.Cast) and "int" in str(e.ty):
            return ev(e.value)
        if type(e) in ops:
            return ops[type(e)](ev(e.a), ev(e.b))
        raise NotImplementedError(type(e).__name__)

    try:
        idx = tuple(np.broadcast_to(ev(e), x.shape) for e in index_map.final_indices)
    except NotImplementedError:
        import tvm

        return np.ascontiguousarray(index_map.map_tensor(tvm.runtime.tensor(x)).numpy())
    out = np.zeros(shape, dtype=x.dtype)
    out[idx] = x
    return out


def _prepack_index_map(func):
    """The IndexMap of a packing function made of one block that copies its parameter (read at its
    own iteration variables) to its output; None for any other form."""
    import tvm
    from tvm import tirx

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        return None
    blk = sch.get(blocks[0])
    ivs = [iv.var for iv in blk.iter_vars]
    if len(blk.reads) != 1 or len(blk.writes) != 1 or \
            any(not r.min.same_as(v) for r, v in zip(blk.reads[0].region, ivs)) or len(blk.reads[0].region) != len(ivs):
        return None
    return tirx.IndexMap(ivs, [r.min for r in blk.writes[0].region], None)


def _finalize_pipeline(cuda_graph: bool = False):
    """Memory planning and VM lowering. ``cuda_graph``: the kernel launches between statically
    planned buffers are captured into a CUDA graph on the first call and replayed after (TVM's
    RewriteCUDAGraph; kernels reading the inputs or writing the outputs stay outside), so a
    batch-1 model stops paying one launch per kernel."""
    import tvm
    from tvm import relax

    return tvm.transform.Sequential([
        relax.transform.RewriteDataflowReshape(),
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(),
        relax.transform.StaticPlanBlockMemory(),
        *([relax.transform.RewriteCUDAGraph()] if cuda_graph else []),
        relax.transform.LowerAllocTensor(),
        relax.transform.KillAfterLastUse(),
        relax.transform.LowerRuntimeBuiltin(),
        relax.transform.ComputePrimValue(),
        relax.transform.VMShapeLower(),
        relax.transform.AttachGlobalSymbol(),
    ])


def build(mod, target: Target):
    """TVM code generation for a scheduled module; returns a relax Executable."""
    import tvm

    if target.family == "cuda":
        from deploytool import cuda

        cuda.ensure_compiler()
    t = target.tvm_target()
    mod = prepack_weights(mod)
    # not with cuDNN calls: RewriteCUDAGraph captures extern calls too, so their first call (where
    # cuDNN times its algorithms and workspace memory is allocated) would run under stream capture
    from deploytool import cudnn as _cudnn

    cuda_graph = target.family == "cuda" and not calls_extern(mod, _cudnn.FUNC)
    ctx = tvm.transform.PassContext.current()
    if cuda_graph:  # the pass reads its switch from the PassContext
        ctx = tvm.transform.PassContext(opt_level=ctx.opt_level, config={**dict(ctx.config),
                                                                        "relax.backend.use_cuda_graph": True})
    try:
        with t, ctx:
            return tvm.compile(mod, t, relax_pipeline=_finalize_pipeline(cuda_graph))
    except Exception as e:
        raise BuildError(f"code generation for {target.name} failed: {describe(e)}",
                         "rerun with --verbose and file an issue with the model attached") from e


def calls_extern(mod, name: str) -> bool:
    """Whether a Relax function of ``mod`` calls the packed function ``name``."""
    from tvm import relax

    found = []

    def visit(e):
        if isinstance(e, relax.ExternFunc) and str(e.global_symbol) == name:
            found.append(e)

    for func in mod.functions.values():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func.body, visit)
    return bool(found)


def toolchain_cc(target: Target) -> str:
    cc = target.toolchain.get("cc", "g++")
    if shutil.which(cc) is None:
        apt = " ".join(target.toolchain.get("apt", [])) or cc
        raise ToolchainError(f"the {target.name} toolchain '{cc}' is not installed",
                             f"install it (Debian: apt-get install --no-install-recommends {apt})")
    return cc


def export(executable, target: Target, path: str | Path, metadata: dict[str, Any]) -> Artifact:
    """Export ONE shared library with the metadata in an ELF section (cross-linked if needed)."""
    from tvm.support import cc as tvm_cc

    if target.artifact != "so":
        raise TargetError(f"target {target.name} ships a {target.artifact}, not a .so",
                          "use a Linux target (x86, arm) for .so artifacts")
    cc = toolchain_cc(target)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="deploytool-export-") as tmp:
        meta_c = Path(tmp) / "deploytool_meta.c"
        meta_c.write_text(metadata_c_source(metadata))
        meta_o = Path(tmp) / "deploytool_meta.o"
        # Compile the metadata with the target's own compiler (as C: g++ would mangle nothing
        # here, but -x c keeps the symbol plain).
        import subprocess

        r = subprocess.run([cc, "-x", "c", "-c", "-fPIC", str(meta_c), "-o", str(meta_o)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ToolchainError(f"compiling the metadata object with {cc} failed: {r.stderr.strip()[:300]}",
                                 "check that the toolchain works (try compiling hello.c)")
        addons = [str(meta_o)]
        if metadata.get("cublas"):
            from deploytool import cublas as _cublas

            addons.append(str(_cublas.compile_object(cc, tmp)))
        if metadata.get("cudnn"):
            from deploytool import cudnn as _cudnn

            addons.append(str(_cudnn.compile_object(cc, tmp)))
        fcompile = tvm_cc.cross_compiler(cc) if target.toolchain.get("cross") else None
        tmp_out = path.with_name(path.name + ".tmp")
        try:
            executable.export_library(str(tmp_out), fcompile=fcompile, addons=addons, workspace_dir=tmp)
        except Exception as e:
            raise BuildError(f"linking {path.name} failed: {describe(e)}",
                             "rerun with --verbose; check the toolchain") from e
        os.replace(tmp_out, path)
    if target.family == "cuda":
        from deploytool import cuda

        want, got = target.tvm.get("arch"), cuda.cubin_archs(path)
        if got != [want]:
            raise BuildError(f"{path.name} holds cubins for {got or 'no arch'} instead of one for {want}: TVM kept "
                             "CUDA source that only a machine with NVRTC could load",
                             "rerun with --verbose and file an issue (deploytool.cuda.ensure_compiler should prevent it)")
    return Artifact.open(path)


def make_metadata(*, target: Target, inputs: list[TensorSpec], outputs: list[TensorSpec], onnx_path: str | Path,
                  onnx_sha256: str, tuning_log_sha256: str | None, tasks_: list[Task], extra: dict | None = None) -> dict:
    import tvm
    import tvm_ffi

    from deploytool import __version__

    meta = {
        "format": FORMAT,
        "runtime": "tvm-relax-vm",
        "entry": "main",
        "deploytool_version": __version__,
        "tvm_version": tvm.__version__,
        "tvm_ffi_version": getattr(tvm_ffi, "__version__", "unknown"),
        "target": target.to_dict(),
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
        "model": {"file": Path(onnx_path).name, "sha256": onnx_sha256},
        "tuning_log_sha256": tuning_log_sha256,
        "kernels": len(tasks_),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if extra:
        meta.update(extra)
    return meta
