"""The deploytool command line: a thin layer over deploytool.api.

Every deploytool error becomes one line on stderr and exit code 2 (1 for a numerical check
that fails); --verbose adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

from deploytool import __version__, interrupts
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
        mark = (f"   LEFT OUT ({i.left_out[op]})" if op in i.left_out
                else "   (imported from its ONNX function body)" if op in i.expandable
                else "   UNSUPPORTED" if op in i.unsupported else "")
        print(f"  {n:6d}  {op}{mark}")
    if i.blocking:
        print(f"unsupported: {len(i.blocking)} operator type(s): {', '.join(sorted(i.blocking))}")
    if i.left_out:
        print("left out by design (training, strings, sequence/optional/map values): "
              + "; ".join(f"{k}: {v}" for k, v in sorted(i.left_out.items())))
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
                    bind_inputs=args.bind_input, dtype=args.dtype, split_k=args.split_k, winograd=args.winograd,
                    cublas=args.cublas, cudnn=args.cudnn, tuning_log=args.tuning_log,
                    require_tuned=args.require_tuned, predict=args.predict,
                    tuned_on=args.tuned_on, progress=prog)
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in r.stage_seconds.items())
    if r.artifact.path.is_dir():
        _print_footprint(r.artifact)
        print(f"wrote {r.artifact.path}/ (C bundle, {len(r.tasks)} kernels, target {r.artifact.target['name']}) in "
              f"{r.seconds:.1f}s [{stages}]")
        return 0
    print(f"wrote {r.artifact.path} ({_fmt_bytes(r.artifact.path.stat().st_size)}, {len(r.tasks)} kernels, "
          f"target {r.artifact.target['name']}) in {r.seconds:.1f}s [{stages}]")
    if r.schedules:
        from collections import Counter

        counts = Counter(r.schedules.values())
        print("schedules: " + ", ".join(f"{n} {rule}" for rule, n in counts.most_common()))
    return 0


def _print_footprint(artifact) -> None:
    fp = artifact.metadata["footprint"]
    f, r = fp["flash"], fp["ram"]
    print(f"footprint ({fp['target']}; also in {artifact.path}/footprint.json)")
    print(f"  flash  {_fmt_bytes(f['total']):>10s}  = code {_fmt_bytes(f['code'])} + weights {_fmt_bytes(f['weights'])}")
    print(f"  RAM    {_fmt_bytes(r['total']):>10s}  = arena {_fmt_bytes(r['arena'])} (of which workspace "
          f"{_fmt_bytes(r['workspace_in_arena'])}) + stack {_fmt_bytes(r['stack'])} + other {_fmt_bytes(max(0, r['other']))}")
    print(f"  arena  {fp['arena_ratio']:.3f}x its lower bound ({_fmt_bytes(fp['arena_lower_bound'])}: the most bytes "
          "live at one step)")


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
                      seed=args.seed, threads=args.threads, device=_device_arg(args), on=args.on)
    except CheckError as e:
        if e.report is not None:
            _print_comparison(e.report)
        raise
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if res.ran_on:
        r = res.ran_on
        where = "this machine (gcc)" if r["where"] == "host" else f"{r['where']} under QEMU"
        extra = f": {r['instructions']:,} instructions (QEMU -icount)" if r.get("instructions") else ""
        if r.get("stack_bytes"):
            extra += f", stack high-water {_fmt_bytes(r['stack_bytes'])}"
        img = r.get("image") or {}
        if img:
            extra += f"; image text {_fmt_bytes(img.get('text', 0))}, data {_fmt_bytes(img.get('data', 0))}, bss " \
                     f"{_fmt_bytes(img.get('bss', 0))}"
        print(f"ran on {where}{extra}")
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


def _device_arg(args):
    from deploytool import device

    return device.parse(rpc=getattr(args, "rpc", None), tracker=getattr(args, "tracker", None),
                        key=getattr(args, "key", None), device=getattr(args, "device", None))


def cmd_bench(args) -> int:
    from deploytool import api

    dev = _device_arg(args)
    r = api.bench(args.artifact, compare=args.compare, inputs=args.inputs, warmup=args.warmup, repeats=args.repeats,
                  threads=args.threads, seed=args.seed, device=dev, rounds=args.rounds)
    for w in r.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    where = f"on {dev.describe()}" if dev else f"threads {r.threads}"
    rounds = f" in {len(r.round_ratios)} alternating rounds" if len(r.round_ratios) > 1 else ""
    print(f"{where}, warm-up {r.deploytool.warmup}, repeats {r.deploytool.repeats}{rounds}")
    print(f"{'engine':12s} {'min ms':>9s} {'median ms':>10s} {'p90 ms':>9s}")
    rows = [("deploytool", r.deploytool)] + ([("onnxruntime", r.onnxruntime)] if r.onnxruntime else [])
    for name, t in rows:
        print(f"{name:12s} {t.min_ms:9.3f} {t.median_ms:10.3f} {t.p90_ms:9.3f}")
    if r.ratio is not None:
        verdict = "faster" if r.ratio < 1 else "slower"
        per_round = f"; rounds {' '.join(f'{x:.2f}' for x in r.round_ratios)}" if len(r.round_ratios) > 1 else ""
        print(f"ratio deploytool/onnxruntime (median): {r.ratio:.2f}x ({verdict}{per_round})")
    return 0


def cmd_profile(args) -> int:
    from deploytool import api
    from deploytool import profiling as _profile

    p = api.profile(args.artifact, tuning_log=args.tuning_log, tuned_on=args.tuned_on, inputs=args.inputs,
                    seed=args.seed, threads=args.threads, runs=args.runs, warmup=args.warmup, peak=args.peak,
                    progress=_Progress(args.quiet))
    if args.plot:
        _profile.plot(p, args.plot, top=args.top)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2))
    else:
        print(_profile.table(p, top=args.top))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def _ms(s) -> str:
    if s is None or s == float("inf"):
        return "-"
    return f"{s * 1e3:.3f}" if s >= 1e-4 else f"{s * 1e3:.2g}"


def _dur(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _TuneView:
    """The live view: one line per round (a redrawn table of the heaviest tasks on a terminal)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.drawn = 0

    def __call__(self, p) -> None:
        if self.quiet:
            return
        t = p.tasks[p.current]
        head = (f"[{p.trials_done:5d}/{p.trials_budget} trials, {_dur(p.elapsed_s)}, left ~{_dur(p.eta_s)}] "
                f"est. end-to-end {_ms(p.est_tuned_s)} ms (untuned {_ms(p.est_untuned_s)} ms)")
        if not self.tty:
            print(f"{head} | {t.name[:40]}: {_ms(t.best_s)} ms (untuned {_ms(t.default_s)}), {t.trials} trials"
                  + (f", {t.done}" if t.done else ""), file=sys.stderr, flush=True)
            return
        rows = sorted(p.tasks, key=lambda s: -(s.best_s if s.best_s < float("inf") else 0) * s.calls)[:12]
        lines = [head, f"  {'kernel':42s} {'calls':>5s} {'untuned ms':>10s} {'best ms':>9s} {'trials':>6s}  state"]
        for s in rows:
            mark = ">" if s is t else " "
            lines.append(f"{mark} {s.name[:42]:42s} {s.calls:5d} {_ms(s.default_s):>10s} {_ms(s.best_s):>9s} "
                         f"{s.trials:6d}  {s.done or 'tuning'}")
        if self.drawn:
            sys.stderr.write(f"\x1b[{self.drawn}F\x1b[J")
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
        self.drawn = len(lines)


def _winograd_arg(value: str):
    """--winograd's value: auto, off, or all (what a bare --winograd means)."""
    if value in ("auto", "off"):
        return value
    if value == "all":
        return True
    raise argparse.ArgumentTypeError(f"'{value}' is not auto, off or all (after a bare --winograd, put the model "
                                     "before it: deploytool compile MODEL --winograd)")


def cmd_tune(args) -> int:
    from deploytool import api
    from deploytool.measure import MeasureSettings

    prog = _Progress(args.quiet)
    measure = MeasureSettings(repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, cache_flush=args.cache_flush)
    r = api.tune(args.model, target=args.target, output=args.output, trials=args.trials,
                 trials_per_task=args.trials_per_task, more=args.more, batch=args.batch,
                 early_stop=args.early_stop,
                 input_shapes=args.input_shape, seed=args.seed, workers=args.workers, measure=measure,
                 device=_device_arg(args), dtype=args.dtype, cost_model=args.cost_model,
                 retime_from=args.retime_from, retime_top=args.retime_top, split_k=args.split_k,
                 winograd=args.winograd, cublas=args.cublas, cudnn=args.cudnn, first_round=args.first_round,
                 settle=args.settle,
                 kernels=args.kernels, threads=args.threads, schedule_library=args.schedule_library,
                 transfer_top=args.transfer_top, on_progress=_TuneView(args.quiet), progress=prog)
    if args.json:
        print(json.dumps(r.to_dict(), indent=1))
    else:
        print(f"{'kernel':44s} {'calls':>5s} {'GFLOP':>7s} {'untuned ms':>10s} {'tuned ms':>9s} {'speedup':>7s} "
              f"{'trials':>6s}  stopped")
        for t in sorted(r.tasks, key=lambda s: -s.default_s * s.calls if s.default_s < float("inf") else 0):
            sp = f"{t.speedup:.2f}x" if t.speedup == t.speedup else "-"
            print(f"{t.name[:44]:44s} {t.calls:5d} {t.flops / 1e9:7.3f} {_ms(t.default_s):>10s} {_ms(t.best_s):>9s} "
                  f"{sp:>7s} {t.trials:6d}  {t.done}")
        print(f"estimated end to end (sum of kernels x calls): untuned {_ms(r.est_untuned_s)} ms -> tuned "
              f"{_ms(r.est_tuned_s)} ms ({r.est_untuned_s / r.est_tuned_s if r.est_tuned_s else float('nan'):.2f}x)")
        sec = r.seconds
        again = "".join(f", {n} {what}" for n, what in ((r.retimed, "re-measured from earlier boots or machines"),
                                                          (r.settled, "timed again in the settle")) if n)
        print(f"{r.trials_new} new trials{again} in {_dur(sec['total'])}: " + ", ".join(
            f"{k} {v:.1f}s" for k, v in sec.items() if k != "total"))
        print(f"log: {r.log_path}" + (f" (resumed from {r.resumed_records} records)" if r.resumed_records else ""))
    if args.plot:
        out = api.report(r.log_path, output=args.plot)
        print(f"wrote {out}")
    return 0


def cmd_logs(args) -> int:
    from deploytool import api

    if args.logs_command == "show":
        st = api.logs_show(args.log, device=args.device)
    elif args.logs_command == "merge":
        st = api.logs_merge(args.logs, args.output)
        print(f"wrote {args.output}")
    elif args.logs_command == "prune":
        st, dropped = api.logs_prune(args.log, keep=args.keep, output=args.output, device=args.device)
        print(f"dropped {dropped} record(s); wrote {args.output or args.log}")
    else:
        cov = api.logs_check(args.log, args.model, target=args.target, input_shapes=args.input_shape, dtype=args.dtype,
                             split_k=args.split_k, winograd=args.winograd, cublas=args.cublas, cudnn=args.cudnn,
                             allow_emulated=args.allow_emulated)
        if args.json:
            print(json.dumps({"covered": cov.covered, "missing": cov.missing}, indent=1))
        else:
            print(f"{len(cov.covered)} of {len(cov.covered) + len(cov.missing)} kernels covered")
            for m in cov.missing:
                print(f"  missing: {m}")
        if not cov.ok:
            from deploytool.errors import CheckError

            raise CheckError(f"tuning log {args.log} lacks {len(cov.missing)} kernel(s) of {args.model}",
                             "tune them: rerun `deploytool tune` with this log as --output")
        return 0
    if args.json:
        print(json.dumps(st.to_dict(), indent=1))
        return 0
    h = st.header
    print(f"log        {st.path} (sha256 {st.sha256[:16]})")
    dev = h.get("device", {})
    where = f"board {dev.get('host')}:{dev.get('port')}" if dev.get("kind") == "rpc" and not dev.get("key") else \
        f"tracker {dev.get('host')}:{dev.get('port')} key '{dev.get('key')}' ({dev.get('boards')} boards)" \
        if dev.get("kind") == "rpc" else "local"
    what = (f"{dev['gpu']} ({dev.get('gpu_arch', '?')}), timed with {h.get('measure', {}).get('gpu_timing', 'a warm L2')}"
            if dev.get("gpu") else
            f"{dev.get('arch', '')} {dev.get('cpu', '?')} ({dev.get('threads') or dev.get('cores') or '?'} threads)")
    print(f"target     {h.get('target', {}).get('name')}   device {where}, {what}"
          + (f"   EMULATED ({h['emulated']}): not for shipping" if h.get('emulated') else ""))
    print(f"made by    deploytool {h.get('deploytool')}, TVM {h.get('tvm')}, {h.get('created')}"
          + (f"; model {h['model']['file']}" if h.get("model") else ""))
    print(f"records    {st.records} in {len(st.workloads)} workloads"
          + (f"; {st.skipped_lines} corrupted line(s) skipped" if st.skipped_lines else ""))
    if len(st.devices) > 1:
        print("machines   " + "; ".join(f"{d}: {n} records" for d, n in st.devices.items())
              + f"\n           (the table shows {st.device}; --device MACHINE for another)")
    print(f"  {'kernel':44s} {'calls':>5s} {'records':>7s} {'failed':>6s} {'untuned ms':>10s} {'best ms':>9s} "
          f"{'speedup':>7s}")
    for w in st.workloads:
        sp = f"{w.speedup:.2f}x" if w.speedup else "-"
        print(f"  {w.name[:44]:44s} {w.calls:5d} {w.records:7d} {w.failures:6d} {_ms(w.default_s):>10s} "
              f"{_ms(w.best_s):>9s} {sp:>7s}")
    return 0


def cmd_report(args) -> int:
    from deploytool import api

    print(f"wrote {api.report(args.log, output=args.output, device=args.device)}")
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


def cmd_device(args) -> int:
    from deploytool import device

    if args.device_command == "serve":
        device.serve(host=args.host, port=args.port, tracker=args.tracker, key=args.key, threads=args.threads,
                     emulated=args.emulated, on_ready=lambda m: print(m, flush=True))
        return 0
    if args.device_command == "list":
        rows = device.list_devices(args.tracker)
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        if not rows:
            print(f"no board is registered at tracker {args.tracker}")
        for r in rows:
            print(f"{r['key']:16s} {r['registered']} registered, {r['free']} free, {r['pending']} waiting   "
                  + " ".join(r["addresses"]))
        return 0
    from deploytool import emulator

    prog = _Progress(False)
    if args.build_only:
        print(emulator.build(args.board, progress=prog, force=args.rebuild))
        return 0
    if args.rebuild:
        emulator.build(args.board, progress=prog, force=True)
    board = emulator.start(args.board, host=args.host, port=args.port, tracker=args.tracker, key=args.key,
                           threads=args.threads, progress=prog)
    use = f"--tracker {args.tracker} --key {args.key or args.board}" if args.tracker else f"--rpc {board.address}"
    print(f"emulated {board.arch} board serving on {board.address}; use {use} "
          "(timings under emulation are not meaningful); Ctrl-C stops", flush=True)
    try:
        board.proc.wait()
    finally:
        board.stop()
    return 0 if board.proc.returncode in (0, -9) else 2


def cmd_simd(args) -> int:
    from deploytool import simd

    arch, kernels = simd.report(args.artifact)
    if args.json:
        print(json.dumps({"arch": arch, "kernels": [k.to_dict() for k in kernels]}, indent=1))
        return 0
    isa = "NEON" if arch in ("aarch64", "armv7l") else "SIMD"
    print(f"{args.artifact} ({arch}): vector fused multiply-adds per kernel, from its disassembly")
    print(f"{'kernel':44s} {'instrs':>7s} {'vec FMA':>7s} {'scal FMA':>8s} {'vec ops':>7s} {'bits':>4s}  uses {isa}")
    for k in kernels:
        print(f"{k.name[:44]:44s} {k.instructions:7d} {k.vector_fma:7d} {k.scalar_fma:8d} {k.vector_ops:7d} "
              f"{k.widest_bits or '-':>4}  {k.verdict}")
    dense = [k for k in kernels if simd.is_dense(k.name)]
    vec = [k for k in dense if k.vector_fma]
    print(f"{len(vec)} of {len(dense)} conv/matmul kernels use {isa} vector FMAs"
          + ("" if len(vec) == len(dense) else ": SCALAR " + ", ".join(k.name for k in dense if not k.vector_fma)))
    return 0 if len(vec) == len(dense) or not args.require_vector else 1


def cmd_package(args) -> int:
    from deploytool import package

    r = package.package(args.artifact, args.output, progress=_Progress(args.quiet))
    if args.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 0
    lib = sum(v for k, v in r.files.items() if k.startswith("lib/"))
    model = sum(v for k, v in r.files.items() if k.endswith(".so") and "/" not in k)
    print(f"wrote {r.path} ({_fmt_bytes(r.bytes)} compressed, {r.arch}): runtime {_fmt_bytes(lib)} (lib/), runner "
          f"{_fmt_bytes(r.files['run'])}, headers {_fmt_bytes(sum(v for k, v in r.files.items() if k.startswith('include/')))}"
          f", model {_fmt_bytes(model)}")
    print(f"on the board: tar xzf {r.path.name} && cd {r.path.name[:-7]} && ./run {Path(args.artifact).name} --inputs ...")
    return 0


def cmd_tracker(args) -> int:
    from deploytool import device

    device.run_tracker(host=args.host, port=args.port, on_ready=lambda m: print(m, flush=True))
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

    def dtype_arg(sp):
        sp.add_argument("--dtype", default="float32", metavar="float32|float16",
                        help="float16: mixed precision inside (convs/matmuls and activations in float16, tensor "
                        "cores on GPUs), float32 inputs and outputs (default: float32)")
        sp.add_argument("--no-split-k", dest="split_k", action="store_false",
                        help="GPUs: keep one kernel per matmul/convolution whose output is too small to "
                        "fill the GPU (by default its reduction is split over more thread blocks and summed after)")
        sp.add_argument("--winograd", nargs="?", const=True, default=None, metavar="auto|off|all",
                        type=_winograd_arg,
                        help="CPUs, float32: 3x3 stride-1 convolutions by Winograd F(4x4, 3x3), 4x fewer "
                        "multiplies but memory-bound transforms: every eligible one (all); `--winograd auto`: "
                        "tune both ways, and build each convolution the way its tuning log times faster; off: "
                        "none (default: tune none, compile as the tuning log was tuned)")
        sp.add_argument("--cublas", action="store_true",
                        help="CUDA, float16: matmuls on cuBLAS's GEMMs (loaded when the model runs; "
                        "building needs no CUDA toolkit), the rest on TVM's kernels")
        sp.add_argument("--cudnn", action="store_true",
                        help="CUDA, float16: convolutions in NHWC on cuDNN's graph API, each with the bias, "
                        "residual and ReLU after it fused, engines timed at the first call (loaded when the model "
                        "runs; building needs no cuDNN), the rest on TVM's kernels (ResNet-50 batch 32 on an H200: 3.2x "
                        "faster than TVM's tuned kernels)")

    def device_args(sp, what):
        sp.add_argument("--device", metavar="HOST:PORT|KEY@HOST:PORT",
                        help=f"{what}: a board serving RPC, or KEY@TRACKER for any free board of a tracker's farm")
        sp.add_argument("--rpc", metavar="HOST:PORT", help="the same as --device HOST:PORT")
        sp.add_argument("--tracker", metavar="HOST:PORT", help="a TVM RPC tracker (with --key)")
        sp.add_argument("--key", help="the kind of board to ask the tracker for")

    s = sub.add_parser("inspect", help="describe a model: I/O, opset, operators, parameters, kernels")
    s.add_argument("model")
    s.add_argument("--target", default="x86", help="target used to list the kernels (default: x86)")
    shape_arg(s)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_inspect)

    s = sub.add_parser("compile", help="compile a model into one self-describing .so")
    s.add_argument("model")
    s.add_argument("--target", default="x86", help="target preset or preset .json (see 'deploytool targets')")
    s.add_argument("-o", "--output", help="output .so (default: model.so), or the folder of a Cortex-M C bundle "
                   "(default: MODEL-TARGET/)")
    shape_arg(s)
    s.add_argument("--bind-input", action="append", metavar="NAME=V1,V2|NAME=FILE.npy",
                   help="make an input a compile-time constant (shape, axes or sizes given as inputs), repeatable")
    s.add_argument("--tuning-log", help="apply the best record of a tuning log to each kernel it covers")
    s.add_argument("--tuned-on", metavar="MACHINE",
                   help="a log with timings from several machines: take this one's records (a name `logs show` "
                        "lists; default: this machine when the target runs here, the nearest machine's when it has none "
                        "of this one, else the log's first)")
    s.add_argument("--predict", nargs="?", const="pretrained", metavar="FILE",
                   help="schedule kernels without a tuning record by the cost model alone, nothing measured: the "
                        "target family's pretrained model, or FILE")
    s.add_argument("--require-tuned", action="store_true",
                   help="fail (exit 2, listing them) if any kernel has no record in the tuning log: the CI mode")
    dtype_arg(s)
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(fn=cmd_compile)

    s = sub.add_parser("tune", help="tune every kernel of a model; records go to a tuning log (resumable)")
    s.add_argument("model")
    s.add_argument("--target", default="x86", help="target preset (default: x86, this machine)")
    s.add_argument("-o", "--output", help="tuning log (.jsonl) to append to; default MODEL-TARGET.jsonl. "
                   "Rerunning with the same log resumes")
    s.add_argument("--trials", type=int, help="total search trials over all kernels, the log's included, "
                   "shared out where the latency is (a kernel may take any part of it unless --trials-per-task "
                   "caps it; default: per task x kernels, at most 2,000)")
    s.add_argument("--trials-per-task", type=int, help="search trials per kernel, the log's included (default: 64 "
                   "on CPUs; with --more: per kernel beyond the log's)")
    s.add_argument("--more", type=int, metavar="N", help="extend the log: N new search trials, whatever it holds "
                   "(instead of --trials)")
    s.add_argument("--batch", type=int, help="candidates per round (default: 16)")
    s.add_argument("--early-stop", type=int, help="after this many trials without a 1%% gain, restart a kernel's "
                   "search once from its best records, and stop it at the second stall (default: 48; 0: never)")
    s.add_argument("--workers", type=int, help="parallel build processes (default: physical cores)")
    s.add_argument("--threads", type=int, help="CPU threads candidates are timed on, the count the model will run "
                   "with (default: $TVM_NUM_THREADS, else physical cores; a board over RPC uses its own)")
    s.add_argument("--repeat", type=int, default=3, help="timed repeats per candidate (default: 3)")
    s.add_argument("--min-repeat-ms", type=int, default=10, help="each repeat runs at least this long (default: 10)")
    s.add_argument("--no-cache-flush", dest="cache_flush", action="store_false",
                   help="time candidates with warm caches (default: CPU caches flushed before each repeat; "
                        "on GPUs the L2 flushed before each launch)")
    s.add_argument("--settle", type=int, metavar="ROUNDS",
                   help="at the end, time each kernel's default and 3 best candidates again side by side in this many "
                        "interleaved rounds; they pick its best (default: 5 on this machine, 0 on boards over RPC)")
    s.add_argument("--retime-from", metavar="LOG",
                   help="first measure again the best candidates per kernel of this log (of the same target), "
                        "with this run's settings: a log moved to new measurement settings or another board")
    s.add_argument("--retime-top", type=int, default=8, metavar="K", help="candidates per kernel to re-measure (default: 8)")
    s.add_argument("--kernels", metavar="GLOB[,GLOB...]",
                   help="tune only the kernels whose names match (e.g. '*winograd*'); the others keep their log records "
                   "(a convolution's other kernels, direct or Winograd, are timed again with them in the settle)")
    s.add_argument("--first-round", type=int, metavar="N", help="measure only the cost model's top N candidates in each "
                   "kernel's first round, so that every kernel is probed before the heavy ones get full rounds "
                   "(default: 4 with a pretrained cost model on CPUs, else a full batch: on GPUs a search round costs far "
                   "more than measuring it)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--cost-model", default="pretrained", metavar="none|pretrained|FILE|metaschedule[:FILE]",
                   help="where the cost model starts: the target family's pretrained model, fine-tuned with "
                        "this run's measurements (default; from scratch if the family has none), none, or a "
                        "model file from `python -m deploytool.cost_model.pretrain train`; metaschedule: "
                        "MetaSchedule's own XGBModel from scratch, the baseline for comparisons; metaschedule:FILE: "
                        "that model pretrained (`python -m deploytool.cost_model.pretrain train-metaschedule`)")
    s.add_argument("--schedule-library", default="none", metavar="none|pretrained|FILE",
                   help="other models' best schedules to adapt to this model's kernels of the same program: each "
                        "kernel's first round also measures its nearest donors' (--transfer-top); pretrained: the "
                        "target family's in cost_model/pretrained, FILE: from `python -m "
                        "deploytool.cost_model.pretrain schedules LOG...` (default: none)")
    s.add_argument("--transfer-top", type=int, default=2, metavar="K",
                   help="adapted donor schedules measured per kernel (default: 2)")
    s.add_argument("--plot", metavar="PNG", help="also draw the tuning curves")
    dtype_arg(s)
    device_args(s, "measure on a board (needed for cross targets such as arm)")
    shape_arg(s)
    s.add_argument("--json", action="store_true", help="machine-readable summary")
    s.add_argument("-q", "--quiet", action="store_true", help="no live view")
    s.set_defaults(fn=cmd_tune)

    s = sub.add_parser("logs", help="tuning logs: show, merge, prune, check")
    lsub = s.add_subparsers(dest="logs_command", required=True, metavar="ACTION")
    a = lsub.add_parser("show", help="statistics per kernel")
    a.add_argument("log")
    a.add_argument("--device", metavar="MACHINE", help="a log with timings from several machines: show this one's")
    a.add_argument("--json", action="store_true")
    a = lsub.add_parser("merge", help="combine logs of one target from several runs or machines")
    a.add_argument("logs", nargs="+")
    a.add_argument("-o", "--output", required=True)
    a.add_argument("--json", action="store_true")
    a = lsub.add_parser("prune", help="keep the best K records per kernel (and its untuned baseline)")
    a.add_argument("log")
    a.add_argument("--keep", type=int, default=1)
    a.add_argument("--device", metavar="MACHINE", help="prune only this machine's records (a name `logs show` lists)")
    a.add_argument("-o", "--output", help="write here instead of rewriting the log")
    a.add_argument("--json", action="store_true")
    a = lsub.add_parser("check", help="does the log cover every kernel of a model for a target? (exit 1 if not)")
    a.add_argument("log")
    a.add_argument("model")
    a.add_argument("--target", default="x86")
    a.add_argument("--allow-emulated", action="store_true",
                   help="accept timings from an emulated board (refused by default: they don't rank schedules)")
    shape_arg(a)
    dtype_arg(a)
    a.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_logs)

    s = sub.add_parser("report", help="draw a tuning log's curves (best latency vs trials) as a PNG")
    s.add_argument("log")
    s.add_argument("-o", "--output", help="PNG path (default: the log's name with .png)")
    s.add_argument("--device", metavar="MACHINE", help="a log with timings from several machines: draw this one's")
    s.set_defaults(fn=cmd_report)

    def io_args(sp):
        sp.add_argument("--inputs", help=".npz with one array per input name (default: seeded random)")
        sp.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
        sp.add_argument("--threads", type=int, help="CPU threads (default: $TVM_NUM_THREADS, else physical cores)")
        device_args(sp, "run it on a board")


    s = sub.add_parser("run", help="run a compiled model once, optionally checking against onnxruntime")
    s.add_argument("artifact")
    io_args(s)
    s.add_argument("--output", help="write the outputs to this .npz")
    s.add_argument("--on", choices=["qemu", "host"], help="Cortex-M C bundles: run under qemu-system-arm (default) or "
                   "built for this machine with gcc")
    s.add_argument("--check", metavar="MODEL.onnx", help="compare with onnxruntime on the same inputs")
    s.add_argument("--rtol", type=float, default=None,
                   help="tolerance: max abs error relative to the output's max magnitude (default: 1e-4; 3e-2 for "
                   "--dtype float16 builds)")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("bench", help="measure latency, optionally side by side with onnxruntime")
    s.add_argument("artifact")
    io_args(s)
    s.add_argument("--compare", metavar="MODEL.onnx", help="also time onnxruntime on the same inputs and threads")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--repeats", type=int, default=20, help="timed runs per engine and round (default: 20)")
    s.add_argument("--rounds", type=int, default=3, help="with --compare: rounds alternating onnxruntime and "
                   "deploytool; the ratio is the rounds' median (default: 3)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("profile", help="each kernel's time inside the model on this machine, next to the tuning "
                       "log's time for it alone")
    s.add_argument("artifact")
    s.add_argument("--inputs", help=".npz with one array per input name (default: seeded random)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    s.add_argument("--threads", type=int, help="CPU threads (default: $TVM_NUM_THREADS, else physical cores)")
    s.add_argument("--tuning-log", metavar="LOG", help="show each kernel's best record of this log next to its time "
                   "in the model")
    s.add_argument("--tuned-on", metavar="MACHINE", help="the machine whose records of a multi-machine log to show "
                   "(default: this one)")
    s.add_argument("--runs", type=int, default=10, help="profiled runs (default: 10; each kernel's mean is shown)")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--top", type=int, default=20, help="kernels to list and plot (default: 20)")
    s.add_argument("--peak", action="store_true", help="x86: also each kernel's %% of this machine's FP32 peak, "
                   "measured first (a loop of FMAs at the artifact's vector width, on --threads threads; ~2 s)")
    s.add_argument("--plot", metavar="PNG", help="draw the kernels' times as a bar chart")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(fn=cmd_profile)

    s = sub.add_parser("device", help="boards over TVM RPC: serve one, emulate one, list a tracker's")
    dsub = s.add_subparsers(dest="device_command", required=True, metavar="ACTION")
    a = dsub.add_parser("serve", help="run on the board: serve it over RPC (needs only the TVM runtime there). "
                        "WARNING: the server runs whatever is uploaded to it")
    a.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only; 0.0.0.0 exposes "
                   "the board to the network)")
    a.add_argument("--port", type=int, default=9090)
    a.add_argument("--tracker", metavar="HOST:PORT", help="register with this tracker instead of waiting for direct "
                   "connections")
    a.add_argument("--key", help="the kind of board, as tuners ask the tracker for it (e.g. rpi4)")
    a.add_argument("--threads", type=int, help="TVM threads on the board (default: the board's cores)")
    a.add_argument("--emulated", help=argparse.SUPPRESS)
    a = dsub.add_parser("emulate", help="start an emulated board (aarch64 under qemu-user) serving RPC on loopback")
    a.add_argument("board", nargs="?", default="arm", choices=["arm"])
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--port", type=int, help="default: a free port")
    a.add_argument("--tracker", metavar="HOST:PORT", help="register with this tracker")
    a.add_argument("--key", help="key to register under (default: the board name)")
    a.add_argument("--threads", type=int)
    a.add_argument("--rebuild", action="store_true", help="rebuild the board's sysroot first")
    a.add_argument("--build-only", action="store_true", help="build the sysroot (cached) and print its folder")
    a = dsub.add_parser("list", help="boards registered at a tracker, per key, and how many are free")
    a.add_argument("--tracker", required=True, metavar="HOST:PORT")
    a.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_device)

    s = sub.add_parser("tracker", help="run a TVM RPC tracker for a farm of boards")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=9190)
    s.set_defaults(fn=cmd_tracker)

    s = sub.add_parser("package", help="bundle a .so with TVM's runtime-only libraries and a native runner "
                       "(no Python on the board)")
    s.add_argument("artifact")
    s.add_argument("-o", "--output", help="the .tar.gz (default: NAME-bundle.tar.gz next to the .so)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_package)

    s = sub.add_parser("simd", help="per kernel of a .so: does it use vector FMAs (NEON, AVX)? From its disassembly")
    s.add_argument("artifact")
    s.add_argument("--require-vector", action="store_true", help="exit 1 if a conv/matmul kernel is scalar")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_simd)

    s = sub.add_parser("targets", help="list target presets")
    s.set_defaults(fn=cmd_targets)

    s = sub.add_parser("metadata", help="print an artifact's metadata (read from the file, not loaded)")
    s.add_argument("artifact")
    s.set_defaults(fn=cmd_metadata)
    return p


def _during_interrupt(e: BaseException) -> bool:
    """Whether ``e`` was raised while a KeyboardInterrupt was being handled (its context chain)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__
    return False


def _interrupted(argv) -> int:
    """Say so and give exit code 130 after Ctrl-C. Run as the program (``argv`` None), leave at
    once: Python's exit handlers join the worker pools' threads, which can block or print
    tracebacks once the workers are killed (deploytool.interrupts.exit_interrupted)."""
    print("deploytool: interrupted", file=sys.stderr)
    if argv is None:
        interrupts.exit_interrupted(130)
    return 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # tune runs Z3 (through TVM), which would swallow a Ctrl-C: interrupts.Watcher, entered before
    # anything starts a thread
    watch = interrupts.Watcher() if args.fn is cmd_tune else contextlib.nullcontext()
    with interrupts.Noted() as ctrl_c, watch:
        return _run(args, argv, ctrl_c)


def _run(args, argv, ctrl_c) -> int:
    try:
        return args.fn(args)
    except DeploytoolError as e:
        if ctrl_c.hit:  # e.g. a build that failed because Ctrl-C became an error inside TVM
            return _interrupted(argv)
        if args.verbose:
            traceback.print_exc()
        print(f"deploytool: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return _interrupted(argv)
    except BrokenPipeError:  # e.g. `deploytool logs show LOG | head`
        sys.stderr.close()
        return 0
    except Exception as e:  # a bug: say so in one line, with the traceback under --verbose
        if ctrl_c.hit or _during_interrupt(e):  # Ctrl-C turned into an error inside TVM, or a clean-up
            # (worker pools, locks) that failed after it
            return _interrupted(argv)
        if args.verbose:
            traceback.print_exc()
        first = str(e).strip().splitlines()
        print(f"deploytool: internal error: {type(e).__name__}: {first[-1] if first else ''} "
              f"(rerun with --verbose and file an issue)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
