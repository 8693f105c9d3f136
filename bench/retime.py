"""Which of two logs of one model holds the faster kernels, timed now, side by side:
python bench/retime.py MODEL.onnx LOG LOG [...] [--target x86-avx512] [--rounds 5]

Each kernel's best candidate of each log (``TuningLog.best_by_workload``) is rebuilt and timed
cold in interleaved rounds (bench/retiming.py), the median of its rounds kept; per log, the sum
over kernels times their calls, as logged and as timed now. Two runs made hours apart on a VM
whose speed drifts compare by this, not by their logged estimates.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import retiming


def main() -> int:
    from deploytool.tuninglog import TuningLog

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--target", default="x86-avx512")
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    model, logs = opts.model, opts.logs
    missing = [p for p in [model, *logs] if not Path(p).is_file()]
    if missing:
        ap.error(f"no such file: {', '.join(missing)}")
    k = retiming.kernels(model, opts.target)
    tasks = k.tasks
    bests = [TuningLog.read(p).best_by_workload() for p in logs]
    jobs = []
    for ti, t in enumerate(tasks):
        for li, b in enumerate(bests):
            r = b.get(t.workload_hash)
            if r is None:
                raise SystemExit(f"{logs[li]} has no record of kernel {t.name}: not a log of this model")
            jobs.append((ti, li, k.replay(ti, r.trace), r.seconds))
    outs = retiming.time_side_by_side(k, [(j[0], j[2]) for j in jobs], opts.rounds)
    now = [0.0] * len(logs); logged = [0.0] * len(logs)
    for (ti, li, _, s), (med, o) in zip(jobs, outs):
        if med is None:
            raise SystemExit(f"{logs[li]}'s best candidate of {tasks[ti].name} failed now: {o.error}")
        c = max(tasks[ti].calls, 1)
        now[li] += med * c * 1e3
        logged[li] += s * c * 1e3
    for p, a, b in zip(logs, logged, now):
        print(f"{p}: logged {a:.3f} ms, re-timed now {b:.3f} ms ({b / a:.3f}x)")
    return 0


if __name__ == "__main__":
    from deploytool.errors import DeploytoolError

    try:
        raise SystemExit(main())
    except DeploytoolError as e:  # a log of another target, an unreadable model: one line
        raise SystemExit(f"retime.py: {e}")
