"""nodes_from_model: shapes for com.microsoft ops, and no side effects on the working directory."""

from __future__ import annotations

import os

from onnx import TensorProto, helper

from npu_ep.ep.onnx_graph import nodes_from_model


def _contrib_model(dims, op: str = "FastGelu"):
    node = helper.make_node(op, ["x"], ["y"], name="gelu", domain="com.microsoft")
    graph = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_contrib_op_output_shapes_are_inferred():
    nodes = nodes_from_model(_contrib_model(["batch", 8]))
    assert nodes[0].outputs[0].shape == ("batch", 8) and nodes[1].outputs[0].shape == ("batch", 8)


def test_incomplete_inference_leaves_the_working_directory_alone(tmp_path, monkeypatch):
    """ORT's SymbolicShapeInference.infer_shapes dumps sym_shape_infer_temp.onnx + <uuid>.data into the cwd when it
    cannot finish; nodes_from_model must not."""
    monkeypatch.chdir(tmp_path)
    nodes = nodes_from_model(_contrib_model([2, 3], op="NoSuchContribOp"))  # symbolic inference cannot complete
    assert [n.op_type for n in nodes] == ["NoSuchContribOp", "Relu"]
    assert os.listdir(tmp_path) == []
