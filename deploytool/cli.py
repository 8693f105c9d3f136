"""The deploytool command line: a thin layer over deploytool.api.

Every deploytool error becomes one line on stderr and exit code 2 (1 for a numerical check
that fails); --verbose adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from deploytool import __version__
from deploytool.errors import DeploytoolError


def _fmt_count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def _fmt_bytes(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


class _Progress:
    """Stage progress on stderr, with elapsed time."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- commands
def cmd_inspect(args) -> int:
    from deploytool import api

    r = api.inspect(args.model, target=args.target, input_shapes=args.input_shape)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    i = r.info
    print(f"model      {i.path}")
    print(f"sha256     {i.sha256}")
    print(f"producer   {i.producer or '-'}   ir_version {i.ir_version}   opset "
          + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(i.opsets.items())))
    print("inputs")
    for s in i.inputs:
        dyn = i.dynamic_dims.get(s.name)
        shape = ", ".join(str(d) if d > 0 else "?" for d in s.shape)
        print(f"  {s.name}: {s.dtype}[{shape}]" + (f"   dynamic: {', '.join(dyn)}" if dyn else ""))
    print("outputs")
    for s in (r.outputs or i.outputs):
        shape = ", ".join(str(d) if d > 0 else "?" for d in s.shape)
        print(f"  {s.name}: {s.dtype}[{shape}]")
    d = r.to_dict()
    print(f"parameters {_fmt_count(d['param_count'])} ({_fmt_bytes(d['param_bytes'])})")
    print(f"operators  {sum(i.op_histogram.values())} nodes, {len(i.op_histogram)} types")
    for op, n in i.op_histogram.most_common():
        mark = "   UNSUPPORTED" if op in i.unsupported else ""
        print(f"  {n:6d}  {op}{mark}")
    if i.unsupported:
        print(f"unsupported: {len(i.unsupported)} operator type(s): {', '.join(sorted(i.unsupported))}")
    if r.tasks is not None:
        total = sum(t.flops * max(t.calls, 1) for t in r.tasks)
        print(f"kernels    {len(r.tasks)} fused kernels, {_fmt_count(total)}FLOP per run (target {args.target})")
        for t in r.tasks:
            print(f"  {t.name:48s} {_fmt_count(t.flops):>9s}FLOP  x{t.calls}  {t.workload_hash}")
    else:
        print(f"kernels    not listed: {r.tasks_error}")
    return 0


def cmd_compile(args) -> int:
    from deploytool import api

    prog = _Progress(args.quiet)
    r = api.compile(args.model, target=args.target, output=args.output, input_shapes=args.input_shape,
                    tuning_log=args.tuning_log, progress=prog)
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in r.stage_seconds.items())
    print(f"wrote {r.artifact.path} ({_fmt_bytes(r.artifact.path.stat().st_size)}, {len(r.tasks)} kernels, "
          f"target {r.artifact.target['name']}) in {r.seconds:.1f}s [{stages}]")
    if r.schedules:
        from collections import Counter

        counts = Counter(r.schedules.values())
        print("default schedules: " + ", ".join(f"{n} {rule}" for rule, n in counts.most_common()))
    return 0


def _print_comparison(res) -> None:
    print(f"{'output':32s} {'max abs err':>12s} {'max rel err':>12s} {'scale':>10s}  result")
    for c in res.comparison:
        print(f"{c.name:32s} {c.max_abs_err:12.3g} {c.max_rel_err:12.3g} {c.ref_scale:10.3g}  "
              f"{'ok' if c.ok else 'FAIL'} (tol {c.tolerance:g})")


def cmd_run(args) -> int:
    from deploytool import api
    from deploytool.errors import CheckError

    try:
        res = api.run(args.artifact, inputs=args.inputs, output=args.output, check=args.check, rtol=args.rtol,
                      seed=args.seed, threads=args.threads)
    except CheckError as e:
        if e.report is not None:
            _print_comparison(e.report)
        raise
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for name, arr in res.outputs.items():
        stats = ""
        if arr.size and arr.dtype.kind in "fiu":
            stats = f"  min {arr.min():.4g}  max {arr.max():.4g}  mean {arr.mean():.4g}"
        print(f"{name}: {arr.dtype}{list(arr.shape)}{stats}")
    if args.output:
        print(f"wrote {args.output}")
    if res.comparison is not None:
        _print_comparison(res)
        print("check passed: outputs match onnxruntime")
    return 0


def cmd_bench(args) -> int:
    from deploytool import api

    r = api.bench(args.artifact, compare=args.compare, inputs=args.inputs, warmup=args.warmup, repeats=args.repeats,
                  threads=args.threads, seed=args.seed)
    for w in r.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    print(f"threads {r.threads}, warm-up {r.deploytool.warmup}, repeats {r.deploytool.repeats}")
    print(f"{'engine':12s} {'min ms':>9s} {'median ms':>10s} {'p90 ms':>9s}")
    rows = [("deploytool", r.deploytool)] + ([("onnxruntime", r.onnxruntime)] if r.onnxruntime else [])
    for name, t in rows:
        print(f"{name:12s} {t.min_ms:9.3f} {t.median_ms:10.3f} {t.p90_ms:9.3f}")
    if r.ratio is not None:
        verdict = "faster" if r.ratio < 1 else "slower"
        print(f"ratio deploytool/onnxruntime (median): {r.ratio:.2f}x ({verdict})")
    return 0


def cmd_targets(args) -> int:
    from deploytool import api

    for t in api.list_targets():
        state = "" if t.available else f"   [not yet: {t.note}]"
        print(f"{t.name:12s} {t.artifact:9s} {t.description}{state}")
    return 0


def cmd_metadata(args) -> int:
    from deploytool import api

    print(json.dumps(api.metadata(args.artifact), indent=2))
    return 0


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deploytool", description="Compile ONNX models into fast deployable modules.")
    p.add_argument("--version", action="version", version=f"deploytool {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def shape_arg(sp):
        sp.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...",
                        help="fix an input's shape (repeat per input), e.g. data:1,3,224,224")

    s = sub.add_parser("inspect", help="describe a model: I/O, opset, operators, parameters, kernels")
    s.add_argument("model")
    s.add_argument("--target", default="x86", help="target used to list the kernels (default: x86)")
    shape_arg(s)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_inspect)

    s = sub.add_parser("compile", help="compile a model into one self-describing .so")
    s.add_argument("model")
    s.add_argument("--target", default="x86", help="target preset or preset .json (see 'deploytool targets')")
    s.add_argument("-o", "--output", default="model.so", help="output .so (default: model.so)")
    shape_arg(s)
    s.add_argument("--tuning-log", help="apply the best records of a tuning log")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(fn=cmd_compile)

    def io_args(sp):
        sp.add_argument("--inputs", help=".npz with one array per input name (default: seeded random)")
        sp.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
        sp.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")

    s = sub.add_parser("run", help="run a compiled model once, optionally checking against onnxruntime")
    s.add_argument("artifact")
    io_args(s)
    s.add_argument("--output", help="write the outputs to this .npz")
    s.add_argument("--check", metavar="MODEL.onnx", help="compare with onnxruntime on the same inputs")
    s.add_argument("--rtol", type=float, default=1e-4,
                   help="tolerance: max abs error relative to the output's max magnitude (default: 1e-4)")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("bench", help="measure latency, optionally side by side with onnxruntime")
    s.add_argument("artifact")
    io_args(s)
    s.add_argument("--compare", metavar="MODEL.onnx", help="also time onnxruntime on the same inputs and threads")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--repeats", type=int, default=20)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("targets", help="list target presets")
    s.set_defaults(fn=cmd_targets)

    s = sub.add_parser("metadata", help="print an artifact's metadata (read from the file, not loaded)")
    s.add_argument("artifact")
    s.set_defaults(fn=cmd_metadata)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except DeploytoolError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"deploytool: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("deploytool: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: say so in one line, with the traceback under --verbose
        if args.verbose:
            traceback.print_exc()
        first = str(e).strip().splitlines()
        print(f"deploytool: internal error: {type(e).__name__}: {first[-1] if first else ''} "
              f"(rerun with --verbose and file an issue)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
