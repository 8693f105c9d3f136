"""The XGBoost cost model."""
