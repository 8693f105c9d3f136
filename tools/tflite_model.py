"""A small float32 TFLite model, and its ONNX twin with the same weights, written without TensorFlow.

    python tools/tflite_model.py OUT_DIR     # writes OUT_DIR/micro_nhwc.tflite and OUT_DIR/micro_nhwc.onnx

The .tflite is written with flatbuffers against the TFLite schema (field slots as in the `tflite`
package's readers). The graph, NHWC as TFLite has it:

    input [1,16,16,3] -> CONV_2D 3x3 8 (SAME, ReLU) -> DEPTHWISE_CONV_2D 3x3 (SAME, ReLU)
      -> MAX_POOL_2D 2x2 -> RESHAPE [1,512] -> FULLY_CONNECTED 10 -> SOFTMAX

The ONNX twin computes the same function (transposes around the NCHW convolutions), so the
bundle compiled from the .tflite can be checked against onnxruntime.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# TFLite schema: builtin operators, options unions, field slots.
CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, FULLY_CONNECTED, SOFTMAX, RESHAPE = 3, 4, 17, 9, 25, 22
OPT_CONV, OPT_DW, OPT_POOL, OPT_FC, OPT_SOFTMAX, OPT_RESHAPE = 1, 2, 5, 8, 9, 17
SAME, RELU = 0, 1


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"conv_w": rng.normal(0, (2 / 27) ** 0.5, (8, 3, 3, 3)).astype(np.float32),       # OHWI
            "conv_b": rng.normal(0, 0.05, 8).astype(np.float32),
            "dw_w": rng.normal(0, (2 / 9) ** 0.5, (1, 3, 3, 8)).astype(np.float32),          # 1HWC
            "dw_b": rng.normal(0, 0.05, 8).astype(np.float32),
            "fc_w": rng.normal(0, (1 / 512) ** 0.5, (10, 512)).astype(np.float32),
            "fc_b": rng.normal(0, 0.05, 10).astype(np.float32)}


def _table(b, fields: list[tuple[str, int, object]]) -> int:
    """A table from (kind, slot, value) fields: kind in int32/uint32/int8/uint8/float32/offset."""
    b.StartObject(max(s for _, s, _ in fields) + 1 if fields else 0)
    for kind, slot, value in fields:
        if kind == "offset":
            b.PrependUOffsetTRelativeSlot(slot, value, 0)
        elif kind == "float32":
            b.PrependFloat32Slot(slot, value, 0.0)
        else:
            getattr(b, {"int32": "PrependInt32Slot", "uint32": "PrependUint32Slot", "int8": "PrependInt8Slot",
                        "uint8": "PrependUint8Slot"}[kind])(slot, value, 0)  # written: ForceDefaults
    return b.EndObject()


def _vector(b, items: list[int], kind: str = "offset") -> int:
    b.StartVector(4, len(items), 4)
    for x in reversed(items):
        b.PrependUOffsetTRelative(x) if kind == "offset" else b.PrependInt32(x)
    return b.EndVector()


def write_tflite(path: str | Path, w: dict[str, np.ndarray]) -> Path:
    import flatbuffers

    b = flatbuffers.Builder(1 << 16)
    b.ForceDefaults(True)  # every field given is written, even when it equals the schema default
    # buffers: 0 is empty by convention; then one per constant
    consts = ["conv_w", "conv_b", "dw_w", "dw_b", "fc_w", "fc_b", "shape"]
    data = {**w, "shape": np.array([1, 512], np.int32)}
    buf_offsets = [_table(b, [])]
    for name in consts:
        b.StartVector(1, data[name].nbytes, 16)
        for byte in reversed(data[name].tobytes()):
            b.PrependUint8(byte)
        vec = b.EndVector()
        buf_offsets.append(_table(b, [("offset", 0, vec)]))
    # tensors: (name, shape, type, buffer); type 0 float32, 2 int32
    tensors = [("input", [1, 16, 16, 3], 0, 0), ("conv_w", [8, 3, 3, 3], 0, 1), ("conv_b", [8], 0, 2),
               ("conv_out", [1, 16, 16, 8], 0, 0), ("dw_w", [1, 3, 3, 8], 0, 3), ("dw_b", [8], 0, 4),
               ("dw_out", [1, 16, 16, 8], 0, 0), ("pool_out", [1, 8, 8, 8], 0, 0), ("shape", [2], 2, 7),
               ("flat", [1, 512], 0, 0), ("fc_w", [10, 512], 0, 5), ("fc_b", [10], 0, 6),
               ("logits", [1, 10], 0, 0), ("probs", [1, 10], 0, 0)]
    idx = {t[0]: i for i, t in enumerate(tensors)}
    t_offs = []
    for name, shape, ttype, buf in tensors:
        nm = b.CreateString(name)
        sh = _vector(b, shape, "int")
        t_offs.append(_table(b, [("offset", 0, sh), ("int8", 1, ttype), ("uint32", 2, buf), ("offset", 3, nm)]))
    # operators: (opcode index, inputs, outputs, options type, options fields)
    opcodes = [CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX]
    new_shape = _vector(b, [1, 512], "int")
    ops = [(0, ["input", "conv_w", "conv_b"], ["conv_out"], OPT_CONV,
            [("int8", 0, SAME), ("int32", 1, 1), ("int32", 2, 1), ("int8", 3, RELU), ("int32", 4, 1), ("int32", 5, 1)]),
           (1, ["conv_out", "dw_w", "dw_b"], ["dw_out"], OPT_DW,
            [("int8", 0, SAME), ("int32", 1, 1), ("int32", 2, 1), ("int32", 3, 1), ("int8", 4, RELU),
             ("int32", 5, 1), ("int32", 6, 1)]),
           (2, ["dw_out"], ["pool_out"], OPT_POOL,
            [("int8", 0, 1), ("int32", 1, 2), ("int32", 2, 2), ("int32", 3, 2), ("int32", 4, 2), ("int8", 5, 0)]),
           (3, ["pool_out", "shape"], ["flat"], OPT_RESHAPE, [("offset", 0, new_shape)]),
           (4, ["flat", "fc_w", "fc_b"], ["logits"], OPT_FC, [("int8", 0, 0)]),
           (5, ["logits"], ["probs"], OPT_SOFTMAX, [("float32", 0, 1.0)])]
    op_offs = []
    for code, ins, outs, otype, ofields in ops:
        opt = _table(b, ofields)
        iv = _vector(b, [idx[n] for n in ins], "int")
        ov = _vector(b, [idx[n] for n in outs], "int")
        op_offs.append(_table(b, [("uint32", 0, code), ("offset", 1, iv), ("offset", 2, ov), ("uint8", 3, otype),
                                  ("offset", 4, opt)]))
    code_offs = [_table(b, [("int8", 0, min(c, 127)), ("int32", 2, 1), ("int32", 3, c)]) for c in opcodes]
    sg_name = b.CreateString("main")
    sg = _table(b, [("offset", 0, _vector(b, t_offs)), ("offset", 1, _vector(b, [idx["input"]], "int")),
                    ("offset", 2, _vector(b, [idx["probs"]], "int")), ("offset", 3, _vector(b, op_offs)),
                    ("offset", 4, sg_name)])
    desc = b.CreateString("deploytool test model (tools/tflite_model.py)")
    model = _table(b, [("uint32", 0, 3), ("offset", 1, _vector(b, code_offs)), ("offset", 2, _vector(b, [sg])),
                       ("offset", 3, desc), ("offset", 4, _vector(b, buf_offsets))])
    b.Finish(model, file_identifier=b"TFL3")
    path = Path(path)
    path.write_bytes(bytes(b.Output()))
    return path


def write_onnx_twin(path: str | Path, w: dict[str, np.ndarray]) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(w["conv_w"].transpose(0, 3, 1, 2).copy(), "conv_w"),
             numpy_helper.from_array(w["conv_b"], "conv_b"),
             numpy_helper.from_array(w["dw_w"].transpose(3, 0, 1, 2).copy(), "dw_w"),
             numpy_helper.from_array(w["dw_b"], "dw_b"),
             numpy_helper.from_array(w["fc_w"], "fc_w"), numpy_helper.from_array(w["fc_b"], "fc_b"),
             numpy_helper.from_array(np.array([1, 512], np.int64), "shape")]
    nodes = [helper.make_node("Transpose", ["input"], ["x"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["cr"]),
             helper.make_node("Conv", ["cr", "dw_w", "dw_b"], ["d"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("MaxPool", ["dr"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Transpose", ["p"], ["pn"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["pn", "shape"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "micro_nhwc", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 16, 16, 3])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="deploytool-tests")
    m.ir_version = 8
    onnx.save(m, path)
    return Path(path)


def write(out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = weights(seed)
    return write_tflite(out / "micro_nhwc.tflite", w), write_onnx_twin(out / "micro_nhwc.onnx", w)


if __name__ == "__main__":
    print(*write(sys.argv[1] if len(sys.argv) > 1 else "."))
