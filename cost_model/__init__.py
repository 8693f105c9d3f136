"""The XGBoost cost model the tuner uses to rank candidate schedules.

* ``features``: a fixed-length vector per candidate, built from MetaSchedule's per-store features
  (164 per buffer store: arithmetic, memory access, loop structure, parallelism, vectorization)
  summarized over the stores of the kernel (mean, max, sum) plus the store count.
* ``model.XGBCostModel``: gradient-boosted trees trained with a pairwise ranking objective, one
  query group per kernel (workload), on normalized throughput (the group's best latency / this
  candidate's latency; failures score 0). Ranking inside a kernel is what the search needs;
  absolute speed across kernels is not.
* ``model.TunerCostModel``: the MetaSchedule adapter (update/predict on measure candidates), with
  adaptive retraining and a warm start from a tuning log.
* ``dataset``: (features, latency, group) rows rebuilt from tuning logs, for training and for the
  held-out ranking evaluation against MetaSchedule's own XGBModel.

This package knows nothing of the CLI or of targets' toolchains.
"""
