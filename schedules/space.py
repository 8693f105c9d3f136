"""The tuning design space per target family, as MetaSchedule objects.

For a kernel the space is the union of two generators:

* ``deploytool-default``: the rule-based default schedule of ``schedules.cpu`` (CPUs) or dlight
  (``schedules.gpu``, NVIDIA GPUs): one point, no decisions. Tuning measures it first, so a tuned kernel is never slower than the untuned one,
  and the evolutionary search starts from it (it is the best record of the task until beaten).
* ``multi-level-tiling``: MetaSchedule's Ansor-style rules configured for the target. CPUs: SSRSRS
  multi-level tiling with a register-sized write cache, auto-inline, rfactor for reductions,
  parallel/vectorize/unroll with a sampled unroll depth, and sampled compute locations. GPUs:
  SSSRRSRS tiling bound to blocks/virtual threads/threads with shared-memory reads (cooperative
  fetch) and register writes, cross-thread reductions, auto-bind, unroll depth at most 256; on
  sm_70+ first tensor-core tiling for float16/int8 products (16x16x16 WMMA fragments through
  dynamic shared memory, or m16n8k8 MMA with a software pipeline), as TVM's "cuda-tensorcore" space.

Postprocessors and mutators follow. On CPUs the last post-processor is ``RewriteLayout``: a
kernel's weights (``cpu.layout_free_params``, marked on the module a task tunes, see
``tuning_module``) are laid out in the order the candidate's loops read them, by a stage that the
graph runs once at compile time (``pipeline.prepack_weights``); the candidate is measured without
it. The default schedule goes through it too (``cpu.schedule_func``).

This module knows nothing of logs, the cost model or the CLI.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from dataclasses import dataclass


# --------------------------------------------------------------------------- kernels and traces
def kernel_hash(obj) -> str:
    """16 hex digits of TVM's structural hash: how kernels (workloads) and scheduled candidates
    are identified in tuning logs and caches. The mark of layout-free weights (``tuning_module``)
    does not count: a candidate hashes the same tuned with it or replayed without it."""
    import tvm
    import tvm_ffi

    from deploytool.schedules.cpu import LAYOUT_FREE

    if isinstance(obj, tvm.IRModule) and len(obj.functions) == 1:
        (gv, f), = obj.functions_items()
        if f.attrs is not None and LAYOUT_FREE in f.attrs:
            obj = tvm.IRModule({gv.name_hint: f.without_attr(LAYOUT_FREE)})
    return f"{tvm_ffi.structural_hash(obj) & 0xFFFFFFFFFFFFFFFF:016x}"


def workload_module(func):
    """A kernel as the one-function IRModule MetaSchedule and trace replay work on."""
    import tvm

    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def tuning_module(func, target):
    """The module a task tunes: ``workload_module``, on CPUs marked with its layout-free weights,
    which the RewriteLayout post-processor lays out per candidate."""
    if target.family in ("x86", "arm"):
        from deploytool.schedules.cpu import with_layout_free

        func = with_layout_free(func)
    return workload_module(func)


def unscheduled_kernels(mod):
    """(GlobalVar, PrimFunc) of every kernel of ``mod`` that no schedule has been applied to yet,
    listed first so that the caller may replace them in ``mod`` as it goes."""
    from tvm import tirx

    return [(gv, func) for gv, func in mod.functions_items() if isinstance(func, tirx.PrimFunc)
            and not (func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))]


_EXPR_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "args", "indices", "base", "stride",
                "body")
# Limits on what inlining may build. compute_inline copies the producer's expression into every read
# of it, and elementwise chains whose ops read their input more than once (Where(x < lo, lo, x), an
# isfinite test, a saturating cast) grow the consumer exponentially where they join. TVM's simplifier
# is worse than linear in nested selects: QLinearMatMul's requantization chain, inlined into one
# expression of 1,223 nodes and 40 selects, took 114 s to build for a 2x3 output (299 nodes and 9
# selects: 4 s more; with these limits the whole case, TVM's import included, takes 4.6 s). The corpus
# peaks at 572 nodes (YOLOv3-tiny's concat) and 5 selects.
MAX_INLINED_NODES = 5000
MAX_INLINED_SELECTS = 8


def _children(expr):
    """The sub-expressions of a TIR expression (operands, call arguments, load indices)."""
    for f in _EXPR_FIELDS:
        child = getattr(expr, f, None)
        if child is None or isinstance(child, (int, float, str, bool)):
            continue
        yield from (c for c in (child if f in ("args", "indices") else [child]) if hasattr(c, "same_as"))


def expr_size(expr, memo: dict | None = None) -> tuple[int, int]:
    """(nodes, selects) of ``expr`` as a tree (what the simplifier and code generator walk): a
    sub-expression shared in memory counts once per occurrence. Linear in the DAG's size."""
    memo = {} if memo is None else memo
    if expr is None or isinstance(expr, (int, float, str, bool)):
        return 0, 0
    if expr in memo:
        return memo[expr]
    kind = type(expr).__name__
    n, sel = 1, int(kind == "Select" or (kind == "Call" and "if_then_else" in str(getattr(expr, "op", ""))))
    for c in _children(expr):
        cn, cs = expr_size(c, memo)
        n, sel = n + cn, sel + cs
    memo[expr] = (n, sel)
    return n, sel


def _loads_of(expr, buf, memo: dict) -> int:
    """How many times ``expr`` (as a tree) reads ``buf``."""
    if expr is None or isinstance(expr, (int, float, str, bool)):
        return 0
    if expr in memo:
        return memo[expr]
    n = 0
    if "Load" in type(expr).__name__:  # TVM 0.27's BufferLoad is a TensorLoad whose source is the buffer
        src = getattr(expr, "buffer", None) or getattr(expr, "source", None)
        n = int(src is not None and src.same_as(buf))
    n += sum(_loads_of(c, buf, memo) for c in _children(expr))
    memo[expr] = n
    return n


def inline_is_cheap(sch, block) -> bool:
    """Whether compute_inline(``block``) keeps every consumer's expression under the limits above
    (where the producer adds selects: a big concat stays inlinable into its consumer)."""
    body = sch.get(block).body
    if type(body).__name__ != "BufferStore":
        return True  # TVM refuses such inlines itself
    nodes, selects = expr_size(body.value)
    for c in sch.get_consumers(block):
        cbody = sch.get(c).body
        if type(cbody).__name__ != "BufferStore":
            continue
        reads = _loads_of(cbody.value, body.buffer, {})
        if not reads:
            continue
        cn, cs = expr_size(cbody.value)
        if cn + reads * nodes > MAX_INLINED_NODES or (selects and cs + reads * selects > MAX_INLINED_SELECTS):
            return False
    return True


def as_scheduled(func, sch):
    """The kernel ``sch`` made of ``func``'s workload module, keeping ``func``'s global symbol, marked
    scheduled."""
    from deploytool.schedules.cpu import LAYOUT_FREE

    new = sch.mod["main"].without_attr("global_symbol").without_attr(LAYOUT_FREE)
    if func.attrs is not None and "global_symbol" in func.attrs:
        new = new.with_attr("global_symbol", func.attrs["global_symbol"])
    return new.with_attr("tirx.is_scheduled", True)


def replay_trace(wmod, trace_json):
    """A schedule of ``wmod`` with a logged (JSON) trace applied; raises if it does not apply."""
    import json

    from tvm import s_tir

    if '"Tensorize"' in json.dumps(trace_json):
        import_tensor_intrinsics()  # registers the intrinsics tensor-core traces name
    sch = s_tir.Schedule(wmod)
    s_tir.Trace.apply_json_to_schedule(trace_json, sch)
    return sch


def _stack_without_far_context(context=1):
    """inspect.stack(), with source lines read for the 3 innermost frames only (the rest get none)."""
    frame = sys._getframe(1)
    out = []
    while frame is not None:
        if len(out) < 3:
            info = inspect.getframeinfo(frame, context)
            out.append(inspect.FrameInfo(frame, *info, positions=info.positions))
        else:
            out.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                                         None, None, positions=None))
        frame = frame.f_back
    return out


def import_tensor_intrinsics() -> None:
    """Import tvm.s_tir.tensor_intrin (registers the WMMA/MMA and CPU dot-product intrinsics that
    tensor-core rules and traces name), fast. Its 496 TVMScript functions each call inspect.stack(),
    which reads the source of every frame's module and scans sys.modules for each: 24.6 s in a
    process with deploytool, onnx and xgboost loaded on a 2-core Zen 3. TVMScript's parser uses the
    source lines of the third frame only (is_defined_in_class) and the frames themselves
    (closure variables), so while the module imports, inspect.stack reads the 3 innermost: 4.0 s."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules and hasattr(sys.modules[name], "cuda"):
        return
    if isinstance(sys.modules.get(name), types.ModuleType) and not hasattr(sys.modules[name], "__file__"):
        sys.modules.pop(name)  # the stub of tensor_intrinsics() (a CPU context being made)
    full = inspect.stack
    inspect.stack = _stack_without_far_context
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = full


@contextlib.contextmanager
def tensor_intrinsics(target):
    """Around the making of MetaSchedule TuneContexts, which import every tensor intrinsic TVM has:
    CPU spaces use none, so there the import is stubbed (then restored, so that a later real import
    still works); for other targets the intrinsics are imported first, fast
    (import_tensor_intrinsics)."""
    name = "tvm.s_tir.tensor_intrin"
    if target.family not in ("x86", "arm"):
        import_tensor_intrinsics()
        yield
        return
    if name in sys.modules:
        yield
        return
    stub = sys.modules[name] = types.ModuleType(name)
    try:
        yield
    finally:
        if sys.modules.get(name) is stub:
            sys.modules.pop(name)


@dataclass(frozen=True)
class SearchConfig:
    """Search settings that belong to the target family (the CLI can override the budgets)."""

    trials_per_task: int = 64          # default budget per task
    # without --trials or --trials-per-task, the total is capped here: 64 per kernel is 12,672 trials
    # for DenseNet-121's 198 kernels (an ETA of 7-11 h on 2 cores), where 1,500 spread by the
    # gradient allocator took its estimate 31.1 -> 25.8 ms in ~29 min
    default_trials: int | None = 2000
    batch: int = 16                    # candidates measured per round
    population: int = 256              # evolutionary search population
    genetic_iters: int = 3
    # MetaSchedule measures int(batch * eps_greedy) random candidates a round, after the model's
    # picks (PickWithEpsGreedy): none at batch 16, so the CPU search takes the model's picks only;
    # CUDA's batch of 32 takes 1
    eps_greedy: float = 0.05
    early_stop_trials: int = 48        # stop a task whose best has not improved for this many trials


def search_config(target) -> SearchConfig:
    if target.family in ("x86", "arm"):
        return SearchConfig()
    if target.family == "cuda":
        # Candidates build in parallel on every core (NVRTC in the persistent build workers) and run in
        # microseconds: bigger rounds keep the GPU machine's cores busy.
        return SearchConfig(trials_per_task=64, batch=32, early_stop_trials=64)
    return SearchConfig(trials_per_task=32, batch=8)


# Unroll depths the CUDA search samples. TVM's default goes to 1024 with explicit unrolling: a
# 1024-step unrolled reduction is tens of thousands of PTX instructions, which NVRTC/ptxas compile in
# tens of seconds -- the candidate-build timeouts seen with MetaSchedule's defaults. 256 keeps the
# gain of unrolling (the innermost tiles are small) at a fraction of the compile time.
CUDA_UNROLL_STEPS = [0, 16, 64, 256]


def cuda_sm(target) -> int:
    """The SM version of a CUDA target (90 for sm_90)."""
    arch = str(target.tvm.get("arch", "sm_50"))
    return int(arch.split("_")[1][:2]) if "_" in arch else 50


# Tensor-core tiling for float16 (and int8) products, as TVM's "cuda-tensorcore" space: 16x16x16 WMMA
# fragments staged through dynamic shared memory, f32 or f16 accumulation, B plain or transposed
# (dense layers keep their weights (N, K)); and m16n8k8 MMA with software pipelining.
_WMMA_TYPES = (("float16", "float32"), ("float16", "float16"), ("int8", "int32"))
_MMA_TYPES = (("float16", "float16"), ("float16", "float32"))


def _cuda_tensor_core_rules(target):
    """MultiLevelTilingTensorCore rules (sm_70+): a block whose product matches no group is left to
    the plain tiling rule after them."""
    if cuda_sm(target) < 70:
        return []
    from tvm.s_tir import meta_schedule as ms
    import_tensor_intrinsics()  # registers the wmma/mma intrinsics
    from tvm.s_tir.tensor_intrin import cuda as intrin

    wmma = [intrin.get_wmma_intrin_group("shared.dyn", "shared.dyn", i, o, trans)
            for i, o in _WMMA_TYPES for trans in (False, True)]
    short = {"float16": "f16", "float32": "f32"}
    mma = [{"init": f"mma_init_m16n8k8_{short[o]}", "load_a": "mma_load_m16n8k8_f16_A_shared_dyn",
            "load_b": "mma_load_m16n8k8_f16_B_shared_dyn", "compute": f"mma_sync_m16n8k8_f16f16{short[o]}",
            "store": f"mma_store_m16n8k8_{short[o]}_global"} for _, o in _MMA_TYPES]

    def tiling(groups, write, pipeline):
        return ms.schedule_rule.MultiLevelTilingTensorCore(
            intrin_groups=groups, structure="SSSRRSRS", tile_binds=["blockIdx.y", "blockIdx.x", "threadIdx.y"],
            max_innermost_factor=4, vector_load_lens=[1, 2, 3, 4, 8, 16],
            reuse_read=ms.schedule_rule.ReuseType(req="must", levels=[4], scope="shared.dyn"),
            reuse_write=ms.schedule_rule.ReuseType(req=write, levels=[2], scope="shared.dyn"),
            use_software_pipeline=pipeline)

    return [tiling(wmma, "must", False), tiling(mma, "no", True)]


def _cuda_rules(target):
    from tvm.s_tir import meta_schedule as ms

    lim = target.tvm
    return [
        ms.schedule_rule.ApplyCustomRule(),
        *_cuda_tensor_core_rules(target),
        ms.schedule_rule.MultiLevelTiling(
            structure="SSSRRSRS",
            tile_binds=["blockIdx.x", "vthread.x", "threadIdx.x"],
            max_innermost_factor=64,
            vector_load_lens=[1, 2, 3, 4, 8, 16],
            reuse_read=ms.schedule_rule.ReuseType(req="must", levels=[4], scope="shared"),
            reuse_write=ms.schedule_rule.ReuseType(req="must", levels=[3], scope="local"),
        ),
        ms.schedule_rule.InlineConstantScalars(),
        ms.schedule_rule.AutoInline(
            into_producer=True, into_consumer=True, inline_const_tensor=True, disallow_if_then_else=False,
            require_injective=False, require_ordered=False, disallow_op=None,
        ),
        ms.schedule_rule.CrossThreadReduction(thread_extents=[4, 8, 16, 32, 64, 128, 256, 512]),
        ms.schedule_rule.ParallelizeVectorizeUnroll(
            max_jobs_per_core=-1, max_vectorize_extent=-1, unroll_max_steps=CUDA_UNROLL_STEPS, unroll_explicit=True,
        ),
        ms.schedule_rule.AutoBind(max_threadblocks=256,
                                  thread_extents=[t for t in (32, 64, 128, 256, 512, 1024)
                                                  if t <= int(lim.get("max_threads_per_block", 1024))]),
    ]


def _cuda_postprocs():
    from tvm.s_tir import meta_schedule as ms

    return [
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteCooperativeFetch(),
        ms.postproc.RewriteUnboundBlock(),
        ms.postproc.RewriteParallelVectorizeUnroll(),
        ms.postproc.RewriteReductionBlock(),
        ms.postproc.RewriteTensorize(),
        ms.postproc.VerifyGPUCode(),
    ]


def _cuda_mutators():
    from tvm.s_tir import meta_schedule as ms

    return {
        ms.mutator.MutateTileSize(): 0.9,
        ms.mutator.MutateUnroll(): 0.08,
        ms.mutator.MutateThreadBinding(): 0.02,
    }


def _cpu_rules(params):
    from tvm.s_tir import meta_schedule as ms

    lanes = params.vector_lanes
    return [
        ms.schedule_rule.AutoInline(
            into_producer=False, into_consumer=True, inline_const_tensor=True,
            disallow_if_then_else=True, require_injective=True, require_ordered=True,
            disallow_op=["tirx.exp"],
        ),
        ms.schedule_rule.AddRFactor(max_jobs_per_core=16, max_innermost_factor=64),
        ms.schedule_rule.MultiLevelTiling(
            structure="SSRSRS",
            tile_binds=None,
            max_innermost_factor=max(64, 4 * lanes),
            vector_load_lens=None,
            reuse_read=None,
            reuse_write=ms.schedule_rule.ReuseType(req="may", levels=[1, 2], scope="global"),
        ),
        ms.schedule_rule.ParallelizeVectorizeUnroll(
            max_jobs_per_core=16,
            max_vectorize_extent=max(16, 4 * lanes),
            unroll_max_steps=[0, 16, 64, 512],
            unroll_explicit=True,
        ),
        ms.schedule_rule.RandomComputeLocation(),
    ]


def _cpu_postprocs():
    from tvm.s_tir import meta_schedule as ms

    return [
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),
        ms.postproc.RewriteReductionBlock(),
        ms.postproc.RewriteLayout(),
    ]


def _cpu_mutators():
    from tvm.s_tir import meta_schedule as ms

    return {
        ms.mutator.MutateTileSize(): 0.9,
        ms.mutator.MutateComputeLocation(): 0.05,
        ms.mutator.MutateUnroll(): 0.03,
        ms.mutator.MutateParallel(max_jobs_per_core=16): 0.02,
    }


def default_schedule_fn(target):
    """A MetaSchedule ScheduleFn body: the rule-based default schedule of a one-kernel module
    (or the schedule unchanged when no rule applies)."""
    if target.family == "cuda":
        from deploytool.schedules import gpu

        return gpu.schedule_fn(target)
    from deploytool.schedules import cpu

    params = cpu.CPUParams.for_target(target)
    tvm_target = target.tvm_target()

    def fn(sch):
        for rule in cpu.RULES:
            trial = sch.copy()
            try:
                with tvm_target:
                    out = rule(trial, tvm_target, params)
            except Exception:
                continue
            if out is not None:
                return out
        return sch

    return fn


def default_candidate(target, wmod):
    """The default schedule of the task ``wmod`` (``tuning_module``) as the search measures it:
    on CPUs with its weights laid out by RewriteLayout, as ``cpu.schedule_func`` builds it."""
    from tvm import s_tir

    sch = default_schedule_fn(target)(s_tir.Schedule(wmod))
    if target.family in ("x86", "arm"):
        from deploytool.schedules import cpu

        sch = cpu.rewrite_layout(sch)
    return sch


def tiling_searched(wmod) -> bool:
    """Whether a task's design space holds MetaSchedule's generic tiling besides its default
    schedule. Not for Winograd convolutions (deploytool.winograd: the blocks data_pack, bgemm,
    inverse): their default schedule is the space, with its batched GEMM's register tile as
    sampled decisions (schedules/cpu.py rule ``winograd``). Generic candidates of those took
    seconds each to featurize (their transforms unrolled up to 512 steps), 82 of a 2-minute
    6-trial tuning run, and none beat the default in 12-24 trials per kernel (ResNet-50,
    YOLOv3-tiny, Zen 5)."""
    from tvm import s_tir

    from deploytool.schedules.cpu import WINOGRAD_BLOCKS

    try:
        sch = s_tir.Schedule(wmod)
        names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    except Exception:
        return True
    return not WINOGRAD_BLOCKS <= names


def space_generator(target, with_default: bool = True, tiling: bool = True):
    """The design space for one task on ``target`` (a MetaSchedule SpaceGenerator). Without
    ``with_default``, the tiling generator alone: for the rare kernel whose default schedule the
    postprocessors reject (dlight leaves a GPU epilogue under blockIdx with no threadIdx, which
    RewriteUnboundBlock refuses with a hard check inside the search). Without ``tiling`` (see
    ``tiling_searched``), the default schedule alone."""
    from tvm.s_tir import meta_schedule as ms

    if target.family == "cuda":
        rules, postprocs, mutators = _cuda_rules(target), _cuda_postprocs(), _cuda_mutators()
    elif target.family in ("x86", "arm"):
        from deploytool.schedules import cpu

        rules, postprocs, mutators = _cpu_rules(cpu.CPUParams.for_target(target)), _cpu_postprocs(), _cpu_mutators()
    else:
        from deploytool.errors import TargetError

        raise TargetError(f"tuning for the {target.family} family is not supported",
                          "tune for an x86, arm or cuda preset (see `deploytool targets`)")
    generic = ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs,
                                                mutator_probs=mutators)
    if not with_default:
        return generic
    ours = ms.space_generator.ScheduleFn(default_schedule_fn(target), sch_rules=[], postprocs=postprocs,
                                         mutator_probs=mutators)
    if not tiling:
        return ours
    return ms.space_generator.SpaceGeneratorUnion([ours, generic], sch_rules=[], postprocs=postprocs,
                                                  mutator_probs=mutators)


def search_population(config: SearchConfig, trials_per_task: int) -> int:
    """The evolutionary population for a budget: ``config.population`` from 16 trials per task up,
    16 per trial below that (at least 32). A quick run (a few trials per kernel) measures a handful
    of candidates and needs no 256 to pick them from: on a 5-kernel model at 4 trials per kernel,
    256 spent 13.2 s searching and 5.0 s in the cost model, 64 spent 3.4 s and 1.6 s."""
    return max(32, min(config.population, 16 * max(trials_per_task, 1)))


def search_strategy(config: SearchConfig, trials_per_task: int):
    from tvm.s_tir import meta_schedule as ms

    pop = search_population(config, trials_per_task)
    return ms.search_strategy.EvolutionarySearch(
        population_size=pop,
        init_measured_ratio=0.2,
        init_min_unmeasured=min(50, pop // 4),
        genetic_num_iters=config.genetic_iters,
        eps_greedy=config.eps_greedy,
    )
