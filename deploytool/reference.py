"""onnxruntime as the reference: same inputs, same thread count, and the comparison report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deploytool.errors import ModelError


def ort_session(model_path: str | Path, threads: int | None = None, model_bytes: bytes | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model_bytes if model_bytes is not None else str(model_path), so,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        raise ModelError(f"onnxruntime cannot load '{model_path}': {str(e).strip().splitlines()[0][:300]}",
                         "check the model with 'deploytool inspect'") from None


def ort_run(session, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    feed = {i.name: inputs[i.name] for i in session.get_inputs() if i.name in inputs}
    return dict(zip(names, session.run(names, feed)))


@dataclass(frozen=True)
class OutputComparison:
    name: str
    max_abs_err: float
    max_rel_err: float      # max |a - b| / max|ref|: the error relative to the output's scale
    ref_scale: float
    tolerance: float
    ok: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def compare(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], rtol: float) -> list[OutputComparison]:
    """Compare every output. The relative error is taken against the output's scale (max |ref|),
    so that outputs near zero do not blow up elementwise ratios."""
    report = []
    for name, ref in reference.items():
        got = outputs[name]
        ref64, got64 = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
        if ref64.shape != got64.shape:
            report.append(OutputComparison(name, float("inf"), float("inf"), 0.0, rtol, False))
            continue
        if ref64.size == 0:
            report.append(OutputComparison(name, 0.0, 0.0, 0.0, rtol, True))
            continue
        # NaN and inf must sit in the same places with the same values (NaN matches NaN).
        same_nonfinite = np.array_equal(~np.isfinite(ref64), ~np.isfinite(got64)) and np.array_equal(
            ref64[~np.isfinite(ref64)], got64[~np.isfinite(ref64)], equal_nan=True)
        fin = np.isfinite(ref64)
        diff = np.abs(ref64[fin] - got64[fin]) if fin.any() else np.zeros(1)
        scale = float(np.max(np.abs(ref64[fin]))) if fin.any() else 0.0
        abs_err = float(diff.max()) if diff.size else 0.0
        rel = abs_err / scale if scale > 0 else abs_err
        exact_kind = np.dtype(ref.dtype).kind in "iub"
        ok = same_nonfinite and (abs_err == 0.0 if exact_kind else rel <= rtol)
        report.append(OutputComparison(name, abs_err if same_nonfinite else float("nan"),
                                       rel if same_nonfinite else float("nan"), scale, rtol, bool(ok)))
    return report
