"""Models we build ourselves, deterministically, for the benchmark corpus (bench/corpus.json).

Each builder returns an onnx.ModelProto whose weights come from a seeded generator, so that the
same code writes the same bytes (the corpus manifest pins their SHA-256):

* ``mobilenet_v2``  MobileNet-v2, 224x224, width 1.0 (inverted residuals, depthwise convs, ReLU6)
* ``mobilenet_v1``  MobileNet-v1, 224x224, width 1.0, as in the paper (depthwise-separable blocks, ReLU):
                    a second depthwise network for the pretrained cost model's training set, so that
                    MobileNet-v2 can be held out of it (no kernel in common: v2's activations are ReLU6)
* ``bert_encoder``  a BERT-base-like encoder: seq 128, hidden 768, 12 heads, 12 layers, FFN 3072,
                    MatMul / Softmax / LayerNormalization / erf-GELU; token ids in, hidden states out
* ``small_encoder`` the same encoder at MiniLM size: seq 128, hidden 384, 6 heads, 6 layers, FFN 1536
                    (no kernel shape in common with ``bert_encoder``: a second transformer for the
                    pretrained cost model's training set, so that BERT can be held out of it)
* ``ds_cnn_1d``     a keyword-spotting DS-CNN over 40 log-mel bins x 98 frames, 1-D convolutions
* ``micro_cnn``     a small image classifier for microcontrollers (conv, depthwise, pooling, dense, softmax)
* ``kws_dscnn``     MLPerf Tiny's keyword-spotting DS-CNN (49 x 10 MFCC, 2-D depthwise-separable blocks)
* ``yolov3_tiny``   a detector: YOLOv3-tiny, 416x416, 80 classes (13x13 and 26x26 heads, upsample +
                    concat), with the box decoding exporters put in the graph; NMS left to the host
"""

from __future__ import annotations

import numpy as np


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, arr: np.ndarray, base: str = "w") -> str:
        from onnx import numpy_helper

        nm = self.name(base)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), nm))
        return nm

    def weight(self, shape, fan_in: int, base: str = "w", gain: float = 2.0) -> str:
        return self.const(self.rng.normal(0, np.sqrt(gain / fan_in), size=shape).astype(np.float32), base)

    def bias(self, n: int) -> str:
        return self.const(self.rng.normal(0, 0.05, size=(n,)).astype(np.float32), "b")

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        from onnx import helper

        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, graph_name, inputs, outputs, opset: int):
        from onnx import helper

        g = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="deploytool.zoo")
        m.ir_version = 8
        return m


def mobilenet_v2(seed: int = 0, num_classes: int = 1000):
    from onnx import TensorProto, helper

    b = _Builder(seed)
    six = b.const(np.array(6.0, np.float32), "six")
    zero = b.const(np.array(0.0, np.float32), "zero")

    def conv_bn_relu6(x, cin, cout, k, stride, groups=1, act=True):
        w = b.weight((cout, cin // groups, k, k), fan_in=cin // groups * k * k)
        y = b.op("Conv", [x, w, b.bias(cout)], kernel_shape=[k, k], strides=[stride, stride],
                 pads=[k // 2] * 4, group=groups)
        return b.op("Clip", [y, zero, six]) if act else y

    x = "input"
    y = conv_bn_relu6(x, 3, 32, 3, 2)
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            h = conv_bn_relu6(y, cin, hidden, 1, 1) if t != 1 else y
            h = conv_bn_relu6(h, hidden, hidden, 3, stride, groups=hidden)
            h = conv_bn_relu6(h, hidden, c, 1, 1, act=False)
            y = b.op("Add", [y, h]) if stride == 1 and cin == c else h
            cin = c
    y = conv_bn_relu6(y, cin, 1280, 1, 1)
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    w = b.weight((num_classes, 1280), fan_in=1280, gain=1.0)
    y = b.op("Gemm", [y, w, b.bias(num_classes)], transB=1)
    b.nodes[-1].output[0] = "logits"
    return b.model("mobilenet_v2", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, num_classes])], opset=13)


def mobilenet_v1(seed: int = 0, num_classes: int = 1000):
    """Howard et al. 2017, Table 1: a 3x3 stride-2 convolution, 13 depthwise-separable blocks (3x3
    depthwise then 1x1 pointwise, each followed by BatchNorm, folded here into the bias, and ReLU),
    global average pooling and a dense classifier."""
    from onnx import TensorProto, helper

    b = _Builder(seed)

    def conv_relu(x, cin, cout, k, stride, groups=1):
        w = b.weight((cout, cin // groups, k, k), fan_in=cin // groups * k * k)
        y = b.op("Conv", [x, w, b.bias(cout)], kernel_shape=[k, k], strides=[stride, stride],
                 pads=[k // 2] * 4, group=groups)
        return b.op("Relu", [y])

    y = conv_relu("input", 3, 32, 3, 2)
    cin = 32
    for cout, stride in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [
            (1024, 2), (1024, 1)]:
        y = conv_relu(y, cin, cin, 3, stride, groups=cin)
        y = conv_relu(y, cin, cout, 1, 1)
        cin = cout
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    w = b.weight((num_classes, cin), fan_in=cin, gain=1.0)
    y = b.op("Gemm", [y, w, b.bias(num_classes)], transB=1)
    b.nodes[-1].output[0] = "logits"
    return b.model("mobilenet_v1", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, num_classes])], opset=13)


def bert_encoder(seed: int = 0, seq: int = 128, hidden: int = 768, heads: int = 12, layers: int = 12,
                 ffn: int = 3072, vocab: int = 30522, name: str = "bert_encoder"):
    from onnx import TensorProto, helper

    b = _Builder(seed)
    dh = hidden // heads

    def layer_norm(x):
        g = b.const((1.0 + 0.05 * b.rng.standard_normal(hidden)).astype(np.float32), "ln_g")
        return b.op("LayerNormalization", [x, g, b.bias(hidden)], axis=-1, epsilon=1e-12)

    def dense(x, cin, cout):
        y = b.op("MatMul", [x, b.weight((cin, cout), fan_in=cin, gain=1.0)])
        return b.op("Add", [y, b.bias(cout)])

    def gelu(x):  # x * 0.5 * (1 + erf(x / sqrt(2))), as exporters emit it
        d = b.op("Div", [x, b.const(np.array(np.sqrt(2.0), np.float32), "sqrt2")])
        e = b.op("Erf", [d])
        p = b.op("Add", [e, b.const(np.array(1.0, np.float32), "one")])
        m = b.op("Mul", [x, p])
        return b.op("Mul", [m, b.const(np.array(0.5, np.float32), "half")])

    emb = b.const((0.02 * b.rng.standard_normal((vocab, hidden))).astype(np.float32), "word_emb")
    pos = b.const((0.02 * b.rng.standard_normal((1, seq, hidden))).astype(np.float32), "pos_emb")
    x = b.op("Gather", [emb, "input_ids"], axis=0)
    x = layer_norm(b.op("Add", [x, pos]))
    split_shape = b.const(np.array([1, seq, heads, dh], np.int64), "shape")
    merge_shape = b.const(np.array([1, seq, hidden], np.int64), "shape")
    scale = b.const(np.array(1.0 / np.sqrt(dh), np.float32), "scale")
    for _ in range(layers):
        q, k, v = (b.op("Transpose", [b.op("Reshape", [dense(x, hidden, hidden), split_shape])], perm=perm)
                   for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]))
        att = b.op("Softmax", [b.op("Mul", [b.op("MatMul", [q, k]), scale])], axis=-1)
        ctx = b.op("Reshape", [b.op("Transpose", [b.op("MatMul", [att, v])], perm=[0, 2, 1, 3]), merge_shape])
        x = layer_norm(b.op("Add", [x, dense(ctx, hidden, hidden)]))
        h = dense(gelu(dense(x, hidden, ffn)), ffn, hidden)
        x = layer_norm(b.op("Add", [x, h]))
    b.nodes[-1].output[0] = "hidden_states"
    return b.model(name, [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                   [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [1, seq, hidden])], opset=17)


def ds_cnn_1d(seed: int = 0, mels: int = 40, frames: int = 98, channels: int = 64, blocks: int = 4,
              num_classes: int = 12):
    from onnx import TensorProto, helper

    b = _Builder(seed)
    w = b.weight((channels, mels, 3), fan_in=mels * 3)
    y = b.op("Relu", [b.op("Conv", ["mel", w, b.bias(channels)], kernel_shape=[3], pads=[1, 1])])
    for _ in range(blocks):
        dw = b.weight((channels, 1, 9), fan_in=9)
        y = b.op("Relu", [b.op("Conv", [y, dw, b.bias(channels)], kernel_shape=[9], pads=[4, 4], group=channels)])
        pw = b.weight((channels, channels, 1), fan_in=channels)
        y = b.op("Relu", [b.op("Conv", [y, pw, b.bias(channels)], kernel_shape=[1])])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.op("Gemm", [y, b.weight((num_classes, channels), fan_in=channels, gain=1.0), b.bias(num_classes)], transB=1)
    b.nodes[-1].output[0] = "scores"
    return b.model("ds_cnn_1d", [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, mels, frames])],
                   [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, num_classes])], opset=13)


def micro_cnn(seed: int = 0, size: int = 32, num_classes: int = 10):
    """A small image classifier for microcontrollers (~67 KB of float weights): conv, depthwise conv,
    pointwise conv, max and average pooling, dense, softmax."""
    from onnx import TensorProto, helper

    b = _Builder(seed)
    y = b.op("Relu", [b.op("Conv", ["image", b.weight((16, 3, 3, 3), 27), b.bias(16)], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], strides=[2, 2])])
    y = b.op("Relu", [b.op("Conv", [y, b.weight((16, 1, 3, 3), 9), b.bias(16)], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], group=16)])
    y = b.op("Relu", [b.op("Conv", [y, b.weight((32, 16, 1, 1), 16), b.bias(32)], kernel_shape=[1, 1])])
    y = b.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Relu", [b.op("Conv", [y, b.weight((32, 1, 3, 3), 9), b.bias(32)], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], group=32)])
    y = b.op("Relu", [b.op("Conv", [y, b.weight((48, 32, 1, 1), 32), b.bias(48)], kernel_shape=[1, 1])])
    y = b.op("Relu", [b.op("Conv", [y, b.weight((32, 48, 3, 3), 432), b.bias(32)], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], strides=[2, 2])])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.op("Gemm", [y, b.weight((num_classes, 32), 32, gain=1.0), b.bias(num_classes)], transB=1)
    b.op("Softmax", [y], axis=1)
    b.nodes[-1].output[0] = "probs"
    return b.model("micro_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
                   [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, num_classes])], opset=13)


def kws_dscnn(seed: int = 0, frames: int = 49, mfcc: int = 10, channels: int = 64, blocks: int = 4,
              num_classes: int = 12):
    """The keyword-spotting DS-CNN of MLPerf Tiny (49 frames x 10 MFCC, 64 channels, 4 depthwise-
    separable blocks, ~23 K parameters), with BatchNorm folded into the convolutions' biases."""
    from onnx import TensorProto, helper

    b = _Builder(seed)
    y = b.op("Relu", [b.op("Conv", ["mfcc", b.weight((channels, 1, 10, 4), 40), b.bias(channels)],
                            kernel_shape=[10, 4], strides=[2, 2], pads=[4, 1, 5, 2])])
    for _ in range(blocks):
        y = b.op("Relu", [b.op("Conv", [y, b.weight((channels, 1, 3, 3), 9), b.bias(channels)], kernel_shape=[3, 3],
                                pads=[1, 1, 1, 1], group=channels)])
        y = b.op("Relu", [b.op("Conv", [y, b.weight((channels, channels, 1, 1), channels), b.bias(channels)],
                                kernel_shape=[1, 1])])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])], axis=1)
    y = b.op("Gemm", [y, b.weight((num_classes, channels), channels, gain=1.0), b.bias(num_classes)], transB=1)
    b.op("Softmax", [y], axis=1)
    b.nodes[-1].output[0] = "scores"
    return b.model("kws_dscnn", [helper.make_tensor_value_info("mfcc", TensorProto.FLOAT, [1, 1, frames, mfcc])],
                   [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, num_classes])], opset=13)


def yolov3_tiny(seed: int = 0, size: int = 416, num_classes: int = 80):
    """YOLOv3-tiny (Redmon & Farhadi's darknet config): 13 convolutions with BatchNorm folded into
    their biases and LeakyReLU(0.1), max pools (the last one stride 1, padded right and bottom),
    a second head at stride 16 through a 1x1 conv, nearest 2x upsampling and a concat. Each head's
    raw (1, 255, H, W) output is decoded in the graph as exporters do: box centres
    (sigmoid + grid) x stride, sizes exp x anchor, objectness and classes sigmoid; the two heads
    are concatenated into (1, 2535, 85) detections. Non-maximum suppression is left to the host."""
    from onnx import TensorProto, helper

    b = _Builder(seed)
    na, no = 3, num_classes + 5

    def conv(x, cin, cout, k, act=True, gain=2.0):
        y = b.op("Conv", [x, b.weight((cout, cin, k, k), fan_in=cin * k * k, gain=gain), b.bias(cout)],
                 kernel_shape=[k, k], pads=[k // 2] * 4)
        return b.op("LeakyRelu", [y], alpha=0.1) if act else y

    def maxpool(x, stride=2):
        return b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[stride, stride],
                    pads=[0, 0, 1, 1] if stride == 1 else [0, 0, 0, 0])

    def decode(x, grid_hw: int, stride: int, anchors):
        shape5 = b.const(np.array([1, na, no, grid_hw, grid_hw], np.int64), "shape")
        t = b.op("Transpose", [b.op("Reshape", [x, shape5])], perm=[0, 1, 3, 4, 2])  # (1, 3, H, W, 85)

        def part(lo, hi):
            return b.op("Slice", [t, b.const(np.array([lo], np.int64), "lo"), b.const(np.array([hi], np.int64), "hi"),
                                  b.const(np.array([4], np.int64), "axis")])
        gy, gx = np.meshgrid(np.arange(grid_hw), np.arange(grid_hw), indexing="ij")
        grid = b.const(np.stack([gx, gy], -1).reshape(1, 1, grid_hw, grid_hw, 2).astype(np.float32), "grid")
        xy = b.op("Mul", [b.op("Add", [b.op("Sigmoid", [part(0, 2)]), grid]),
                          b.const(np.array(float(stride), np.float32), "stride")])
        wh = b.op("Mul", [b.op("Exp", [part(2, 4)]),
                          b.const(np.array(anchors, np.float32).reshape(1, na, 1, 1, 2), "anchors")])
        y = b.op("Concat", [xy, wh, b.op("Sigmoid", [part(4, no)])], axis=4)
        return b.op("Reshape", [y, b.const(np.array([1, na * grid_hw * grid_hw, no], np.int64), "shape")])

    y = "images"
    cin = 3
    for cout in (16, 32, 64, 128):
        y = maxpool(conv(y, cin, cout, 3))
        cin = cout
    route = conv(y, 128, 256, 3)                       # stride 16, 26x26x256
    y = maxpool(conv(maxpool(route), 256, 512, 3), stride=1)
    y = conv(conv(y, 512, 1024, 3), 1024, 256, 1)      # 13x13x256
    head1 = conv(conv(y, 256, 512, 3), 512, na * no, 1, act=False, gain=0.1)
    up = b.op("Resize", [conv(y, 256, 128, 1), "", b.const(np.array([1, 1, 2, 2], np.float32), "scales")],
              mode="nearest")
    y = b.op("Concat", [up, route], axis=1)            # 26x26x384
    head2 = conv(conv(y, 384, 256, 3), 256, na * no, 1, act=False, gain=0.1)
    g1, g2 = size // 32, size // 16
    b.op("Concat", [decode(head1, g1, 32, [(81, 82), (135, 169), (344, 319)]),
                    decode(head2, g2, 16, [(10, 14), (23, 27), (37, 58)])], axis=1)
    b.nodes[-1].output[0] = "detections"
    n = na * (g1 * g1 + g2 * g2)
    return b.model("yolov3_tiny", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                   [helper.make_tensor_value_info("detections", TensorProto.FLOAT, [1, n, no])], opset=13)


def small_encoder(seed: int = 0):
    return bert_encoder(seed, seq=128, hidden=384, heads=6, layers=6, ffn=1536, name="small_encoder")


BUILDERS = {"small_encoder": small_encoder, "mobilenet_v2": mobilenet_v2, "mobilenet_v1": mobilenet_v1,
            "bert_encoder": bert_encoder, "ds_cnn_1d": ds_cnn_1d,
            "micro_cnn": micro_cnn, "kws_dscnn": kws_dscnn, "yolov3_tiny": yolov3_tiny}
