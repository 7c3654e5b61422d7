"""QDQ models as users bring them: float nets quantized by onnxruntime.quantization.quantize_static (QDQ format,
per-channel int8 weights), and QNN-style 16-bit-activation graphs built by hand with com.microsoft Q/DQ."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def _float_model(nodes, x_shape, y_name, y_shape, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "float", [helper.make_tensor_value_info("x", F32, list(x_shape))],
                              [helper.make_tensor_value_info(y_name, F32, list(y_shape))],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def conv3_float(seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu -> Conv, 1x3x16x16 -> 1x8x16x16."""
    rng = np.random.default_rng(seed)
    inits, nodes, prev = {}, [], "x"
    chans = [3, 8, 16, 8]
    for i in range(3):
        inits[f"w{i}"] = rng.normal(0, 0.3, (chans[i + 1], chans[i], 3, 3))
        inits[f"b{i}"] = rng.normal(0, 0.1, (chans[i + 1],))
        out = f"c{i}" if i < 2 else "y"
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [out], name=f"conv{i}", pads=[1, 1, 1, 1]))
        if i < 2:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            out = f"r{i}"
        prev = out
    return _float_model(nodes, (1, 3, 16, 16), "y", (1, 8, 16, 16), inits)


def mlp_float(seed: int = 1) -> onnx.ModelProto:
    """MatMul -> Add -> Relu -> MatMul -> Add, 4x32 -> 4x16."""
    rng = np.random.default_rng(seed)
    inits = {"w0": rng.normal(0, 0.2, (32, 64)), "b0": rng.normal(0, 0.1, (64,)),
             "w1": rng.normal(0, 0.2, (64, 16)), "b1": rng.normal(0, 0.1, (16,))}
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"], name="mm0"),
             helper.make_node("Add", ["m0", "b0"], ["a0"], name="add0"),
             helper.make_node("Relu", ["a0"], ["r0"], name="relu0"),
             helper.make_node("MatMul", ["r0", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["y"], name="add1")]
    return _float_model(nodes, (4, 32), "y", (4, 16), inits)


class _Reader:
    def __init__(self, shape, n=4, seed=3):
        rng = np.random.default_rng(seed)
        self.data = iter([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.data, None)


def quantize_qdq(model: onnx.ModelProto, x_shape, folder, name: str, **extra) -> onnx.ModelProto:
    """``quantize_static`` in QDQ format: uint8 activations, per-channel int8 weights (ORT's defaults otherwise)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    src, dst = os.path.join(str(folder), f"{name}_f.onnx"), os.path.join(str(folder), f"{name}_qdq.onnx")
    onnx.save(model, src)
    quantize_static(src, dst, _Reader(x_shape), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, **extra)
    return onnx.load(dst)


def conv3_qdq(folder) -> onnx.ModelProto:
    return quantize_qdq(conv3_float(), (1, 3, 16, 16), folder, "conv3")


def mlp_qdq(folder) -> onnx.ModelProto:
    return quantize_qdq(mlp_float(), (4, 32), folder, "mlp")


# --- QNN-style graphs: 16-bit activations through com.microsoft Q/DQ, per-channel int8 (or int4) weights ---------
MS = "com.microsoft"


class QdqBuilder:
    """Builds DQ -> op -> Q graphs by hand: ``act`` quantizes a float value (Q then DQ), ``weight`` adds a
    constant per-channel weight behind a DequantizeLinear."""

    def __init__(self, act_type=TensorProto.UINT16, domain: str = MS, seed: int = 5):
        self.nodes, self.inits, self.act_type, self.domain = [], {}, act_type, domain
        self.rng = np.random.default_rng(seed)
        self.zp_dtype = helper.tensor_dtype_to_np_dtype(act_type)

    def _n(self, op, ins, outs, domain=None, **attrs):
        name = f"{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, ins, outs, name=name, domain=self.domain if domain is None else
                                           domain, **attrs))
        return name

    def qdq(self, x: str, scale: float, zp: int) -> str:
        """Q then DQ of ``x`` (an activation boundary); returns the dequantized name."""
        self.inits[f"{x}_s"] = np.array(scale, np.float32)
        self.inits[f"{x}_z"] = np.array(zp, self.zp_dtype)
        self._n("QuantizeLinear", [x, f"{x}_s", f"{x}_z"], [f"{x}_q"])
        self._n("DequantizeLinear", [f"{x}_q", f"{x}_s", f"{x}_z"], [f"{x}_dq"])
        return f"{x}_dq"

    def weight(self, name: str, shape, axis: int, bits: int = 8) -> str:
        w = self.rng.normal(0, 0.2, shape).astype(np.float32)
        lim = 127 if bits == 8 else 7
        s = (np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis)) / lim).astype(np.float32)
        q = np.clip(np.rint(w / np.expand_dims(s, [i for i in range(w.ndim) if i != axis])), -lim - 1, lim)
        if bits == 4:
            import ml_dtypes

            self.inits[f"{name}_q"] = q.astype(ml_dtypes.int4)
        else:
            self.inits[f"{name}_q"] = q.astype(np.int8)
        self.inits[f"{name}_s"] = s
        self.inits[f"{name}_z"] = np.zeros(s.shape, self.inits[f"{name}_q"].dtype)
        domain = "" if bits == 4 else self.domain  # int4 DQ is an ai.onnx opset-21 type
        self._n("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name], domain=domain, axis=axis)
        return name

    def op(self, op: str, ins, out: str, **attrs) -> str:
        self._n(op, ins, [out], domain="", **attrs)
        return out

    def model(self, x_shape, y: str, y_shape) -> onnx.ModelProto:
        inits = []
        for k, v in self.inits.items():
            inits.append(numpy_helper.from_array(v, k))
        graph = helper.make_graph(self.nodes, "qnn", [helper.make_tensor_value_info("x", F32, list(x_shape))],
                                  [helper.make_tensor_value_info(y, F32, list(y_shape))], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
        m.ir_version = 10
        return m


def a16_mlp(bits: int = 8, act_type=TensorProto.UINT16) -> onnx.ModelProto:
    """x[4,32] -> a16 Q/DQ -> MatMul(w0 per-channel) -> Q/DQ -> Relu -> Q/DQ -> MatMul(w1) -> Q/DQ."""
    b = QdqBuilder(act_type)
    zp = 32768 if act_type == TensorProto.UINT16 else 0
    x = b.qdq("x", 1 / 8000, zp)
    h = b.qdq(b.op("MatMul", [x, b.weight("w0", (32, 64), 1, bits)], "h"), 1 / 6000, zp)
    r = b.qdq(b.op("Relu", [h], "r"), 1 / 6000, zp)
    y = b.qdq(b.op("MatMul", [r, b.weight("w1", (64, 16), 1, bits)], "y"), 1 / 5000, zp)
    return b.model((4, 32), y, (4, 16))


def a16_attention() -> onnx.ModelProto:
    """One attention head, QNN style: q/k/v projections (a16w8 units), q @ k^T, Softmax, @ v, output projection."""
    b = QdqBuilder()
    zp = 32768
    x = b.qdq("x", 1 / 8000, zp)
    proj = {}
    for name in ("q", "k", "v"):
        proj[name] = b.qdq(b.op("MatMul", [x, b.weight(f"w{name}", (32, 16), 1)], name), 1 / 5000, zp)
    kt = b.qdq(b.op("Transpose", [proj["k"]], "kt", perm=[1, 0]), 1 / 5000, zp)
    s = b.qdq(b.op("MatMul", [proj["q"], kt], "scores"), 1 / 2000, zp)
    p = b.qdq(b.op("Softmax", [s], "probs", axis=-1), 1 / 65535, 0)
    a = b.qdq(b.op("MatMul", [p, proj["v"]], "att"), 1 / 5000, zp)
    y = b.qdq(b.op("MatMul", [a, b.weight("wo", (16, 32), 1)], "out"), 1 / 5000, zp)
    return b.model((8, 32), y, (8, 32))
