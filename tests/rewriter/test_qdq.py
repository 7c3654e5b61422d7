"""Q/DQ rules: each fusion on a small QDQ graph (positive), near-misses left alone (negative), ORT CPU numerics."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.kernels.target import BUILTIN_DIR as TARGETS, Target
from npu_ep.rewriter import RewriteError, rewrite

U8, I8, I32, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32, TensorProto.FLOAT
NP = {U8: np.uint8, I8: np.int8, I32: np.int32, F32: np.float32}


class G:
    """Tiny graph builder: constants by value, nodes by (op, inputs, outputs, attrs)."""

    def __init__(self):
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []

    def const(self, name, value, dtype=None):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def qp(self, prefix, scale, zp, zdtype):
        """Scale and zero-point initializers."""
        return self.const(f"{prefix}_s", scale, np.float32), self.const(f"{prefix}_z", zp, NP[zdtype])

    def node(self, op, inputs, outputs, domain="", **attrs):
        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{len(self.nodes)}", domain=domain,
                                           **attrs))
        return outputs[0]

    def input(self, name, elem, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name, elem, shape=None):
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def model(self):
        graph = helper.make_graph(self.nodes, "qdq", self.inputs, self.outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                       helper.make_opsetid("com.microsoft", 1)], ir_version=10)


def run(model, feeds, optimize=True):
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def ops(result) -> list[str]:
    return [n.op_type for n in result.model.graph]


def reasons(result) -> str:
    return " | ".join(f.reason for f in result.report.failures)


RNG = np.random.default_rng(0)


def u8(*shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


# ---------------------------------------------------------------- DQ -> Q and Q -> DQ


def _dq_q_model(s2=0.1, z2=128):
    g = G()
    x = g.input("x", U8, [2, 8])
    s1, z1 = g.qp("a", 0.1, 128, U8)
    s2_, z2_ = g.qp("b", s2, z2, U8)
    g.node("DequantizeLinear", [x, s1, z1], ["d"])
    g.node("QuantizeLinear", ["d", s2_, z2_], ["q"])
    g.node("DequantizeLinear", ["q", s1, z1], ["y"])
    g.output("y", F32, [2, 8])
    return g.model()


def test_lossless_dq_q_pair_is_dropped():
    model = _dq_q_model()
    result = rewrite(model, passes="qdq")
    assert result.report.counts["DropLosslessDqQ"] == 1
    assert ops(result) == ["DequantizeLinear"]
    x = u8(2, 8)
    np.testing.assert_array_equal(run(result.model, {"x": x})[0], run(model, {"x": x}, optimize=False)[0])


def test_dq_q_with_different_scale_is_kept():
    result = rewrite(_dq_q_model(s2=0.2), passes="qdq")
    assert ops(result) == ["DequantizeLinear", "QuantizeLinear", "DequantizeLinear"]
    assert "params differ" in reasons(result)


def test_dq_q_with_different_zero_point_is_kept():
    result = rewrite(_dq_q_model(z2=127), passes="qdq")
    assert "DropLosslessDqQ" not in result.report.counts


def _q_dq_model():
    g = G()
    x = g.input("x", F32, [4, 4])
    s, z = g.qp("a", 0.05, 0, I8)
    g.node("QuantizeLinear", [x, s, z], ["q"])
    g.node("DequantizeLinear", ["q", s, z], ["d"])
    g.node("Relu", ["d"], ["y"])
    g.output("y", F32, [4, 4])
    return g.model()


def test_q_dq_round_trip_is_kept_by_default_with_reason():
    result = rewrite(_q_dq_model(), passes="qdq")
    assert ops(result) == ["QuantizeLinear", "DequantizeLinear", "Relu"]
    assert "lossy" in reasons(result)


def test_q_dq_round_trip_dropped_on_request():
    result = rewrite(_q_dq_model(), passes="qdq", drop_qdq_roundtrips=True)
    assert ops(result) == ["Relu"]
    x = RNG.standard_normal((4, 4)).astype(np.float32) * 10  # beyond int8 range * 0.05: no clipping any more
    np.testing.assert_array_equal(run(result.model, {"x": x})[0], np.maximum(x, 0))


# ---------------------------------------------------------------- MatMul units


def _matmul_model(quantize_output=True, per_channel_a=False, extra_consumer=False, b_dtype=I8):
    g = G()
    a = g.input("a", U8, [3, 16])
    sa, za = g.qp("a", [0.02] * 3 if per_channel_a else 0.02, [120] * 3 if per_channel_a else 120, U8)
    # |b| <= 50 keeps u8*s8 pair sums inside int16, where ORT's AVX2 u8s8 kernels are exact
    b = g.const("b", RNG.integers(-50, 50, (16, 8)), NP[b_dtype])
    sb, zb = g.qp("b", 0.01, 0, b_dtype)
    g.node("DequantizeLinear", [a, sa, za], ["da"], **({"axis": 0} if per_channel_a else {}))
    g.node("DequantizeLinear", [b, sb, zb], ["db"])
    g.node("MatMul", ["da", "db"], ["mm"])
    if quantize_output:
        sy, zy = g.qp("y", 0.05, 128, U8)
        g.node("QuantizeLinear", ["mm", sy, zy], ["y"])
        g.output("y", U8, [3, 8])
    else:
        g.output("mm", F32, [3, 8])
    if extra_consumer:
        g.node("Relu", ["da"], ["r"])
        g.output("r", F32, [3, 16])
    return g.model()


def test_dq_matmul_q_becomes_qlinearmatmul_with_identical_integers():
    model = _matmul_model()
    result = rewrite(model, passes="qdq")
    assert ops(result) == ["QLinearMatMul"]
    a = u8(3, 16)
    np.testing.assert_array_equal(run(result.model, {"a": a})[0], run(model, {"a": a})[0])
    # and within one quantization step of the unfused float reference
    diff = run(result.model, {"a": a})[0].astype(int) - run(model, {"a": a}, optimize=False)[0].astype(int)
    assert np.abs(diff).max() <= 1


def test_dq_matmul_float_out_becomes_matmulintegertofloat():
    model = _matmul_model(quantize_output=False)
    result = rewrite(model, passes="qdq")
    assert ops(result) == ["MatMulIntegerToFloat"]
    assert next(iter(result.model.graph)).domain == "com.microsoft"
    a = u8(3, 16)
    want = run(model, {"a": a}, optimize=False)[0]
    np.testing.assert_allclose(run(result.model, {"a": a})[0], want, rtol=1e-5, atol=1e-5)


def test_per_channel_activation_is_not_fused():
    result = rewrite(_matmul_model(per_channel_a=True), passes="qdq")
    assert "QLinearMatMul" not in ops(result) and "MatMulIntegerToFloat" not in ops(result)
    assert "per-channel" in reasons(result)


def test_shared_dq_is_not_fused():
    result = rewrite(_matmul_model(extra_consumer=True), passes="qdq")
    assert "QLinearMatMul" not in ops(result)
    assert "consumers" in reasons(result)


def test_matmul_output_that_is_a_graph_output_is_not_qlinear_fused():
    """The float MatMul output must stay visible: only the DQs fold (MatMulIntegerToFloat), the Q stays."""
    model = _matmul_model()
    model.graph.output.append(helper.make_tensor_value_info("mm", F32, [3, 8]))
    result = rewrite(model, passes="qdq")
    assert ops(result) == ["MatMulIntegerToFloat", "QuantizeLinear"]
    assert [v.name for v in result.model.graph.outputs] == ["y", "mm"]
    a = u8(3, 16)
    for got, want in zip(run(result.model, {"a": a}), run(model, {"a": a}, optimize=False), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1.0)


# ---------------------------------------------------------------- Conv


def _conv_model(with_bias=True, bad_bias_scale=False, x_type=U8):
    g = G()
    x = g.input("x", x_type, [1, 2, 6, 6])
    sx, zx = g.qp("x", 0.03, 100 if x_type == U8 else 3, x_type)
    w = g.const("w", RNG.integers(-60, 60, (3, 2, 3, 3)), np.int8)
    sw = g.const("w_s", [0.01, 0.02, 0.015], np.float32)
    zw = g.const("w_z", [0, 0, 0], np.int8)
    g.node("DequantizeLinear", [x, sx, zx], ["dx"])
    g.node("DequantizeLinear", [w, sw, zw], ["dw"], axis=0)
    conv_in = ["dx", "dw"]
    if with_bias:
        bias = g.const("bias", RNG.integers(-500, 500, 3), np.int32)
        scale = np.float32(0.03) * np.array([0.01, 0.02, 0.015], np.float32) * (2 if bad_bias_scale else 1)
        sb = g.const("bias_s", scale, np.float32)
        zb = g.const("bias_z", [0, 0, 0], np.int32)
        g.node("DequantizeLinear", [bias, sb, zb], ["dbias"], axis=0)
        conv_in.append("dbias")
    g.node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3])
    sy, zy = g.qp("y", 0.05, 110 if x_type == U8 else 0, x_type)
    g.node("QuantizeLinear", ["c", sy, zy], ["y"])
    g.output("y", x_type, [1, 3, 6, 6])
    return g.model()


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("x_type", [U8, I8])
def test_dq_conv_q_becomes_qlinearconv(with_bias, x_type):
    model = _conv_model(with_bias=with_bias, x_type=x_type)
    result = rewrite(model, passes="qdq")
    assert ops(result) == ["QLinearConv"]
    x = RNG.integers(0, 256, (1, 2, 6, 6)).astype(np.uint8) if x_type == U8 else \
        RNG.integers(-128, 128, (1, 2, 6, 6)).astype(np.int8)
    got = run(result.model, {"x": x})[0]
    ort_fused = run(model, {"x": x})[0]
    if x_type == U8:
        np.testing.assert_array_equal(got, ort_fused)
    else:  # ORT's optimizer re-routes int8 Conv units through its S8->U8 transform: rounding may differ by 1
        assert np.abs(got.astype(int) - ort_fused.astype(int)).max() <= 1
    diff = got.astype(int) - run(model, {"x": x}, optimize=False)[0].astype(int)
    assert np.abs(diff).max() <= 1


def test_conv_bias_with_wrong_scale_is_not_fused():
    result = rewrite(_conv_model(bad_bias_scale=True), passes="qdq")
    assert "QLinearConv" not in ops(result)
    assert "bias scale" in reasons(result)


# ---------------------------------------------------------------- Add / Mul


def _binary_model(op_type, y_type=U8):
    g = G()
    a = g.input("a", U8, [2, 5])
    b = g.input("b", U8, [2, 5])
    sa, za = g.qp("a", 0.04, 128, U8)
    sb, zb = g.qp("b", 0.03, 120, U8)
    sy, zy = g.qp("y", 0.06, 125 if y_type == U8 else 0, y_type)
    g.node("DequantizeLinear", [a, sa, za], ["da"])
    g.node("DequantizeLinear", [b, sb, zb], ["db"])
    g.node(op_type, ["da", "db"], ["m"])
    g.node("QuantizeLinear", ["m", sy, zy], ["y"])
    g.output("y", y_type, [2, 5])
    return g.model()


def target_without_qlinear_binary(tmp_path, base: str = "npu-ref") -> str:
    """A copy of ``base`` whose [ops] table lacks com.microsoft QLinearAdd/QLinearMul."""
    lines = [ln for ln in (TARGETS / f"{base}.toml").read_text().splitlines()
             if not ln.startswith(('"com.microsoft::QLinearAdd"', '"com.microsoft::QLinearMul"'))]
    name = f"{base}-no-qlinear-binary"
    text = "\n".join(f'name = "{name}"' if ln.startswith("name =") else ln for ln in lines) + "\n"
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    assert Target.load(path).rule("com.microsoft", "QLinearAdd") is None
    return str(path)


@pytest.mark.parametrize("op_type", ["Add", "Mul"])
def test_dq_binary_q_becomes_qlinear_op_where_the_target_lists_it(op_type):
    model = _binary_model(op_type)
    result = rewrite(model, passes="qdq", target="npu-ref")
    assert ops(result) == [f"QLinear{op_type}"]
    feeds = {"a": u8(2, 5), "b": u8(2, 5)}
    got = run(result.model, feeds)[0]
    np.testing.assert_array_equal(got, run(model, feeds)[0])
    assert np.abs(got.astype(int) - run(model, feeds, optimize=False)[0].astype(int)).max() <= 1


@pytest.mark.parametrize("base", ["npu-ref", "npu-edge"])
@pytest.mark.parametrize("op_type", ["Add", "Mul"])
def test_binary_unit_stays_where_the_target_does_not_list_the_qlinear_op(op_type, base, tmp_path):
    model = _binary_model(op_type)
    target = target_without_qlinear_binary(tmp_path, base)
    result = rewrite(model, passes="qdq", target=target)
    assert ops(result) == ["DequantizeLinear", "DequantizeLinear", op_type, "QuantizeLinear"]
    assert sum(result.report.counts.values()) == 0
    assert f"com.microsoft::QLinear{op_type} is not in the ops table of target {base}-no-qlinear-binary" \
        in reasons(result)


def test_bad_rewrite_target_is_a_rewrite_error(tmp_path):
    with pytest.raises(RewriteError, match="rewrite target: unknown target 'npu-nope'"):
        rewrite(_binary_model("Add"), passes="qdq", target="npu-nope")


def test_binary_with_mixed_types_is_not_fused():
    result = rewrite(_binary_model("Add", y_type=I8), passes="qdq", target="npu-ref")
    assert "QLinearAdd" not in ops(result)
    assert "types differ" in reasons(result)


# ---------------------------------------------------------------- data movement


def _movement_model(op_type, same_params=True):
    g = G()
    x = g.input("x", U8, [2, 3, 4])
    s, z = g.qp("a", 0.1, 128, U8)
    s2, z2 = (s, z) if same_params else g.qp("b", 0.2, 128, U8)
    g.node("DequantizeLinear", [x, s, z], ["d"])
    extra = {
        "Reshape": lambda: ([g.const("shape", [6, 4], np.int64)], {}),
        "Transpose": lambda: ([], {"perm": [2, 0, 1]}),
        "Squeeze": lambda: ([g.const("axes", [0], np.int64)], {}),
        "Unsqueeze": lambda: ([g.const("axes", [1], np.int64)], {}),
        "Gather": lambda: ([g.const("idx", [2, 0], np.int64)], {"axis": 1}),
        "Slice": lambda: ([g.const("st", [1], np.int64), g.const("en", [3], np.int64),
                           g.const("ax", [2], np.int64)], {}),
    }[op_type]()
    if op_type == "Squeeze":
        g.inputs[0] = helper.make_tensor_value_info("x", U8, [1, 3, 4])
    g.node(op_type, ["d", *extra[0]], ["m"], **extra[1])
    g.node("QuantizeLinear", ["m", s2, z2], ["q"])
    g.node("DequantizeLinear", ["q", s2, z2], ["y"])
    g.output("y", F32)
    return g.model()


@pytest.mark.parametrize("op_type", ["Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice"])
def test_data_movement_passes_through_qdq(op_type):
    model = _movement_model(op_type)
    result = rewrite(model, passes="qdq")
    assert result.report.counts[f"QdqPassThrough{op_type}"] == 1
    assert ops(result) == [op_type, "DequantizeLinear"]
    x = u8(1 if op_type == "Squeeze" else 2, 3, 4)
    np.testing.assert_array_equal(run(result.model, {"x": x})[0], run(model, {"x": x}, optimize=False)[0])


def test_data_movement_with_different_params_is_kept():
    result = rewrite(_movement_model("Transpose", same_params=False), passes="qdq")
    assert "Transpose" in ops(result) and "QuantizeLinear" in ops(result)
    assert "would requantize" in reasons(result)


def test_qdq_pass_is_idempotent():
    model = _conv_model()
    once = rewrite(model, passes="qdq")
    proto_once = ir.serde.serialize_model(once.model)
    twice = rewrite(onnx.ModelProto.FromString(proto_once.SerializeToString()), passes="qdq")
    assert sum(twice.report.counts.values()) == 0
    assert ir.serde.serialize_model(twice.model).graph == proto_once.graph
