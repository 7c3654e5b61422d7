"""Partitions have readable names in messages ('NpuEP_<first op>_<index>', with ORT's fused-node name after it,
which stays the key of EPContext's partition_name), and the shim's output-shape check names the node."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session, save

import npu_ep


def gather_model():
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=0, name="gather"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 3])],
                      [helper.make_tensor_value_info("y", F32, [3])], {"idx": np.array(1, np.int64)})


def test_runtime_error_names_the_partition_readably():
    model = gather_model()
    sess = npu_session(model)
    with pytest.raises(Exception) as info:
        sess.run(None, {"x": np.zeros((1, 3), np.float32)})  # index 1 out of range at run time
    msg = str(info.value)
    assert "partition 'NpuEP_Gather_0' (2 nodes, ORT node 'NpuEP_NpuEP_" in msg, msg
    assert "node 'gather' (Gather)" in msg


def test_epcontext_partition_name_stays_orts_fused_node_name(tmp_path):
    src = save(gather_model(), tmp_path)
    ctx = str(tmp_path / "model_ctx.onnx")
    npu_session(src, **{"ep.context_enable": "1", "ep.context_file_path": ctx})
    (node,) = [n for n in onnx.load(ctx).graph.node if n.op_type == "EPContext"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["partition_name"].decode().startswith(f"{npu_ep.get_ep_name()}_{npu_ep.get_ep_name()}_")
    sess = npu_session(ctx)
    x = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(gather_model(), {"x": x})[0])


def test_dims_differing_from_orts_inference_warn_once_naming_the_node(caplog):
    """ONNX's inference sizes this ceil_mode pool 12 wide, ORT's CPU kernel (and ours) 11: ORT warns, so do we."""
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[3], strides=[2], pads=[1, 2],
                            ceil_mode=1, count_include_pad=1)
    model = make_model([node], [helper.make_tensor_value_info("x", F32, [2, 4, 21])],
                       [helper.make_tensor_value_info("y", F32, [2, 4, 12])], opset=21)
    sess = npu_session(model)
    assert assignment(sess) == {"pool": "NpuEP"}
    x = np.random.default_rng(1).standard_normal((2, 4, 21)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="npu_ep"):
        for _ in range(3):
            got = sess.run(None, {"x": x})[0]
    warnings = [r.getMessage() for r in caplog.records if "graph declares" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "output 'y' of node 'pool' (AveragePool) has shape [2,4,11] but the graph declares [2,4,12]" in warnings[0]
    np.testing.assert_array_equal(got, cpu_run(model, {"x": x})[0])


def test_output_of_another_rank_than_declared_warns_once_and_matches_cpu(caplog):
    """ddddocr's CRNN declares its [T, 1, classes] output as [1, seqlen]: ORT's executor warns and the CPU EP runs
    it, so NpuEP hands ORT the rank it computed and warns once, naming the node."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 6]),
                               helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, ["r"])],
                       [helper.make_tensor_value_info("y", F32, [1, "seqlen"])])
    sess = npu_session(model)
    assert assignment(sess) == {"relu": "NpuEP", "reshape": "NpuEP"}
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32), "shape": np.array([2, 1, 12], np.int64)}
    with caplog.at_level(logging.WARNING, logger="npu_ep"):
        got = [sess.run(None, feeds)[0] for _ in range(3)]
    warnings = [r.getMessage() for r in caplog.records if "graph declares" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "output 'y' of node 'reshape' (Reshape) has shape [2,1,12] but the graph declares [1,-1]" in warnings[0]
    want = cpu_run(model, feeds)[0]
    assert want.shape == (2, 1, 12)
    for g in got:
        np.testing.assert_array_equal(g, want)
