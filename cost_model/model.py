"""The XGBoost ranking model and its MetaSchedule adapter."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
import os
import time
from pathlib import Path

import numpy as np

from deploytool.cost_model import features as F

log = logging.getLogger(__name__)

FAILED = 1e10
# With a pretrained model, a kernel's score blends it with a model of this run's measurements alone:
# weight min(1, n / BLEND_RECORDS) on the latter after n of this kernel's records. A kernel the run
# has not measured yet is ranked by the pretrained model alone. Before (until 2026-12-07), each refit
# continued the pretrained booster with 50 trees on the run's records: fitted to the first kernels
# measured, those trees moved the ranking of kernels they had never seen. Replayed offline on six
# held-out models, 3 seeds (bench/finetune_sim.py: each model's logged records as the candidate
# pool, round robin, first round 4 then 8 per kernel), the blend's kernels summed to 1.187x their
# pools' best after the first rounds against 1.230x, and 1.024x against 1.030x after 28 trials each
# (MobileNetV2 1.130 vs 1.229 after the first round, BERT 1.153 vs 1.250). It lost on Inception v1
# (1.345 vs 1.302), whose many similar kernels gained from trees fitted to the first ones. n / 32
# blended as well as z-normalized scores and better than n / 64.
BLEND_RECORDS = 32


def normalized_throughput(latencies: np.ndarray) -> np.ndarray:
    """best / latency per candidate of ONE kernel (failures and inf: 0)."""
    lat = np.asarray(latencies, dtype=np.float64)
    ok = np.isfinite(lat) & (lat < FAILED) & (lat > 0)
    if not ok.any():
        return np.zeros_like(lat)
    best = lat[ok].min()
    return np.where(ok, best / np.where(ok, lat, 1.0), 0.0)


class XGBCostModel:
    """Gradient-boosted trees over candidate features; data grouped by kernel (workload)."""

    def __init__(self, objective: str = "reg:squarederror", nthread: int | None = None, seed: int = 0,
                 num_rounds: int = 200, max_depth: int = 8, eta: float = 0.2, label: str = "log-throughput"):
        self.objective = objective
        self.label = label
        self.params = {"objective": objective, "max_depth": max_depth, "eta": eta, "min_child_weight": 0,
                       "gamma": 0.0001, "subsample": 1.0, "seed": seed, "verbosity": 0,
                       "nthread": nthread or (os.cpu_count() or 1), "tree_method": "hist"}
        if objective.startswith("rank:"):
            self.params["lambdarank_pair_method"] = "topk"
            self.params["lambdarank_num_pair_per_sample"] = 8
        self.num_rounds = num_rounds
        self.groups: dict[str, tuple[list[np.ndarray], list[float]]] = {}
        self.booster = None
        # a pretrained booster: blended per kernel with ``booster``, a model of this run's
        # measurements alone (see BLEND_RECORDS)
        self.base = None
        self.trained_on = 0
        self.fit_seconds = 0.0

    # ------------------------------------------------------------------ data
    @property
    def size(self) -> int:
        return sum(len(v[1]) for v in self.groups.values())

    def add(self, group: str, feats: np.ndarray, latencies) -> None:
        xs, ys = self.groups.setdefault(group, ([], []))
        xs.extend(np.asarray(feats, dtype=np.float32))
        ys.extend(float(x) for x in latencies)

    def _matrix(self):
        X, y, qid = [], [], []
        for gi, (xs, lat) in enumerate(self.groups.values()):
            if not xs:
                continue
            X.append(np.stack(xs))
            t = normalized_throughput(np.array(lat))
            if self.objective.startswith("rank:"):  # integer relevance grades: 0..30
                y.append(np.round(t * 30))
            elif self.label == "log-throughput":  # log(best / latency): spreads the slow end out
                y.append(np.where(t > 0, np.log(np.maximum(t, 1e-6)), np.log(1e-3)))
            else:
                y.append(t)
            qid.append(np.full(len(xs), gi))
        return np.concatenate(X), np.concatenate(y), np.concatenate(qid)

    # ------------------------------------------------------------------ training
    def fit(self) -> None:
        import xgboost as xgb

        if self.size < 2:
            return
        t0 = time.perf_counter()
        X, y, qid = self._matrix()
        d = xgb.DMatrix(X, label=y, qid=qid) if self.objective.startswith("rank:") else xgb.DMatrix(X, label=y)
        self.booster = xgb.train(self.params, d, num_boost_round=self.num_rounds)
        self.trained_on = self.size
        self.fit_seconds += time.perf_counter() - t0

    def predict(self, feats: np.ndarray, group: str | None = None) -> np.ndarray:
        """Scores of candidates of the kernel ``group`` (higher: faster). Without a pretrained model:
        this run's model, or random before it has one. With one: the pretrained model's score,
        blended with this run's model's by how many of ``group``'s records the run has (see
        BLEND_RECORDS); both predict the same label, log(best / latency) within a kernel."""
        import xgboost as xgb

        if (self.booster is None and self.base is None) or len(feats) == 0:
            return np.random.default_rng().uniform(0, 1, len(feats))
        d = xgb.DMatrix(np.asarray(feats, dtype=np.float32))
        if self.base is None:
            return self.booster.predict(d)
        base = self.base.predict(d)
        a = min(1.0, len(self.groups.get(group, ((), ()))[1]) / BLEND_RECORDS) if self.booster is not None else 0.0
        return base if a == 0 else (1 - a) * base + a * self.booster.predict(d)

    def start_from(self, path: str | Path) -> None:
        """Use the pretrained model at ``path`` (see cost_model.pretrain) as the starting point."""
        import xgboost as xgb

        meta = json.loads(Path(path).with_suffix(".meta.json").read_text())
        if meta.get("feature_length") != F.LENGTH or meta.get("label", "log-throughput") != self.label:
            raise ValueError(f"'{path}' was trained on other features or labels "
                             f"({meta.get('feature_length')} features, label {meta.get('label')})")
        self.base = xgb.Booster(model_file=str(path))
        self.base.set_param({"nthread": self.params["nthread"]})

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.booster is None:
            raise ValueError("the model is not trained")
        self.booster.save_model(str(path))
        meta = {"objective": self.objective, "label": self.label, "features": "per-store-summary", "feature_length": F.LENGTH,
                "trained_on": self.trained_on, "groups": len(self.groups), "params": self.params}
        path.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, nthread: int | None = None) -> XGBCostModel:
        import xgboost as xgb

        path = Path(path)
        meta = json.loads(path.with_suffix(".meta.json").read_text())
        m = cls(objective=meta["objective"], nthread=nthread, label=meta.get("label", "log-throughput"))
        m.booster = xgb.Booster(model_file=str(path))
        m.booster.set_param({"nthread": m.params["nthread"]})
        m.trained_on = meta.get("trained_on", 0)
        return m


def make_tuner_cost_model(model: XGBCostModel, warmup: int = 16):
    """A MetaSchedule cost model (PyCostModel) over ``model``: it learns from every measured batch
    and retrains when the data grew by a fifth since the last fit (as MetaSchedule's XGBModel)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.ir.utils import derived_object

    from deploytool.schedules.space import kernel_hash

    @derived_object
    class TunerCostModel(ms.cost_model.PyCostModel):
        def __init__(self):
            super().__init__()
            self.model = model
            self.fe = F.extractor()
            self.seconds = 0.0
            self.warmup = warmup
            self.cache: OrderedDict = OrderedDict()
            self.cache_size = 20000

        def load(self, path: str) -> None:  # the tuner warm-starts from logs instead
            pass

        def save(self, path: str) -> None:
            pass

        def features(self, context, candidates) -> np.ndarray:
            """Features per candidate, cached by the scheduled kernel's structural hash: the
            evolutionary search re-scores the same schedules across generations and rounds, and
            extraction (~6 ms a candidate) is most of the cost model's time."""
            keys = [tvm_ffi.structural_hash(c.sch.mod) for c in candidates]
            miss = [i for i, k in enumerate(keys) if k not in self.cache]
            if miss:
                new = F.from_candidates(context, [candidates[i] for i in miss], self.fe)
                for i, row in zip(miss, new):
                    self.cache[keys[i]] = row
            out = np.stack([self.cache[k] for k in keys]) if keys else np.zeros((0, F.LENGTH), np.float32)
            for k in keys:  # least recently used go first
                self.cache.move_to_end(k)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
            return out

        def update(self, context, candidates, results) -> None:
            t0 = time.perf_counter()
            feats = self.features(context, candidates)
            lat = [_median(r.run_secs) if r.run_secs else FAILED for r in results]
            self.model.add(kernel_hash(context.mod), feats, lat)
            if self.model.size >= self.warmup and self.model.size - self.model.trained_on >= max(
                    1, self.model.trained_on // 5):
                self.model.fit()
            self.seconds += time.perf_counter() - t0

        def predict(self, context, candidates) -> np.ndarray:
            t0 = time.perf_counter()
            if self.model.booster is None and self.model.base is None:
                out = np.random.default_rng().uniform(0, 1, len(candidates))
            else:
                out = score(self.model.predict(self.features(context, candidates), kernel_hash(context.mod)))
            self.seconds += time.perf_counter() - t0
            return np.asarray(out, dtype="float64")

    return TunerCostModel()


def score(pred: np.ndarray) -> np.ndarray:
    """The evolutionary search's score of a predicted log(best / latency): exp, the predicted
    normalized throughput (MetaSchedule's scale), positive as MetaSchedule needs (it clips at 0).
    One fixed map, so that scores of different predict calls compare: the search keeps one heap of
    the best candidates across its generations, each scored in a call of its own. Until 2026-12-07
    each call's scores were shifted by that call's minimum; later generations, whose worst is
    better, scored lower for the same prediction (SqueezeNet: a generation's best at -0.104
    scored 3.45 against the previous generation's -0.268 at 3.59), so the heap kept the first,
    mostly random, generation's candidates over the evolved ones."""
    return np.exp(np.clip(np.asarray(pred, dtype=np.float64), -40.0, 40.0))


def metaschedule_xgb(nthread: int | None = None, seed: int = 0):
    """MetaSchedule's own XGBModel as the baseline uses it (adaptive training, quiet)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.cost_model.XGBModel(config=ms.cost_model.xgb_model.XGBConfig(seed=seed, nthread=nthread),
                                  verbose_eval=0, adaptive_training=True)


def make_metaschedule_cost_model(nthread: int | None = None, seed: int = 0, pretrained=None):
    """MetaSchedule's own XGBModel (its per-store features, rank objective and adaptive training),
    timed like ours: the baseline our cost model is measured against (``--cost-model
    metaschedule``). From scratch it learns from this run's measurements only; ``pretrained`` (a
    file from ``pretrain train-metaschedule``) loads a model and the records it was trained on, as
    MetaSchedule's own ``XGBModel.load`` does: each retraining then uses both (``--cost-model
    metaschedule:FILE``)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    inner = metaschedule_xgb(nthread, seed)
    if pretrained is not None:
        inner.load(str(pretrained))

    @derived_object
    class TimedXGBModel(ms.cost_model.PyCostModel):
        def __init__(self):
            super().__init__()
            self.seconds = 0.0

        def load(self, path: str) -> None:
            inner.load(path)

        def save(self, path: str) -> None:
            inner.save(path)

        def update(self, context, candidates, results) -> None:
            t0 = time.perf_counter()
            inner.update(context, candidates, results)
            self.seconds += time.perf_counter() - t0

        def predict(self, context, candidates) -> np.ndarray:
            t0 = time.perf_counter()
            out = np.asarray(inner.predict(context, candidates), dtype="float64")
            self.seconds += time.perf_counter() - t0
            return out

    return TimedXGBModel()


def _median(xs) -> float:
    v = sorted(float(x) for x in xs)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
