"""Two tuning logs of one model, timed against each other and onnxruntime in one run:

    python bench/logs_ab.py --label intel MODEL.onnx:LOG_A:LOG_B [MODEL2.onnx:LOG_A:LOG_B ...]
                            [--names A,B] [--tuned-on MACHINE] [--rounds 5] [--target x86-avx512]
                            [--winograd ,auto]

Each model is built from both logs (--require-tuned; each build checked against onnxruntime),
then timed in --rounds interleaved rounds (A, B, onnxruntime per round, same inputs and
threads). The ratio per round is deploytool's median over onnxruntime's in that round; the
table gives the median ratio and its range. Writes bench/results/logs-<label>.{json,md}.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from deploytool import api, targets

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+", metavar="MODEL.onnx:LOG_A:LOG_B")
p.add_argument("--names", default="A,B", help="labels of the two logs (default: A,B)")
p.add_argument("--label", required=True)
p.add_argument("--target", default="x86-avx512")
p.add_argument("--tuned-on", help="the machine whose records to take from multi-machine logs (default: this one)")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--repeats", type=int, default=20)
p.add_argument("--winograd", default="", metavar="A,B",
               help="--winograd for each build: '' (none), 'auto' or 'all', comma-separated (default: none for both)")
args = p.parse_args()
na, nb = args.names.split(",")
wino = dict(zip((na, nb), ((args.winograd.split(",") + [""])[:2] if args.winograd else ["", ""])))
wino = {k: {"": False, "all": True, "auto": "auto"}[v] for k, v in wino.items()}
out_dir = Path(__file__).resolve().parent / "results"
rows = []
with tempfile.TemporaryDirectory() as tmp:
    for run in args.runs:
        model, log_a, log_b = run.split(":")
        name = Path(model).stem
        arts = {}
        for lab, lg in ((na, log_a), (nb, log_b)):
            so = Path(tmp) / f"{name}-{lab}.so"
            api.compile(model, target=args.target, output=so, tuning_log=lg, require_tuned=True, tuned_on=args.tuned_on,
                        winograd=wino[lab], progress=print if wino[lab] == "auto" else (lambda _m: None))
            chk = api.run(so, check=model)
            arts[lab] = (so, chk.ok)
        per = {na: [], nb: [], "onnxruntime": [], f"ratio_{na}": [], f"ratio_{nb}": []}
        for _ in range(args.rounds):
            for lab in (na, nb):
                r = api.bench(arts[lab][0], compare=model, repeats=args.repeats)
                per[lab].append(r.deploytool.median_ms)
                per["onnxruntime"].append(r.onnxruntime.median_ms)
                per[f"ratio_{lab}"].append(r.deploytool.median_ms / r.onnxruntime.median_ms)
        rows.append({"model": name, "logs": {na: log_a, nb: log_b}, "check": {k: v[1] for k, v in arts.items()},
                     **{k: v for k, v in per.items()}})
        print(name, {k: round(statistics.median(v), 3) for k, v in per.items()}, flush=True)

res = {"benchmark": "logs_ab", "target": args.target, "host": {"cpu": targets.cpu_name()},
       "threads": targets.physical_cores(), "rounds": args.rounds,
       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "names": [na, nb], "rows": rows,
       **({"winograd": {k: v for k, v in wino.items() if v}} if any(wino.values()) else {})}
(out_dir / f"logs-{args.label}.json").write_text(json.dumps(res, indent=1) + "\n")
md = [f"Host {res['host']['cpu']}, {res['threads']} threads, {res['date']}; {args.rounds} interleaved rounds. "
      "Ratio: deploytool's median over onnxruntime's in the same round (median of rounds, [min-max]).", "",
      f"| model | {na} ms | {nb} ms | onnxruntime ms | {na} / ort | {nb} / ort | check |", "|---|---|---|---|---|---|---|"]
for r in rows:
    def rng(k):
        v = r[k]
        return f"{statistics.median(v):.2f}x [{min(v):.2f}-{max(v):.2f}]"
    md.append(f"| {r['model']} | {statistics.median(r[na]):.2f} | {statistics.median(r[nb]):.2f} | "
              f"{statistics.median(r['onnxruntime']):.2f} | {rng('ratio_' + na)} | {rng('ratio_' + nb)} | "
              f"{'pass' if all(r['check'].values()) else r['check']} |")
(out_dir / f"logs-{args.label}.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
