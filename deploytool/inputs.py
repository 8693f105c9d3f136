"""Model inputs: seeded random defaults, .npz files checked against the model, output files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from deploytool.artifact import TensorSpec
from deploytool.errors import InputError


def random_inputs(specs: list[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: N(0, 1) for floats, small non-negative ints (safe as indices), random bools."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in specs:
        dt = np.dtype(s.dtype)
        if dt.kind == "f":
            out[s.name] = rng.standard_normal(s.shape).astype(dt)
        elif dt.kind in "iu":
            out[s.name] = rng.integers(0, 4, size=s.shape).astype(dt)
        elif dt.kind == "b":
            out[s.name] = rng.integers(0, 2, size=s.shape).astype(bool)
        else:
            raise InputError(f"input {s.name} has dtype {s.dtype}, for which no random data is made",
                             "pass inputs with --inputs file.npz")
    return out


def load_inputs(path: str | Path, specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Load an .npz (or a single-input .npy) and check names, shapes and dtypes against the model."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"inputs file '{path}' not found", "check the path")
    try:
        if path.suffix == ".npy":
            if len(specs) != 1:
                raise InputError(f"'{path}' is a single .npy but the model has {len(specs)} inputs",
                                 "pass an .npz with one array per input name")
            arrays = {specs[0].name: np.load(path, allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"'{path}' is not a readable .npz/.npy file ({type(e).__name__})",
                         "save inputs with numpy.savez(path, name=array, ...)") from None
    by_name = {s.name: s for s in specs}
    by_tvm = {s.tvm_name: s for s in specs}
    fixed: dict[str, np.ndarray] = {}
    for key, arr in arrays.items():
        spec = by_name.get(key) or by_tvm.get(key)
        if spec is None:
            raise InputError(f"'{path}' has array '{key}', which is not a model input",
                             f"name arrays after the inputs: {', '.join(by_name)}")
        if tuple(arr.shape) != tuple(spec.shape):
            raise InputError(f"input {spec.name} has shape {list(arr.shape)} in '{path}', the model wants {list(spec.shape)}",
                             "reshape the array, or recompile with --input-shape")
        if np.dtype(arr.dtype) != np.dtype(spec.dtype):
            raise InputError(f"input {spec.name} has dtype {arr.dtype} in '{path}', the model wants {spec.dtype}",
                             f"convert it with .astype('{spec.dtype}')")
        fixed[spec.name] = arr
    missing = [n for n in by_name if n not in fixed]
    if missing:
        raise InputError(f"'{path}' lacks input(s) {', '.join(missing)}", "add an array for each model input")
    return fixed


def save_outputs(path: str | Path, outputs: dict[str, np.ndarray]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **outputs)
