"""Output channels padded to whole vectors, for CPU convolutions whose channel count is not a
multiple of the SIMD width.

The CPU schedules vectorize a convolution over its output channels (NHWC, HWIO weights). A count
that no full vector divides leaves them half-vectors or worse: SqueezeNet's classifier, a 1x1
convolution to 1,000 channels, ran in 8-lane vectors on AVX-512 (1,000 = 62.5 x 16); YOLOv3-tiny's
detection heads have 255 channels. Here such a convolution computes Kp channels instead (weights
padded with zeros at compile time: 1,008 for 1,000 on AVX-512, +0.8% of its FLOPs); the ops after it
that act per element or per channel (bias, ReLU, clip, scale; a mean or pooling over the spatial
axes) run on the padded tensor, their constants padded too; then one slice back to K channels.

The slice is a kernel of its own (marked opaque, so that FuseOps leaves it alone): fused into the
convolution it made the write-back a predicated block, and TVM 0.27's reverse_compute_at drops a
block's predicate when it moves it onto a tile (out-of-bounds stores, seen with our default
schedule; MetaSchedule's tiling does the same move). So a convolution is padded only where that
slice is cheap: after a spatial reduction (SqueezeNet: 1,008 values after the global mean), or where
only layout changes or the graph's output read the result (YOLOv3-tiny's heads); a convolution
whose result flows into other compute (a residual add, another convolution) stays as it is.

Applied when the padding costs at most 25% more channels (1,000 -> 1,008, 255 -> 256, 40 -> 48;
not 24 -> 32), to float32 NHWC convolutions with constant weights.

Grouped convolutions (not depthwise) pad each group's output channels: the schedule keeps a
vector tile within one group (its input channels are then one broadcast), so ShuffleNet's groups of
34 output channels ran in vectors of 2 lanes (12-13 GFLOP/s, half the model's time); padded to 40
they run in whole vectors. The weights and per-channel constants are padded group by group, and
the slice back ([..., G * kgp] -> [..., G, kg] -> [..., K]) goes after the convolution whatever
follows it: the gain is worth a pass over the output. That slice is marked injective, not opaque,
so FuseOps fuses what follows (the channel shuffle, a residual add, a concat) into it and leaves
the convolution alone.
"""

from __future__ import annotations

MAX_EXTRA = 0.25  # at most this fraction of extra channels
OPAQUE = 8  # TVM's OpPatternKind kOpaque: FuseOps fuses nothing with it
INJECTIVE = 2  # kInjective: FuseOps fuses the elementwise ops after it, not the convolution before

# binary elementwise ops whose constant operand may be padded along the channels: pad value per op
_BINARY_PAD = {"relax.add": 0.0, "relax.subtract": 0.0, "relax.multiply": 1.0, "relax.divide": 1.0,
               "relax.maximum": 0.0, "relax.minimum": 0.0}
# per-element ops: padded channels in, padded channels out
_UNARY = {"relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
          "relax.nn.gelu_tanh", "relax.exp", "relax.sqrt", "relax.negative", "relax.abs", "relax.astype"}
# reductions over axes other than the channels (an ``axis`` attribute), and NHWC poolings
_SPATIAL_REDUCE = {"relax.mean", "relax.sum", "relax.max", "relax.min"}
_POOL = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"}
# consumers that a slice kernel may precede at no real cost: they only move the values
_LAYOUT = {"relax.permute_dims", "relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten"}


def padded(k: int, lanes: int) -> int | None:
    """The channel count to compute instead of ``k``, or None where ``k`` stays."""
    if lanes <= 1 or k % lanes == 0:
        return None
    kp = -(-k // lanes) * lanes
    return kp if kp - k <= MAX_EXTRA * k else None


def _conv_channels(call) -> tuple[int, int] | None:
    """(K, groups) of a convolution this pass may pad (NHWC / HWIO, constant weights, not
    depthwise: at least 2 output channels per group), else None."""
    import tvm

    a = call.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NHWC", "HWIO", "NHWC"):
        return None
    w = call.args[1]
    if not isinstance(w, tvm.ir.Constant) or str(w.ty.dtype) != "float32":
        return None
    k, groups = int(w.ty.shape[3]), int(a.groups)
    if k % groups or k // groups < 2:
        return None
    return k, groups


def _pad_groups(data, axis: int, groups: int, kgp: int, value: float):
    """``data`` with each of its ``groups`` runs along ``axis`` padded with ``value`` to ``kgp``."""
    import numpy as np

    shape = list(data.shape)
    kg = shape[axis] // groups
    split = data.reshape(shape[:axis] + [groups, kg] + shape[axis + 1:])
    width = [(0, 0)] * split.ndim
    width[axis + 1] = (0, kgp - kg)
    return np.pad(split, width, constant_values=value).reshape(shape[:axis] + [groups * kgp] + shape[axis + 1:])


def _channel_constant(c, k: int) -> bool:
    """A constant that broadcasts along the channels of an [..., k] tensor: [..., k] or [..., 1]."""
    import tvm

    if not isinstance(c, tvm.ir.Constant):
        return False
    shape = [int(d) for d in c.ty.shape]
    return not shape or shape[-1] in (1, k)


def _keeps_channels(call, arg) -> bool:
    """Whether ``call`` reduces ``arg`` (NHWC, channels last) over spatial axes only, keeping the
    channels as its last axis: a mean/sum/max/min over axes without the last, or an NHWC pooling."""
    name = call.op.name
    if not call.args or not call.args[0].same_as(arg):
        return False
    ndim = len(arg.ty.shape)
    if name in _SPATIAL_REDUCE:
        axes = call.attrs.axis
        if axes is None or len(call.ty.shape) != ndim:  # over everything, or channels no longer last
            return False
        return all(int(a) % ndim != ndim - 1 for a in axes)
    if name in _POOL:
        return str(call.attrs.layout) == "NHWC" and str(getattr(call.attrs, "out_layout", "NHWC")) == "NHWC"
    return False


def pad_pass(lanes: int):
    """The module pass (see the module's docstring)."""
    import numpy as np
    import tvm
    from tvm import relax, topi

    def pad_last(c, k: int, kp: int, value: float, groups: int = 1):
        """A constant along the channels, each group's run padded to kp // groups."""
        data = c.value.numpy()
        if data.ndim == 0 or data.shape[-1] != k:
            return c
        return relax.const(_pad_groups(data, data.ndim - 1, groups, kp // groups, value), str(data.dtype))

    def plan(block) -> dict:
        """binding var -> (k, kp, last): the convolutions to pad and the elementwise ops after them
        that run padded; ``last`` marks where the slice back to k goes."""
        users = relax.analysis.udchain(block)
        values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        todo = {}
        for var, value in values.items():
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                    and value.op.name == "relax.nn.conv2d"):
                continue
            kg = _conv_channels(value)
            if kg is None:
                continue
            k, groups = kg
            kgp = padded(k // groups, lanes)
            if kgp is None:
                continue
            kp = kgp * groups
            chain, reduced = [var], False
            while True:  # extend through single-use per-element, per-channel or spatial-reduction consumers
                cur = chain[-1]
                if not isinstance(cur, relax.DataflowVar) or len(users.get(cur, [])) != 1:
                    break
                nxt = users[cur][0]
                call = values.get(nxt)
                if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                    break
                name = call.op.name
                others = [a for a in call.args if not a.same_as(cur)]
                if name in _UNARY and call.args[0].same_as(cur):
                    pass
                elif name in _BINARY_PAD and len(others) == 1 and _channel_constant(others[0], k):
                    pass
                elif _keeps_channels(call, cur):
                    reduced = True
                else:
                    break
                chain.append(nxt)
            end = chain[-1]
            cheap = reduced or not isinstance(end, relax.DataflowVar) or all(
                isinstance(values.get(u), relax.Call) and isinstance(values[u].op, tvm.ir.Op)
                and values[u].op.name in _LAYOUT for u in users.get(end, []))
            if cheap or groups > 1:  # a grouped one gains whole vectors, worth a pass over its output
                for i, v in enumerate(chain):
                    todo[v] = (k, kp, groups, i == len(chain) - 1)
        return todo

    @relax.expr_functor.mutator
    class Pad(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.todo = {}
            for func in mod.functions.values():
                if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                    for block in func.body.blocks:
                        if isinstance(block, relax.DataflowBlock):
                            self.todo.update(plan(block))

        def visit_var_binding_(self, binding):
            if binding.var not in self.todo:
                return super().visit_var_binding_(binding)
            k, kp, groups, last = self.todo[binding.var]
            call = binding.value
            if call.op.name == "relax.nn.conv2d":
                new = relax.Call(call.op, [self.visit_expr(call.args[0]), pad_last(call.args[1], k, kp, 0.0, groups)],
                                 call.attrs)
            else:
                fill = _BINARY_PAD.get(call.op.name, 0.0)
                args = [pad_last(x, k, kp, fill, groups) if isinstance(x, tvm.ir.Constant) else self.visit_expr(x)
                        for x in call.args]
                new = relax.Call(call.op, args, call.attrs, call.ty_args)
            wide = self.builder_.emit(new, binding.var.name + "_padded")
            if not last:
                self.set_var_remap(binding.var, wide)
                return
            shape = [int(d) for d in binding.var.ty.shape]
            ndim = len(shape)

            def slice_back(t):
                if groups == 1:
                    return topi.strided_slice(t, [0] * ndim, shape)
                # [..., G * kgp] -> [..., G, kgp] -> the first kg of each group -> [..., K]
                split = topi.reshape(t, shape[:-1] + [groups, kp // groups])
                kept = topi.strided_slice(split, [0] * (ndim + 1), shape[:-1] + [groups, k // groups])
                return topi.reshape(kept, shape)

            sliced = self.builder_.call_te(slice_back, wide, primfunc_name_hint="channel_slice",
                                           primfunc_attrs={"op_pattern": OPAQUE if groups == 1 else INJECTIVE})
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(sliced)))

    from deploytool.pipeline import _relax_function_pass

    return _relax_function_pass(Pad, "PadOutputChannels")
