"""The Python API. Each CLI command is one function here, with the same arguments:

    inspect(model)                      -> InspectResult
    compile(model, target, output)      -> CompileResult   (--tuning-log, --require-tuned)
    tune(model, target, output)         -> TuneResult      (appends to / resumes a tuning log)
    logs_show / logs_merge / logs_prune / logs_check       (tuning logs)
    report(log, output)                 -> Path            (tuning curves as a PNG)
    run(artifact, inputs, check)        -> RunResult
    bench(artifact, compare)            -> BenchResult

Errors are deploytool exceptions (deploytool.errors); nothing here prints or exits.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from deploytool import cublas as _cublas
from deploytool import cudnn as _cudnn
from deploytool import interrupts
from deploytool import splitk
from deploytool import targets as _targets
from deploytool.artifact import Artifact, TensorSpec, read_metadata
from deploytool.errors import CheckError, InputError, ShapeError
from deploytool.frontend import ModelInfo, import_model, import_onnx, load_onnx, model_info, parse_input_shapes
from deploytool.pipeline import Task
from deploytool.reference import OutputComparison, compare, ort_run, ort_session
from deploytool.runner import LocalRunner, Timing, runner_for, time_callable

Progress = Callable[[str], None]


def _noop(_msg: str) -> None:
    pass


def _require(ok: bool, what: str, value, rule: str) -> None:
    """One-line InputError for a nonsensical numeric option."""
    if not ok:
        raise InputError(f"{what} {value} is not allowed", f"pass {rule}")


def _check_threads(threads) -> None:
    _require(threads is None or threads >= 1, "--threads", threads, "a whole number of threads >= 1")


def _shapes(input_shapes) -> dict[str, tuple[int, ...]]:
    if input_shapes is None:
        return {}
    if isinstance(input_shapes, dict):
        return {k: tuple(v) for k, v in input_shapes.items()}
    return parse_input_shapes(list(input_shapes))


def _bindings(bind_inputs) -> dict[str, np.ndarray]:
    """--bind-input NAME=1,2,3 | NAME=file.npy (repeatable), or a dict of arrays."""
    if not bind_inputs:
        return {}
    if isinstance(bind_inputs, dict):
        return {k: np.asarray(v) for k, v in bind_inputs.items()}
    out = {}
    for spec in bind_inputs:
        name, sep, value = str(spec).partition("=")
        if not sep or not name or not value:
            raise InputError(f"--bind-input '{spec}' is not NAME=VALUES", "write e.g. --bind-input axes=0,2 or axes=axes.npy")
        if value.endswith(".npy"):
            try:
                out[name] = np.load(value)
            except OSError as e:
                raise InputError(f"--bind-input {name}: cannot read '{value}' ({e})", "check the path") from None
            continue
        try:
            vals = [float(v) if any(c in v for c in ".eE") else int(v) for v in value.split(",")]
        except ValueError:
            raise InputError(f"--bind-input {name}: '{value}' is not a list of numbers", "e.g. 1,3,224,224") from None
        out[name] = np.array(vals, np.float32 if any(isinstance(v, float) for v in vals) else np.int64)
    return out


# ----------------------------------------------------------------------------- inspect
@dataclass
class InspectResult:
    info: ModelInfo
    outputs: list[TensorSpec] | None = None
    tasks: list[Task] | None = None
    tasks_error: str | None = None       # why tasks could not be listed (dynamic dims...)

    def to_dict(self) -> dict[str, Any]:
        i = self.info
        return {
            "path": i.path, "sha256": i.sha256, "ir_version": i.ir_version, "opsets": i.opsets,
            "producer": i.producer,
            "inputs": [s.to_dict() for s in i.inputs], "dynamic_dims": i.dynamic_dims,
            "outputs": [s.to_dict() for s in (self.outputs or i.outputs)],
            "op_histogram": dict(i.op_histogram.most_common()),
            "param_count": i.initializer_count,
            "param_bytes": i.initializer_bytes,
            "unsupported_ops": i.blocking,
            "expanded_from_function_bodies": sorted(i.expandable),
            "left_out": i.left_out,
            "tasks": [t.to_dict() for t in self.tasks] if self.tasks is not None else None,
            "tasks_error": self.tasks_error,
        }


def inspect(model: str | Path, *, target: str = "x86", input_shapes=None) -> InspectResult:
    """Describe a model: I/O, opset, operators, parameters, the kernels it compiles to, and
    every operator the importer cannot handle."""
    onnx_model = load_onnx(model)
    info = model_info(onnx_model, model)
    result = InspectResult(info=info)
    if info.blocking or info.left_out:
        result.tasks_error = "the model has unsupported operators or values (listed above)"
        return result
    from deploytool.pipeline import optimize, partition, tasks

    tgt = _targets.load(target)
    try:
        imported = import_onnx(model, _shapes(input_shapes))
    except ShapeError as e:
        result.tasks_error = str(e)
        return result
    result.outputs = imported.outputs
    mod = optimize(imported.mod, tgt)
    result.tasks = tasks(partition(mod, tgt))
    return result


# ----------------------------------------------------------------------------- compile
@dataclass
class CompileResult:
    artifact: Artifact
    tasks: list[Task]
    stage_seconds: dict[str, float] = field(default_factory=dict)
    schedules: dict[str, str] = field(default_factory=dict)   # kernel -> default rule ("none")

    @property
    def seconds(self) -> float:
        return sum(self.stage_seconds.values())


def _compile_c_bundle(mod, tgt, imported, model, output, task_list, times, sched, stage) -> CompileResult:
    """A Cortex-M C project (deploytool.cbundle) instead of a .so."""
    from deploytool import cbundle, pipeline

    meta = pipeline.make_metadata(target=tgt, inputs=imported.inputs, outputs=imported.outputs, onnx_path=model,
                                  onnx_sha256=imported.info.sha256, tuning_log_sha256=None, tasks_=task_list,
                                  extra={"runtime": "c-bundle-aot", "entry": "model_run"})
    names = {f"input{i}": s.name for i, s in enumerate(imported.inputs)}
    names.update({f"output{i}": s.name for i, s in enumerate(imported.outputs)})
    out, plan, _ = stage("generate C", cbundle.write_bundle, mod, tgt, output, "model", names)
    fp = stage("footprint", cbundle.footprint, out, tgt)
    meta.update(memory_plan={"arena_bytes": plan.arena_bytes, "lower_bound": plan.lower_bound}, footprint=fp)
    (Path(out) / "deploytool.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return CompileResult(artifact=Artifact(Path(out), meta), tasks=task_list, stage_seconds=times, schedules=sched)


def compile(model: str | Path, *, target: str = "x86", output: str | Path | None = None, input_shapes=None,
            tuning_log: str | Path | None = None, require_tuned: bool = False, bind_inputs=None,
            dtype: str = "float32", predict: str | None = None, split_k: bool = True,
            winograd: bool | str | None = None, cublas: bool = False, cudnn: bool = False,
            tuned_on: str | None = None, progress: Progress = _noop) -> CompileResult:
    """Import, optimize, partition, schedule and build ``model`` into one self-describing .so.
    With ``tuning_log``, each kernel takes the log's best record (others: default schedules),
    among the records of one machine where the log holds several: ``tuned_on`` (a name that
    ``logs show`` lists), else this machine when the target runs here, else, where the target runs
    here but the log has none of this machine's, the nearest machine's (``TuningLog.nearest_device``),
    else the log's header's;
    ``require_tuned`` makes a kernel without a record an error that lists them all. ``bind_inputs``
    ({name: array}, or "NAME=1,2" strings) makes inputs compile-time constants (shape/axes inputs).
    ``dtype="float16"``: mixed precision inside, float32 inputs and outputs (see pipeline.optimize).
    ``split_k=False``: GPU matmuls and convolutions with a small output keep one kernel (see
    deploytool.splitk; the kernels differ, so tune and compile must agree).
    ``winograd``: CPUs, float32: 3x3 stride-1 convolutions in Winograd F(4x4, 3x3)
    (deploytool.winograd; other kernels, so tune and compile must agree here too); "auto": each
    convolution the way ``tuning_log`` times faster, its Winograd or its direct kernel (a log
    tuned with ``winograd="auto"`` has both); "off" or False: none; None (default): as the log was
    tuned: True for a log tuned with ``winograd=True``, "auto" for one holding Winograd records
    besides, else none.
    ``predict`` ("pretrained" or a model file): kernels without a log record take the schedule the
    cost model ranks first, nothing measured (deploytool.predict)."""
    from deploytool import pipeline
    from deploytool.tuninglog import TuningLog

    _require(dtype in pipeline.DTYPES, "--dtype", dtype, " or ".join(pipeline.DTYPES))
    tgt = _targets.load(target)
    if not tgt.available:
        raise _targets.TargetError(f"target '{tgt.name}' is not available yet ({tgt.note})",
                                   f"choose one of {', '.join(n for n in _targets.preset_names() if _targets.load(n).available)}")
    winograd = _check_winograd(tgt, dtype, winograd)   # None: as the tuning log was tuned (below)
    _check_vendor_libs(tgt, dtype, cublas, cudnn)
    if output is None:
        output = f"{Path(model).stem}-{tgt.name}" if tgt.artifact == "c-bundle" else "model.so"
    if require_tuned and tuning_log is None:
        raise InputError("--require-tuned needs a tuning log", "pass --tuning-log LOG.jsonl")
    tlog = None
    if tuning_log is not None:
        tlog = TuningLog.read(tuning_log)
        tlog.check_target(tgt)
        logged = (tlog.header.get("model") or {}).get("winograd")
        if winograd is None:
            winograd = _winograd_of_log(tlog, tgt, dtype)
        if logged is not None and logged != "auto" and winograd != "auto" \
                and bool(logged) != pipeline.winograd_applies(tgt, dtype, winograd):
            progress(f"warning: {Path(tuning_log).name} was tuned {'with' if logged else 'without'} --winograd and "
                     f"this build is {'without' if logged else 'with'} it: its convolution kernels will not match "
                     f"({'drop --winograd off' if logged else 'drop --winograd'})")
        if tlog.header.get("emulated"):
            progress(f"warning: {Path(tuning_log).name} was measured on an emulated board "
                     f"({tlog.header['emulated']}): fine for testing the pipeline, not tuning to ship")
        tuned_on = _records_machine(tlog, tgt, tuned_on, Path(tuning_log).name, progress)
    predict_model = None
    if predict is not None:
        predict_model = _cost_model_file(predict, tgt)
        if predict_model is None:
            from deploytool.cost_model.pretrain import family_of

            raise InputError(f"--predict: deploytool ships no pretrained cost model for {family_of(tgt)}",
                             "pass a model file (--predict FILE), trained on tuning logs of this target family "
                             "with `python -m deploytool.cost_model.pretrain`")
    times: dict[str, float] = {}

    def stage(name, fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        times[name] = time.perf_counter() - t0
        progress(f"{name} done ({times[name]:.1f}s)")
        return out

    winograd = False if winograd is None else winograd
    if winograd == "auto" and tlog is None:
        raise InputError("--winograd auto picks each convolution's kernel by the tuning log's timings, and there "
                         "is no log", "pass --tuning-log LOG (tuned with --winograd auto), or --winograd for every "
                         "eligible convolution")
    bound = _bindings(bind_inputs)
    imported = stage("import", import_model, model, _shapes(input_shapes), bound)
    chosen = None
    if winograd == "auto":
        winograd = chosen = stage("Winograd choice", _winograd_choice, imported.mod, tgt, dtype, split_k, cublas,
                                  cudnn, tlog, tuned_on, progress)
    mod = stage("optimize", pipeline.optimize, imported.mod, tgt, dtype, split_k, winograd, cublas, cudnn)
    mod = stage("partition", pipeline.partition, mod, tgt)
    task_list = pipeline.tasks(mod)
    progress(f"{len(task_list)} kernels to schedule and build")
    sched: dict[str, str] = {}
    mod = stage("schedule", pipeline.schedule, mod, tgt, sched, tlog, require_tuned, predict_model, tuned_on)
    if predict_model is not None:
        n = sum(1 for v in sched.values() if v == "predicted")
        progress(f"{n} of {len(sched)} kernels with the schedule {predict_model.name} predicts fastest "
                 "(nothing measured); the others kept their default schedule. Experimental: bench the result "
                 "against a build without --predict (it has been much slower, see bench/pretrain.py)")
    if tlog is not None:
        n = sum(1 for v in sched.values() if v == "tuned")
        progress(f"{n} of {len(sched)} kernels from tuning log {Path(tuning_log).name}"
                 + (f"; {len(sched) - n} with default schedules" if n < len(sched) else ""))
    unscheduled = sorted(k for k, v in sched.items() if v == "none")
    if unscheduled:
        progress(f"warning: {len(unscheduled)} kernel(s) have no default schedule and run unoptimized: "
                 + ", ".join(unscheduled[:5]) + (" ..." if len(unscheduled) > 5 else ""))
    if tgt.artifact == "c-bundle":
        return _compile_c_bundle(mod, tgt, imported, model, output, task_list, times, sched, stage)
    ex = stage("build", pipeline.build, mod, tgt)
    meta = pipeline.make_metadata(target=tgt, inputs=imported.inputs, outputs=imported.outputs, onnx_path=model,
                                  onnx_sha256=imported.info.sha256,
                                  tuning_log_sha256=tlog.sha256() if tlog else None, tasks_=task_list,
                                  extra={"tuned_kernels": sum(1 for v in sched.values() if v == "tuned"), "dtype": dtype,
                                         "split_k": splitk.applies(tgt, dtype, split_k),
                                         "winograd": pipeline.winograd_applies(tgt, dtype, winograd),
                                         **({"winograd_auto": len(chosen)} if chosen is not None else {}),
                                         "cublas": _cublas.applies(tgt, dtype, cublas),
                                         "cudnn": _cudnn.applies(tgt, dtype, cudnn),
                                         "predicted_kernels": sum(1 for v in sched.values() if v == "predicted"),
                                         "bound_inputs": {k: v.tolist() for k, v in bound.items()},
                                         "kernel_table": [dict(t.to_dict(), schedule=sched.get(t.name))
                                                          for t in task_list]})
    artifact = stage("export", pipeline.export, ex, tgt, output, meta)
    return CompileResult(artifact=artifact, tasks=task_list, stage_seconds=times, schedules=sched)


# ----------------------------------------------------------------------------- run
@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]
    comparison: list[OutputComparison] | None = None
    warnings: list[str] = field(default_factory=list)
    ran_on: dict[str, Any] = field(default_factory=dict)   # C bundles: where, instructions, image sizes

    @property
    def ok(self) -> bool:
        return self.comparison is None or all(c.ok for c in self.comparison)


def _device_spec(device):
    """A DeviceSpec from a spec, "HOST:PORT" or "KEY@HOST:PORT" (a tracker); None stays None (local)."""
    from deploytool import device as _device

    if device is None or isinstance(device, _device.DeviceSpec):
        return device
    return _device.parse(device=str(device))


def _inputs_for(artifact: Artifact, inputs, seed: int) -> dict[str, np.ndarray]:
    from deploytool.inputs import load_inputs, random_inputs

    if inputs is None:
        return random_inputs(artifact.inputs, seed)
    if isinstance(inputs, dict):
        return dict(inputs)
    return load_inputs(inputs, artifact.inputs)


def _check_model_warning(artifact: Artifact, model: str | Path) -> list[str]:
    from deploytool.artifact import sha256_file

    want = artifact.metadata.get("model", {}).get("sha256")
    if want and Path(model).is_file() and sha256_file(model) != want:
        return [f"'{model}' is not the model '{artifact.path.name}' was built from (hash differs)"]
    return []


FLOAT16_RTOL = 3e-2  # the default --check tolerance of float16 (mixed precision) artifacts


def run(artifact: str | Path, *, inputs=None, output: str | Path | None = None, check: str | Path | None = None,
        rtol: float | None = None, seed: int = 0, threads: int | None = None, device=None, on: str | None = None) -> RunResult:
    """Run an artifact once; with ``check``, compare with onnxruntime and raise CheckError past ``rtol``.
    ``device``: a board (``deploytool.device.parse(rpc=...)`` or "HOST:PORT"); default: this machine.
    A Cortex-M C bundle runs under QEMU (``on="qemu"``, the default) or built for this machine (``on="host"``)."""
    from deploytool.inputs import save_outputs

    _check_threads(threads)
    _require(rtol is None or (rtol > 0 and rtol == rtol and rtol != float("inf")), "--rtol", rtol,
             "a finite tolerance > 0, e.g. 1e-4")
    art = Artifact.open(artifact)
    if rtol is None:  # float16 inside: 11-bit mantissas, errors of ~1e-3 relative per op add up
        rtol = FLOAT16_RTOL if art.metadata.get("dtype") == "float16" else 1e-4
    feed = _inputs_for(art, inputs, seed)
    ran_on: dict[str, Any] = {}
    if art.target.get("artifact") == "c-bundle":
        from deploytool import mcu

        _require(on in (None, "qemu", "host"), "--on", on, "qemu or host")
        r = mcu.run_bundle(art.path, feed, on=on or "qemu")
        outs, ran_on = r.outputs, {"where": r.where, "instructions": r.instructions, "stack_bytes": r.stack_bytes,
                                   "image": r.image}
    else:
        _require(on is None, "--on", on, "only for Cortex-M C bundles (leave it out for a .so)")
        outs = runner_for(art, _device_spec(device), threads).run(feed)
    if output is not None:
        save_outputs(output, outs)
    result = RunResult(outputs=outs, inputs=feed, ran_on=ran_on)
    if check is not None:
        load_onnx(check)  # one-line errors for a bad reference model
        result.warnings += _check_model_warning(art, check)
        sess = ort_session(check, threads=threads)
        ref = ort_run(sess, feed)
        result.comparison = compare(outs, ref, rtol)
        bad = [c for c in result.comparison if not c.ok]
        if bad:
            worst = max(bad, key=lambda c: c.max_rel_err if c.max_rel_err == c.max_rel_err else float("inf"))
            what = (f"max rel err {worst.max_rel_err:.3g} > tolerance {rtol:g}" if worst.max_rel_err == worst.max_rel_err
                    else "NaN/inf values differ")
            raise CheckError(f"output {worst.name} differs from onnxruntime: {what} "
                             f"({len(bad)} of {len(result.comparison)} outputs fail)",
                             (f"{result.warnings[0]}: pass the model it was built from" if result.warnings else
                              "report it with the model attached, or loosen --rtol if the model is numerically sensitive"),
                             report=result)
    return result


# ----------------------------------------------------------------------------- bench
@dataclass
class BenchResult:
    artifact: str
    threads: int
    deploytool: Timing
    onnxruntime: Timing | None = None
    warnings: list[str] = field(default_factory=list)
    round_ratios: list[float] = field(default_factory=list)  # deploytool / onnxruntime medians, per round

    @property
    def ratio(self) -> float | None:
        """deploytool median / onnxruntime median (below 1: deploytool is faster): over rounds that
        alternate the two engines, the median of the rounds' ratios."""
        if self.onnxruntime is None:
            return None
        if self.round_ratios:
            return statistics.median(self.round_ratios)
        return self.deploytool.median_ms / self.onnxruntime.median_ms

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "threads": self.threads, "deploytool": self.deploytool.to_dict(),
                "onnxruntime": self.onnxruntime.to_dict() if self.onnxruntime else None, "ratio": self.ratio,
                "round_ratios": self.round_ratios, "warnings": self.warnings}


# between the two engines' blocks: long enough for both thread pools to stop spin-waiting (TVM's
# workers and onnxruntime's spin for well under a millisecond, then sleep)
_POOL_SETTLE_S = 0.1


def bench(artifact: str | Path, *, compare: str | Path | None = None, inputs=None, warmup: int = 3,
          repeats: int = 20, min_seconds: float = 0.5, threads: int | None = None, seed: int = 0,
          device=None, rounds: int = 3) -> BenchResult:
    """Latency of an artifact (min/median/p90); with ``compare``, onnxruntime on the same inputs and
    the same number of threads, in the same run: ``rounds`` rounds, each timing onnxruntime then
    deploytool (``repeats`` runs each), so that a slow phase of a shared machine lands on both
    engines of a round; the ratio is the median of the rounds' ratios, the timings pool every
    round. ``device``: time it on a board instead (timed there)."""
    _check_threads(threads)
    _require(repeats >= 1, "--repeats", repeats, "at least 1 timed run")
    _require(warmup >= 0, "--warmup", warmup, "0 or more warm-up runs")
    _require(rounds >= 1, "--rounds", rounds, "at least 1 round")
    art = Artifact.open(artifact)
    threads = threads or _targets.default_threads()
    feed = _inputs_for(art, inputs, seed)
    spec = _device_spec(device)
    if spec is not None:
        if compare is not None:
            raise InputError("--compare times onnxruntime on this machine, not on the board",
                             "drop --compare with --device (run onnxruntime on the board itself to compare)")
        runner = runner_for(art, spec)
        ours = runner.time(feed, warmup=warmup, repeats=repeats, min_seconds=min_seconds)
        notes = [f"the board {runner.board.name} is emulated ({runner.board.emulated}): these timings say nothing "
                 "about a real board"] if runner.board.emulated else []
        return BenchResult(artifact=str(artifact), threads=0, deploytool=ours, warnings=notes)
    LocalRunner.check_loadable(art)
    if compare is None:
        runner = LocalRunner(art, threads=threads)
        ours = runner.time(feed, warmup=warmup, repeats=repeats, min_seconds=min_seconds)
        return BenchResult(artifact=str(artifact), threads=threads, deploytool=ours)
    load_onnx(compare)
    warnings = _check_model_warning(art, compare)
    # onnxruntime's session (and its thread pool) first: TVM pins its workers when its pool starts.
    # Both pools live on through the rounds; each engine's block starts after the other's pool has
    # gone to sleep (_POOL_SETTLE_S), so neither shares its cores with the other's spinning threads.
    sess = ort_session(compare, threads=threads)
    runner = LocalRunner(art, threads=threads)
    theirs, ours = [], []
    for i in range(rounds):
        w = warmup if i == 0 else min(warmup, 1)
        theirs.append(time_callable(lambda: ort_run(sess, feed), warmup=w, repeats=repeats, min_seconds=min_seconds))
        time.sleep(_POOL_SETTLE_S)
        ours.append(runner.time(feed, warmup=w, repeats=repeats, min_seconds=min_seconds))
        time.sleep(_POOL_SETTLE_S)
    return BenchResult(artifact=str(artifact), threads=threads, deploytool=Timing.pooled(ours),
                       onnxruntime=Timing.pooled(theirs), warnings=warnings,
                       round_ratios=[o.median_ms / t.median_ms for o, t in zip(ours, theirs)])


def profile(artifact: str | Path, *, tuning_log: str | Path | None = None, tuned_on: str | None = None,
            inputs=None, seed: int = 0, threads: int | None = None, runs: int = 10, warmup: int = 3,
            peak: bool = False, progress: Progress = _noop):
    """Each kernel's time inside the model, on this machine (deploytool.profile); with
    ``tuning_log``, next to the log's best record for the same kernel timed alone (this machine's
    records, or ``tuned_on``'s); with ``peak`` (x86 artifacts), as a % of this machine's FP32 peak
    at the artifact's vector width, measured first (deploytool.peak)."""
    from deploytool import profiling as _profile
    from deploytool.runner import _on_gpu
    from deploytool.tuninglog import TuningLog

    _check_threads(threads)
    _require(runs >= 1, "--runs", runs, "at least 1 profiled run")
    _require(warmup >= 0, "--warmup", warmup, "0 or more warm-up runs")
    art = Artifact.open(artifact)
    meta = art.metadata
    if meta.get("runtime") != "tvm-relax-vm":
        raise InputError(f"'{artifact}' is a {meta.get('runtime')} bundle: profile runs .so artifacts on this machine",
                         "profile a .so build of the model (a Linux target)")
    tasks_ = meta.get("kernel_table") or []
    notes = []
    log_best, machine = None, None
    if tuning_log is not None:
        tlog = TuningLog.read(tuning_log)
        tgt = _targets.load(meta["target"]["name"]) if meta["target"]["name"] in _targets.preset_names() else None
        machine = _records_machine(tlog, tgt, tuned_on, Path(tuning_log).name, progress) if tgt is not None \
            else (tlog.require_device(tuned_on, "--tuned-on") if tuned_on else None)
        log_best = {h: r.seconds for h, r in tlog.best_by_workload(machine).items()}
        machine = machine or tlog.home
        if not tasks_:
            notes.append("this artifact has no kernel table (built before deploytool recorded one): rebuild it to "
                         "see the log's times next to the model's")
        elif meta.get("tuning_log_sha256") not in (None, tlog.sha256()):
            notes.append(f"'{artifact}' was not built from this log: its 'log ms' is the log's best, not what the "
                         "artifact runs")
    LocalRunner.check_loadable(art)
    threads = threads or _targets.default_threads()
    runner = LocalRunner(art, threads=threads)
    feed = _inputs_for(art, inputs, seed)
    sync = runner.device.sync if _on_gpu(art) else None
    peak_gflops = _peak_of(meta, threads, progress) if peak else None
    progress(f"profiling {Path(artifact).name}: {warmup} warm-up + {runs} runs")
    plain = runner.time(feed, warmup=warmup, repeats=runs)
    args = runner.to_device(feed)
    per_run, walls = _profile.measure(runner, args, runs=runs, warmup=warmup, sync=sync)
    per_run, walls, stalled = _profile.steady(per_run, walls)
    rows, builtins_ms = _profile.summarize(per_run)
    kernels = _profile.kernel_rows(rows, tasks_, log_best)
    import statistics

    return _profile.Profile(artifact=str(artifact), runs=runs, threads=threads, wall_ms=plain.median_ms,
                            instrumented_ms=statistics.fmean(walls) * 1e3, kernels=kernels, builtins_ms=builtins_ms,
                            log=str(tuning_log) if tuning_log is not None else None, log_machine=machine, notes=notes,
                            stalled=stalled, peak_gflops=peak_gflops)


def _peak_of(meta: dict, threads: int, progress: Progress) -> float:
    """profile --peak: this machine's FP32 peak for an x86 artifact (its vector width, ``threads``)."""
    from deploytool.peak import measured_peak_gflops

    t = meta.get("target") or {}
    if t.get("family") != "x86":
        raise InputError(f"--peak: measures x86 CPUs; this artifact is for {t.get('name')} ({t.get('family')})",
                         "drop --peak")
    wide = "avx512f" in (t.get("required_features") or [])
    progress(f"measuring this machine's FP32 peak: {threads} threads of {'AVX-512' if wide else 'AVX2'} FMAs")
    got = measured_peak_gflops(threads, wide)
    if got is None:
        raise InputError("--peak: could not build or run the FMA loop here (it needs gcc and an x86 CPU with "
                         f"{'AVX-512' if wide else 'AVX2 and FMA'})", "drop --peak")
    return got


# ----------------------------------------------------------------------------- tune
def default_log_name(model: str | Path, target: str) -> str:
    return f"{Path(model).stem}-{target}.jsonl"


FIRST_ROUND_PRETRAINED = 4  # a pretrained model's top picks per kernel before any kernel gets a full round


def tune(model: str | Path, *, target: str = "x86", output: str | Path | None = None, trials: int | None = None,
         trials_per_task: int | None = None, more: int | None = None, batch: int | None = None,
         early_stop: int | None = None,
         input_shapes=None, seed: int = 0, workers: int | None = None, measure=None, objective: str | None = None,
         device=None, dtype: str = "float32", cost_model: str = "pretrained", retime_from=None, retime_top: int = 8,
         split_k: bool = True, winograd: bool | str = False, cublas: bool = False, cudnn: bool = False,
         first_round: int | None = None, first_round_spread: int = 0, settle: int | None = None,
         kernels: str | None = None, threads: int | None = None, schedule_library: str | None = None,
         transfer_top: int = 2, on_progress=None, progress: Progress = _noop):
    """Tune every kernel of ``model`` for ``target``; records go to the tuning log ``output``
    (appended and flushed as they arrive). Rerunning the same command resumes.
    Budgets: ``trials`` is the total over all kernels (without ``trials_per_task``, one kernel may
    take any part of it) and ``trials_per_task`` each kernel's, both
    counting the log's trials that still count here (timed by this machine, this boot, today's
    settings), so a rerun finishes the same budget. ``more``: instead, this many new trials, each
    kernel taking up to ``trials_per_task`` more than the log has (extending a log).
    ``cost_model``: "pretrained" (the target family's model in cost_model/pretrained, fine-tuned
    with this run's measurements; from scratch when the family has none), "none", a file, or
    "metaschedule" (MetaSchedule's own XGBModel from scratch: the baseline for comparisons) or
    "metaschedule:FILE" (that model pretrained: ``python -m deploytool.cost_model.pretrain
    train-metaschedule``).
    ``device``: measure on a board over RPC ("HOST:PORT", "KEY@TRACKER:PORT" or a DeviceSpec);
    needed when the target is not this machine's architecture.
    ``retime_from``: another log of the target whose ``retime_top`` best candidates per kernel are
    measured again first (new measurement settings, another board), then the search goes on.
    ``first_round``: each kernel's first round measures only this many candidates (the cost model's
    top picks), so every kernel is probed before the heavy ones get full rounds; None: 4 when the
    search starts from a pretrained model (SqueezeNet, held out of it, 3 seeds: 95% of the reference
    after a median of 89 trials instead of 232, 151 vs 232 on the seed timed alike; the same final
    latency; bench/results/pretrain-first-round.md) on CPUs, a full batch otherwise (on GPUs the
    search round, seconds on the host, costs far more than measuring its candidates).
    ``first_round_spread``: the first round's picks differ in at least this many tile decisions
    (``tuner.first_picks``); 0, the default: the model's top ones. Spread by 2 on MobileNetV2 held
    out, 3 seeds, the first round ended no better (4.95 ms against 4.75;
    bench/results/first-round-mobilenet-depthwise.md).
    ``settle``: rounds of the settle at the end (deploytool.tuner.SETTLE_ROUNDS): each kernel's
    default and best few candidates timed again side by side, which then pick its best; None: 5
    when measuring on this machine, 0 (none) on boards over RPC.
    ``kernels``: comma-separated glob patterns of kernel names (e.g. ``*winograd*``): tune only
    those (the others keep whatever the log has).
    ``winograd``: True: the kernels of the Winograd build (see compile); "auto": both, each eligible
    convolution's direct and Winograd kernels, so that ``compile(winograd="auto")`` can take the
    faster.
    ``threads``: the CPU threads candidates are timed on here (default: ``measure.threads``, else
    $TVM_NUM_THREADS, else the physical cores): the thread count the model will run with. Records
    name it with their machine. A board over RPC times on its own (`device serve --threads`)."""
    import fnmatch

    from deploytool import pipeline
    from deploytool.measure import MeasureSettings
    from deploytool.tuner import TuneOptions
    from deploytool.tuner import tune as _tune

    _require(trials is None or trials >= 0, "--trials", trials, "a number of trials >= 0")
    _require(trials_per_task is None or trials_per_task >= 1, "--trials-per-task", trials_per_task,
             "a number of trials >= 1")
    _require(more is None or more >= 1, "--more", more, "a number of new trials >= 1")
    if more is not None and trials is not None:
        raise InputError("--more N and --trials N are two ways to set the budget",
                         "pass one: --trials for the total including the log's trials, --more for new ones")
    _require(batch is None or batch >= 1, "--batch", batch, "a batch size >= 1")
    _require(early_stop is None or early_stop >= 0, "--early-stop", early_stop, "0 (off) or a number of trials")
    _require(workers is None or workers >= 1, "--workers", workers, "a number of build workers >= 1")
    _require(dtype in pipeline.DTYPES, "--dtype", dtype, " or ".join(pipeline.DTYPES))
    _require(retime_top >= 1, "--retime-top", retime_top, "a number of candidates per kernel >= 1")
    _require(settle is None or settle >= 0, "--settle", settle, "0 (no settle) or a number of rounds")
    _require(first_round is None or first_round >= 1, "--first-round", first_round, "a number of candidates >= 1")
    _require(first_round_spread >= 0, "first_round_spread", first_round_spread, "a number of tile decisions >= 0")
    _require(transfer_top >= 0, "--transfer-top", transfer_top, "0 (none) or a number of candidates per kernel")
    _check_threads(threads)
    if retime_from is not None and not Path(retime_from).is_file():
        raise InputError(f"--retime-from: no tuning log at {retime_from}", "pass an existing .jsonl or .jsonl.gz log")
    tgt = _targets.load(target)
    if not tgt.available:
        raise _targets.TargetError(f"target '{tgt.name}' is not available yet ({tgt.note})",
                                   "tune for an x86 or arm preset (see `deploytool targets`)")
    winograd = _check_winograd(tgt, dtype, winograd) or False
    _check_vendor_libs(tgt, dtype, cublas, cudnn)
    spec = _device_spec(device)
    if threads is not None and (spec is not None or tgt.family == "cuda"):
        raise InputError("--threads sets the CPU threads candidates are timed on here; "
                         + ("a board times them on its own" if spec is not None else "CUDA kernels run on the GPU"),
                         "drop --threads" + (" (start the board with `deploytool device serve --threads N`)"
                                             if spec is not None else ""))
    if tgt.family == "cuda":
        from deploytool import cuda

        if spec is not None:
            raise _targets.TargetError("tuning for CUDA measures on this machine's GPU; --rpc/--tracker are for CPU "
                                       "boards", "run `deploytool tune` on the machine with the GPU")
        cuda.require_gpu(tgt.tvm.get("arch"), f"tuning for {tgt.name}")
    elif spec is None and tgt.arch != _targets.host_arch():
        raise _targets.TargetError(f"target '{tgt.name}' builds for {tgt.arch}; its kernels must be timed on such a "
                                   f"board, and this machine is {_targets.host_arch()}",
                                   "pass --rpc HOST:PORT (a board running `deploytool device serve`), or --tracker "
                                   "HOST:PORT --key KEY; without hardware: `deploytool device emulate arm`")
    elif spec is None and (lacking := _targets.missing_features(tgt.required_features, tgt.arch)):
        # timed here, its candidates would die of SIGILL: a log of failures and a meaningless summary
        portable = _targets.portable_preset()
        raise _targets.TargetError(f"target '{tgt.name}' needs CPU features this machine lacks "
                                   f"({', '.join(lacking)}), so its kernels cannot be timed here",
                                   f"tune for --target x86 (this machine){f' or {portable}' if portable else ''}, "
                                   "or measure on a machine that has them with --rpc HOST:PORT")
    ranker = "metaschedule" if cost_model.split(":", 1)[0] == "metaschedule" else "deploytool"
    cm_file = None if ranker == "metaschedule" else _cost_model_file(cost_model, tgt, nearest=True)
    ms_file = Path(cost_model.split(":", 1)[1]) if ranker == "metaschedule" and ":" in cost_model else None
    if ms_file is not None and not ms_file.is_file():
        raise InputError(f"--cost-model metaschedule:FILE: no such file {ms_file}",
                         "make one with `python -m deploytool.cost_model.pretrain train-metaschedule LOG...`")
    if first_round is None and cm_file is not None and tgt.family != "cuda":
        # not on GPUs: there a search round (seconds of evolutionary search on the host) costs far more
        # than measuring its candidates (microseconds each, built in parallel), so a round of 4
        # instead of 32 made ResNet-50 b32 float16 tune at ~10 s a trial on the H200 machine
        first_round = FIRST_ROUND_PRETRAINED
    library = _schedule_library(schedule_library, tgt)
    output = Path(output) if output is not None else Path(default_log_name(model, target))
    from deploytool.tuninglog import require_appendable

    require_appendable(output)
    # Ctrl-C from here on stops at the next step: deploytool.interrupts says why not at once
    with interrupts.Deferred("stopping after the step in flight (Ctrl-C again: at once)") as interrupt:
        imported = import_onnx(model, _shapes(input_shapes))
        interrupt.check()
        mod = pipeline.partition(pipeline.optimize(imported.mod, tgt, dtype, split_k, winograd != "auto" and winograd,
                                                   cublas, cudnn), tgt)
        interrupt.check()
        task_list = pipeline.tasks(mod)
        if winograd == "auto":
            mod, task_list = _with_winograd_kernels(mod, task_list, imported.mod, tgt, dtype, split_k, cublas, cudnn)
        if kernels:
            pats = [k.strip() for k in kernels.split(",") if k.strip()]
            picked = [t for t in task_list if any(fnmatch.fnmatchcase(t.name, p) for p in pats)]
            if not picked:
                raise InputError(f"--kernels {kernels}: no kernel of {Path(model).name} matches",
                                 "use glob patterns of kernel names as `deploytool inspect` lists them, e.g. "
                                 f"'*conv2d*' or '{task_list[0].name if task_list else 'fused_conv2d_add_relu'}'")
            partners = _convolution_partners(mod, task_list, picked)
            task_list = picked + partners
        else:
            partners = []
        progress(f"{len(task_list) - len(partners)} kernels to tune for {tgt.name}"
                 + (f" ({len(partners)} more settled with them: their convolutions' other kernels)" if partners else "")
                 + f"; log: {output}; cost model: "
                 + (f"MetaSchedule's XGBModel, pretrained ({ms_file.name})" if ms_file else
                    "MetaSchedule's XGBModel, learned from scratch" if ranker == "metaschedule" else
                    f"{cm_file.name} (pretrained{_other_family(cm_file, tgt)}, fine-tuned as it goes)" if cm_file
                    else "learned from scratch")
                 + (f"; schedules of {len(library)} kernels of {len(library.models)} other models to adapt"
                    if library is not None and transfer_top else ""))
        opts = TuneOptions(trials=trials, trials_per_task=trials_per_task, more=more, batch=batch,
                           early_stop=early_stop,
                           seed=seed, workers=workers, device=spec, progress=progress,
                           measure=dataclasses.replace(measure or MeasureSettings(),
                                                       **({"threads": threads} if threads else {})),
                           cost_model=cm_file, ranker=ranker, ms_pretrained=ms_file, retime_from=retime_from,
                           retime_top=retime_top,
                           first_round=first_round, first_round_spread=first_round_spread,
                           settle=settle, settle_only=frozenset(t.name for t in partners),
                           schedule_library=library, transfer_top=transfer_top,
                           **({"objective": objective} if objective else {}))
        return _tune(mod, task_list, tgt, output, opts, on_progress=on_progress,
                     model={"file": Path(model).name, "sha256": imported.info.sha256, "dtype": dtype,
                            "split_k": splitk.applies(tgt, dtype, split_k),
                            "winograd": "auto" if winograd == "auto" else pipeline.winograd_applies(tgt, dtype, winograd),
                            "cublas": _cublas.applies(tgt, dtype, cublas),
                            "cudnn": _cudnn.applies(tgt, dtype, cudnn)})


def _convolution_partners(mod, task_list, picked) -> list:
    """The tasks of ``task_list`` outside ``picked`` that compute a convolution one of ``picked``
    computes another way (direct, or a Winograd tile: winograd.kernel_signature). --kernels
    '*winograd*' tunes a convolution's Winograd kernels; its direct kernel is settled with them
    (not searched), so that compile --winograd auto compares the three within one settle: one
    kernel read 0.24, 0.43 and 0.23 ms in three runs minutes apart."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool import winograd

    def sig(t):
        shapes = [[int(x) for x in a.shape] for a in ms.arg_info.ArgInfo.from_prim_func(mod[t.name])]
        s = winograd.kernel_signature(t.name, shapes)
        return s[0] if s is not None else None

    names = {t.name for t in picked}
    sigs = {sig(t) for t in picked} - {None}
    return [t for t in task_list if t.name not in names and sigs and sig(t) in sigs]


def _other_family(cm_file: Path, tgt) -> str:
    """' on x86-avx512 logs, this target is x86-avx2' when a model of another family tunes ``tgt``."""
    from deploytool.cost_model import pretrain

    try:
        trained = json.loads(cm_file.with_suffix(".meta.json").read_text()).get("family")
    except (OSError, ValueError):
        return ""
    mine = pretrain.family_of(tgt)
    return f" on {trained} logs, this target is {mine}" if trained and trained != mine else ""


def _cost_model_file(choice: str, tgt, nearest: bool = False):
    """The pretrained cost model file ``--cost-model`` names for ``tgt`` (None: from scratch);
    ``nearest``: a family without a model takes its nearest family's (tuning only)."""
    from deploytool.cost_model import pretrain

    try:
        return pretrain.resolve(choice, tgt, nearest)
    except FileNotFoundError:
        raise InputError(f"--cost-model '{choice}' is not a cost model file (a .ubj or .json with its .meta.json "
                         "next to it)",
                         "pass none, pretrained, or a file written by `python -m deploytool.cost_model.pretrain "
                         "train`") from None


def _schedule_library(choice: str | None, tgt):
    """The schedule library ``--schedule-library`` names (None: none): "pretrained" is the target
    family's in cost_model/pretrained (none if it has none), else a file from
    ``python -m deploytool.cost_model.pretrain schedules``."""
    from deploytool.cost_model import pretrain
    from deploytool.schedules.transfer import ScheduleLibrary

    if choice in (None, "", "none"):
        return None
    path = pretrain.library_path(tgt) if choice == "pretrained" else Path(choice)
    if path is None:
        return None
    try:
        lib = ScheduleLibrary.load(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"--schedule-library '{choice}' is not a schedule library ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                         "pass none, pretrained, or a file written by `python -m deploytool.cost_model.pretrain "
                         "schedules LOG...`") from None
    mine = pretrain.family_of(tgt)
    if lib.family not in (mine, pretrain.NEAREST_FAMILY.get(mine)):  # x86-avx2 adapts x86-avx512 schedules
        raise InputError(f"--schedule-library '{choice}' holds {lib.family} schedules; {tgt.name} is {mine}",
                         f"build one from {mine} logs with `python -m deploytool.cost_model.pretrain schedules`")
    return lib


# ----------------------------------------------------------------------------- logs
def _conv_kernels(mod, winograd, tgt, dtype, split_k, cublas, cudnn):
    """(name, workload hash, argument shapes) of the kernels of ``mod`` built with ``winograd``
    (see pipeline.optimize)."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool import pipeline

    part = pipeline.partition(pipeline.optimize(mod, tgt, dtype, split_k, winograd, cublas, cudnn), tgt)
    return [(t.name, t.workload_hash, [[int(x) for x in a.shape]
                                       for a in ms.arg_info.ArgInfo.from_prim_func(part[t.name])])
            for t in pipeline.tasks(part)]


def _winograd_of_log(tlog, tgt, dtype) -> bool | str:
    """compile without --winograd: build as the log was tuned. True where it was tuned with
    --winograd (every eligible convolution), "auto" where it holds Winograd records besides the
    direct ones (tuned with --winograd auto, or resumed with it), else False."""
    from deploytool import pipeline

    if not pipeline.winograd_applies(tgt, dtype, True):
        return False
    logged = (tlog.header.get("model") or {}).get("winograd")
    if logged is True:
        return True
    return "auto" if any("winograd" in w.name for w in tlog.workloads.values()) else False


def _winograd_choice(mod, tgt, dtype, split_k, cublas, cudnn, tlog, tuned_on, progress) -> dict:
    """--winograd auto: signature (winograd.call_signature) -> Winograd tile, for the convolutions
    whose Winograd kernel (of some tile) the log times faster than their direct kernel, the builds'
    kernels paired by shape (winograd.choose). Only the tiles the log has records of are built."""
    from deploytool import winograd as _wg

    best = []   # per machine, this build's first: a convolution's kernels compare on one machine
    for dev in dict.fromkeys(d for d in (tuned_on, tlog.home, *tlog.devices()) if d):
        best.append({h: r.seconds for h, r in tlog.best_by_workload(dev).items() if tlog.device_of(r) == dev})
    logged = {sig[1] for w in tlog.workloads.values()
              if (sig := _wg.kernel_signature(w.name, [a[0] for a in w.args])) and sig[1]}
    direct = _conv_kernels(mod, False, tgt, dtype, split_k, cublas, cudnn)
    wino = [k for m in sorted(logged) for k in _conv_kernels(mod, m, tgt, dtype, split_k, cublas, cudnn)]
    wkernels = [(h, sig[0]) for name, h, shapes in wino if (sig := _wg.kernel_signature(name, shapes)) and sig[1]]
    eligible = {sig for _, sig in wkernels}
    chosen = _wg.choose(direct, wino, best)
    untimed = sum(1 for h, _ in wkernels if not any(h in b for b in best))
    progress(f"--winograd auto: Winograd for {len(chosen)} of {len(eligible)} eligible convolutions"
             + (f" ({untimed} Winograd kernels have no record: tune with --winograd auto)" if untimed else "")
             + "".join(f"; {h}x{w}x{ci}->{co}: F({m}x{m}) {tw * 1e3:.3f} vs {td * 1e3:.3f} ms direct"
                       for (n, h, w, ci, co, _, _), (m, td, tw) in sorted(chosen.items())))
    return {sig: m for sig, (m, _, _) in chosen.items()}


def _with_winograd_kernels(mod, task_list, imported_mod, tgt, dtype, split_k, cublas, cudnn):
    """--winograd auto, tuning: the direct build's partitioned module and tasks, plus the Winograd
    kernels of the builds that rewrite every eligible convolution, one build per tile
    (winograd.TILES; the tuner takes a task's function from the module by its name)."""
    from deploytool import pipeline
    from deploytool import winograd as _wg

    have = {t.workload_hash for t in task_list}
    names = {gv.name_hint for gv in mod.get_global_vars()}
    extra = []
    for m in _wg.TILES:
        wmod = pipeline.partition(pipeline.optimize(imported_mod, tgt, dtype, split_k, m, cublas, cudnn), tgt)
        for t in pipeline.tasks(wmod):
            if t.workload_hash in have:
                continue
            name = t.name
            while name in names:
                name += "_w"
            names.add(name)
            mod[name] = wmod[t.name]
            extra.append(dataclasses.replace(t, name=name))
            have.add(t.workload_hash)
    return mod, sorted(task_list + extra, key=lambda t: -t.flops * max(t.calls, 1))


def _check_vendor_libs(tgt, dtype: str, cublas: bool, cudnn: bool = False) -> None:
    """--cublas and --cudnn are for CUDA targets in float16: a one-line error elsewhere."""
    for flag, on, what in (("--cublas", cublas, "cuBLAS matmuls"), ("--cudnn", cudnn, "cuDNN convolutions")):
        if on and not (tgt.family == "cuda" and dtype == "float16"):
            raise InputError(f"{flag}: {what} are for CUDA targets in float16, not {tgt.name} in {dtype}",
                             f"drop {flag}, or add --dtype float16 for a CUDA target")


def _check_winograd(tgt, dtype: str, winograd):
    """--winograd's value checked against the target, "off" read as False (None, compile's "as
    the log was tuned", is left to the caller)."""
    from deploytool import pipeline

    if winograd not in (None, False, True, "auto", "off"):
        raise InputError(f"--winograd {winograd}: not a choice",
                         "pass --winograd (every eligible convolution), --winograd auto (each the faster way, "
                         "by the tuning log) or --winograd off")
    if winograd in (None, "off"):
        return False if winograd == "off" else None
    if winograd and not pipeline.winograd_applies(tgt, dtype, winograd):
        raise InputError(f"--winograd: Winograd convolutions are for CPU targets (x86, arm) in float32, not "
                         f"{tgt.name} in {dtype}", "drop --winograd")
    return winograd


def _this_machine(tgt) -> str | None:
    """device_name of this machine, when ``tgt`` runs on it: its GPU for a CUDA target, its CPU
    for a CPU target of this architecture that is not reached over RPC; else None."""
    from deploytool.tuninglog import device_name

    if tgt.family == "cuda":
        from deploytool import cuda

        gpu = cuda.local_gpu()
        return device_name({"gpu": gpu.name}) if gpu is not None else None
    if tgt.arch == _targets.host_arch() and (tgt.device or {}).get("kind", "local") == "local" \
            and tgt.artifact == "so":
        return device_name({"cpu": _targets.cpu_name()})
    return None


def _records_machine(tlog, tgt, tuned_on: str | None, name: str, progress: Progress) -> str | None:
    """Which machine's records a build takes (see compile), saying so when it matters."""
    if tuned_on is not None:
        return tlog.require_device(tuned_on, "--tuned-on")
    devs = tlog.devices()
    here = _this_machine(tgt)
    dev = tlog.match_device(here)
    if len(devs) > 1:
        if dev is None and here is not None:  # none of this machine's: the nearest machine's
            near = tlog.nearest_device(here)
            progress(f"{name} holds timings from {len(devs)} machines, none from this one ({here}); using those "
                     f"of {near}, the nearest (cold-timed, same vendor and family first), and the others' where it "
                     f"has none (--tuned-on picks another; `deploytool tune MODEL -o LOG` adds this machine's)")
            return near
        progress(f"{name} holds timings from {len(devs)} machines; using those of "
                 f"{dev or tlog.home}{' (this machine)' if dev else ''}, and the others' where it has none")
    elif here is not None and dev is None:
        progress(f"note: {name} was tuned on {tlog.home}, this machine is {here}: its kernels may not be the "
                 f"fastest here (retune: `deploytool tune MODEL -o LOG` on this machine adds its timings to a copy "
                 f"of the log)")
    return dev


def logs_show(log: str | Path, *, device: str | None = None):
    """Per-kernel statistics of a log, from one machine's records (``device``; default: the
    header's machine). ``.devices`` lists every machine of the log."""
    from deploytool import logs
    from deploytool.tuninglog import TuningLog

    return logs.stats(TuningLog.read(log), device)


def logs_merge(inputs: list[str | Path], output: str | Path):
    from deploytool import logs
    from deploytool.tuninglog import TuningLog

    return logs.stats(logs.merge([TuningLog.read(p) for p in inputs], output))


def logs_prune(log: str | Path, *, keep: int = 1, output: str | Path | None = None, device: str | None = None):
    """Keep the ``keep`` best records per workload and machine (``device``: prune only that
    machine's). Returns (stats, records dropped)."""
    from deploytool import logs
    from deploytool.tuninglog import TuningLog

    new, dropped = logs.prune(TuningLog.read(log), keep, output, device)
    return logs.stats(new), dropped


def logs_check(log: str | Path, model: str | Path, *, target: str = "x86", input_shapes=None,
               allow_emulated: bool = False, dtype: str = "float32", split_k: bool = True,
               winograd: bool | str = False, cublas: bool = False, cudnn: bool = False):
    """Which kernels of ``model`` on ``target`` the log covers (raises if the log is for another target,
    or holds timings from an emulated board, unless ``allow_emulated``). ``winograd="auto"``: the
    direct build's kernels, which every convolution falls back to."""
    from deploytool import logs, pipeline
    from deploytool.tuninglog import TuningLog, TuningLogError

    tlog = TuningLog.read(log)
    tgt = _targets.load(target)
    winograd = _check_winograd(tgt, dtype, winograd) or False
    _check_vendor_libs(tgt, dtype, cublas, cudnn)
    tlog.check_target(tgt)
    if tlog.header.get("emulated") and not allow_emulated:
        raise TuningLogError(f"tuning log {log} was measured on an emulated board ({tlog.header['emulated']}): its "
                             f"timings do not rank schedules for a real {tgt.arch} board",
                             "retune on a real board (--rpc or --tracker), or pass --allow-emulated for a pipeline test")
    imported = import_onnx(model, _shapes(input_shapes))
    mod = pipeline.optimize(imported.mod, tgt, dtype, split_k, winograd != "auto" and winograd, cublas, cudnn)
    task_list = pipeline.tasks(pipeline.partition(mod, tgt))
    return logs.coverage(tlog, task_list)


def report(log: str | Path, *, output: str | Path | None = None, device: str | None = None) -> Path:
    """Tuning curves of a log as a PNG (default: next to the log), from one machine's records
    (``device``; default: the header's machine)."""
    from deploytool import logs
    from deploytool.tuninglog import TuningLog

    tlog = TuningLog.read(log)
    return logs.plot(tlog, output or Path(log).with_suffix(".png"), device=device)


def metadata(artifact: str | Path) -> dict[str, Any]:
    """The metadata of an artifact, read from the file alone."""
    return read_metadata(artifact)


def list_targets() -> list[_targets.Target]:
    return [_targets.load(n) for n in _targets.preset_names()]
