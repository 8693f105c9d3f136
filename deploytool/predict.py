"""Prediction-only scheduling (``compile --predict``): schedules picked by the cost model alone, with
nothing measured -- for targets that cannot be measured (a board you don't have, microcontrollers
behind no RPC) or when there is no time to tune.

Per kernel: the default schedule plus ``samples`` schedules a few mutations away from it (the
tuner's own mutators on its knobs, postprocessors applied exactly as the tuner would measure
them), featurized like the tuner does, ranked by the pretrained model; the top one replaces the
default when the model predicts it ``MARGIN`` faster. How close this gets to measured tuning is
benchmarked in bench/pretrain.py.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)
# a sample replaces the default schedule only if the model predicts it this much faster (the
# labels are log(best / latency), so 0.3 ~ 1.35x)
MARGIN = 0.3


def _apply(wmod, trace, postprocs):
    """A schedule of ``wmod`` from ``trace`` with the postprocessors applied, or None."""
    from tvm import s_tir

    sch = s_tir.Schedule(wmod)
    try:
        trace.apply_to_schedule(sch, remove_postproc=True)
        for p in postprocs:
            if not p.apply(sch):
                return None
    except Exception:
        return None
    return sch


def _candidates(wmod, target, samples: int, seed: int):
    """The TuneContext, and the default schedule followed by up to ``samples`` schedules a few
    mutations away from it (none at all when no default rule applies): its
    register tile, parallel extent and unroll knobs changed by the tuner's own mutators (a walk from
    the default, each step from a random earlier point). Near the default is where the tuning logs
    the model learned from have most of their records; uniform samples of the whole tiling space
    were ranked badly (README)."""
    import random

    from tvm.s_tir import meta_schedule as ms

    from deploytool.schedules import space

    with space.tensor_intrinsics(target):
        ctx = ms.TuneContext(mod=wmod, target=target.tvm_target(), space_generator=space.space_generator(target, True),
                             task_name="predict", rand_state=seed or 1, num_threads=1)
    post = list(ctx.space_generator.postprocs)
    mutators = list(ctx.space_generator.mutator_probs.items())
    try:
        default = space.default_candidate(target, wmod)
    except Exception as e:  # no default rule for this kernel
        log.debug("no default schedule: %s", e)
        return ctx, []
    out = [default]
    pool = [default.trace]
    seen = {str(default.trace)}
    rng = random.Random(seed)
    tries = 0
    while len(out) < samples + 1 and tries < 8 * samples and mutators:
        tries += 1
        m = rng.choices([m for m, _ in mutators], weights=[float(p) for _, p in mutators])[0]
        try:
            t = m.apply(rng.choice(pool))
        except Exception:
            t = None
        if t is None or str(t) in seen:
            continue
        seen.add(str(t))
        sch = _apply(wmod, t, post)
        if sch is not None:
            pool.append(t)
            out.append(sch)
    return ctx, out


def predict_schedules(mod, target, model_file, samples: int = 64, seed: int = 0, report: dict | None = None,
                      margin: float | None = None):
    """Schedule every not-yet-scheduled kernel of ``mod`` with the candidate ``model_file`` ranks
    first, where that is not the default schedule; ``report`` gets kernel name -> "predicted" for
    those (the others are left to the default rules, which report them as usual)."""
    from tvm.s_tir import meta_schedule as ms

    from deploytool.cost_model import features as F
    from deploytool.cost_model.model import XGBCostModel
    from deploytool.schedules.space import as_scheduled, tuning_module, unscheduled_kernels

    margin = MARGIN if margin is None else margin
    model = XGBCostModel(nthread=None)
    model.start_from(model_file)
    fe = F.extractor()
    for gv, func in unscheduled_kernels(mod):
        wmod = tuning_module(func, target)
        ctx, cands = _candidates(wmod, target, samples, seed)
        if len(cands) < 2:
            continue
        args = ms.arg_info.ArgInfo.from_prim_func(wmod["main"])
        scores = model.predict(F.from_candidates(ctx, [ms.MeasureCandidate(s, args) for s in cands], fe))
        best = int(np.argmax(scores))
        # cands[0] is the default: a sample must be predicted clearly faster; otherwise the default
        # rules schedule (and report) the kernel, as without --predict
        if best == 0 or scores[best] - scores[0] < margin:
            continue
        mod[gv] = as_scheduled(func, cands[best])
        if report is not None:
            report[gv.name_hint] = "predicted"
    return mod
