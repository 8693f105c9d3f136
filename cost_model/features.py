"""Candidate features: MetaSchedule's per-store features, summarized to a fixed length."""

from __future__ import annotations

import numpy as np

PER_STORE = 164
LENGTH = 4 * PER_STORE + 1


def extractor():
    from tvm.s_tir import meta_schedule as ms

    return ms.feature_extractor.PerStoreFeature(extract_workload=False)


def summarize(per_store: np.ndarray) -> np.ndarray:
    """(stores, 164) -> (4 * 164 + 1,): the heaviest store's own features (most floating-point
    multiply-adds, adds and multiplies: the kernel's main loop nest, whose tiling, vectorization
    and unrolling decide its speed), then the mean, max and sum over all stores, then the store
    count."""
    per_store = np.asarray(per_store, dtype=np.float32)
    if per_store.ndim != 2 or per_store.shape[0] == 0:
        return np.zeros(LENGTH, dtype=np.float32)
    heavy = per_store[int(np.argmax(per_store[:, 0] + per_store[:, 1] + per_store[:, 2]))]
    return np.concatenate([heavy, per_store.mean(0), per_store.max(0), per_store.sum(0),
                           np.array([np.log2(1 + per_store.shape[0])], dtype=np.float32)])


def from_candidates(context, candidates, fe=None) -> np.ndarray:
    """(len(candidates), LENGTH) features of MetaSchedule measure candidates."""
    fe = fe or extractor()
    feats = fe.extract_from(context, list(candidates))
    return np.stack([summarize(f.numpy()) for f in feats]) if feats else np.zeros((0, LENGTH), np.float32)
