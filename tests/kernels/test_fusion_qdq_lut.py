"""The qdq_lut fusion pass (kernels/fusion/qdq_lut.py) and its kernel npu::QdqLut (kernels/ops/qdq_lut.py,
kernels/native/qdq_lut.cc): which 8-bit element-wise QDQ units become tables, how chains compose, and exactness.

Numerics reference: ORT's CPU EP with ORT_DISABLE_ALL, which runs the QDQ graph literally (DQ, float op, Q); the
tables are those same operations evaluated per input byte, so outputs are bit-equal (no tolerance)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npu_ep
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.fusion.qdq_lut import fuse_qdq_lut
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.qdq_lut import reference
from npu_ep.kernels.target import Target
from _single_op import run_nodes
from npu_testing import assignment, npu_session

REF = Target.load("npu-ref")
EDGE = Target.load("npu-edge")
F32, U8 = TensorProto.FLOAT, TensorProto.UINT8


def _unoptimized(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _run(nodes, feeds, target=REF, kernels="native"):
    return run_nodes(nodes, feeds, target, kernels)


def _ops(nodes):
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in nodes]


class _Builder:
    """A hand-written QDQ graph: x, s (per-channel side input) quantized to uint8, element-wise units after."""

    def __init__(self, shape=(1, 5, 7, 9), side=(1, 5, 1, 1)):
        self.nodes, self.inits, self.shape, self.side = [], {}, shape, side

    def q(self, name, x, scale, zp, **attrs):
        self.inits.setdefault(f"{name}_s", np.float32(scale))
        self.inits.setdefault(f"{name}_z", np.asarray(zp, np.uint8))
        self.nodes.append(helper.make_node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"],
                                           name=f"{name}_Q", **attrs))
        return f"{name}_q"

    def dq(self, name, qname, out=None):
        out = out or f"{qname}_dq{len(self.nodes)}"
        self.nodes.append(helper.make_node("DequantizeLinear", [qname, f"{name}_s", f"{name}_z"], [out],
                                           name=f"DQ_{out}"))
        return out

    def op(self, op, ins, name, **attrs):
        self.nodes.append(helper.make_node(op, ins, [name], name=name, **attrs))
        return name

    def const(self, name, value):
        self.inits[name] = np.asarray(value, np.float32)
        return name

    def model(self, outs):
        ins = [helper.make_tensor_value_info("x", F32, list(self.shape)),
               helper.make_tensor_value_info("s", F32, list(self.side))]
        graph = helper.make_graph(self.nodes, "qdq_lut", ins, [helper.make_tensor_value_info(o, F32, list(self.shape))
                                                               for o in outs],
                                  [numpy_helper.from_array(np.asarray(v), k) for k, v in self.inits.items()])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 9
        onnx.checker.check_model(m)
        return m


def _hardswish_net():
    """PP-LCNetV3's tail as quantize_static writes it: scale/bias, x * clip(x + 3, 0, 6) / 6 (clip absorbed into
    the Q range), scale/bias, then a per-channel Mul by a second quantized input (squeeze-excite)."""
    b = _Builder()
    x = b.dq("x", b.q("x", "x", 0.04, 128))
    m1 = b.dq("m1", b.q("m1", b.op("Mul", [x, b.const("c_s1", 1.3)], "mul1"), 0.05, 120))
    a1 = b.dq("a1", b.q("a1", b.op("Add", [m1, b.const("c_b1", 0.2)], "add1"), 0.05, 118), "a1_x")
    # the constant 3 as quantize_static writes it: a DQ of a uint8 initializer read by one node here
    b.inits["three_q"], b.inits["three_s"], b.inits["three_z"] = np.uint8(255), np.float32(3 / 255), np.uint8(0)
    b.nodes.append(helper.make_node("DequantizeLinear", ["three_q", "three_s", "three_z"], ["three"], name="DQ3"))
    h = b.dq("h", b.q("h", b.op("Add", [a1, "three"], "add3"), 6 / 255, 0))
    a1b = b.dq("a1", "a1_q", "a1_y")
    mm = b.dq("mm", b.q("mm", b.op("Mul", [a1b, h], "hsmul"), 0.09, 30))
    d6 = b.dq("d6", b.q("d6", b.op("Div", [mm, b.const("c_six", 6.0)], "div6"), 0.015, 30))
    s = b.dq("s", b.q("s", "s", 0.01, 0))
    y = b.dq("y", b.q("y", b.op("Mul", [d6, s], "se"), 0.012, 25), "y")
    return b.model([y])


def _feeds(seed=0, shape=(1, 5, 7, 9), side=(1, 5, 1, 1)):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 2.5, shape).astype(np.float32), "s": rng.uniform(0, 2, side).astype(np.float32)}


def test_hardswish_chain_collapses_to_one_table():
    nodes = fuse_partition(nodes_from_model(_hardswish_net()), REF)
    assert _ops(nodes) == ["QuantizeLinear", "QuantizeLinear", "npu::QdqLut", "DequantizeLinear"]
    lut = nodes[2]
    assert [v.name for v in lut.inputs[:-1]] == ["x_q", "s_q"] and lut.inputs[-1].value.size == 65536


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_fused_equals_unfused_steps_bit_for_bit(kernels):
    model = _hardswish_net()
    plain = nodes_from_model(model)
    fused = fuse_qdq_lut(plain, REF)
    for seed in range(3):
        feeds = _feeds(seed)
        assert np.array_equal(_run(fused, feeds, kernels=kernels)["y"], _run(plain, feeds, kernels=kernels)["y"])


def test_session_equals_ort_unoptimized_exactly():
    model = _hardswish_net()
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {npu_ep.get_ep_name()}
    for seed in range(3):
        feeds = _feeds(seed)
        ours, ref = sess.run(None, feeds)[0], _unoptimized(model, feeds)[0]
        assert np.array_equal(ours, ref), np.abs(ours - ref).max()


def test_edge_target_fuses_too():
    assert "npu::QdqLut" in _ops(fuse_partition(nodes_from_model(_hardswish_net()), EDGE))


def _single_unit(op="Mul", const=1.5, q_axis=None, extra_reader=False, side_act=False):
    b = _Builder()
    x = b.dq("x", b.q("x", "x", 0.04, 128))
    other = b.dq("s", b.q("s", "s", 0.01, 0)) if side_act else b.const("c", const)
    ins = [x] if op in ("Relu", "Sigmoid", "Neg", "Abs") else [x, other]
    y = b.op(op, ins, "op")
    outs = []
    if extra_reader:
        outs.append(b.op("Relu", [y], "also"))
    if q_axis is not None:  # per-channel output quantization
        b.inits["yq_s"], b.inits["yq_z"] = np.full(5, 0.05, np.float32), np.full(5, 100, np.uint8)
        b.nodes.append(helper.make_node("QuantizeLinear", [y, "yq_s", "yq_z"], ["yq_q"], name="yq_Q", axis=1))
        yq = "yq_q"
        b.nodes.append(helper.make_node("DequantizeLinear", [yq, "yq_s", "yq_z"], ["out"], name="out_DQ", axis=1))
    else:
        b.dq("yq", b.q("yq", y, 0.05, 100), "out")
    return b.model(["out", *outs])


@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div", "Relu", "Neg", "Abs", "Max", "Min"])
def test_single_units_fuse_and_match_ort(op):
    model = _single_unit(op)
    nodes = fuse_partition(nodes_from_model(model), REF)
    assert _ops(nodes) == ["QuantizeLinear", "npu::QdqLut", "DequantizeLinear"]
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {npu_ep.get_ep_name()}
    feeds = _feeds(4)
    assert np.array_equal(sess.run(None, feeds)[0], _unoptimized(model, feeds)[0])


@pytest.mark.parametrize("case", [
    {"const": np.full((1, 5, 1, 1), 1.5)},  # per-channel constant: a table per channel would be needed
    {"q_axis": 1},                          # per-channel output Q
    {"extra_reader": True},                 # the float result is read by another node too
    {"op": "Sigmoid"},                      # not an exact element-wise op of the list
])
def test_near_misses_stay_as_steps(case):
    nodes = fuse_partition(nodes_from_model(_single_unit(**case)), REF)
    assert "npu::QdqLut" not in _ops(nodes)


@pytest.mark.parametrize("case,reason", [
    ({"const": np.full((1, 5, 1, 1), 1.5)}, "input 'c' is a constant of 5 elements, not one"),
    ({"q_axis": 1}, "QuantizeLinear 'yq_Q' is not per-tensor to 8 bits with a constant float32 scale and zero point"),
    ({"extra_reader": True}, "its output 'op' has 2 readers, not one QuantizeLinear")])
def test_a_unit_left_float_says_why(case, reason):
    """The pass's candidate (the unit's element-wise op) that stays float leaves a FusionMiss with the reason
    (npu-report --explain-fusions)."""
    misses = []
    fuse_partition(nodes_from_model(_single_unit(**case)), REF, misses)
    assert [(m.node, m.reason) for m in misses if m.fusion == "qdq_lut"] == [("op", reason)]


def test_two_sources_of_one_shape_use_the_full_table():
    b = _Builder(side=(1, 5, 7, 9))
    x = b.dq("x", b.q("x", "x", 0.04, 128))
    s = b.dq("s", b.q("s", "s", 0.01, 0))
    b.dq("y", b.q("y", b.op("Add", [x, s], "add"), 0.05, 100), "y")
    model = b.model(["y"])
    nodes = fuse_partition(nodes_from_model(model), REF)
    assert _ops(nodes) == ["QuantizeLinear", "QuantizeLinear", "npu::QdqLut", "DequantizeLinear"]
    sess = npu_session(model)
    feeds = _feeds(5, side=(1, 5, 7, 9))
    assert np.array_equal(sess.run(None, feeds)[0], _unoptimized(model, feeds)[0])


# --- the kernel: native vs numpy reference -----------------------------------------------------------------------
@pytest.mark.parametrize("cap", [None, 0])  # the widest ISA of this host, then the scalar loop
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_native_table_reads_equal_reference(cap, dtype):
    nat = runtime.native_module()
    if nat is None:
        pytest.skip("native extension not built")
    rng = np.random.default_rng(7)
    nat.set_isa_cap(-1 if cap is None else cap)
    try:
        for shape in [(1,), (63,), (65,), (3, 5, 7, 11), (1, 2, 300, 1000)]:
            a = rng.integers(-128 if dtype == np.int8 else 0, 128 if dtype == np.int8 else 256, shape).astype(dtype)
            b = rng.integers(0, 256, shape).astype(np.uint8)
            t1 = rng.integers(0, 256, 256).astype(np.uint8).view(dtype)
            t2 = rng.integers(0, 256, 65536).astype(np.uint8).view(dtype)
            for threads in (1, 2):
                assert np.array_equal(nat.qdq_lut(a, None, t1, threads).reshape(shape), reference(t1, a))
                assert np.array_equal(nat.qdq_lut(a, b, t2, threads).reshape(shape), reference(t2, a, b))
            if len(shape) == 4:
                s = rng.integers(0, 256, shape[:2] + (1, 1)).astype(np.uint8)
                rows = np.ascontiguousarray(t2.reshape(256, 256).T).reshape(-1)
                inner = shape[2] * shape[3]
                assert np.array_equal(nat.qdq_lut_rows(a, s, inner, rows, 2), reference(t2, a, s))
                assert np.array_equal(nat.qdq_lut_rows(a, s, inner, t2, 2), reference(t2, s, a))
    finally:
        nat.set_isa_cap(-1)


def test_native_rejects_bad_arguments():
    nat = runtime.native_module()
    if nat is None:
        pytest.skip("native extension not built")
    a = np.zeros(8, np.uint8)
    with pytest.raises(ValueError, match="table has 255 entries, expected 256"):
        nat.qdq_lut(a, None, np.zeros(255, np.uint8), 1)
    with pytest.raises(ValueError, match="uint8 or int8"):
        nat.qdq_lut(a.astype(np.float32), None, np.zeros(256, np.uint8), 1)
    with pytest.raises(ValueError, match="same number of elements"):
        nat.qdq_lut(a, np.zeros(7, np.uint8), np.zeros(65536, np.uint8), 1)
    with pytest.raises(ValueError, match="inner"):
        nat.qdq_lut_rows(a, np.zeros(3, np.uint8), 3, np.zeros(65536, np.uint8), 1)


# --- a table folded into the QLinearConv before it --------------------------------------------------------------
def _conv_hardswish_qdq(tmp_path, conv_output_too=False):
    """quantize_static over Conv -> Mul(1.3) -> Add(0.2) -> x * clip(x + 3, 0, 6) / 6 (uint8 activations)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ep"))
    import _qdq_models as qm

    rng = np.random.default_rng(2)
    inits = {"w": rng.normal(0, 0.4, (6, 3, 3, 3)), "b": rng.normal(0, 0.1, 6), "s1": np.float32(1.3),
             "b1": np.float32(0.2), "three": np.float32(3), "zero": np.float32(0), "six": np.float32(6)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s1"], ["m1"], "mul1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], "add1"),
             helper.make_node("Add", ["a1", "three"], ["h"], "add3"),
             helper.make_node("Clip", ["h", "zero", "six"], ["hc"], "clip"),
             helper.make_node("Mul", ["a1", "hc"], ["j"], "hsmul"),
             helper.make_node("Div", ["j", "six"], ["y"], "div6")]
    outs = [helper.make_tensor_value_info("y", F32, [1, 6, 9, 11])]
    if conv_output_too:
        outs.append(helper.make_tensor_value_info("c", F32, [1, 6, 9, 11]))
    graph = helper.make_graph(nodes, "conv_hs", [helper.make_tensor_value_info("x", F32, [1, 3, 9, 11])], outs,
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return qm.quantize_qdq(model, (1, 3, 9, 11), tmp_path, f"conv_hs{int(conv_output_too)}")


def _x_feeds(seed):
    return {"x": np.random.default_rng(seed).normal(0, 1, (1, 3, 9, 11)).astype(np.float32)}


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_table_folds_into_the_qlinearconv_bit_for_bit(tmp_path, kernels):
    from npu_ep.kernels.fusion.qdq import fuse_qdq

    model = _conv_hardswish_qdq(tmp_path)
    units = fuse_qdq(nodes_from_model(model), REF)  # QLinearConv, then the element-wise units as float steps
    fused = fuse_partition(nodes_from_model(model), REF)
    assert "npu::QdqLut" not in _ops(fused)
    (conv,) = [n for n in fused if n.op_type == "QLinearConv"]
    assert conv.attrs["output_lut"].shape == (256,)
    for seed in range(3):
        got, want = _run(fused, _x_feeds(seed), kernels=kernels), _run(units, _x_feeds(seed), kernels=kernels)
        assert np.array_equal(got["y"], want["y"])
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {npu_ep.get_ep_name()}
    assert np.array_equal(sess.run(None, _x_feeds(5))[0], _run(units, _x_feeds(5))["y"])


def test_table_stays_when_the_conv_output_is_read_elsewhere(tmp_path):
    fused = fuse_partition(nodes_from_model(_conv_hardswish_qdq(tmp_path, conv_output_too=True)), REF)
    assert "npu::QdqLut" in _ops(fused)
    assert all("output_lut" not in n.attrs for n in fused)


def test_native_qlinear_conv_rejects_a_bad_table():
    nat = runtime.native_module()
    if nat is None:
        pytest.skip("native extension not built")
    x = np.zeros((1, 4, 3, 3), np.uint8)
    w = np.zeros((2, 1, 1, 4), np.int8)
    args = (x, 0, w, np.zeros(2, np.int32), None, np.ones(2, np.float32), 0, False,
            [2, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0], False, 1)
    with pytest.raises(ValueError, match="lut must be 256"):
        nat.qlinear_conv(*args, np.zeros(255, np.uint8))
    assert nat.qlinear_conv(*args, np.full(256, 7, np.uint8)).max() == 7
