"""onnxruntime's own per-node times for a model: python bench/ort_profile.py MODEL.onnx [--threads 2]

What `deploytool profile` shows for our kernels, for the engine we compare against: onnxruntime's
session profiler, the median of --runs runs per node (after --warmup), heaviest first, with each
convolution's GFLOP/s and output shape. Put the two side by side to see which kernels hold a model
back."""

import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--top", type=int, default=15)
args = p.parse_args()
if not os.path.isfile(args.model):
    print(f"bench/ort_profile.py: error: no model at {args.model}: pass the path of an .onnx file", file=sys.stderr)
    sys.exit(2)

so = ort.SessionOptions()
so.enable_profiling = True
so.intra_op_num_threads = args.threads
so.profile_file_prefix = tempfile.mkdtemp() + "/ort"
sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feed = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
        for i in sess.get_inputs()}
for _ in range(args.warmup + args.runs):
    sess.run(None, feed)
events = json.load(open(sess.end_profiling()))
times = collections.defaultdict(list)
flops, shapes = {}, {}
for e in events:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
        key = (e["name"][: -len("_kernel_time")], e["args"].get("op_name"))
        times[key].append(e["dur"])
        ins, outs = e["args"].get("input_type_shape", []), e["args"].get("output_type_shape", [])
        shapes[key] = outs
        if key[1] == "Conv" and len(ins) >= 2 and outs:
            # every weight is used once per output pixel (any layout, NCHWc too: [N, C/8, H, W, 8])
            w, o = next(iter(ins[1].values())), next(iter(outs[0].values()))
            flops[key] = 2 * int(np.prod(w)) * o[0] * o[2] * o[3]
rows = sorted(((float(np.median(v[args.warmup:] or v)) / 1e3, k) for k, v in times.items()), reverse=True)
total = sum(r[0] for r in rows)
print(f"{'node':30} {'op':8} {'ms':>8} {'share':>6} {'GFLOP':>7} {'GFLOP/s':>8}  output")
for ms, key in rows[: args.top]:
    f = flops.get(key)
    print(f"{key[0][:30]:30} {key[1] or '?':8} {ms:8.3f} {100 * ms / total:5.1f}% "
          + (f"{f / 1e9:7.3f} {f / ms / 1e6:8.0f}" if f else f"{'':7} {'':8}") + f"  {shapes[key]}")
print(f"nodes: {total:.3f} ms in all ({len(rows)} nodes), {args.threads} threads")
