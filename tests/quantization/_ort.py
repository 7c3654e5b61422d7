"""Tiny helpers to run one-node ONNX models on ORT's CPU EP (the reference for our quantization math)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


def run_single_node(node: onnx.NodeProto | list[onnx.NodeProto], inputs: dict[str, np.ndarray],
                    initializers: list[onnx.TensorProto], out_type: int, opset: int = 21) -> np.ndarray:
    """Build a graph of the node(s) whose graph inputs are ``inputs`` and run it on CPU; returns the last
    node's output 0."""
    nodes = node if isinstance(node, list) else [node]
    graph_inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for k, v in inputs.items()]
    out = helper.make_tensor_value_info(nodes[-1].output[0], out_type, None)
    graph = helper.make_graph(nodes, "g", graph_inputs, [out], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]
