"""ONNX conformance: the official backend node tests through deploytool's own import, compile and run.

Each case of ``onnx.backend.test`` (``kind="node"``: a one-node model with inputs and reference
outputs) is imported with deploytool's frontend, optimized, partitioned, scheduled and built for
the host (x86 preset) by deploytool's pipeline, run in the relax VM and compared with the reference
at the case's own tolerances. Cases run in a pool of worker processes (each imports TVM once and
generates the cases once), one at a time per worker, with a time limit; a case that crashes or
hangs its worker costs only itself.

Left out by design (the issue's fixed list): training ops (losses, Gradient, Momentum, Adam,
Adagrad), cases whose inputs or outputs are sequences, optionals or maps, and string ops.

    python -m deploytool.conformance [--jobs N] [--only REGEX] [--json OUT]
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import re
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field

STATUSES = ("pass", "import_error", "compile_error", "run_error", "wrong", "crash", "timeout")
_TRAINING = re.compile(r"^test_(softmax_cross_entropy|sce|nllloss|negative_log_likelihood|gradient|momentum|"
                       r"nesterov_momentum|adam|adagrad|ai_onnx_preview_training)")


@dataclass
class CaseResult:
    name: str
    status: str
    ops: list[str] = field(default_factory=list)
    message: str = ""
    seconds: float = 0.0


def _generate():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.loader import load_model_tests

        return {c.name: c for c in load_model_tests(kind="node")}


def _cases():
    """The node cases by name. onnx generates them by running its reference implementations (12 s
    in every process that asks: each pool worker, each pytest worker): they are generated once per
    onnx and numpy version and kept in the cache (10 MB; DEPLOYTOOL_CACHE, ~/.cache/deploytool)."""
    import pickle

    import numpy as np
    import onnx
    from onnx.backend.test.case.test_case import TestCase

    from deploytool.emulator import cache_root

    path = cache_root() / "conformance" / f"node-cases-onnx{onnx.__version__}-numpy{np.__version__}.pkl"
    try:
        stored = pickle.loads(path.read_bytes())
    except Exception:  # missing, or not readable by this Python/onnx: generate again
        stored = None
    if stored is None:
        cases = _generate()
        stored = {n: (c.model_name, c.model.SerializeToString(), c.data_sets, c.kind, c.rtol, c.atol)
                  for n, c in cases.items()}
        try:  # write then rename: concurrent shards never read half a file
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(stored, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(tmp, path)
        except OSError:
            pass
        return cases
    return {n: TestCase(n, model_name, None, None, onnx.load_model_from_string(model), data_sets, kind, rtol, atol)
            for n, (model_name, model, data_sets, kind, rtol, atol) in stored.items()}


def _ops(model) -> list[str]:
    return sorted({n.op_type for n in model.graph.node})


def excluded(case) -> str | None:
    """Why a case is left out (the issue's list), or None."""
    if _TRAINING.match(case.name):
        return "training op"
    from deploytool.frontend import left_out

    why = left_out(case.model)
    return next(iter(why.values())) if why else None


# ----------------------------------------------------------------------------- one case (in a worker)
_STATE: dict = {}


def _init_worker(parent: int) -> None:
    from deploytool.measure import die_with_parent

    die_with_parent(parent)
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    import logging

    logging.disable(logging.WARNING)
    _STATE["cases"] = _cases()


def _compare(got, want, rtol, atol) -> str | None:
    import numpy as np

    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {list(g.shape)}, expected {list(w.shape)}"
        # ml_dtypes' narrow floats (float8/float4 variants) are numpy kind "V": compared as floats
        narrow = w.dtype.name.startswith(("float8", "float4", "bfloat16"))
        if w.dtype.kind in "fc" or g.dtype.kind in "fc" or narrow:
            gf, wf = g.astype(np.float64), w.astype(np.float64)
            if not np.allclose(gf, wf, rtol=rtol, atol=atol, equal_nan=True):
                err = np.nanmax(np.abs(gf - wf)) if gf.size else 0.0
                return f"output {i}: max abs err {err:.3g} (rtol {rtol}, atol {atol})"
        elif not np.array_equal(g.astype(w.dtype) if g.dtype != w.dtype else g, w):
            return f"output {i}: values differ"
    return None


def run_case(name: str) -> CaseResult:
    """Import, compile and run one case with deploytool's pipeline (in a worker)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from deploytool import targets
    from deploytool.errors import describe
    from deploytool.onnx_backend import build, import_proto, run_vm, specialize, vm_of

    case = _STATE["cases"][name]
    ops = _ops(case.model)
    t0 = time.perf_counter()

    def done(status, msg=""):
        return CaseResult(name, status, ops, msg[:300], round(time.perf_counter() - t0, 3))

    inputs, outputs = case.data_sets[0]
    # some cases hold TensorProtos (bfloat16, float8...), not arrays
    inputs = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x) for x in inputs]
    outputs = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x) for x in outputs]
    # what a user passes: --input-shape for dynamic dims, --bind-input for inputs that carry shapes,
    # axes or sizes (TVM's importer wants them constant)
    shapes, bind, inputs = specialize(case.model, inputs, bind_shape_operands=True)
    try:
        imp = import_proto(case.model, shapes, bind)
    except Exception as e:
        return done("import_error", describe(e))
    try:
        ex = build(imp, _STATE.setdefault("target", targets.load("x86")))
    except Exception as e:
        return done("compile_error", describe(e))
    try:
        got = run_vm(vm_of(ex), inputs)
    except Exception as e:
        return done("run_error", describe(e))
    bad = _compare(got, outputs, case.rtol, case.atol)
    return done("wrong", bad) if bad else done("pass")


# ----------------------------------------------------------------------------- why a case fails
_REASONS = [  # (pattern on status + message, reason): first match wins
    (r"Only constant axes|axes must be a constant|non-constant axis", "TVM importer: axes given at run time (needs a constant)"),
    (r"Reshape requires the input new shape|new shape to be Shape", "TVM importer: Reshape shape given at run time"),
    (r"Dynamic pads", "TVM importer: Pad pads given at run time"),
    (r"for size is currently unsupported|for scale is currently unsupported", "TVM importer: Resize sizes/scales given at run time"),
    (r"TopK k must be a constant", "TVM importer: TopK k given at run time"),
    (r"cannot handle ShapeExpr", "TVM importer: an op on a runtime shape value (Shape feeding arithmetic)"),
    (r"is not a tensor of static shape", "output shape depends on runtime values (dynamic output shape)"),
    (r"UnsupportedOperatorError: .*?: (\S+)", "operator not supported by TVM's importer and no ONNX function body"),
    (r"KeyError", "TVM importer: a converter misses an attribute or input form of this opset"),
    (r"if_then_else can|FLOAT8|float8|e4m3|e5m2|FLOAT4|float4|e8m0|e2m1", "float8/float4 types: TVM codegen lacks them"),
    (r"arr_size == nbytes|dtype.bits % ", "2/4-bit integer types can't pass between numpy and TVM"),
    (r"ptr->ndim == ndim", "runtime argument rank differs from what the importer declared"),
    (r"slot->value_computed", "TVM codegen: symbolic shape not computed (dynamic shape)"),
    (r"unknown intrinsic", "TVM codegen: an intrinsic missing on the CPU target"),
    (r"shape.size\(\) == indices.size\(\)", "TVM graph passes: tensor rank mismatch in a converter's output"),
    (r"power only applies", "TVM: Pow on integers"),
    (r"the worker process died", "crashes TVM (the worker process dies)"),
    (r"^timeout", "compiles or runs past the time limit"),
    (r"^wrong.*shape", "wrong output shape from TVM's converter"),
    (r"^wrong", "wrong values from TVM's converter"),
    (r"^compile_error", "TVM build fails"),
    (r"^run_error", "fails at run time in the relax VM"),
    (r"^import_error", "TVM importer fails"),
]


# cases whose failure is understood and is not deploytool's to fix
_KNOWN = {
    "test_dft_inverse": "the reference output comes from numpy's float32 FFT: its rounding noise (~2e-6) where the "
                        "exact value is 0 exceeds the case's atol of 1e-7 (deploytool computes in double)",
}


def reason(r: "CaseResult") -> str:
    for prefix, why in _KNOWN.items():
        if r.name == prefix or r.name.startswith(prefix + "_opset"):
            return why
    text = f"{r.status}: {r.message}"
    for pat, why in _REASONS:
        m = re.search(pat, text)
        if m:
            if "operator not supported" in why:
                ops = re.search(r"type\(s\): (.+?): (?=[a-z])", text)
                return f"{why}: {ops.group(1).strip() if ops else '?'}"
            return why
    return r.status


# ----------------------------------------------------------------------------- the runner
@dataclass
class Report:
    results: list[CaseResult]
    excluded: dict[str, str]
    seconds: float

    def counts(self) -> Counter:
        return Counter(r.status for r in self.results)

    def pass_rate(self) -> float:
        return self.counts()["pass"] / max(1, len(self.results))

    def top_failing_ops(self, n: int = 15) -> list[tuple[str, int]]:
        c = Counter()
        for r in self.results:
            if r.status != "pass":
                for op in r.ops:
                    c[op] += 1
        return c.most_common(n)

    def summary(self) -> str:
        c = self.counts()
        lines = [f"{len(self.results)} cases ({len(self.excluded)} left out) in {self.seconds:.0f}s: "
                 + ", ".join(f"{s} {c[s]}" for s in STATUSES if c[s]) + f"; pass rate {self.pass_rate():.1%}",
                 "top failing operators: " + ", ".join(f"{op} {n}" for op, n in self.top_failing_ops())]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"counts": dict(self.counts()), "pass_rate": self.pass_rate(), "seconds": self.seconds,
                "pools": getattr(self, "pools", []),
                "excluded": self.excluded, "top_failing_ops": self.top_failing_ops(40),
                "results": [asdict(r) for r in self.results]}


_POOLS: list = []  # (started, cases pending, workers): how often pools restart


def _pool_run(names: list[str], jobs: int, timeout_s: float, cases, on_result) -> list[str]:
    """Run ``names`` in a pool of ``jobs`` workers; returns the cases whose worker died under them
    (with several cases in flight, the one that crashed is not known: they are run again alone)."""
    ctx = multiprocessing.get_context("spawn")
    suspects: list[str] = []
    pending = list(names)
    while pending:
        _POOLS.append((time.time(), len(pending), jobs))
        pool = cf.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(os.getpid(),))
        futures: dict = {}
        it = iter(pending)
        broken = False

        def fill():  # one case per worker in flight, so that a death implicates at most `jobs` cases
            while len(futures) < jobs:
                n = next(it, None)
                if n is None:
                    return
                futures[pool.submit(run_case, n)] = (n, time.monotonic())

        try:
            fill()
            while futures and not broken:
                done, _ = cf.wait(list(futures), timeout=1.0, return_when=cf.FIRST_COMPLETED)
                for f in done:
                    n, _ = futures.pop(f)
                    try:
                        on_result(f.result())
                    except cf.process.BrokenProcessPool:
                        broken = True
                        suspects.append(n)
                    except Exception as e:
                        on_result(CaseResult(n, "crash", _ops(cases[n].model), f"{type(e).__name__}: {e}"[:300]))
                now = time.monotonic()
                for f, (n, started) in list(futures.items()):
                    if now - started > timeout_s:
                        futures.pop(f)
                        on_result(CaseResult(n, "timeout", _ops(cases[n].model), f"over {timeout_s:.0f} s"))
                        broken = True
                if broken:
                    suspects += [n for n, _ in futures.values()]
                    break
                fill()
        finally:
            for p in list(getattr(pool, "_processes", {}).values()):
                try:
                    p.kill()
                except Exception:
                    pass
            pool.shutdown(wait=False, cancel_futures=True)
        pending = list(it)
    return suspects


def case_names() -> tuple[list[str], dict[str, str]]:
    """(cases that count, sorted; cases left out with why)."""
    cases = _cases()
    skipped = {n: why for n, c in cases.items() if (why := excluded(c))}
    return [n for n in sorted(cases) if n not in skipped], skipped


def run(only: str | None = None, jobs: int | None = None, timeout_s: float = 120.0,
        progress=lambda done, total: None, names: list[str] | None = None) -> Report:
    t0 = time.perf_counter()
    cases = _cases()
    skipped = {n: why for n, c in cases.items() if (why := excluded(c))}
    if names is None:
        names = [n for n in sorted(cases) if n not in skipped and (not only or re.search(only, n))]
    jobs = jobs or max(1, os.cpu_count() or 1)
    results: dict[str, CaseResult] = {}

    def record(r: CaseResult) -> None:
        results[r.name] = r
        progress(len(results), len(names))

    suspects = _pool_run(names, jobs, timeout_s, cases, record)
    # again, one at a time in one worker: now a death is the running case's own
    for n in _pool_run([n for n in suspects if n not in results], 1, timeout_s, cases, record):
        record(CaseResult(n, "crash", _ops(cases[n].model), "the worker process died (segfault or abort)"))
    log_pools = list(_POOLS)
    _POOLS.clear()
    rep = Report([results[n] for n in names], skipped, time.perf_counter() - t0)
    rep.pools = log_pools
    return rep


def main(argv=None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m deploytool.conformance")
    p.add_argument("--only", help="regex on case names")
    p.add_argument("--jobs", type=int)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", help="write the full report here")
    a = p.parse_args(argv)
    rep = run(a.only, a.jobs, a.timeout,
              progress=lambda d, t: print(f"\r{d}/{t}", end="", file=sys.stderr, flush=True) if d % 50 == 0 else None)
    print(file=sys.stderr)
    print(rep.summary())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep.to_dict(), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
