"""The qdq_bytes fusion pass (kernels/fusion/qdq_bytes.py): DQ -> MaxPool | movement op -> Q with the DQ's own
parameters runs the op on the bytes. Equal bit for bit to the unfused steps and to ORT with ORT_DISABLE_ALL
(which runs the QDQ graph literally); near misses keep the float steps."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npu_ep
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion.qdq_bytes import fuse_qdq_bytes
from npu_ep.kernels.target import Target
from _single_op import run_nodes
from npu_testing import assignment, npu_session

REF = Target.load("npu-ref")
F32 = TensorProto.FLOAT


def _model(qtype=TensorProto.UINT8, *, q2_scale=0.05, op="MaxPool", op_attrs=None, indices=False, dq_scale=0.05):
    """x -> Q -> DQ -> op -> Q -> DQ -> Flatten -> Q -> DQ -> y (the Q after op with scale ``q2_scale``)."""
    zp = np.asarray(7, np.uint8 if qtype == TensorProto.UINT8 else np.int8)
    inits = {"s": np.float32(dq_scale), "z": zp, "s2": np.float32(q2_scale)}
    attrs = op_attrs if op_attrs is not None else {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]}
    ins = ["xd"]
    if op == "Resize":
        inits["scales"] = np.asarray([1, 1, 2, 2], np.float32)
        ins = ["xd", "", "scales"]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], "q0"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], "dq0"),
             helper.make_node(op, ins, ["p", "idx"] if indices else ["p"], "op", **attrs),
             helper.make_node("QuantizeLinear", ["p", "s2", "z"], ["pq"], "q1"),
             helper.make_node("DequantizeLinear", ["pq", "s2", "z"], ["pd"], "dq1"),
             helper.make_node("Flatten", ["pd"], ["f"], "flat"),
             helper.make_node("QuantizeLinear", ["f", "s2", "z"], ["fq"], "q2"),
             helper.make_node("DequantizeLinear", ["fq", "s2", "z"], ["y"], "dq2")]
    outs = [helper.make_tensor_value_info("y", F32, ["b", "n"])]
    if indices:
        outs.append(helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 3, 4, 5]))
    graph = helper.make_graph(nodes, "qdq_bytes", [helper.make_tensor_value_info("x", F32, [1, 3, 7, 9])], outs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def _run(nodes, feeds, kernels="native"):
    return run_nodes(nodes, feeds, REF, kernels)


def _feeds(seed):
    return {"x": np.random.default_rng(seed).normal(0, 4, (1, 3, 7, 9)).astype(np.float32)}


def _ops(nodes):
    return [n.op_type for n in nodes]


@pytest.mark.parametrize("qtype", [TensorProto.UINT8, TensorProto.INT8])
@pytest.mark.parametrize("op,attrs", [("MaxPool", None), ("Resize", {"mode": "nearest"}),
                                      ("Transpose", {"perm": [0, 2, 3, 1]})])
def test_units_run_on_bytes_and_equal_ort_unoptimized(qtype, op, attrs):
    model = _model(qtype, q2_scale=0.05, op=op, op_attrs=attrs)
    plain = nodes_from_model(model)
    fused = fuse_qdq_bytes(plain, REF)
    assert _ops(fused) == ["QuantizeLinear", op, "Flatten", "DequantizeLinear"]
    for kernels in ("native", "reference"):
        for seed in range(2):
            assert np.array_equal(_run(fused, _feeds(seed), kernels)["y"], _run(plain, _feeds(seed), kernels)["y"])
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {npu_ep.get_ep_name()}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    cpu = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for seed in range(3):
        assert np.array_equal(sess.run(None, _feeds(seed))[0], cpu.run(None, _feeds(seed))[0])


@pytest.mark.parametrize("case", [
    {"q2_scale": 0.07},                                   # the Q requantizes: not a pure move
    {"op": "Resize", "op_attrs": {"mode": "linear"}},     # blends values
    {"indices": True},                                    # MaxPool's Indices output is used
    {"dq_scale": -0.05, "q2_scale": -0.05},               # a decreasing DQ turns max into min
])
def test_near_misses_keep_the_float_unit(case):
    fused = fuse_qdq_bytes(nodes_from_model(_model(**case)), REF)
    op = case.get("op", "MaxPool")
    i = _ops(fused).index(op)
    assert fused[i - 1].op_type == "DequantizeLinear" and fused[i + 1].op_type == "QuantizeLinear"


_SAME_PARAMS = "are not per tensor 8-bit with the same constant scale > 0, zero point and type"


@pytest.mark.parametrize("case, reason", [
    ({"q2_scale": 0.07}, f"node 'q1' (QuantizeLinear) and node 'dq0' (DequantizeLinear) {_SAME_PARAMS}"),
    ({"op": "Resize", "op_attrs": {"mode": "linear"}},
     "node 'op' (Resize) does not only move or select elements (Resize: nearest only; MaxPool: one output)"),
    ({"indices": True},
     "node 'op' (MaxPool) does not only move or select elements (Resize: nearest only; MaxPool: one output)"),
])
def test_each_near_miss_says_why(case, reason):
    """The rule's candidate (the Q after the op) that stays a float unit leaves a FusionMiss with the reason
    (npu-report --explain-fusions and the debug log show it); the Flatten unit after it still runs on the bytes."""
    misses = []
    fused = fuse_qdq_bytes(nodes_from_model(_model(**case)), REF, misses)
    assert "Flatten" in _ops(fused) and "QuantizeLinear" in _ops(fused)
    assert [(m.fusion, m.node, m.reason) for m in misses] == [("qdq_bytes", "q1", reason)]
