"""INT4 packing: MatMul -> MatMulNBits bit-identical to ORT's MatMulNBitsQuantizer; DQ(int4) -> MatMul repack."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from npu_ep.rewriter import RewriteOptions, rewrite

logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

NP_TO_ONNX = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def mlp_model(shapes: list[tuple[int, int]], dtype=np.float32, seed: int = 0, names=None) -> onnx.ModelProto:
    """x[b, K0] -> MatMul(W0) -> Relu -> MatMul(W1) ... with constant weights of ``shapes``."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    cur = "x"
    for i, (k, n) in enumerate(shapes):
        w = (rng.standard_normal((k, n)) * 0.5).astype(dtype)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        name = names[i] if names else f"mm{i}"
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"h{i}"], name=name))
        cur = f"h{i}"
        if i < len(shapes) - 1:
            nodes.append(helper.make_node("Relu", [cur], [f"r{i}"], name=f"relu{i}"))
            cur = f"r{i}"
    t = NP_TO_ONNX[dtype]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", t, ["batch", "seq", shapes[0][0]])],
                              [helper.make_tensor_value_info(cur, t, ["batch", "seq", shapes[-1][1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def ort_quantize(model: onnx.ModelProto, block_size: int, symmetric: bool, accuracy_level=None,
                 exclude=None, quant_format=QuantFormat.QOperator) -> onnx.ModelProto:
    q = MatMulNBitsQuantizer(onnx.load_from_string(model.SerializeToString()), block_size=block_size,
                             is_symmetric=symmetric, accuracy_level=accuracy_level, nodes_to_exclude=exclude,
                             quant_format=quant_format)
    q.process()
    return q.model.model


def run(model: onnx.ModelProto | ir.Model, feeds: dict, optimize: bool = True) -> list[np.ndarray]:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    so = ort.SessionOptions()
    if not optimize:  # the unfused graph: ORT's own DQ->MatMul fusion is not the reference semantics
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def initializers(model: onnx.ModelProto | ir.Model) -> dict[str, np.ndarray]:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def nbits_nodes(model: onnx.ModelProto | ir.Model) -> list:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    return [n for n in model.graph.node if n.op_type == "MatMulNBits"]


def attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("shapes", [[(64, 32)], [(100, 48), (48, 20)], [(300, 17)], [(35, 8)]])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_packed_tensors_bit_identical_to_ort_quantizer(shapes, block_size, symmetric):
    model = mlp_model(shapes, seed=block_size)
    ref = ort_quantize(model, block_size, symmetric)
    ours = rewrite(model, passes="int4", int4_block_size=block_size, int4_symmetric=symmetric)
    assert ours.report.counts["MatMulToNBits"] == len(shapes)
    ref_init, our_init = initializers(ref), initializers(ours.model)
    assert sorted(ref_init) == sorted(our_init)
    for name, value in ref_init.items():
        assert value.dtype == our_init[name].dtype and value.shape == our_init[name].shape, name
        assert value.tobytes() == our_init[name].tobytes(), name
    for ref_node, our_node in zip(nbits_nodes(ref), nbits_nodes(ours.model), strict=True):
        assert attrs(ref_node) == attrs(our_node)
        assert list(ref_node.input) == list(our_node.input)
    x = np.random.default_rng(1).standard_normal((2, 3, shapes[0][0])).astype(np.float32)
    np.testing.assert_array_equal(run(ours.model, {"x": x})[0], run(ref, {"x": x})[0])


def test_accuracy_level_and_block_256_match_ort():
    model = mlp_model([(512, 64)])
    ref = ort_quantize(model, 256, False, accuracy_level=4)
    ours = rewrite(model, passes=("int4",), int4_block_size=256, int4_symmetric=False, int4_accuracy_level=4)
    assert attrs(nbits_nodes(ours.model)[0]) == attrs(nbits_nodes(ref)[0])
    assert attrs(nbits_nodes(ours.model)[0])["accuracy_level"] == 4
    x = np.random.default_rng(2).standard_normal((1, 4, 512)).astype(np.float32)
    np.testing.assert_array_equal(run(ours.model, {"x": x})[0], run(ref, {"x": x})[0])


def test_float16_weights_match_ort():
    model = mlp_model([(96, 40)], dtype=np.float16)
    ref = ort_quantize(model, 32, True)
    ours = rewrite(model, passes=("int4",), int4_block_size=32, int4_symmetric=True)
    for name, value in initializers(ref).items():
        assert value.tobytes() == initializers(ours.model)[name].tobytes(), name
    x = np.random.default_rng(3).standard_normal((1, 2, 96)).astype(np.float16)
    np.testing.assert_array_equal(run(ours.model, {"x": x})[0], run(ref, {"x": x})[0])


def test_int4_error_is_within_quantizer_step():
    model = mlp_model([(128, 64)])
    ours = rewrite(model, passes=("int4",), int4_block_size=32, int4_symmetric=False)
    x = np.random.default_rng(4).standard_normal((1, 5, 128)).astype(np.float32)
    want = run(model, {"x": x})[0]
    got = run(ours.model, {"x": x})[0]
    err = np.abs(got - want).max()
    assert 0 < err < 0.1 * np.abs(want).max()


def test_exclude_regex_keeps_named_node_float_with_reason():
    model = mlp_model([(64, 64), (64, 32)], names=["layers.0.mlp", "lm_head"])
    ours = rewrite(model, passes=("int4",), exclude="lm_head")
    ops = [n.op_type for n in ours.model.graph]
    assert ops.count("MatMulNBits") == 1 and ops.count("MatMul") == 1
    assert [n.name for n in ours.model.graph if n.op_type == "MatMul"] == ["lm_head"]
    assert any(f.node == "lm_head" and "--exclude" in f.reason for f in ours.report.failures)
    ref = ort_quantize(model, 32, True, exclude=["lm_head"])
    x = np.random.default_rng(5).standard_normal((1, 1, 64)).astype(np.float32)
    np.testing.assert_array_equal(run(ours.model, {"x": x})[0], run(ref, {"x": x})[0])


def test_min_elements_leaves_small_weights_float():
    model = mlp_model([(64, 64), (64, 16)])
    ours = rewrite(model, passes=("int4",), int4_min_elements=64 * 64)
    assert ours.report.counts["MatMulToNBits"] == 1
    assert any("min-elements" in f.reason for f in ours.report.failures)


def test_near_misses_are_left_alone():
    """Weight fed at run time, 3-D weight, integer MatMul: no rewrite, each with a reason."""
    rng = np.random.default_rng(6)
    w3 = numpy_helper.from_array(rng.standard_normal((2, 16, 8)).astype(np.float32), "w3")
    wi = numpy_helper.from_array(rng.integers(-3, 3, (16, 8)).astype(np.int32), "wi")
    nodes = [
        helper.make_node("MatMul", ["x", "wdyn"], ["y0"], name="dyn"),
        helper.make_node("MatMul", ["x3", "w3"], ["y1"], name="batched"),
        helper.make_node("MatMul", ["xi", "wi"], ["y2"], name="intmm"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
         helper.make_tensor_value_info("wdyn", TensorProto.FLOAT, [16, 8]),
         helper.make_tensor_value_info("x3", TensorProto.FLOAT, [2, 4, 16]),
         helper.make_tensor_value_info("xi", TensorProto.INT32, [4, 16])],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         [("y0", TensorProto.FLOAT), ("y1", TensorProto.FLOAT), ("y2", TensorProto.INT32)]],
        [w3, wi])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    ours = rewrite(model, passes=("int4",), int4_block_size=16)
    assert [n.op_type for n in ours.model.graph] == ["MatMul"] * 3
    reasons = {f.node: f.reason for f in ours.report.failures}
    assert "not a constant" in reasons["dyn"]
    assert "only 2-D" in reasons["batched"]
    assert "INT32" in reasons["intmm"]


def test_shared_weight_is_packed_once():
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["a", "w"], ["ya"], name="ma"),
             helper.make_node("MatMul", ["b", "w"], ["yb"], name="mb")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 32]) for n in "ab"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16]) for n in ("ya", "yb")], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    ours = rewrite(model, passes=("int4",), int4_block_size=16)
    assert ours.report.counts["MatMulToNBits"] == 2
    assert sorted(initializers(ours.model)) == ["w_Q4", "w_scales"]
    feeds = {"a": rng.standard_normal((1, 32)).astype(np.float32),
             "b": rng.standard_normal((1, 32)).astype(np.float32)}
    ya, yb = run(ours.model, feeds)
    ref = ort_quantize(model, 16, True)
    ra, rb = run(ref, feeds)
    np.testing.assert_array_equal(ya, ra)
    np.testing.assert_array_equal(yb, rb)


@pytest.mark.parametrize("symmetric", [True, False])
def test_dq_int4_matmul_is_repacked_exactly(symmetric):
    """ORT's QDQ-format int4 weights (DequantizeLinear int4/uint4, axis 0, blocked) -> MatMulNBits with the same
    B/scales/zero_points its QOperator format produces, and the same outputs as the unfused DQ model on ORT CPU
    (ORT's own DQ->MatMulNBits graph fusion of signed int4 differs from the unfused graph by ~0.1 here)."""
    model = mlp_model([(96, 32), (32, 24)], seed=11)
    qdq = ort_quantize(model, 32, symmetric, quant_format=QuantFormat.QDQ)
    assert [n.op_type for n in qdq.graph.node].count("DequantizeLinear") == 2
    ours = rewrite(qdq, passes=("int4",))
    assert ours.report.counts["DqInt4MatMulToNBits"] == 2
    assert "DequantizeLinear" not in [n.op_type for n in ours.model.graph]
    qop = ort_quantize(model, 32, symmetric)
    ours_init = initializers(ours.model)
    for ref_node, our_node in zip(nbits_nodes(qop), nbits_nodes(ours.model), strict=True):
        assert attrs(ref_node) == attrs(our_node)
        for ref_in, our_in in zip(ref_node.input[1:], our_node.input[1:], strict=True):
            ref_t = initializers(qop)[ref_in]
            np.testing.assert_array_equal(ours_init[our_in].reshape(ref_t.shape), ref_t)
    x = np.random.default_rng(8).standard_normal((2, 3, 96)).astype(np.float32)
    np.testing.assert_array_equal(run(ours.model, {"x": x})[0], run(qdq, {"x": x}, optimize=False)[0])


def test_dq_int4_per_channel_axis_1_is_not_repacked():
    rng = np.random.default_rng(9)
    from npu_ep.quantization import pack_int4

    q = helper.make_tensor("q", TensorProto.INT4, (32, 16), pack_int4(rng.integers(-8, 8, (32, 16))).tobytes(),
                           raw=True)
    s = numpy_helper.from_array(rng.uniform(0.01, 0.1, (32, 1)).astype(np.float32), "s")
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=1, block_size=16, name="dq"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [q, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    ours = rewrite(model, passes=("int4",))
    assert [n.op_type for n in ours.model.graph] == ["DequantizeLinear", "MatMul"]
    assert any("axis is 1" in f.reason for f in ours.report.failures)


def test_external_data_model_rewritten_from_path(tmp_path):
    model = mlp_model([(128, 64), (64, 32)])
    src = tmp_path / "in.onnx"
    ref = ort_quantize(model, 32, True)
    onnx.save(model, src, save_as_external_data=True, all_tensors_to_one_file=True, location="in.onnx.data",
              size_threshold=0)
    ours = rewrite(src, RewriteOptions(passes=("int4",)))
    out = ours.save(tmp_path / "out.onnx")
    x = np.random.default_rng(10).standard_normal((1, 2, 128)).astype(np.float32)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], run(ref, {"x": x})[0])
