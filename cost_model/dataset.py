"""Training data from tuning logs: each record's trace replayed on its workload, featurized."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Group:
    """The measured candidates of one workload, in log order."""

    workload: str
    name: str
    mod: object                 # the workload IRModule
    schedules: list             # tirx Schedules, one per record
    latencies: np.ndarray       # seconds; 1e10 for failures
    feats: np.ndarray           # (n, features.LENGTH)

    def candidates(self):
        from tvm.s_tir import meta_schedule as ms

        args = ms.arg_info.ArgInfo.from_prim_func(self.mod["main"])
        return [ms.MeasureCandidate(s, args) for s in self.schedules]


def context(mod, target):
    from tvm.s_tir import meta_schedule as ms

    from deploytool.schedules.space import tensor_intrinsics

    with tensor_intrinsics(target):
        return ms.TuneContext(mod=mod, target=target.tvm_target(), task_name="dataset", num_threads=1)


def groups_from_log(tlog, target, min_records: int = 8, featurize: bool = True) -> list[Group]:
    """One Group per workload (and machine: latencies rank only within one machine's records) of
    ``tlog`` with at least ``min_records`` replayable records (``featurize=False``: without our
    features, for a model that makes its own). A group of another machine than the header's is
    named ``<hash>@<machine>``."""
    import tvm

    from deploytool.cost_model import features as F
    from deploytool.schedules.space import replay_trace, workload_module

    fe = F.extractor()
    out = []
    for (h, dev), recs in tlog.by_workload_and_device().items():
        w = tlog.workloads.get(h)
        if w is None or len(recs) < min_records:
            continue
        mod = workload_module(tvm.ir.load_json(w.ir))
        schs, lats = [], []
        for r in recs:
            try:
                schs.append(replay_trace(mod, r.trace))
            except Exception:  # not replayable with this TVM: skip
                continue
            lats.append(r.seconds if r.ok else 1e10)
        if len(schs) < min_records:
            continue
        g = Group(h if dev == tlog.home else f"{h}@{dev}", w.name, mod, schs, np.array(lats),
                  np.zeros((0, F.LENGTH), np.float32))
        if featurize:
            g.feats = F.from_candidates(context(mod, target), g.candidates(), fe)
        out.append(g)
    return out


def pairwise_accuracy(scores: np.ndarray, latencies: np.ndarray) -> tuple[int, int]:
    """(correctly ordered pairs, pairs) among valid candidates with different latencies: a pair is
    right when the faster candidate scores higher."""
    ok = latencies < 1e10
    s, lat = scores[ok], latencies[ok]
    right = total = 0
    for i in range(len(lat)):
        for j in range(i + 1, len(lat)):
            if abs(lat[i] - lat[j]) <= 0.01 * min(lat[i], lat[j]):
                continue  # within noise: not a pair
            total += 1
            right += (s[i] > s[j]) == (lat[i] < lat[j])
    return right, total


def top_k_recall(scores: np.ndarray, latencies: np.ndarray, k: int) -> float:
    """Of the k truly fastest candidates, the fraction the model also puts in its top k."""
    k = min(k, len(latencies))
    true = set(np.argsort(latencies)[:k].tolist())
    pred = set(np.argsort(-scores)[:k].tolist())
    return len(true & pred) / k if k else float("nan")
