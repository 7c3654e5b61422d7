"""Shape plumbing between claimed compute stays on NpuEP: exporters compute Reshape targets with Shape -> Gather ->
Mul/Div (int64) -> Unsqueeze -> Concat, plus Cast and Identity. Those tensors hold a few int64 elements that the NPU
carries as metadata (int32/int64 on the plumbing ops in both target tables), so a chain of supported compute with
its plumbing is one partition, not one partition per side of every shape computation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session, session_options


def plumbing_model(batch):
    """y = Relu(Reshape(Relu(x), [N * 2 / 1, -1])) with the shape computed from x at run time."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_in"),
             helper.make_node("Shape", ["a"], ["shp"], name="shape"),
             helper.make_node("Gather", ["shp", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Mul", ["n", "two"], ["n2"], name="mul_int"),
             helper.make_node("Div", ["n2", "one"], ["n3"], name="div_int"),
             helper.make_node("Cast", ["n3"], ["n4"], name="cast_int", to=TensorProto.INT64),
             helper.make_node("Identity", ["n4"], ["n5"], name="identity_int"),
             helper.make_node("Unsqueeze", ["n5", "axes0"], ["n6"], name="unsqueeze"),
             helper.make_node("Concat", ["n6", "minus_one"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["a", "target"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu_out")]
    inits = {"zero": np.array(0, np.int64), "two": np.array(2, np.int64), "one": np.array(1, np.int64),
             "axes0": np.array([0], np.int64), "minus_one": np.array([-1], np.int64)}
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [batch, 8])],
                      [helper.make_tensor_value_info("y", F32, ["A", "B"])], inits)


def _session(model, target):
    so = session_options()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # ORT would fold static plumbing
    return npu_session(model, {"target": target}, so=so)


PLUMBING = ["shape", "gather", "mul_int", "div_int", "cast_int", "identity_int", "unsqueeze", "concat"]


def test_shape_plumbing_between_claimed_nodes_is_one_partition():
    model = plumbing_model("N")
    sess = _session(model, "npu-ref")
    where = assignment(sess)
    assert set(where.values()) == {"NpuEP"}, where
    assert len(npu_partitions(sess)) == 1
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    assert got.shape == want.shape == (8, 4)
    np.testing.assert_array_equal(got, want)


def test_npu_edge_claims_the_plumbing_and_declines_only_the_dynamic_reshape(caplog):
    """npu-edge compiles static shapes: the plumbing (static [1]/[2] int64 tensors) is claimed with the Relu before
    it; the Reshape to a runtime shape and what follows have dynamic shapes and stay on the CPU, saying so."""
    model = plumbing_model(4)
    with caplog.at_level("DEBUG", logger="npu_ep"):
        sess = _session(model, "npu-edge")
    where = assignment(sess)
    assert {n: where[n] for n in ["relu_in", *PLUMBING]} == {n: "NpuEP" for n in ["relu_in", *PLUMBING]}
    assert where["reshape"] == where["relu_out"] == "CPUExecutionProvider"
    assert "node 'reshape' (Reshape): r:float32[?,?] has symbolic/dynamic shape; target npu-edge requires static " \
        "shapes" in caplog.text
    assert len(npu_partitions(sess)) == 1
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])
