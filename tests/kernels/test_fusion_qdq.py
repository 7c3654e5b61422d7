"""The qdq fusion pass (kernels/fusion/qdq.py): which DQ -> op -> Q chains become one integer node, which stay as
float steps with their weight DQ folded to a constant, and the integer node's numerics.

Numerics reference: ORT's CPU EP with ORT_DISABLE_ALL, which runs the QDQ graph literally (DQ, float op, Q). The
integer units sum exactly where ORT sums dequantized products in float32, so the bound is one quantum."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion.qdq import fuse_qdq
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ep"))
import _qdq_models as qm

REF = Target.load("npu-ref")
EDGE = Target.load("npu-edge")


def _unoptimized(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _run(nodes, feeds, target=REF):
    env = dict(feeds)
    for nd in nodes:
        k = kernel_for(nd.domain, nd.op_type)
        p = k.prepare(nd, target)
        p.target = target
        outs = k.run(p, [None if v.missing or v.is_constant else env[v.name] for v in nd.inputs])
        env.update({o.name: a for o, a in zip(nd.outputs, outs)})
    return env


def within_one_quantum(ours, ref, quantum: float) -> bool:
    """Dequantized outputs at most one quantum apart (plus float32 rounding of the DequantizeLinear itself)."""
    ref = np.asarray(ref, np.float32)
    return bool(np.all(np.abs(np.asarray(ours, np.float32) - ref) <= quantum + 4 * np.spacing(np.abs(ref))))


def _ops(nodes):
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in nodes]


def _matmul_unit(*, act=TensorProto.UINT8, w_axis=1, weight_readers=1, act_readers=1, q_readers=1,
                 const_scale=True, extra_op_reader=False):
    """x -> Q -> DQ -> MatMul(DQ(W)) -> Q -> DQ -> y, with knobs that break one unit rule each."""
    b = qm.QdqBuilder(act, domain="")
    zp = 128 if act == TensorProto.UINT8 else 32768
    xs = 1 / 40 if act == TensorProto.UINT8 else 1 / 8000
    x = b.qdq("x", xs, zp)
    w = b.weight("w", (16, 8), w_axis)
    outs = [b.op("MatMul", [x, w], "mm")]
    for i in range(1, weight_readers):
        outs.append(b.op("MatMul", [x, w], f"mm{i}"))
    for i in range(1, act_readers):
        outs.append(b.op("Relu", [x], f"xr{i}"))
    if extra_op_reader:
        outs.append(b.op("Neg", ["mm"], "neg"))
    y = b.qdq("mm", xs * 4, zp)
    finals = [y] + [b.op("Identity", [o], f"{o}_out") for o in outs[1:]]
    for i in range(1, q_readers):
        b._n("DequantizeLinear", ["mm_q", "mm_s", "mm_z"], [f"dq{i}"], domain="")
        finals.append(f"dq{i}")
    if not const_scale:  # the activation DQ's scale becomes a graph input
        b.inits.pop("x_s")
    graph_outputs = [helper.make_tensor_value_info(f, TensorProto.FLOAT, [4, 8]) for f in finals]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])]
    if not const_scale:
        inputs.append(helper.make_tensor_value_info("x_s", TensorProto.FLOAT, []))
    g = helper.make_graph(b.nodes, "g", inputs, graph_outputs,
                          [numpy_helper.from_array(v, k) for k, v in b.inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


X = np.random.default_rng(0).normal(0, 1, (4, 16)).astype(np.float32)


def _check_against_ort(model, fused, extra=None):
    feeds = {"x": X, **(extra or {})}
    ref = _unoptimized(model, feeds)
    ours = _run(fused, feeds)
    for out, r in zip(model.graph.output, ref):
        # outputs are DequantizeLinear values: one quantum is the output scale (mm_s)
        quantum = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "mm_s")))
        assert within_one_quantum(ours[out.name], r, quantum), out.name


def test_u8_matmul_unit_becomes_qlinearmatmul_within_one_quantum():
    model = _matmul_unit()
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"]
    assert len(fused[1].attrs["fused_nodes"]) == 4  # DQ(x), DQ(W), MatMul, Q
    _check_against_ort(model, fused)


def test_u16_matmul_unit_becomes_qdqmatmul_on_ref_and_is_declined_on_edge():
    model = _matmul_unit(act=TensorProto.UINT16)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused) == ["QuantizeLinear", "npu::QdqMatMul", "DequantizeLinear"]
    _check_against_ort(model, fused)
    from npu_ep.kernels.support import why_not

    reason = why_not(fused[1], EDGE)
    assert reason is not None and "npu::QdqMatMul" in reason


def test_weight_dq_with_two_readers_feeds_the_unit_and_folds_into_the_float_reader():
    # ORT's EnsureUniqueDQForNodeUnit gives each reader its own DQ: the MatMul ending in a Q is a unit, the other
    # (read by an Identity, no Q) stays a float step, its weight DQ folded into it as the only reader left
    model = _matmul_unit(weight_readers=2)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused).count("QLinearMatMul") == 1 and "MatMul" in _ops(fused)
    assert fused[_ops(fused).index("MatMul")].inputs[1].value is not None
    _check_against_ort(model, fused)


def test_two_units_sharing_one_weight_dq_both_fuse_and_the_dq_goes():
    # exporters share one initializer between equal weights; ORT gives each unit its own DQ copy, so both fuse
    b = qm.QdqBuilder(TensorProto.UINT8, domain="")
    x = b.qdq("x", 1 / 40, 128)
    w = b.weight("w", (16, 8), 1)
    y0 = b.qdq(b.op("MatMul", [x, w], "mm"), 0.1, 128)
    y1 = b.qdq(b.op("MatMul", [x, w], "mm1"), 0.1, 128)
    g = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, [4, 8]) for y in (y0, y1)],
                          [numpy_helper.from_array(v, k) for k, v in b.inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused).count("QLinearMatMul") == 2
    assert _ops(fused) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear", "QLinearMatMul",
                           "DequantizeLinear"]  # the shared activation and weight DQs both went
    ref, ours = _unoptimized(model, {"x": X}), _run(fused, {"x": X})
    for y, r in zip((y0, y1), ref):
        assert within_one_quantum(ours[y], r, 0.1)


def test_activation_dq_with_two_readers_feeds_the_unit_and_stays_for_the_other():
    model = _matmul_unit(act_readers=2)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert "QLinearMatMul" in _ops(fused) and "Relu" in _ops(fused)
    relu = fused[_ops(fused).index("Relu")]
    assert any(n.outputs[0].name == relu.inputs[0].name for n in fused if n.op_type == "DequantizeLinear")
    _check_against_ort(model, fused)


def test_q_with_two_dq_readers_still_forms_the_unit():
    model = _matmul_unit(q_readers=2)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert "QLinearMatMul" in _ops(fused)
    _check_against_ort(model, fused)


def test_op_output_read_by_q_and_another_node_is_not_a_unit():
    model = _matmul_unit(extra_op_reader=True)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert "QLinearMatMul" not in _ops(fused) and "MatMul" in _ops(fused)
    mm = fused[_ops(fused).index("MatMul")]
    assert mm.inputs[1].value is not None  # the weight DQ folded into a float constant instead
    _check_against_ort(model, fused)


def test_per_channel_axis_not_the_output_channel_is_not_a_unit_but_folds():
    model = _matmul_unit(w_axis=0)  # per-row (K) scales: not one multiplier per output column
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert "QLinearMatMul" not in _ops(fused)
    mm = fused[_ops(fused).index("MatMul")]
    assert mm.inputs[1].value is not None and mm.inputs[1].value.dtype == np.float32
    _check_against_ort(model, fused)


def test_non_constant_scale_is_not_a_unit():
    model = _matmul_unit(const_scale=False)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert "QLinearMatMul" not in _ops(fused)


def test_conv_unit_from_quantize_static_becomes_qlinearconv_with_int32_bias(tmp_path):
    model = qm.conv3_qdq(tmp_path)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused).count("QLinearConv") == 3 and "Conv" not in _ops(fused)
    assert all(len(n.inputs) == 9 for n in fused if n.op_type == "QLinearConv")  # bias folded as int32
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    ref = _unoptimized(model, {"x": x})[0]
    ours = _run(fused, {"x": x})["y"]
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "y_scale")))
    assert within_one_quantum(ours, ref, scale)  # within one quantum of ORT_DISABLE_ALL


def test_conv_bias_with_another_scale_stays_float_steps(tmp_path):
    model = qm.conv3_qdq(tmp_path)
    for init in model.graph.initializer:
        if init.name.startswith("b0") and init.name.endswith("_scale"):
            arr = numpy_helper.to_array(init) * np.float32(1.5)
            init.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), init.name))
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused).count("QLinearConv") == 2 and _ops(fused).count("Conv") == 1
    conv = fused[_ops(fused).index("Conv")]
    assert conv.inputs[1].value is not None and conv.inputs[2].value is not None  # W and bias folded to floats
    x = np.random.default_rng(2).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    ref = _unoptimized(model, {"x": x})[0]
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "y_scale")))
    assert within_one_quantum(_run(fused, {"x": x})["y"], ref, scale)


def test_a16w4_mlp_units_within_one_quantum():
    model = qm.a16_mlp(bits=4)
    fused = fuse_qdq(nodes_from_model(model), REF)
    assert _ops(fused).count("npu::QdqMatMul") == 2
    ref = _unoptimized(model, {"x": X.reshape(4, 16).repeat(2, axis=1)})[0]
    ours = _run(fused, {"x": X.reshape(4, 16).repeat(2, axis=1)})
    assert within_one_quantum(ours[model.graph.output[0].name], ref, 1 / 5000)


def test_qdqmatmul_declines_a_k_that_overflows_the_accumulator():
    target = Target.from_dict({**REF.raw, "matrix": {**REF.raw["matrix"], "a16_accumulator_bits": 24}})
    model = _matmul_unit(act=TensorProto.UINT16)
    nodes = nodes_from_model(model)
    assert "npu::QdqMatMul" not in _ops(fuse_qdq(nodes, target))  # 16 * 32768 * 127 needs more than 24 bits
    from npu_ep.kernels.support import why_not

    synth = fuse_qdq(nodes, REF)[1]
    reason = why_not(synth, target)
    assert reason is not None and "overflow the 24-bit accumulator" in reason


def test_onnx_model_checker_accepts_builders():
    for m in (_matmul_unit(), qm.a16_mlp(), qm.a16_attention()):
        onnx.checker.check_model(m)


@pytest.mark.parametrize("kw, target, reason", [
    ({"extra_op_reader": True}, REF, "node 'MatMul_3' (MatMul): its output is read outside the unit"),
    ({"w_axis": 0}, REF, "node 'DequantizeLinear_2' (DequantizeLinear): weights are not per tensor or per output "
                         "channel, or not 2-D for MatMul"),
    ({"const_scale": False}, REF, "node 'DequantizeLinear_1' (DequantizeLinear) (the activation's) is not per tensor "
                                  "of a runtime value"),
    ({"act": TensorProto.UINT16}, EDGE, "target declines the fused node: node 'MatMul_3/qdq' (npu::QdqMatMul): op "
                                        "not listed in [ops] of target npu-edge"),
])
def test_each_unit_that_stays_float_says_why(kw, target, reason):
    """The rule's candidate (the unit's Q) that does not become one integer node leaves a FusionMiss with the
    reason (npu-report --explain-fusions and the debug log show it)."""
    misses = []
    fused = fuse_qdq(nodes_from_model(_matmul_unit(**kw)), target, misses)
    assert not {"QLinearMatMul", "npu::QdqMatMul"} & set(_ops(fused))
    assert [(m.fusion, m.op, m.reason) for m in misses] == [("qdq", "QuantizeLinear", reason)]
