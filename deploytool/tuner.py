"""Tuning: MetaSchedule's evolutionary search, driven task by task from here.

The loop is ours (not MetaSchedule's TaskScheduler) so that it can:

* start every task from its default schedule (measured first, the record to beat);
* resume: trials already in the log count against the budget, candidates already measured are
  never built or timed again (looked up by the scheduled kernel's structural hash), the cost
  model is warm-started from the log and the search from its best records;
* when a task's best has not improved for ``early_stop`` trials, restart its search once (a fresh
  search state from its best records), and stop it at the second such stall;
* allocate trials across tasks by gradient (Ansor): the next round goes to the task whose
  next round is expected to cut the most end-to-end latency (calls x latency);
* account for where the time goes (search, building, measuring, cost model) and report
  progress after every round;
* settle: at the end, time each kernel's default and best few candidates again, side by side in
  interleaved rounds, and log those times (deploytool.tuninglog: the kernel's best is picked
  among them from then on).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from deploytool.interrupts import Deferred
from deploytool.measure import LocalMeasurer, MeasureSettings, Outcome, RPCMeasurer, _one_line
from deploytool.schedules.space import kernel_hash, replay_trace, tensor_intrinsics, tuning_module
from deploytool.tuninglog import (SETTLE, TRANSFER, LogWriter, Record, TuningLog, TuningLogError, Workload, comparable,
                                  device_name, make_header, settled, this_boot, timed_name, to_py)

log = logging.getLogger(__name__)


@dataclass
class TuneOptions:
    trials: int | None = None            # total search trials over all tasks (None: per task x tasks)
    trials_per_task: int | None = None   # None: the target family's default (schedules.space)
    # this many new search trials (not with ``trials``): the log's trials that count here are
    # kept and each kernel may take ``trials_per_task`` more than it has
    more: int | None = None
    batch: int | None = None             # candidates per round
    early_stop: int | None = None        # stop a task after this many trials without a 1% gain (0: never)
    seed: int = 0
    workers: int | None = None           # parallel builders (None: physical cores)
    objective: str = "reg:squarederror"  # the cost model's objective (see cost_model)
    cost_model: Any = None               # a pretrained model file to start from (None: from scratch)
    ranker: str = "deploytool"           # "metaschedule": MetaSchedule's XGBModel instead (comparisons)
    ms_pretrained: Any = None            # with it: a file of that model pretrained (pretrain train-metaschedule)
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    device: Any = None                   # a deploytool.device.DeviceSpec: measure on boards over RPC
    progress: Callable[[str], None] | None = None  # one-line notes (boards lost, reconnected)
    # re-measure the best candidates of another log first (new measurement settings, another board
    # of the same target): its top ``retime_top`` per kernel become this run's first trials
    retime_from: Any = None
    retime_top: int = 8
    # measure at most this many candidates in each task's first round (the cost model's top picks),
    # so that every task is probed before the heavy ones get full rounds (None: a full batch)
    first_round: int | None = None
    # ... spread over tilings: picks differ in at least this many tile decisions (0: the top ones)
    first_round_spread: int = 0
    # a schedules.transfer.ScheduleLibrary: each task's first round also measures up to
    # ``transfer_top`` of its donors' best traces, adapted to it (source "transfer"); None: none
    schedule_library: Any = None
    transfer_top: int = 2
    # rounds of the settle at the end (None: SETTLE_ROUNDS when measuring here, 0 on boards over RPC;
    # 0: none)
    settle: int | None = None
    # names of tasks that are settled at the end but not searched: a convolution's other kernels
    # (direct, Winograd tiles) when --kernels picks some of them, so that compile compares the
    # convolution's kernels within one settle (see _settle)
    settle_only: frozenset[str] = frozenset()


# The settle (see the module's docstring and _settle): each kernel's default, its SETTLE_TOP best
# candidates and a few more, timed in SETTLE_ROUNDS interleaved rounds. Why: on a noisy VM a
# search's best record is the luckiest of hundreds of timings minutes apart. YOLOv3-tiny's shipped
# x86-avx2 log, its 12 convolutions re-timed this way (2-core Zen 3, 5 rounds): the per-kernel
# winners sum to 0.946x the kernels the log picked (33.4 vs 35.3 ms); the 13x13 3x3 convolution's
# default schedule took 9.56 ms against 10.98 for the record picked (logged 11.19, and the default
# 11.44 on a slower hour). ~40 s for those 48 candidates; none over RPC by default (one board's
# timings are steadier, and each costs an upload).
SETTLE_TOP = 3
SETTLE_ROUNDS = 5


@dataclass
class TaskState:
    name: str
    workload: str
    flops: float
    calls: int
    args: list
    default_s: float = math.inf          # the untuned (default schedule) latency
    best_s: float = math.inf
    trials: int = 0                      # search records in the log (this run and earlier ones)
    cap: int = 0                         # the trials (log's and this run's) at which it stops: its budget
    new_trials: int = 0                  # measured by this run
    cached: int = 0                      # proposed again, answered from the log
    rounds: int = 0
    since_gain: int = 0
    done: str = ""                       # why the task stopped ("" while active)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (task trial, best so far)
    round_best: list[float] = field(default_factory=list)
    empty_rounds: int = 0
    restarts: int = 0                    # searches restarted after a stall (see tune)
    settled: int = 0                     # candidates its settle timed side by side (this run)

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.best_s < math.inf and self.default_s < math.inf else float("nan")

    def to_dict(self) -> dict[str, Any]:
        f = (lambda x: None if x == math.inf else x)
        return {"name": self.name, "workload": self.workload, "flops": self.flops, "calls": self.calls,
                "default_s": f(self.default_s), "best_s": f(self.best_s), "trials": self.trials,
                "new_trials": self.new_trials, "cached": self.cached, "done": self.done, "restarts": self.restarts,
                "settled": self.settled, "curve": self.curve}


@dataclass
class TuneProgress:
    """What the live view shows, after every round."""

    tasks: list[TaskState]
    current: int
    trials_done: int                      # search trials measured by this run
    trials_budget: int                    # this run's budget left at the start
    elapsed_s: float
    eta_s: float | None
    est_untuned_s: float
    est_tuned_s: float


@dataclass
class TuneResult:
    log_path: Path
    tasks: list[TaskState]
    seconds: dict[str, float]
    trials_new: int
    est_untuned_s: float
    est_tuned_s: float
    curve: list[tuple[int, float]]        # (run trial, estimated end-to-end latency)
    resumed_records: int = 0
    retimed: int = 0                      # other machines' or boots' candidates measured again here
    settled: int = 0                      # candidates the settle at the end timed again

    def to_dict(self) -> dict[str, Any]:
        return {"log": str(self.log_path), "tasks": [t.to_dict() for t in self.tasks], "seconds": self.seconds,
                "trials_new": self.trials_new, "est_untuned_s": self.est_untuned_s, "est_tuned_s": self.est_tuned_s,
                "curve": self.curve, "resumed_records": self.resumed_records, "retimed": self.retimed,
                "settled": self.settled}


def _convolutions(states: list[TaskState]) -> dict[tuple, dict[int, list[TaskState]]]:
    """The 3x3 convolutions among the tasks (``winograd.kernel_signature``): signature -> how
    (0 direct, else the Winograd tile) -> its tasks."""
    from deploytool import winograd

    convs: dict[tuple, dict[int, list[TaskState]]] = {}
    for t in states:
        sig = winograd.kernel_signature(t.name, [shape for shape, _ in t.args])
        if sig is not None:
            convs.setdefault(sig[0], {}).setdefault(sig[1], []).append(t)
    return convs


def _estimate(states: list[TaskState], attr: str) -> float:
    """End-to-end latency: each task's ``attr`` (best_s: its default's where it has none) times its
    calls. A convolution tuned several ways (``tune --winograd auto``: a direct kernel and a
    Winograd kernel per tile, paired by ``winograd.kernel_signature``) counts once, the way compile
    would build it (``winograd.pick``); untuned (``default_s``), directly, as a build without a log
    does."""
    from deploytool import winograd

    def value(t):
        v = getattr(t, attr)
        if attr == "best_s" and v == math.inf:
            v = t.default_s
        return v

    left_out = set()
    for hows in _convolutions(states).values():
        if 0 in hows and len(hows) > 1:
            times = {how: min(map(value, ts)) for how, ts in hows.items()}
            keep = winograd.pick(times) if attr == "best_s" else 0
            left_out.update(id(t) for how, ts in hows.items() if how != keep for t in ts)
    total = 0.0
    for t in states:
        v = value(t)
        if id(t) not in left_out:
            total += (v if v < math.inf else 0.0) * max(t.calls, 1)
    return total


def tune(partitioned_mod, task_list, target, log_path: str | Path, options: TuneOptions | None = None,
         on_progress: Callable[[TuneProgress], None] | None = None, model: dict | None = None) -> TuneResult:
    """Tune every task of a partitioned module for ``target``, appending to ``log_path``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from deploytool.cost_model import features as F
    from deploytool.cost_model.model import XGBCostModel, make_metaschedule_cost_model, make_tuner_cost_model
    from deploytool.schedules import space

    opts = options or TuneOptions()
    cfg = space.search_config(target)
    per_task = _per_task(opts, cfg)
    batch = max(1, min(opts.batch or cfg.batch, per_task or 1))
    early = cfg.early_stop_trials if opts.early_stop is None else opts.early_stop
    t_start = time.perf_counter()
    seconds = {"search": 0.0, "build": 0.0, "measure": 0.0, "cost_model": 0.0, "warm_start": 0.0}

    # ---- tasks, one per distinct workload
    states: list[TaskState] = []
    funcs: dict[str, Any] = {}
    by_hash: dict[str, TaskState] = {}
    for t in task_list:
        if t.workload_hash in by_hash:
            by_hash[t.workload_hash].calls += max(t.calls, 1)
            continue
        func = partitioned_mod[t.name]
        args = [([int(x) for x in a.shape], str(a.dtype)) for a in ms.arg_info.ArgInfo.from_prim_func(func)]
        st = TaskState(name=t.name, workload=t.workload_hash, flops=t.flops, calls=max(t.calls, 1), args=args)
        states.append(st)
        by_hash[t.workload_hash] = st
        funcs[t.workload_hash] = func

    # ---- the log: resume from it, or start it
    log_path = Path(log_path)
    old = None
    if log_path.exists() and log_path.stat().st_size > 0:
        old = TuningLog.read(log_path)
        old.check_target(target)
    retime_src = None
    if opts.retime_from is not None:  # checked before anything is measured
        retime_src = TuningLog.read(opts.retime_from)
        retime_src.check_target(target)
    if opts.device is not None:
        measurer = RPCMeasurer(target, opts.measure, opts.device, workers=opts.workers, progress=opts.progress)
    else:
        measurer = LocalMeasurer(target, opts.measure, workers=opts.workers)
    header = make_header(target, device=measurer.device(), measure={**opts.measure.to_dict(), **measurer.timing()},
                         model=model,
                         emulated=measurer.emulated or False)
    if old is not None and bool(old.header.get("emulated")) != bool(header["emulated"]):
        measurer.close()
        what = "an emulated board" if old.header.get("emulated") else "real hardware"
        raise TuningLogError(f"tuning log {log_path} holds timings from {what}; this run measures on "
                             f"{'an emulated board' if header['emulated'] else 'real hardware'}",
                             "tune into a new log (-o): emulated and real timings must not mix")
    timing_keys = ("cpu_timing", "cold_calls_per_repeat")  # a change of these: see `here` below

    def settings(m):
        return {k: v for k, v in (m or {}).items() if k not in timing_keys}

    if old is not None and settings(old.header.get("measure")) != settings(header["measure"]):
        log.warning("tuning log %s was measured with %s; this run measures with %s: their latencies are "
                    "not strictly comparable", log_path, old.header.get("measure"), header["measure"])
    # a log of another machine (or of several): only this machine's records count as measured here;
    # the others' best candidates are re-measured here first (as --retime-from would), and this
    # run's records name their machine (see deploytool.tuninglog)
    machine = device_name(header["device"])
    timing = "cold" if header["measure"].get("cpu_timing") == "cold" else None
    here = timed_name(machine, timing, target.family != "cuda")
    # this machine's records of an earlier boot count as another machine's: a cloud VM of the same
    # name can be another host, or a slower day (ResNet-50's best candidates re-timed 1.16-1.36x
    # their records one session later, and 632 new trials never beat the stale times). Boards over
    # RPC keep theirs (the host's boot says nothing about the board).
    boot = this_boot() if header["device"].get("kind") == "local" else None

    def current(t: TuningLog, r: Record) -> bool:
        return t.device_of(r) == here and (boot is None or r.boot == boot)

    foreign = None
    # the log's pick per kernel for this machine (all its boots, latencies scaled): what compile
    # uses now, so the settle at the end times it with the leaders (see _settle)
    incumbents: dict[str, Record] = {}
    if old is not None:
        incumbents = {wl: r for wl, r in old.best_by_workload(here).items()
                      if wl in by_hash and old.device_of(r) == here}
        mine = [r for r in old.records if current(old, r)]
        others = [r for r in old.records if not current(old, r) and r.workload in by_hash]
        if others:
            foreign = TuningLog(path=log_path, header=old.header, workloads=old.workloads, records=others)
            whose = [d for d in old.devices() if d != here]
            if any(old.device_of(r) == here for r in others):
                whose.append(f"this machine before its last restart ({here})")
            log.info("tuning log %s holds timings from %s; this machine (%s) re-measures their best candidates",
                     log_path, ", ".join(whose), here)
        old = TuningLog(path=log_path, header=old.header, workloads=old.workloads, records=mine, skipped=old.skipped)
    measured: dict[str, Record] = {}
    # per workload, each candidate's best search-time latency and when it was last measured (what
    # the settle picks its leaders by), and its latest settle: (its time, {candidate: its latency})
    raw: dict[str, dict[str, tuple[float, float]]] = {}
    settles: dict[str, tuple[float, dict[str, float]]] = {}
    resumed = 0
    if old is not None:
        for r in old.records:
            if r.workload in by_hash:
                resumed += 1
                if r.source == SETTLE:
                    continue  # see _last_settles
                measured.setdefault(r.candidate, r)
                st = by_hash[r.workload]
                _note(raw, r)
                if r.source == "default":
                    st.default_s = min(st.default_s, r.seconds)
                else:
                    st.trials += 1
                if r.ok and r.seconds < st.best_s:
                    st.best_s = r.seconds
    writer = LogWriter(log_path, header, known_workloads=old.workloads if old else ())
    tag = machine if old is not None and machine != old.device else None  # the file's header names another machine
    wmods = {}
    for st in states:
        wmods[st.workload] = tuning_module(funcs[st.workload], target)
        writer.workload(Workload(st.workload, st.name, st.flops, st.args, tvm.ir.save_json(funcs[st.workload]),
                                 st.calls))

    tkey = header["target_key"]
    tvm_target = target.tvm_target()

    def record(st: TaskState, cand_hash: str, trace, out: Outcome, source: str, when: float = 0.0) -> Record:
        r = Record(workload=st.workload, candidate=cand_hash, trace=trace, latency_s=out.latency_s,
                   error=out.error, source=source, target_key=tkey, device=tag, timing=timing, boot=boot, time=when)
        writer.record(r)
        if source != SETTLE:
            measured[cand_hash] = r
            _note(raw, r)
        return r

    if old is not None:
        settles.update(_last_settles(old, by_hash))
    defaults: dict[str, str] = {}  # workload -> its default schedule's candidate

    def settle() -> None:
        rounds = opts.settle if opts.settle is not None else (0 if opts.device is not None else SETTLE_ROUNDS)
        if rounds > 0:
            _settle(states, wmods, raw, settles, defaults, incumbents, measured, measurer, record, rounds,
                    seconds, opts.progress, interrupt)

    guard = Deferred()  # for callers other than api.tune, which has one active already
    interrupt = guard.__enter__()  # then this is api.tune's: one flag for the whole command
    try:
        # ---- 1. the default schedule of every task is the first record to beat; measured again
        # when the default rules changed since the log was written (a new candidate)
        seeded = []
        jobs = []
        for st in states:
            interrupt.check()
            sch = space.default_candidate(target, wmods[st.workload])
            h = kernel_hash(sch.mod)
            defaults[st.workload] = h
            if h not in measured:
                jobs.append((st, sch, h))
        if jobs:
            outs = measurer.measure([sch.mod for _, sch, _ in jobs], [st.args for st, _, _ in jobs])
            for (st, sch, h), out in zip(jobs, outs):
                r = record(st, h, to_py(sch.trace.as_json(remove_postproc=False)), out, "default")
                seeded.append((st, sch))
                st.default_s = r.seconds
                if r.seconds < st.best_s:
                    st.best_s = r.seconds
        retimed = 0
        for src in (foreign, retime_src):
            interrupt.check()
            if src is not None:
                retimed += _retime(src, opts.retime_top, states, wmods, defaults, measured, measurer, record)
        if retimed:  # the cost model starts from the re-measured records
            old = TuningLog.read(log_path)
            old.records = [r for r in old.records if current(old, r)]
        for st in states:
            st.round_best.append(st.best_s)
            st.curve.append((st.trials, st.best_s))

        # without --trials, each kernel's budget is its own: one tuned past --trials-per-task before
        # (a longer earlier run) leaves the others theirs (it took them all: a resume of YOLOv3-tiny's
        # log with --kernels 'fused_conv2d*' --trials-per-task 80 ran 0 trials, three of its 13
        # convolutions having 208)
        # With --more N, N new trials: each kernel's cap is what it has plus --trials-per-task
        for st in states:
            st.cap = per_task + (st.trials if opts.more is not None else 0)
            if st.name in opts.settle_only:
                st.cap = st.trials
        budget_left, capped = _budget(states, opts, cfg)
        if capped and opts.progress is not None:
            asked = per_task * sum(st.name not in opts.settle_only for st in states)
            opts.progress(f"budget: {cfg.default_trials:,} trials in all, the log's included (the default; "
                          f"{per_task} per kernel would be {asked:,}); --trials N or --trials-per-task N to change it")
        for st in states:
            if st.trials >= st.cap:
                st.done = "settled only (--kernels)" if st.name in opts.settle_only else "budget"
        if budget_left == 0 or all(st.done for st in states):
            for st in states:
                st.done = st.done or "budget"
            settle()
            return _result(log_path, states, seconds, measurer, t_start, [], resumed, retimed)

        # ---- 2. the cost model, warm-started from the log
        t0 = time.perf_counter()
        model = XGBCostModel(objective=opts.objective, nthread=measurer.threads, seed=opts.seed)
        if opts.cost_model is not None:
            model.start_from(opts.cost_model)
        if opts.ranker == "metaschedule":  # the baseline: MetaSchedule's XGBModel (this run's data, or pretrained)
            cost_model = make_metaschedule_cost_model(nthread=measurer.threads, seed=opts.seed,
                                                      pretrained=opts.ms_pretrained)
        else:
            cost_model = make_tuner_cost_model(model)
        # one search database per task (the search reads only its own workload's records); a task
        # retried on the tiling space alone gets a fresh one (see below)
        databases: dict[str, Any] = {}
        contexts = {}
        fe = F.extractor()

        def make_context(st: TaskState, i: int, with_default: bool = True):
            with tensor_intrinsics(target):
                return ms.TuneContext(mod=wmods[st.workload], target=tvm_target,
                                      space_generator=space.space_generator(
                                          target, with_default, space.tiling_searched(wmods[st.workload])),
                                      search_strategy=space.search_strategy(cfg, per_task), task_name=st.name,
                                      rand_state=(opts.seed * 7919 + st.trials * 31 + i) % (2**31 - 1) or 1,
                                      num_threads=measurer.threads, logger=_quiet_logger())

        def db(st: TaskState):
            return databases.setdefault(st.workload, ms.database.MemoryDatabase())

        # tasks whose design spaces take no decision: the spaces (post-processed) are the whole search,
        # measured in one round. The evolutionary search would spin on them: YOLOv3-tiny's decode
        # kernel (two such spaces) took 138 s of search to find its one new candidate.
        fixed: dict[str, list] = {}

        transfers: dict[str, list] = {}  # workload -> adapted donor candidates for its first round

        def start_search(ctx, st: TaskState) -> None:
            spaces = ctx.generate_design_space()
            if opts.schedule_library is not None and st.workload not in transfers:
                transfers[st.workload] = _transferred(ctx, spaces, opts.schedule_library, opts.transfer_top)
            if all(len(sp.trace.decisions) == 0 for sp in spaces):
                fixed[st.workload] = _postprocessed(ctx, spaces)
                return
            ctx.pre_tuning(max_trials=max(st.cap - st.trials, 1) + 4 * batch, num_trials_per_iter=batch,
                           design_spaces=spaces, database=db(st), cost_model=cost_model)
            db(st).commit_workload(wmods[st.workload])

        def search_tiling_only(st: TaskState, why: Exception) -> None:
            """A hard check inside MetaSchedule's search (this task only). The default schedule is the
            usual culprit (see space_generator), as a design space or as a record the search starts
            from: search the tiling space alone, from an empty database; the default stays measured
            as the record to beat. A second failure ends the task's search."""
            old_ctx = contexts.pop(st.workload, None)
            if old_ctx is not None:
                with contextlib.suppress(Exception):
                    old_ctx.post_tuning()
            if st.workload in tiling_only:
                st.done = f"search failed: {_one_line(why)}"
                log.warning("tuning %s stopped: %s", st.name, st.done)
                return
            tiling_only.add(st.workload)
            databases[st.workload] = ms.database.MemoryDatabase()
            try:
                ctx = contexts[st.workload] = make_context(st, states.index(st), with_default=False)
                start_search(ctx, st)
            except Exception as e:
                search_tiling_only(st, e)

        tiling_only: set[str] = set()  # tasks searched without their default schedule as a design space

        def restart(st: TaskState) -> None:
            """A stalled task's search starts again: a fresh search state (random state, population)
            over a database seeded with its best 32 records, the cost model kept. On BERT from
            scratch every heavy matmul improved in the first rounds after a resume (the GELU one
            2.705 -> 2.002 ms at its 51st trial), where 80 more trials of the stalled search had
            found nothing."""
            old_ctx = contexts.pop(st.workload, None)
            if old_ctx is not None:
                with contextlib.suppress(Exception):
                    old_ctx.post_tuning()
            st.restarts += 1
            st.since_gain = 0
            databases[st.workload] = ms.database.MemoryDatabase()
            try:
                ctx = contexts[st.workload] = make_context(st, states.index(st) + 7919 * st.restarts,
                                                           with_default=st.workload not in tiling_only)
                best = sorted((r for r in measured.values() if r.workload == st.workload and r.ok),
                              key=lambda r: r.seconds)[:32]
                _commit_best(ctx, _replayed(ctx, best), db(st), tvm_target)
                start_search(ctx, st)
            except Exception as e:
                search_tiling_only(st, e)
        for i, st in enumerate(states):
            interrupt.check()
            if st.done:
                continue
            ctx = make_context(st, i)
            contexts[st.workload] = ctx
            if old is not None:
                try:
                    _warm_start(ctx, st, old, model, db(st), fe, tvm_target,
                                ms_model=cost_model if opts.ranker == "metaschedule" else None)
                except Exception as e:  # the log's records of this task cannot seed it: search from scratch
                    log.warning("could not warm-start %s from the log (%s); it searches from scratch", st.name,
                                _one_line(e))
                    databases[st.workload] = ms.database.MemoryDatabase()
        if model.size >= 2:
            model.fit()
        seconds["warm_start"] += time.perf_counter() - t0

        for st, sch in seeded:  # this run's default schedules: the search starts from them
            rec = measured.get(kernel_hash(sch.mod))
            if rec is not None and rec.ok:
                db(st).commit_tuning_record(ms.database.TuningRecord(
                    sch.trace, db(st).commit_workload(wmods[st.workload]), rec.latency_s, tvm_target,
                    ms.arg_info.ArgInfo.from_prim_func(funcs[st.workload])))
        for st in states:
            interrupt.check()
            if st.workload in contexts:
                try:
                    start_search(contexts[st.workload], st)
                except Exception as e:
                    search_tiling_only(st, e)

        # ---- 3. rounds
        run_curve: list[tuple[int, float]] = [(0, _estimate(states, "best_s"))]
        done_new = 0
        loop_t0 = time.perf_counter()
        while done_new < budget_left:
            interrupt.check()
            active = [st for st in states if not st.done]
            if not active:
                break
            st = _pick(active)
            ctx = contexts[st.workload]
            cm_before = cost_model.seconds
            t0 = time.perf_counter()
            try:
                whole = fixed.get(st.workload)
                cands = whole if whole is not None else ctx.generate_measure_candidates()
            except Exception as e:  # a hard check inside MetaSchedule's search: this task only
                search_tiling_only(st, e)
                seconds["search"] += time.perf_counter() - t0
                continue
            seconds["search"] += time.perf_counter() - t0 - (cost_model.seconds - cm_before)
            if not cands:
                st.done = "search space exhausted"
                continue
            hashes = [kernel_hash(c.sch.mod) for c in cands]
            # unmeasured candidates, each kernel once (a batch may propose one twice), within budget
            fresh, seen = [], set()
            for j, h in enumerate(hashes):
                if h not in measured and h not in seen:
                    seen.add(h)
                    fresh.append(j)
            fresh = fresh[: max(0, min(budget_left - done_new, st.cap - st.trials))]
            if st.rounds == 0 and opts.first_round and opts.first_round_spread:
                picks = first_picks([tile_signature(cands[j].sch) for j in fresh], opts.first_round,
                                    opts.first_round_spread)
                fresh = [fresh[i] for i in picks]
            elif st.rounds == 0 and opts.first_round:
                fresh = fresh[: opts.first_round]
            donated = set()  # positions in cands of adapted donor schedules (first round only)
            if st.rounds == 0 and transfers.get(st.workload) and whole is None:
                cands = list(cands)
                for c in transfers[st.workload]:
                    h = kernel_hash(c.sch.mod)
                    if h not in measured and h not in seen and len(fresh) < min(budget_left - done_new,
                                                                                st.cap - st.trials):
                        seen.add(h)
                        cands.append(c)
                        hashes.append(h)
                        fresh.append(len(cands) - 1)
                        donated.add(len(cands) - 1)
            outs = measurer.measure([cands[j].sch.mod for j in fresh], [st.args] * len(fresh)) if fresh else []
            got = dict(zip(fresh, outs))
            wl = db(st).commit_workload(wmods[st.workload])
            used, results, new = [], [], []  # new: positions in `used` measured this round
            for j, c in enumerate(cands):
                if j in got:
                    r = record(st, hashes[j], to_py(c.sch.trace.as_json(remove_postproc=False)), got[j],
                               TRANSFER if j in donated else "search")
                    st.trials += 1
                    st.new_trials += 1
                    st.since_gain += 1
                    done_new += 1
                elif hashes[j] in measured:
                    r = measured[hashes[j]]
                    st.cached += 1
                else:
                    continue  # past the budget: neither measured nor known
                used.append(c)
                results.append(ms.runner.RunnerResult(r.latency_s if r.ok else None, None if r.ok else r.error))
                if r.ok and r.seconds < st.best_s:
                    if r.seconds < st.best_s * 0.99:
                        st.since_gain = 0
                    st.best_s = r.seconds
                if j in got:
                    new.append(len(used) - 1)
                    st.curve.append((st.trials, st.best_s))
                    if r.ok:
                        db(st).commit_tuning_record(ms.database.TuningRecord(
                            c.sch.trace, wl, r.latency_s, tvm_target, c.args_info))
            if whole is None:
                ctx.notify_runner_results(used, results)
            if new:
                cost_model.update(ctx, [used[i] for i in new], [results[i] for i in new])
                st.empty_rounds = 0
            else:
                st.empty_rounds += 1
            st.rounds += 1
            st.round_best.append(st.best_s)
            if st.trials >= st.cap:
                st.done = "budget"
            elif early and st.since_gain >= early and whole is None and st.restarts < 1:
                restart(st)
            elif early and st.since_gain >= early:
                st.done = "converged"
            elif st.empty_rounds >= 3:
                st.done = "no new candidates"
            elif whole is not None and all(h in measured for h in hashes):
                n = len(set(hashes))
                st.done = f"search space measured ({n} candidate{'s' if n > 1 else ''})"
            run_curve.append((done_new, _estimate(states, "best_s")))
            if on_progress is not None:
                elapsed = time.perf_counter() - loop_t0
                left = min(budget_left - done_new, sum(max(0, s.cap - s.trials) for s in states if not s.done))
                eta = elapsed / done_new * left if done_new else None
                on_progress(TuneProgress(tasks=states, current=states.index(st), trials_done=done_new,
                                         trials_budget=budget_left, elapsed_s=time.perf_counter() - t_start,
                                         eta_s=eta, est_untuned_s=_estimate(states, "default_s"),
                                         est_tuned_s=_estimate(states, "best_s")))
        for st in states:
            st.done = st.done or "budget"
        for w, ctx in contexts.items():
            if w not in fixed:
                ctx.post_tuning()
        seconds["cost_model"] = cost_model.seconds
        settle()
        return _result(log_path, states, seconds, measurer, t_start, run_curve, resumed, retimed)
    finally:
        guard.__exit__(None, None, None)
        writer.close()
        measurer.close()


def tile_signature(sch) -> tuple:
    """A candidate's tiling: the decisions of its trace's SamplePerfectTile instructions, in order."""
    trace = sch.trace
    decisions = (trace.get_decision(inst) for inst in trace.insts if inst.kind.name == "SamplePerfectTile")
    return tuple(None if d is None else tuple(int(x) for x in d) for d in decisions)


def first_picks(signatures: list[tuple], k: int, spread: int = 0) -> list[int]:
    """Which ``k`` of a task's first-round candidates to measure, given their tilings
    (``tile_signature``) in the search's order (the cost model's ranking, a few random ones mixed
    in). ``spread`` 0: the first ``k``. Else greedily down that order, a candidate whose tiling
    differs from every one already picked in at least ``spread`` tile decisions (a candidate of
    another design space, with another count of them, differs from all), then the order's next
    ones if too few did: the model's top picks are often one tiling with other unroll or
    compute-location decisions, and where the model misjudges a kernel all of them miss together."""
    if not spread:
        return list(range(min(k, len(signatures))))

    def far(a, b) -> bool:
        return len(a) != len(b) or sum(x != y for x, y in zip(a, b)) >= spread

    picks: list[int] = []
    for i, sig in enumerate(signatures):
        if len(picks) == k:
            break
        if all(far(sig, signatures[p]) for p in picks):
            picks.append(i)
    picks += [i for i in range(len(signatures)) if i not in picks][: k - len(picks)]
    return sorted(picks)


def _result(log_path, states, seconds, measurer, t_start, curve, resumed, retimed) -> TuneResult:
    seconds = dict(seconds)
    seconds.update(measurer.seconds)
    seconds["total"] = time.perf_counter() - t_start
    seconds["other"] = max(0.0, seconds["total"] - sum(v for k, v in seconds.items() if k != "total"))
    return TuneResult(log_path=Path(log_path), tasks=states, seconds=seconds,
                      trials_new=sum(s.new_trials for s in states), est_untuned_s=_estimate(states, "default_s"),
                      est_tuned_s=_estimate(states, "best_s"), curve=curve, resumed_records=resumed,
                      retimed=retimed, settled=sum(s.settled for s in states))


def _note(raw: dict, r: Record) -> None:
    """Keep a valid record's latency in ``raw`` (see tune): its candidate's best, and its latest time."""
    if r.ok:
        lat = raw.setdefault(r.workload, {})
        best, when = lat.get(r.candidate, (math.inf, 0.0))
        lat[r.candidate] = (min(best, r.seconds), max(when, r.time))


def _last_settles(old: TuningLog, by_hash: dict) -> dict[str, tuple[float, dict[str, float]]]:
    """Per workload of this run, its latest settle in ``old`` (this machine's records), as
    tuninglog.settled finds it: (its time, {candidate: its latency over the rounds}, inf for a
    failure)."""
    out: dict[str, tuple[float, dict[str, float]]] = {}
    for wl, recs in old.by_workload().items():
        batch = [r for r, _ in settled([(r, r.seconds) for r in recs]) if r.source == SETTLE]
        if wl in by_hash and batch:
            out[wl] = (batch[0].time, {r.candidate: r.seconds for r in batch})
    return out


def _settle(states, wmods, raw, settles, defaults, incumbents, measured, measurer, record, rounds, seconds,
            progress, interrupt) -> None:
    """Time each kernel's leaders again side by side and log them as settle records. The leaders:
    the default schedule, the SETTLE_TOP best candidates by their search-time latency, the log's
    pick when this run started (``incumbents``: it may come from an earlier boot, whose records the
    settle retires), the last settle's winner, and any candidate measured since that settle whose
    latency beats the winner's there (which the log's best would otherwise pick: tuninglog.settled).
    A kernel whose leaders its last settle all timed is skipped (rerunning a finished command
    settles nothing), unless it is one of a convolution's kernels tuned both ways (``tune
    --winograd auto``: direct, Winograd per tile) whose last settles were not one: those are timed
    together, so that compile compares them within one settle (timed apart, minutes or runs
    apart, one kernel read 0.24, 0.43 and 0.23 ms). Each kernel's best_s and default_s become its
    settle's, this one's or the last one's."""
    together = set()  # workloads to settle whatever their own leaders
    for hows in _convolutions(states).values():
        members = [st for ts in hows.values() for st in ts]
        times = {settles.get(st.workload, (None, {}))[0] for st in members}
        if len(hows) > 1 and (None in times or len(times) > 1):
            together.update(st.workload for st in members)
    jobs = []
    for st in states:
        lat = raw.get(st.workload, {})
        prev_t, prev = settles.get(st.workload, (None, {}))
        win = min(prev, key=prev.get) if prev else None
        traces = {c: measured[c].trace for c in lat}  # measured, and valid
        inc = incumbents.get(st.workload)
        if inc is not None:
            traces.setdefault(inc.candidate, inc.trace)
        leaders = set(sorted(lat, key=lambda c: lat[c][0])[:SETTLE_TOP]) | {defaults.get(st.workload), win}
        leaders |= {inc.candidate if inc is not None else None}
        if win is not None:
            leaders |= {c for c, (x, when) in lat.items() if when > prev_t and x < prev[win]}
        leaders = sorted(c for c in leaders if c in traces)
        if not leaders or (st.workload not in together and (len(leaders) < 2 or set(leaders) <= set(prev))):
            continue  # nothing its last settle did not time
        for c in leaders:
            try:
                sch = replay_trace(wmods[st.workload], traces[c])
            except Exception:  # a trace from an older deploytool or TVM
                continue
            jobs.append((st, c, sch, traces[c]))
    if jobs:
        kernels = len({st.workload for st, _, _, _ in jobs})
        if progress is not None:
            progress(f"settling {kernels} kernel(s): {len(jobs)} leading candidates timed again side by side, "
                     f"{rounds} rounds")
        before = dict(measurer.seconds)
        t0 = time.time()
        outs = measurer.measure_rounds([sch.mod for _, _, sch, _ in jobs], [st.args for st, _, _, _ in jobs],
                                       [st.workload for st, _, _, _ in jobs], rounds, interrupt.check)
        for (st, c, _, trace), out in zip(jobs, outs):
            r = record(st, c, trace, out, SETTLE, when=t0)
            st.settled += 1
            if st.workload not in settles or settles[st.workload][0] != t0:
                settles[st.workload] = (t0, {})
            settles[st.workload][1][c] = r.seconds
        spent = 0.0
        for k in ("build", "measure"):  # reported as the settle's, not the search's
            d = measurer.seconds[k] - before.get(k, 0.0)
            measurer.seconds[k] -= d
            spent += d
        seconds["settle"] = seconds.get("settle", 0.0) + spent
    for st in states:  # the latencies the log's best stands on (tuninglog.settled)
        t, cands = settles.get(st.workload, (None, {}))
        ok = {c: x for c, x in cands.items() if x < math.inf}
        if not ok:
            continue
        later = [x for x, when in raw.get(st.workload, {}).values() if when > t]
        st.best_s = min([*ok.values(), *later])
        st.default_s = ok.get(defaults.get(st.workload), st.default_s)


def _per_task(opts: TuneOptions, cfg) -> int:
    """Each kernel's cap (the log's trials included; with --more, beyond them): --trials-per-task,
    else with --trials the whole total (the gradient allocator and early stopping share it out),
    else the family's default. Until 2026-12-07 --trials alone kept the default 64 per kernel: BERT's
    14 kernels tuned with --trials 2000 stopped at 517 trials and 1.07x, where the 2,000 spread by
    the allocator reached 1.35x (its FFN matmuls took 620 each and still gained after 300)."""
    if opts.trials_per_task is not None:
        return opts.trials_per_task
    if opts.trials is not None and opts.more is None:
        return max(opts.trials, 1)
    return cfg.trials_per_task


def _budget(states: list[TaskState], opts: TuneOptions, cfg) -> tuple[int, bool]:
    """The new trials this run may measure (each task's ``cap`` set), and whether the target
    family's default total (``cfg.default_trials``) capped it: without --trials or
    --trials-per-task, per task x kernels would make a many-kernel model an all-night run. The
    gradient allocator spreads a total, so the capped run still goes where the latency is."""
    if opts.more is not None:
        return opts.more, False
    if opts.trials is not None:
        return max(0, opts.trials - sum(st.trials for st in states)), False
    left = sum(max(0, st.cap - st.trials) for st in states)
    if opts.trials_per_task is None and cfg.default_trials is not None:
        total = max(0, cfg.default_trials - sum(st.trials for st in states))
        if total < left:
            return total, True
    return left, False


def _pick(active: list[TaskState]) -> TaskState:
    """Gradient task selection: first every task once, then the task whose next round is expected
    to remove the most weighted latency (backward gradient over the last 3 rounds, blended with an
    optimistic forward estimate that shrinks as the task gets rounds)."""
    fresh = [st for st in active if st.rounds == 0]
    if fresh:
        return max(fresh, key=lambda s: s.calls * (s.best_s if s.best_s < math.inf else 1.0))
    best, best_g = None, None
    for st in active:
        b = [x if x < math.inf else 1.0 for x in st.round_best]
        k = min(3, len(b) - 1)
        back = (b[-1] - b[-1 - k]) / k if k > 0 else -b[-1]
        fwd = -b[-1] / (st.rounds + 1)
        g = st.calls * (0.2 * back + 0.8 * fwd)
        if best_g is None or g < best_g:
            best, best_g = st, g
    return best


def _transferred(ctx, spaces, library, k: int) -> list:
    """Up to ``k`` measure candidates of the task: its donors' best traces in ``library``, adapted
    to it (schedules.transfer), replayed and post-processed as the search's own candidates."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    if k <= 0:
        return []
    traces = library.traces_for([to_py(sp.trace.as_json()) for sp in spaces], 2 * k)
    args_info = ms.arg_info.ArgInfo.from_prim_func(ctx.mod["main"])
    out, seen = [], set()
    for tr in traces:
        try:
            sch = s_tir.Schedule(ctx.mod)
            s_tir.Trace.apply_json_to_schedule(tr, sch)
            cand = _candidate(ctx, sch, args_info)
        except Exception:  # a decision the kernel cannot take after all (e.g. a compute location)
            continue
        if cand is None:
            continue
        h = kernel_hash(sch.mod)
        if h not in seen:
            seen.add(h)
            out.append(cand)
        if len(out) >= k:
            break
    return out


def _postprocessed(ctx, spaces) -> list:
    """Design spaces without decisions as measure candidates, post-processed as the search would."""
    from tvm.s_tir import meta_schedule as ms

    args_info = ms.arg_info.ArgInfo.from_prim_func(ctx.mod["main"])
    return [c for c in (_candidate(ctx, sp.copy(), args_info) for sp in spaces) if c is not None]


def _candidate(ctx, sch, args_info):
    """``sch`` post-processed as the search would, as a measure candidate (None: a post-processor
    rejects it)."""
    from tvm.s_tir import meta_schedule as ms

    sch.enter_postproc()
    if not all(p.apply(sch) for p in ctx.space_generator.postprocs):
        return None
    return ms.MeasureCandidate(sch, args_info)


def leading_records(src: TuningLog, recs: list[Record], default: str | None) -> list[Record]:
    """A kernel's records in ``src`` (another log, or other machines' and boots' records), best first
    as each machine's own pick ranks them (tuninglog.settled over comparable: a settled kernel's
    settle winners, not the luckiest search timings), one per candidate, the default schedule's
    left out (measured anyway); several machines' rankings interleaved, first of each, then second."""
    per_machine: dict[str, list[Record]] = {}
    for r in recs:
        per_machine.setdefault(src.device_of(r), []).append(r)
    ranked = []
    for mine in per_machine.values():
        best: dict[str, tuple[float, Record]] = {}
        for r, s in settled(comparable(mine)):
            if r.source != "default" and r.candidate != default and s < best.get(r.candidate, (math.inf,))[0]:
                best[r.candidate] = (s, r)
        ranked.append([r for _, r in sorted(best.values(), key=lambda x: x[0])])
    out, seen = [], set()
    for i in range(max(map(len, ranked), default=0)):
        for rs in ranked:
            if i < len(rs) and rs[i].candidate not in seen:
                seen.add(rs[i].candidate)
                out.append(rs[i])
    return out


def _retime(src: TuningLog, top: int, states: list[TaskState], wmods, defaults, measured, measurer,
            record) -> int:
    """Measure again, with this run's settings, the ``top`` best candidates per kernel of another
    log (the ones this log has not measured yet, ranked by _leading); they count as search trials.
    Returns how many."""
    by_wl = src.by_workload()
    jobs, queued = [], set()
    for st in states:
        ok = leading_records(src, by_wl.get(st.workload, []), defaults.get(st.workload))
        for r in ok[:max(0, top - st.trials)]:
            try:
                sch = replay_trace(wmods[st.workload], r.trace)
            except Exception:  # a trace from an older deploytool or TVM
                continue
            h = kernel_hash(sch.mod)
            if h not in measured and h not in queued:  # each candidate measured once
                queued.add(h)
                jobs.append((st, sch, h, r.trace))
    if not jobs:
        return 0
    log.info("re-measuring %d candidates of %s", len(jobs), src.path)
    for i in range(0, len(jobs), 32):
        chunk = jobs[i:i + 32]
        outs = measurer.measure([sch.mod for _, sch, _, _ in chunk], [st.args for st, _, _, _ in chunk])
        for (st, _, h, trace), out in zip(chunk, outs):
            r = record(st, h, trace, out, "search")
            st.trials += 1
            if r.ok and r.seconds < st.best_s:
                st.best_s = r.seconds
    return len(jobs)


def _warm_start(ctx, st: TaskState, old: TuningLog, model, database, fe, tvm_target, ms_model=None) -> None:
    """Feed a task's logged records to the cost model (``ms_model``: MetaSchedule's, when that is
    the ranker), and its best ones to the search database."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from deploytool.cost_model import features as F

    recs = [r for r in old.records if r.workload == st.workload]
    if not recs:
        return
    ok = sorted((r for r in recs if r.ok), key=lambda r: r.seconds)
    keep = ok[:256] + [r for r in recs if not r.ok][:32]
    pairs = _replayed(ctx, keep)
    if not pairs:
        return
    schs = [sch for sch, _ in pairs]
    lats = [r.seconds if r.ok else 1e10 for _, r in pairs]
    args_info = ms.arg_info.ArgInfo.from_prim_func(ctx.mod["main"])
    cands = [ms.MeasureCandidate(s, args_info) for s in schs]
    if ms_model is not None:
        ms_model.update(ctx, cands, [ms.runner.RunnerResult([x], None) if x < 1e10 else
                                     ms.runner.RunnerResult(None, "failed") for x in lats])
    else:
        model.add(kernel_hash(ctx.mod), F.from_candidates(ctx, cands, fe), np.array(lats))
    _commit_best(ctx, pairs, database, tvm_target)


def _replayed(ctx, recs: list[Record]) -> list:
    """(schedule, record) for each record whose trace replays on the task (in ``recs``' order)."""
    out = []
    for r in recs:
        try:
            out.append((replay_trace(ctx.mod, r.trace), r))
        except Exception:  # a trace from an older deploytool or TVM: skip it
            continue
    return out


def _commit_best(ctx, pairs: list, database, tvm_target, k: int = 32) -> None:
    """The first ``k`` valid (schedule, record) pairs (best first) into a task's search database:
    the search's starting points."""
    from tvm.s_tir import meta_schedule as ms

    args_info = ms.arg_info.ArgInfo.from_prim_func(ctx.mod["main"])
    wl = database.commit_workload(ctx.mod)
    for sch, r in [p for p in pairs if p[1].ok][:k]:
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, r.latency_s, tvm_target, args_info))


def _quiet_logger():
    """MetaSchedule logs every trial at INFO; deploytool shows its own progress."""
    lg = logging.getLogger("deploytool.metaschedule")
    lg.setLevel(logging.WARNING)
    return lg
