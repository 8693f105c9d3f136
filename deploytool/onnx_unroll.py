"""Loops unrolled at the ONNX level, once input shapes are known: Scan (opset 9+) and the recurrent
cells LSTM, GRU and RNN. TVM's importer has none of them; unrolled, a recurrent model imports as a
plain graph of MatMul/Add/activations (and ONNX functions whose bodies use Scan, such as
LinearAttention, import too). Only static lengths are unrolled (at most ``MAX_UNROLL`` steps);
``unroll`` leaves any other such node in place and ``frontend`` reports it in one line.
"""

from __future__ import annotations

import numpy as np

MAX_UNROLL = 512
UNROLLED = {"Scan", "LSTM", "GRU", "RNN"}
# If with a condition that folds to a constant is replaced by its branch (onnx_passes.fold_constants)
INLINED = {"If"}


def _opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def unroll(model) -> int:
    """Unroll every top-level node of UNROLLED whose length is static, in place; returns how many."""
    from onnx import helper, numpy_helper, shape_inference

    opset = _opset(model)
    if not any(n.op_type in UNROLLED and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return 0
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return 0
    shapes, types = {}, {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        types[vi.name] = vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
        types[t.name] = t.data_type
    nodes, inits, done = [], [], 0
    for idx, node in enumerate(model.graph.node):
        out = None
        if node.domain in ("", "ai.onnx"):
            if node.op_type == "Scan" and opset >= 9:
                out = _unroll_scan(node, idx, shapes, opset, helper, numpy_helper)
            elif node.op_type in ("LSTM", "GRU", "RNN"):
                out = _Cell(node, idx, shapes, types, opset).build()
        if out is None:
            nodes.append(node)
            continue
        nodes.extend(out[0])
        inits.extend(out[1])
        done += 1
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.graph.initializer.extend(inits)
    return done


def _unroll_scan(node, idx, shapes, opset, helper, numpy_helper):
    attrs = {a.name: a for a in node.attribute}
    body = attrs["body"].g
    m = attrs["num_scan_inputs"].i
    n_state = len(node.input) - m
    in_axes = list(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else [0] * m
    in_dirs = list(attrs["scan_input_directions"].ints) if "scan_input_directions" in attrs else [0] * m
    k_out = len(body.output) - n_state
    out_axes = list(attrs["scan_output_axes"].ints) if "scan_output_axes" in attrs else [0] * k_out
    out_dirs = list(attrs["scan_output_directions"].ints) if "scan_output_directions" in attrs else [0] * k_out
    if m == 0 or any(a.g is not None and a.g.node or a.graphs for n in body.node for a in n.attribute):
        return None  # nested subgraphs: their outer-scope names would need renaming too
    first = shapes.get(node.input[n_state])
    if not first:
        return None
    ax0 = in_axes[0] % len(first)
    steps = first[ax0]
    if not steps or steps > MAX_UNROLL:
        return None
    p = f"{node.output[0] or node.name or 'scan'}__scan{idx}_"
    nodes, inits = [], []
    consts = {}

    def const(value, name):
        if name not in consts:
            t = numpy_helper.from_array(np.asarray(value, np.int64), p + name)
            inits.append(t)
            consts[name] = t.name
        return consts[name]

    local = {i.name for i in body.input} | {t.name for t in body.initializer}
    for n in body.node:
        local.update(o for o in n.output if o)
    state = list(node.input[:n_state])
    per_step = [[] for _ in range(k_out)]
    for t in range(steps):
        tp = f"{p}t{t}_"
        ren = {nm: tp + nm for nm in local}
        for t_init in body.initializer:
            c = type(t_init)()
            c.CopyFrom(t_init)
            c.name = ren[t_init.name]
            inits.append(c)
        for i, bi in enumerate(body.input[:n_state]):
            nodes.append(helper.make_node("Identity", [state[i]], [ren[bi.name]]))
        for j, bi in enumerate(body.input[n_state:]):
            rank = len(shapes.get(node.input[n_state + j]) or [None])
            step = steps - 1 - t if in_dirs[j] else t
            nodes.append(helper.make_node("Gather", [node.input[n_state + j], const(step, f"i{step}")],
                                          [ren[bi.name]], axis=in_axes[j] % max(rank, 1)))
        for n in body.node:
            c = type(n)()
            c.CopyFrom(n)
            c.name = tp + (n.name or "n")
            c.input[:] = [ren.get(x, x) if x else x for x in n.input]
            c.output[:] = [ren.get(x, x) if x else x for x in n.output]
            nodes.append(c)
        state = [ren[o.name] for o in body.output[:n_state]]
        for k in range(k_out):
            per_step[k].append(ren[body.output[n_state + k].name])
    for i in range(n_state):
        if node.output[i]:
            nodes.append(helper.make_node("Identity", [state[i]], [node.output[i]]))
    for k in range(k_out):
        name = node.output[n_state + k] if n_state + k < len(node.output) else ""
        if not name:
            continue
        elems = per_step[k][::-1] if out_dirs[k] else per_step[k]
        axis = out_axes[k]
        if axis < 0:  # negative axes count from the end of the *output* rank: resolved by shape inference
            rank = len(shapes.get(name) or [])
            if not rank:
                return None
            axis %= rank
        ups = []
        for t, e in enumerate(elems):
            u = f"{p}u{k}_{t}"
            if opset >= 13:
                nodes.append(helper.make_node("Unsqueeze", [e, const([axis], f"ax{axis}")], [u]))
            else:
                nodes.append(helper.make_node("Unsqueeze", [e], [u], axes=[axis]))
            ups.append(u)
        nodes.append(helper.make_node("Concat", ups, [name], axis=axis))
    return nodes, inits


_ACTS = {"Sigmoid", "Tanh", "Relu"}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


class _Cell:
    """One LSTM/GRU/RNN node unrolled over its (static) sequence: per direction, per step, the ONNX
    equations written out with MatMul/Add/Mul and the activations; sequence_lens masks the state
    updates (forward direction)."""

    def __init__(self, node, idx, shapes, types, opset):
        from onnx import helper

        self.node, self.shapes, self.types, self.opset = node, shapes, types, opset
        self.kind = node.op_type
        self.a = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.p = f"{node.output[0] or node.output[-1] or node.name or 'rnn'}__{self.kind.lower()}{idx}_"
        self.nodes, self.inits, self.n = [], [], 0

    # -- emit helpers
    def _name(self, tag):
        self.n += 1
        return f"{self.p}{tag}{self.n}"

    def op(self, op_type, inputs, **attrs):
        from onnx import helper

        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def const(self, value, dtype=np.int64):
        from onnx import numpy_helper

        t = numpy_helper.from_array(np.asarray(value, dtype), self._name("c"))
        self.inits.append(t)
        return t.name

    def gather(self, x, i, axis=0):
        return self.op("Gather", [x, self.const(i)], axis=axis)

    def rows(self, x, start, end, axis):
        if self.opset >= 10:
            return self.op("Slice", [x, self.const([start]), self.const([end]), self.const([axis])])
        return self.op("Slice", [x], starts=[start], ends=[end], axes=[axis])

    def unsqueeze(self, x, axis):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const([axis])])
        return self.op("Unsqueeze", [x], axes=[axis])

    def act(self, name, x):
        return self.op(name, [x])

    def clip(self, x):
        c = self.a.get("clip")
        if c is None:
            return x
        if self.opset >= 11:
            return self.op("Clip", [x, self.const(-c, self.np_dtype), self.const(c, self.np_dtype)])
        return self.op("Clip", [x], min=-c, max=c)

    def inp(self, i):
        return self.node.input[i] if len(self.node.input) > i and self.node.input[i] else None

    # -- the unrolled graph
    def build(self):
        from onnx import helper

        k = self.kind
        x = self.inp(0)
        xs = self.shapes.get(x)
        layout = int(self.a.get("layout", 0))
        H = int(self.a.get("hidden_size", 0))
        if not xs or len(xs) != 3 or any(d is None for d in xs) or not H:
            return None
        T, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
        if T > MAX_UNROLL:
            return None
        direction = self.a.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
        acts = [s.decode() if isinstance(s, bytes) else s for s in self.a.get("activations", [])]
        n_act = len(_DEFAULT_ACTS[k])
        if dirs is None or (acts and (len(acts) != n_act * len(dirs) or set(acts) - _ACTS)):
            return None
        acts = acts or _DEFAULT_ACTS[k] * len(dirs)
        seq_lens = self.inp(4)
        if seq_lens and any(dirs):
            return None  # reverse over per-sequence lengths: not unrolled
        if k == "LSTM" and self.a.get("input_forget", 0) and self.inp(7):
            return None
        self.np_dtype = helper.tensor_dtype_to_np_dtype(self.types.get(x, 1))
        G = _GATES[k]
        ys, finals_h, finals_c = [], [], []
        for d, rev in enumerate(dirs):
            y, h, c = self.direction(d, rev, acts[d * n_act:(d + 1) * n_act], T, batch, H, G, layout, seq_lens)
            ys.append(y)
            finals_h.append(h)
            finals_c.append(c)
        outs = list(self.node.output) + [""] * 3
        if outs[0]:  # Y: [T, num_dir, batch, H] (layout 1: [batch, T, num_dir, H])
            steps = []
            for t in range(T):
                per_dir = [self.unsqueeze(ys[d][t], 0) for d in range(len(dirs))]
                step = per_dir[0] if len(per_dir) == 1 else self.op("Concat", per_dir, axis=0)
                steps.append(self.unsqueeze(step, 0))
            y = steps[0] if T == 1 else self.op("Concat", steps, axis=0)
            self.nodes.append(helper.make_node("Transpose" if layout else "Identity", [y], [outs[0]],
                                               **({"perm": [2, 0, 1, 3]} if layout else {})))
        for slot, finals in ((1, finals_h), (2, finals_c)):
            if not outs[slot] or finals[0] is None:
                continue
            per_dir = [self.unsqueeze(f, 0) for f in finals]
            y = per_dir[0] if len(per_dir) == 1 else self.op("Concat", per_dir, axis=0)
            self.nodes.append(helper.make_node("Transpose" if layout else "Identity", [y], [outs[slot]],
                                               **({"perm": [1, 0, 2]} if layout else {})))
        return self.nodes, self.inits

    def zeros(self, batch, H):
        from onnx import numpy_helper

        return self.op("ConstantOfShape", [self.const([batch, H])],
                       value=numpy_helper.from_array(np.zeros(1, self.np_dtype)))

    def initial(self, idx, d, batch, H, layout):
        v = self.inp(idx)
        return self.gather(v, d, axis=1 if layout else 0) if v else self.zeros(batch, H)

    def direction(self, d, rev, acts, T, batch, H, G, layout, seq_lens):
        k = self.kind
        W, R, B = self.inp(1), self.inp(2), self.inp(3)
        Wt = self.op("Transpose", [self.gather(W, d)], perm=[1, 0])        # [I, G*H]
        Rd = self.gather(R, d)                                              # [G*H, H]
        Rt = self.op("Transpose", [Rd], perm=[1, 0])                        # [H, G*H]
        wb = rb = None
        if B:
            Bd = self.gather(B, d)
            wb, rb = self.rows(Bd, 0, G * H, 0), self.rows(Bd, G * H, 2 * G * H, 0)
        # The input projection of every step in one MatMul ([T, batch, I] x [I, G*H], W's bias added
        # once): per step, only the recurrent MatMul stays. One GEMM instead of T small ones, and one
        # kernel fewer per step (a 49-step LSTM ran ~5 kernels a step, mostly per-call overhead).
        xw_all = self.op("MatMul", [self.node.input[0], Wt])
        if wb:
            xw_all = self.op("Add", [xw_all, wb])
        h = self.initial(5, d, batch, H, layout)
        c = self.initial(6, d, batch, H, layout) if k == "LSTM" else None
        P = self.inp(7) if k == "LSTM" else None
        if P:
            Pd = self.gather(P, d)
            pi, po, pf = (self.rows(Pd, j * H, (j + 1) * H, 0) for j in range(3))
        lbr = k == "GRU" and int(self.a.get("linear_before_reset", 0))
        if k == "GRU":
            Rh_t = self.op("Transpose", [self.rows(Rd, 2 * H, 3 * H, 0)], perm=[1, 0])   # [H, H]
        zeros = None
        ys = [None] * T

        def chunk(v, j):  # gate j of a [batch, G*H] pre-activation
            return self.rows(v, j * H, (j + 1) * H, 1)

        for t in (range(T - 1, -1, -1) if rev else range(T)):
            xw = self.gather(xw_all, t, axis=1 if layout else 0)  # x_t W^T + Wb, [batch, G*H]
            if k == "GRU":
                hr = self.op("MatMul", [h, Rt])
                pre = self.op("Add", [xw, hr])
                if rb:
                    pre = self.op("Add", [pre, rb])
                z = self.act(acts[0], self.clip(chunk(pre, 0)))
                r = self.act(acts[0], self.clip(chunk(pre, 1)))
                xh = chunk(xw, 2)  # W's bias included
                if lbr:
                    hrh = chunk(hr, 2)
                    if rb:
                        hrh = self.op("Add", [hrh, self.rows(rb, 2 * H, 3 * H, 0)])
                    ht = self.op("Add", [xh, self.op("Mul", [r, hrh])])
                else:
                    rh = self.op("MatMul", [self.op("Mul", [r, h]), Rh_t])
                    if rb:
                        rh = self.op("Add", [rh, self.rows(rb, 2 * H, 3 * H, 0)])
                    ht = self.op("Add", [xh, rh])
                ht = self.act(acts[1], self.clip(ht))
                new_h = self.op("Add", [ht, self.op("Mul", [z, self.op("Sub", [h, ht])])])
                new_c = None
            else:
                pre = self.op("Add", [xw, self.op("MatMul", [h, Rt])])
                if rb:
                    pre = self.op("Add", [pre, rb])
                if k == "RNN":
                    new_h, new_c = self.act(acts[0], self.clip(pre)), None
                else:
                    gi, go, gf, gc = (chunk(pre, j) for j in range(4))
                    if P:
                        gi = self.op("Add", [gi, self.op("Mul", [pi, c])])
                        gf = self.op("Add", [gf, self.op("Mul", [pf, c])])
                    i_ = self.act(acts[0], self.clip(gi))
                    if self.a.get("input_forget", 0):
                        f_ = self.op("Sub", [self.const(1.0, self.np_dtype), i_])
                    else:
                        f_ = self.act(acts[0], self.clip(gf))
                    c_ = self.act(acts[1], self.clip(gc))
                    new_c = self.op("Add", [self.op("Mul", [f_, c]), self.op("Mul", [i_, c_])])
                    if P:
                        go = self.op("Add", [go, self.op("Mul", [po, new_c])])
                    o_ = self.act(acts[0], self.clip(go))
                    new_h = self.op("Mul", [o_, self.act(acts[2], new_c)])
            if seq_lens:
                live = self.unsqueeze(self.op("Less", [self.const(t, np.int32 if self.types.get(seq_lens) == 6
                                                                  else np.int64), seq_lens]), 1)
                if zeros is None:
                    zeros = self.zeros(batch, H)
                ys[t] = self.op("Where", [live, new_h, zeros])
                new_h = self.op("Where", [live, new_h, h])
                if new_c is not None:
                    new_c = self.op("Where", [live, new_c, c])
            else:
                ys[t] = new_h
            h, c = new_h, new_c
        return ys, h, c
