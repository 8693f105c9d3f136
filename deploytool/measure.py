"""Building and timing candidate kernels during tuning (the only place tuning measures).

MetaSchedule's LocalBuilder starts a fresh pool of worker processes for every batch (each
importing TVM: 18 s for a batch of ONE candidate on the 2-core machine). Here the workers are
started once per tuning run and reused:

* builders: ``workers`` processes, each building a scheduled kernel to a .so with the target's
  own toolchain (cross-linked for cross targets);
* a timer: one process (measurements never overlap), loading each .so and timing it with TVM's
  time_evaluator on random inputs, optionally flushing the CPU caches between repeats.

A worker that crashes or hangs costs only the candidates in flight: they are reported as
failures and the pool is restarted.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from deploytool import interrupts


@dataclass(frozen=True)
class MeasureSettings:
    """How a candidate is timed. Recorded in the tuning log's header."""

    number: int = 1              # calls per timed repeat (raised to fill min_repeat_ms)
    repeat: int = 3              # timed repeats; the record keeps each
    min_repeat_ms: int = 10    # each repeat runs at least this long
    # Time CPU candidates cold: every timed call after a flush of the kernel's weights and output
    # (see cpu_timing), as inside a model whose weights exceed the caches; on GPUs, the L2 flushed
    # before each launch (see GPU_COLD_LAUNCHES).
    cache_flush: bool = True
    threads: int = 0             # TVM thread-pool size while timing (0: physical cores)
    build_timeout_s: float = 120.0
    run_timeout_s: float = 30.0

    def to_dict(self):
        return asdict(self)


# --------------------------------------------------------------------------- workers
def _init_worker(threads: int, parent: int, cuda: bool = False) -> None:
    die_with_parent(parent)
    # Ctrl-C reaches the terminal's whole process group: the tuner handles it (its close() kills
    # these workers); a worker taking it too would only print a KeyboardInterrupt traceback. Started
    # with SIGINT blocked (interrupts.sigint_blocked), it ignores it before unblocking
    interrupts.ignore_in_worker()
    # TVM sizes its thread pool from TVM_NUM_THREADS when the first kernel runs (see
    # deploytool.runner.set_threads); builders need one thread, the timer the target's count.
    os.environ["TVM_NUM_THREADS"] = str(threads or 1)
    import tvm  # noqa: F401  (imported once per worker)

    if cuda:  # NVRTC, TVM's CUDA compile callback and runtime: loaded once per worker, not per candidate
        from deploytool import cuda as _cuda

        _cuda.ensure_compiler()


def die_with_parent(parent: int) -> None:
    """A worker process must not outlive the process that started it, even one killed with kill -9
    (it would hold a core, or a board): Linux's PR_SET_PDEATHSIG, and an exit if the parent is
    already gone. Used by the tuning workers, the conformance workers and the board's RPC server."""
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _build_one(mod_json: str, target_json: dict, host_json: dict | None, cc: str, cross: bool, out_path: str) -> str:
    import tvm
    from tvm.support import cc as tvm_cc

    mod = tvm.ir.load_json(mod_json)
    target = tvm.target.Target(target_json, host=host_json) if host_json else tvm.target.Target(target_json)
    with target:  # TVM's CUDA compile callback reads the arch from the current target
        rt_mod = tvm.tirx.build(mod, target=target)
    fcompile = tvm_cc.cross_compiler(cc) if cross else None
    rt_mod.export_library(out_path, fcompile=fcompile)
    return out_path


# CPU candidates are timed cold, one call at a time. TVM's time_evaluator runs its f_preproc (the
# flush) once per repeat, before `number` calls, and min_repeat_ms raises `number` until a repeat
# lasts 10 ms: for a 0.2 ms kernel only the first of ~50 calls ran cold, so the "flushed" timings
# were warm. Inside a model they are not: ResNet-50 on a 2-core Zen 5, tuned that way, ran its
# kernels 1.30x slower than the log said (up to 2.4x for the 8 MB-weight 1x1 convolution), and
# timed one call after each flush, the same candidates took 1.5x their logged time; the best
# candidate changed too (stage 4's 3x3 convolution: 0.52 ms cold for a candidate logged 6% slower
# than the one picked, which took 0.74 ms cold). Now each repeat a record keeps is the mean of
# COLD_CALLS single calls, each after TVM's cache_flush_cpu_non_first_arg (every argument but the
# first, the input activation, which the previous kernel has just written: weights, bias, residual,
# output). The flush is not timed. On this machine it runs deploytool's own hook (cpuflush.py:
# CLFLUSHOPT), since TVM's CLFLUSH took ~145 ns a line on an Intel Xeon, 11 s a candidate for
# ZFNet-512's 151 MB weight; boards over RPC keep TVM's hook.
COLD_CALLS = 10


def cpu_timing(settings: dict) -> dict:
    """How CPU candidates are timed, for the tuning log's header."""
    if not settings["cache_flush"]:
        return {"cpu_timing": "warm"}
    return {"cpu_timing": "cold", "cold_calls_per_repeat": COLD_CALLS}


def time_cpu(lib, entry: str, dev, tensors: list, settings: dict, flush: str = "cache_flush_cpu_non_first_arg") -> list[float]:
    """The ``repeat`` samples a record keeps (see COLD_CALLS), locally or on a board over RPC; `flush`
    names the hook that evicts every argument but the first before each call."""
    if not settings["cache_flush"]:
        f = lib.time_evaluator(entry, dev, number=settings["number"], repeat=settings["repeat"],
                               min_repeat_ms=int(settings["min_repeat_ms"]))
        return [float(x) for x in f(*tensors).results]
    k = COLD_CALLS
    f = lib.time_evaluator(entry, dev, number=1, repeat=settings["repeat"] * k, min_repeat_ms=0,
                           f_preproc=flush)
    xs = [float(x) for x in f(*tensors).results]
    return [sum(xs[i * k:(i + 1) * k]) / k for i in range(settings["repeat"])]


# GPU candidates are timed with a cold L2 (settings["cache_flush"]): inside a model a kernel's
# weights come from HBM (the kernels before it ran over other data), while a kernel timed alone,
# launch after launch on the same buffers, finds them in the L2 (60 MB on the H200). Measured on
# the H200: tuned tensor-core kernels timed warm ran 1.2-1.84x slower inside the model than the
# tuner had timed them; the untuned ones matched within 4%. So before each timed launch the timer
# copies a buffer of 2x the L2 (read + write: 4x the L2 of traffic) on the same stream. Measured
# since (bench/results/gpu_profile.md): a cold sample still carries ~5-6 us of launch latency and
# the flush also evicts activations the model finds in L2, so logged times run high (in model /
# log 0.5-0.94x); which candidate of a kernel wins does not change. Each repeat the record keeps
# is the mean of this many launches.
GPU_COLD_LAUNCHES = 10


def gpu_timing(settings: dict, l2_bytes: int | None = None) -> dict:
    """How GPU candidates are timed, for the tuning log's header."""
    if not settings["cache_flush"]:
        return {"gpu_timing": "warm L2"}
    return {"gpu_timing": "cold L2", "l2_flush_bytes": _l2_flush_bytes(l2_bytes),
            "launches_per_repeat": GPU_COLD_LAUNCHES}


def _l2_flush_bytes(l2_bytes: int | None) -> int:
    return 2 * l2_bytes if l2_bytes else 256 << 20


def _time_one(path: str, args: list, settings: dict, device: str = "cpu") -> list[float]:
    import tvm

    dev = tvm.device(device, 0)
    lib = tvm.runtime.load_module(path)
    key = (device, repr(args))
    if key not in _ARGS:  # the timer process keeps one kernel's inputs for its next candidates
        _ARGS.clear()
        _ARGS[key] = [tvm.runtime.tensor(a, dev) for a in _random_args(args)]
    tensors = _ARGS[key]
    entry = lib.entry_name if hasattr(lib, "entry_name") and lib.entry_name else "main"
    if device == "cpu":
        from deploytool import cpuflush

        flush = cpuflush.hook_for(tensors) if settings["cache_flush"] else cpuflush.TVM_HOOK
        return time_cpu(lib, entry, dev, tensors, settings, flush)
    if settings["cache_flush"]:
        return _time_cold_gpu(lib, entry, dev, tensors, settings)
    f = lib.time_evaluator(entry, dev, number=settings["number"], repeat=settings["repeat"],
                           min_repeat_ms=int(settings["min_repeat_ms"]))
    return [float(x) for x in f(*tensors).results]


_FLUSH: dict = {}
_ARGS: dict = {}


def _time_cold_gpu(lib, entry: str, dev, tensors: list, settings: dict) -> list[float]:
    """One launch per timed repeat, each after an L2 flush (see GPU_COLD_LAUNCHES)."""
    import tvm

    if not _FLUSH:  # the timer process keeps its flush buffers (and the hook) for the whole run
        n = _l2_flush_bytes(dev.l2_cache_size_bytes)
        src, dst = tvm.runtime.empty((n,), "uint8", dev), tvm.runtime.empty((n,), "uint8", dev)
        _FLUSH.update(src=src, dst=dst)

        def flush(*_):  # returns nothing: the evaluator refuses an object as the hook's result
            _FLUSH["src"].copyto(_FLUSH["dst"])

        tvm.register_global_func("deploytool.flush_l2", flush, override=True)
    k, r = GPU_COLD_LAUNCHES, settings["repeat"]
    f = lib.time_evaluator(entry, dev, number=1, repeat=r * k, min_repeat_ms=0, f_preproc="deploytool.flush_l2")
    res = [float(x) for x in f(*tensors).results]
    return [sum(res[i * k:(i + 1) * k]) / k for i in range(r)]


# --------------------------------------------------------------------------- the measurer
@dataclass
class Outcome:
    latency_s: list[float] | None = None
    error: str | None = None


class LocalMeasurer:
    """Builds candidates in parallel and times them one at a time, on this machine."""

    def __init__(self, target, settings: MeasureSettings, workers: int | None = None):
        from deploytool import pipeline, targets

        self.target = target
        self.settings = settings
        self.threads = settings.threads or targets.default_threads()
        self.workers = max(1, workers or targets.physical_cores())
        self.cc = pipeline.toolchain_cc(target)
        self.cross = bool(target.toolchain.get("cross"))
        self.tmp = tempfile.mkdtemp(prefix="deploytool-tune-")
        self._ctx = multiprocessing.get_context("spawn")
        self._builders = None
        self._timer = None
        self._n = 0
        self.seconds = {"build": 0.0, "measure": 0.0}
        self.cuda = target.family == "cuda"
        self.gpu = None
        if self.cuda:
            from deploytool import cuda

            self.gpu = cuda.local_gpu()  # None: this measurer can still build (api.tune checks for a GPU)

    emulated = None

    def device(self) -> dict:
        from deploytool import targets

        d = {"kind": "local", "arch": targets.host_arch(), "cpu": targets.cpu_name(), "threads": self.threads}
        if self.gpu is not None:
            d.update(gpu=self.gpu.name, gpu_arch=self.gpu.arch)
        return d

    def timing(self) -> dict:
        """How candidates are timed beyond the settings (cold CPU calls, the GPU's L2 flush), for the
        log's header."""
        if not self.cuda:
            return cpu_timing(self.settings.to_dict())
        return gpu_timing(self.settings.to_dict(), getattr(self.gpu, "l2_bytes", None))

    def _pool(self, which: str):
        if which == "build":
            if self._builders is None:
                self._builders = cf.ProcessPoolExecutor(self.workers, mp_context=self._ctx, initializer=_init_worker,
                                                        initargs=(1, os.getpid(), self.cuda))
            return self._builders
        if self._timer is None:
            self._timer = cf.ProcessPoolExecutor(1, mp_context=self._ctx, initializer=_init_worker,
                                                 initargs=(self.threads, os.getpid()))
        return self._timer

    def _reset(self, which: str) -> None:
        pool = self._builders if which == "build" else self._timer
        if pool is None:
            return
        for p in list(getattr(pool, "_processes", {}).values()):
            try:
                p.kill()
            except Exception:  # already gone
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        if which == "build":
            self._builders = None
        else:
            self._timer = None

    def build(self, mods: list) -> list[Outcome | str]:
        """Build scheduled kernels (IRModules); each item becomes a .so path or a failed Outcome."""
        import tvm

        t0 = time.perf_counter()
        tjson, hjson = dict(self.target.tvm), self.target.host
        jobs = []
        pool = self._pool("build")
        for mod in mods:
            self._n += 1
            out = os.path.join(self.tmp, f"cand{self._n}.so")
            with interrupts.sigint_blocked():  # submit starts the workers: they must not take Ctrl-C
                jobs.append(pool.submit(_build_one, tvm.ir.save_json(mod), tjson, hjson, self.cc, self.cross, out))
        # a build stuck in the compiler (seen: a recursion in TVM's simplifier that ran for minutes)
        # must not hold the batch: the builds time out once none has finished for build_timeout_s
        # (the other workers keep finishing theirs meanwhile), not after a deadline that grows with
        # the batch (that was 16 minutes for 16 candidates on 2 workers)
        pending, last = set(jobs), time.monotonic()
        while pending:
            done, pending = cf.wait(pending, timeout=max(0.1, last + self.settings.build_timeout_s - time.monotonic()),
                                    return_when=cf.FIRST_COMPLETED)
            if done:
                last = time.monotonic()
            elif time.monotonic() - last >= self.settings.build_timeout_s:
                break
        results: list[Outcome | str | None] = [None] * len(jobs)
        broken, retry = False, []
        # queued ones are built again, but only behind at least one stuck build: otherwise (none had
        # started) retrying could go round for ever, and they all count as timed out
        any_stuck = any(job.running() for job in pending)
        for i, job in enumerate(jobs):
            if job in pending:
                broken = True
                if job.running() or not any_stuck:
                    results[i] = Outcome(error=f"build timed out after {self.settings.build_timeout_s:.0f} s")
                else:
                    retry.append(i)
                continue
            try:
                results[i] = job.result(timeout=0)
            except cf.process.BrokenProcessPool:
                broken = True
                results[i] = Outcome(error="the build worker crashed")
            except Exception as e:  # a TVM error from the worker
                results[i] = Outcome(error=_one_line(e))
        if broken:
            self._reset("build")
        self.seconds["build"] += time.perf_counter() - t0
        if retry:
            for i, r in zip(retry, self.build([mods[i] for i in retry])):
                results[i] = r
        return results

    def run(self, paths: list[str], args: list) -> list[Outcome]:
        """Time built kernels, one at a time; ``args``: per kernel, its (shape, dtype) pairs."""
        t0 = time.perf_counter()
        out: list[Outcome] = []
        s = self.settings.to_dict()
        for path, a in zip(paths, args):
            try:
                with interrupts.sigint_blocked():  # it may start the timing worker
                    job = self._pool("run").submit(_time_one, path, a, s, "cuda" if self.cuda else "cpu")
                lat = job.result(timeout=self.settings.run_timeout_s)
                out.append(Outcome(latency_s=lat))
            except cf.TimeoutError:
                self._reset("run")
                out.append(Outcome(error=f"run timed out after {self.settings.run_timeout_s:.0f} s"))
            except cf.process.BrokenProcessPool:
                self._reset("run")
                out.append(Outcome(error="the kernel crashed the timing process"))
            except Exception as e:
                out.append(Outcome(error=_one_line(e)))
            finally:
                try:
                    os.remove(path)
                except OSError:
                    pass
        self.seconds["measure"] += time.perf_counter() - t0
        return out

    def measure(self, mods: list, args: list) -> list[Outcome]:
        """Build and time kernels; ``args[i]`` are kernel i's (shape, dtype) pairs."""
        mods, args = _without_prepack(mods, args)
        built = self.build(mods)
        paths = [b for b in built if isinstance(b, str)]
        timed = iter(self.run(paths, [a for a, b in zip(args, built) if isinstance(b, str)]))
        return [next(timed) if isinstance(b, str) else b for b in built]

    def measure_rounds(self, mods: list, args: list, groups: list, rounds: int, check=None) -> list[Outcome]:
        """Build kernels once and time them in ``rounds`` interleaved rounds: each round times each
        group's kernels back to back (``groups[i]``: kernel i's group), the order rotated by one a
        round so that none always goes first. A kernel's outcome holds all its rounds' samples, or
        the first error. ``check()`` runs before each round (Ctrl-C: see deploytool.interrupts)."""
        mods, args = _without_prepack(mods, args)
        built = self.build(mods)
        failed = {i: b for i, b in enumerate(built) if not isinstance(b, str)}
        samples: list[list[float]] = [[] for _ in built]
        try:
            for rnd in range(rounds):
                if check is not None:
                    check()
                order = []
                for g in dict.fromkeys(groups):
                    idx = [i for i, x in enumerate(groups) if x == g and i not in failed]
                    if idx:
                        k = rnd % len(idx)
                        order += idx[k:] + idx[:k]
                copies = []
                for i in order:  # run() removes what it timed
                    copies.append(f"{built[i]}.round{rnd}.so")
                    shutil.copyfile(built[i], copies[-1])
                for i, out in zip(order, self.run(copies, [args[i] for i in order])):
                    if out.error is not None:
                        failed[i] = out
                    else:
                        samples[i] += out.latency_s
        finally:
            for b in built:
                if isinstance(b, str):
                    with contextlib.suppress(OSError):
                        os.remove(b)
        return [failed.get(i) or Outcome(latency_s=samples[i]) for i in range(len(built))]

    def close(self) -> None:
        self._reset("build")
        self._reset("run")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _without_prepack(mods: list, args: list) -> tuple[list, list]:
    """Kernels as they run in a model: a kernel whose schedule packs its weights (a stage marked
    schedules.cpu.PREPACK) gets them packed at compile time (pipeline.prepack_weights), so it is
    measured without that stage, on random weights in the packed layout (MetaSchedule does the
    same: ArgInfo.from_entry_func with remove_preproc)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    strip = tvm.s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)
    out_mods, out_args = [], []
    for mod, a in zip(mods, args):
        m = strip(mod)
        b = [([int(x) for x in i.shape], str(i.dtype)) for i in ms.arg_info.ArgInfo.from_prim_func(m["main"])]
        if [list(s) for s, _ in b] != [list(s) for s, _ in a]:
            mod, a = m, b
        out_mods.append(mod)
        out_args.append(a)
    return out_mods, out_args


# --------------------------------------------------------------------------- measuring on boards
def _random_args(args: list) -> list:
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for shape, dtype in args:
        if dtype.startswith("float"):
            out.append(rng.uniform(-1, 1, size=shape).astype(dtype))
        elif dtype == "bool":
            out.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            out.append(rng.integers(0, 8, size=shape).astype(dtype))
    return out


class _BoardSlot:
    """One board in the measuring pool: its session, a thread to call it from, its input cache."""

    def __init__(self, board):
        self.board = board
        self.pool = cf.ThreadPoolExecutor(1)
        self.tensors: dict[str, list] = {}

    def time(self, path: str, args: list, settings: dict) -> list[float]:
        import tvm

        sess = self.board.session
        name = os.path.basename(path)
        sess.upload(path, name)
        try:
            lib = sess.load_module(name)
            dev = sess.cpu()
            key = repr(args)
            if key not in self.tensors:  # inputs stay on the board for the next candidate of the kernel
                self.tensors = {key: [tvm.runtime.tensor(a, dev) for a in _random_args(args)]}
            return time_cpu(lib, "main", dev, self.tensors[key], settings)
        finally:
            try:
                sess.remove(name)
            except Exception:
                pass

    def drop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.board.close()
        self.tensors = {}


class RPCMeasurer(LocalMeasurer):
    """Builds candidates here (cross-compiled) and times them on boards over TVM RPC.

    With a tracker, every free board under the key measures, one candidate each at a time. A board
    that dies mid-measurement is dropped and its candidate is measured again on another board (or on
    the same one, once it serves again); tuning goes on with the boards that remain and picks up
    boards that (re)register. With no board left, a DeviceError stops the run: every record measured
    so far is already in the log, and rerunning the command resumes."""

    MAX_TRIES = 3

    def __init__(self, target, settings: MeasureSettings, spec, workers: int | None = None, progress=None):
        super().__init__(target, settings, workers=workers)
        self.spec = spec
        self.progress = progress or (lambda msg: None)
        self.slots: list[_BoardSlot] = []
        self.lost: list[str] = []
        self._add_boards(first=True)
        self.emulated = self.slots[0].board.emulated
        arch = self.slots[0].board.info.get("arch")
        if arch and arch != target.arch:
            raise _device_error(f"the board {self.slots[0].board.name} is {arch}, and target '{target.name}' "
                                f"builds for {target.arch}", "tune on a board of the target's architecture")

    def timing(self) -> dict:
        return cpu_timing(self.settings.to_dict())  # boards time on their CPU, over RPC

    def device(self) -> dict:
        info = dict(self.slots[0].board.info) if self.slots else {}
        info.pop("address", None)
        return {"kind": "rpc", **self.spec.to_dict(), "boards": len(self.slots), **info}

    def _add_boards(self, first: bool = False) -> None:
        from deploytool import device

        if not self.spec.via_tracker:
            if not self.slots:
                self.slots.append(_BoardSlot(device.open_board(self.spec, wait_s=None if first else 15)))
            return
        want = 1 if first else 0
        try:
            free, _ = device.tracker_free(self.spec)
        except Exception:
            if first:
                raise
            return
        for i in range(max(free, want)):
            try:
                b = device.open_board(self.spec, wait_s=None if first and i == 0 else 10)
            except Exception:
                if first and i == 0:
                    raise
                break
            self.slots.append(_BoardSlot(b))
        if first and len(self.slots) > 1:
            self.progress(f"measuring on {len(self.slots)} boards under key '{self.spec.key}'")

    def _replace(self, slot: _BoardSlot, why: str) -> None:
        """Drop a board whose session died; reconnect if it serves again (or another board is free)."""
        from deploytool import device

        self.slots.remove(slot)
        slot.drop()
        try:
            self.slots.append(_BoardSlot(device.open_board(self.spec, wait_s=15)))
            self.progress(f"board {slot.board.name} lost its session ({why}); reconnected")
        except Exception:
            self.lost.append(slot.board.name)
            self.progress(f"board {slot.board.name} lost ({why}); {len(self.slots)} board(s) left")

    def run(self, paths: list[str], args: list) -> list[Outcome]:
        import collections

        t0 = time.perf_counter()
        if self.spec.via_tracker:
            self._add_boards()
        s = self.settings.to_dict()
        timeout = self.settings.run_timeout_s * (10 if self.emulated else 1)
        results: dict[int, Outcome] = {}
        tries = collections.Counter()
        pending = collections.deque(range(len(paths)))
        running: dict[cf.Future, tuple[_BoardSlot, int, float]] = {}
        try:
            while pending or running:
                busy = {slot for slot, _, _ in running.values()}
                for slot in [sl for sl in self.slots if sl not in busy]:
                    if not pending:
                        break
                    i = pending.popleft()
                    running[slot.pool.submit(slot.time, paths[i], args[i], s)] = (slot, i, time.monotonic() + timeout)
                if not running:
                    raise _device_error(
                        f"lost every board ({', '.join(self.lost) or self.spec.describe()}); {len(pending)} candidate(s) "
                        "of this batch were not measured",
                        "restart the board(s) and rerun the same command: the tuning log keeps everything measured "
                        "so far and the run resumes")
                wait = max(0.1, min(d for _, _, d in running.values()) - time.monotonic())
                done, _ = cf.wait(list(running), timeout=wait, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    slot, i, _ = running.pop(fut)
                    try:
                        results[i] = Outcome(latency_s=fut.result())
                    except Exception as e:
                        if slot.board.alive():  # the session answers: the candidate itself failed
                            results[i] = Outcome(error=_one_line(e))
                            continue
                        tries[i] += 1
                        self._replace(slot, _one_line(e))
                        if tries[i] >= self.MAX_TRIES:
                            results[i] = Outcome(error=f"the board's session died {tries[i]} times measuring it: "
                                                       f"{_one_line(e)}")
                        else:
                            pending.appendleft(i)  # measured again, on whichever board is free
                now = time.monotonic()
                for fut, (slot, i, deadline) in list(running.items()):
                    if now > deadline and not fut.done():
                        running.pop(fut)
                        results[i] = Outcome(error=f"run timed out after {timeout:.0f} s on board {slot.board.name}")
                        self._replace(slot, "a candidate ran past the time limit")
        finally:
            for p in paths:
                try:
                    os.remove(p)
                except OSError:
                    pass
            self.seconds["measure"] += time.perf_counter() - t0
        return [results[i] for i in range(len(paths))]

    def close(self) -> None:
        for slot in self.slots:
            slot.drop()
        self.slots = []
        super().close()


def _device_error(problem: str, fix: str):
    from deploytool.errors import DeviceError

    return DeviceError(problem, fix)


def _one_line(e: BaseException) -> str:
    """The exception's last meaningful line; a compiler's report (NVRTC's ends in a NUL after its
    summary) gives its first error line instead."""
    lines = [ln.strip() for ln in str(e).replace("\x00", "").strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if " error: " in ln or ln.startswith("error")]
    return f"{type(e).__name__}: {errors[0] if errors else lines[-1] if lines else ''}"[:300]
