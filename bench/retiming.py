"""What bench/retime.py and bench/retime_curve.py share: a model's kernels as the pipeline makes them
today, and candidates of them timed side by side, cold, in interleaved rounds
(``LocalMeasurer.measure_rounds``: a kernel's candidates back to back, each round in turn)."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@dataclass
class Kernels:
    """A model's tuning tasks for a target, each with its tuning module and argument shapes."""

    target: object
    tasks: list
    modules: list
    args: list

    def replay(self, ti: int, trace):
        """Task ``ti``'s candidate that ``trace`` (a record's) describes, as a module to build."""
        from deploytool.schedules import space

        return space.replay_trace(self.modules[ti], trace).mod


def kernels(model, target: str) -> Kernels:
    from tvm.s_tir import meta_schedule as ms

    from deploytool import frontend, pipeline, targets
    from deploytool.schedules import space

    tgt = targets.load(target)
    mod = pipeline.partition(pipeline.optimize(frontend.import_onnx(model).mod, tgt), tgt)
    tasks = pipeline.tasks(mod)
    modules = [space.tuning_module(mod[t.name], tgt) for t in tasks]
    args = [[([int(n) for n in x.shape], str(x.dtype)) for x in ms.arg_info.ArgInfo.from_prim_func(mod[t.name])]
            for t in tasks]
    return Kernels(tgt, tasks, modules, args)


def time_side_by_side(k: Kernels, jobs: list[tuple[int, object]], rounds: int) -> list:
    """``jobs``: (task index, built-able module) pairs. Each job's median over ``rounds`` interleaved
    rounds, in seconds (None where it failed), and each job's measure output (for its error)."""
    from deploytool.measure import LocalMeasurer, MeasureSettings

    me = LocalMeasurer(k.target, MeasureSettings())
    try:
        outs = me.measure_rounds([m for _, m in jobs], [k.args[ti] for ti, _ in jobs], [ti for ti, _ in jobs], rounds)
    finally:
        me.close()
    return [(statistics.median(o.latency_s) if o.latency_s else None, o) for o in outs]
