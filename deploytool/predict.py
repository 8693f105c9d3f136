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
    """The default schedule, then up to ``samples`` schedules a few mutations away from it: its
    register tile, parallel extent and unroll knobs changed by the tuner's own mutators (a walk from
    the default, each step from a random earlier point). Near the default is where the tuning logs
    the model learned from have most of their records; uniform samples of the whole tiling space
    were ranked badly (README)."""
    import random

    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from deploytool.schedules import space

    with space.without_tensor_intrinsics(target):
        ctx = ms.TuneContext(mod=wmod, target=target.tvm_target(), space_generator=space.space_generator(target, True),
                             task_name="predict", rand_state=seed or 1, num_threads=1)
    post = list(ctx.space_generator.postprocs)
    mutators = list(ctx.space_generator.mutator_probs.items())
    try:
        default = space.default_schedule_fn(target)(s_tir.Schedule(wmod))
    except Exception as e:  # no default rule for this kernel
        log.debug("no default schedule: %s", e)
        return ctx, []
    out = [("default", default)]
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
            out.append(("predicted", sch))
    return ctx, out


def predict_schedules(mod, target, model_file, samples: int = 64, seed: int = 0, report: dict | None = None,
                      margin: float | None = None):
    """Schedule every not-yet-scheduled kernel of ``mod`` with the candidate ``model_file`` ranks
    first. ``report`` gets kernel name -> "predicted" or "default" (the default won)."""
    from tvm import tirx
    from tvm.s_tir import meta_schedule as ms

    from deploytool.cost_model import features as F
    from deploytool.cost_model.model import XGBCostModel
    from deploytool.schedules.space import workload_module

    margin = MARGIN if margin is None else margin
    model = XGBCostModel(nthread=None)
    model.start_from(model_file)
    fe = F.extractor()
    updated = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and func.attrs.get("tirx.is_scheduled", False)):
            continue
        wmod = workload_module(func)
        ctx, cands = _candidates(wmod, target, samples, seed)
        if not cands:
            continue
        args = ms.arg_info.ArgInfo.from_prim_func(wmod["main"])
        feats = F.from_candidates(ctx, [ms.MeasureCandidate(s, args) for _, s in cands], fe)
        scores = model.predict(feats)
        best = int(np.argmax(scores))
        kind, sch = cands[best]
        if cands[0][0] == "default" and scores[best] - scores[0] < margin:
            kind, sch = cands[0]  # not predicted clearly faster than the default: keep the default
        if report is not None:
            report[gv.name_hint] = kind
        if kind == "default":  # scheduled (and reported) by the default rules, as without --predict
            continue
        new = sch.mod["main"].without_attr("global_symbol")
        if func.attrs is not None and "global_symbol" in func.attrs:
            new = new.with_attr("global_symbol", func.attrs["global_symbol"])
        updated[gv] = new.with_attr("tirx.is_scheduled", True)
    for gv, func in updated.items():
        mod[gv] = func
    return mod
