"""The XGBoost cost model the tuner uses to rank candidate schedules.

* ``features``: a fixed-length vector per candidate, built from MetaSchedule's per-store features
  (164 per buffer store: arithmetic, memory access, loop structure, parallelism, vectorization):
  the heaviest store's own features, then the mean, max and sum over the kernel's stores, and
  the store count.
* ``model.XGBCostModel``: gradient-boosted trees regressing log(best / latency) within each kernel
  (workload): 0 for the kernel's best candidate, negative for slower ones, failures pinned low.
  Ranking inside a kernel is what the search needs; absolute speed across kernels is not. The log
  spreads the slow end out (MetaSchedule regresses best / latency, which squeezes every slow
  candidate towards 0). Pairwise-ranking objectives were measured too and did no better
  (bench/cost_model.py).
* ``model.TunerCostModel``: the MetaSchedule adapter (update/predict on measure candidates), with
  adaptive retraining and a warm start from a tuning log.
* ``dataset``: (features, latency, group) rows rebuilt from tuning logs, for training and for the
  held-out ranking evaluation against MetaSchedule's own XGBModel.
* ``pretrain``: training sets per target family built from any tuning logs (``data/``), pretrained
  models (``pretrained/<family>.ubj``) that ``tune`` starts from and fine-tunes, and the
  leave-one-model-out evaluation (bench/pretrain.py).

This package knows nothing of the CLI or of targets' toolchains.
"""
