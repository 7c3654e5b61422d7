"""QDQ graphs as users bring them, in a real session: quantize_static output (per-channel int8 weights) and
QNN-style 16-bit-activation graphs with com.microsoft Q/DQ run on NpuEP with no rewrite, as few partitions, and
within one quantum of ORT's CPU EP with ORT_DISABLE_ALL (which executes the QDQ graph literally; the default CPU EP
fuses QDQ into MLAS kernels whose results differ by themselves). Graph assignment is checked through ORT."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npu_ep
from npu_ep.ep.capability import analyze
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _qdq_models as qm
from npu_testing import assignment, npu_partitions, npu_session

NPU = npu_ep.get_ep_name()


def _unoptimized(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _output_quantum(model) -> float:
    """Scale of the DequantizeLinear producing the graph output: one quantum of the output."""
    last = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    assert last.op_type == "DequantizeLinear"
    init = next(i for i in model.graph.initializer if i.name == last.input[1])
    return float(numpy_helper.to_array(init))


def _within_one_quantum(ours, ref, quantum):
    ref = np.asarray(ref, np.float32)
    return bool(np.all(np.abs(ours - ref) <= quantum + 4 * np.spacing(np.abs(ref))))


def _all_on_npu(model, x, **provider_options):
    sess = npu_session(model, provider_options)
    placed = assignment(sess)
    assert placed and all(ep == NPU for ep in placed.values()), {k: v for k, v in placed.items() if v != NPU}
    ours = sess.run(None, {"x": x})[0]
    ref = _unoptimized(model, {"x": x})[0]
    assert _within_one_quantum(ours, ref, _output_quantum(model))  # one quantum of ORT_DISABLE_ALL
    return sess


def test_quantize_static_three_conv_net_is_one_partition(tmp_path):
    model = qm.conv3_qdq(tmp_path)
    x = np.random.default_rng(0).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    sess = _all_on_npu(model, x)
    assert len(npu_partitions(sess)) == 1


def test_quantize_static_mlp_is_one_partition(tmp_path):
    model = qm.mlp_qdq(tmp_path)
    x = np.random.default_rng(1).normal(0, 1, (4, 32)).astype(np.float32)
    sess = _all_on_npu(model, x)
    assert len(npu_partitions(sess)) == 1


@pytest.mark.parametrize("bits", [8, 4])
def test_qnn_style_a16_mlp_runs_whole_on_npu_ref(bits):
    model = qm.a16_mlp(bits)
    x = np.random.default_rng(2).normal(0, 1, (4, 32)).astype(np.float32)
    sess = _all_on_npu(model, x)
    assert len(npu_partitions(sess)) == 1


def test_qnn_style_a16_attention_block_runs_whole_on_npu_ref():
    model = qm.a16_attention()
    x = np.random.default_rng(3).normal(0, 1, (8, 32)).astype(np.float32)
    sess = _all_on_npu(model, x)
    assert len(npu_partitions(sess)) == 1


def test_npu_edge_declines_16_bit_activations_with_a_reason():
    cap = analyze(nodes_from_model(qm.a16_mlp()), Target.load("npu-edge"))
    reasons = [d.reason for d in cap.declined]
    assert any("16-bit activations" in r and "a16_accumulator_bits" in r for r in reasons), reasons
    assert not any(n for g in cap.partitions for n in g if cap.decisions[n].node.op_type == "DequantizeLinear"
                   and cap.decisions[n].node.inputs[0].is_constant and len(g) == 1)


def _weight_dq_model(reader: str, readers: int = 1, **attrs):
    """x -> MatMul(x, DQ(W)) ... with ``readers`` nodes of type ``reader`` reading the weight DQ."""
    w = np.random.default_rng(4).integers(-100, 100, (8, 8)).astype(np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="w_dq", axis=1)]
    outs = []
    for i in range(readers):
        nodes.append(helper.make_node(reader, ["x", "w"], [f"y{i}"], name=f"{reader.lower()}{i}", **attrs))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [8, 8]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])], outs,
                          [numpy_helper.from_array(w, "wq"),
                           numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_weight_dq_of_a_declined_reader_stays_on_the_cpu_with_it():
    # Einsum is not an NPU op: its weight DQ must not become a partition of its own
    w = np.random.default_rng(5).integers(0, 3, (8,)).astype(np.uint8)
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="w_dq"),
             helper.make_node("Einsum", ["x", "w"], ["y"], name="einsum", equation="i,i->i")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
                          [numpy_helper.from_array(w + 1, "wq"), numpy_helper.from_array(np.float32(0.5), "ws")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    cap = analyze(nodes_from_model(model), Target.load("npu-ref"))
    assert cap.partitions == []
    dq = cap.decisions[0]
    assert not dq.claimed and "stays with its only reader node 'einsum'" in dq.reason


def test_weight_dq_with_two_readers_is_claimed_with_them_and_matches_cpu():
    model = _weight_dq_model("MatMul", readers=2)  # not folded: the MatMuls read it at run time
    x = np.random.default_rng(6).normal(0, 1, (8, 8)).astype(np.float32)
    cap = analyze(nodes_from_model(model), Target.load("npu-ref"))  # as written: one DQ, two readers
    assert all(d.claimed for d in cap.decisions) and cap.partitions == [[0, 1, 2]]
    sess = npu_session(model)  # ORT's level-1 EnsureUniqueDQForNodeUnit gives each reader its own DQ copy
    placed = assignment(sess)
    assert all(ep == NPU for ep in placed.values())
    assert all(len(p) == 2 for p in npu_partitions(sess))  # every DQ copy with its MatMul, never alone
    for ours, ref in zip(sess.run(None, {"x": x}), _unoptimized(model, {"x": x})):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)  # float MatMul: different summation order


def test_weight_dqs_whose_readers_are_all_declined_form_no_partition():
    model = _weight_dq_model("Einsum", readers=2, equation="ij,ij->ij")  # not an NPU op
    cap = analyze(nodes_from_model(model), Target.load("npu-ref"))
    assert cap.partitions == []
    assert "weight DequantizeLinear nodes alone" in cap.decisions[0].reason
