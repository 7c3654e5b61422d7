"""Static values of a subgraph, for checks that ask what a subgraph computes rather than how it is spelled.

- ``backward_slice``: the nodes computing some values, and the graph inputs they read.
- ``evaluate_values``: runs that slice on ORT's CPU EP for given inputs (rope evaluates cos/sin per position, gqa
  the attention mask for a few sequence/past/padding cases).
- ``static_ints``: integer contents known without running anything (constants, and TorchScript's shape plumbing
  over static dims, which the constant folder leaves behind).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper

SLICE_LIMIT = 400  # nodes; a cos/sin or mask subgraph is a few dozen at most


def backward_slice(graph: ir.Graph, outputs: list[ir.Value]) -> tuple[list[ir.Node], list[ir.Value]]:
    """Nodes computing ``outputs`` (topological order) and the non-constant graph inputs they read."""
    nodes: set[ir.Node] = set()
    leaves: list[ir.Value] = []
    stack = list(outputs)
    seen: set[ir.Value] = set()
    while stack:
        v = stack.pop()
        if v is None or v in seen:
            continue
        seen.add(v)
        if v.const_value is not None and v.producer() is None:
            continue
        node = v.producer()
        if node is None:
            leaves.append(v)
            continue
        if any(isinstance(a.value, (ir.Graph, list)) and a.type in (ir.AttributeType.GRAPH,
               ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            raise ValueError(f"node {node.name} ({node.op_type}) has a subgraph")
        nodes.add(node)
        if len(nodes) > SLICE_LIMIT:
            raise ValueError(f"subgraph larger than {SLICE_LIMIT} nodes")
        stack.extend(node.inputs)
    order = [n for n in graph if n in nodes]
    return order, leaves


def evaluate_values(graph: ir.Graph, outputs: list[ir.Value], feed_sets: list[dict[ir.Value, np.ndarray]]
                    ) -> list[list[np.ndarray]]:
    """Run the subgraph computing ``outputs`` on ORT CPU once per feed set (feeds keyed by leaf value)."""
    nodes, leaves = backward_slice(graph, outputs)
    missing = [v.name for v in leaves if v not in feed_sets[0]]
    if missing:
        raise ValueError(f"depends on graph inputs {missing}")
    inits, seen = [], set()
    for node in nodes:
        for v in node.inputs:
            if v is not None and v.producer() is None and v.const_value is not None and v.name not in seen:
                seen.add(v.name)
                inits.append(ir.serde.serialize_tensor(v.const_value))
                inits[-1].name = v.name
    leaf_order = list(feed_sets[0])
    g = helper.make_graph(
        [ir.serde.serialize_node(n) for n in nodes], "slice",
        [helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(feed_sets[0][v].dtype), None)
         for v in leaf_order],
        [helper.make_empty_tensor_value_info(v.name) for v in outputs], initializer=inits)
    opsets = [helper.make_opsetid(d, v) for d, v in graph.opset_imports.items()]
    proto = helper.make_model(g, opset_imports=opsets)
    proto.ir_version = 10
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [sess.run([v.name for v in outputs], {v.name: feeds[v] for v in leaf_order}) for feeds in feed_sets]


def static_ints(v: ir.Value | None, depth: int = 8) -> list[int] | None:
    """Integer contents of ``v`` when known statically: constants, and TorchScript-style shape plumbing
    (Shape -> Gather -> Unsqueeze -> Div ...) over static dims, which the constant folder leaves behind."""
    if v is None:
        return None
    if v.const_value is not None:
        arr = v.const_value.numpy()
        return [int(a) for a in arr.reshape(-1)] if arr.dtype.kind in "iu" else None
    node = v.producer()
    if node is None or depth == 0:
        return None
    op, ins = node.op_type, node.inputs
    if op == "Constant":
        attr = node.attributes.get("value_ints") or node.attributes.get("value_int")
        if attr is not None:
            val = attr.value
            return list(val) if isinstance(val, (list, tuple)) else [int(val)]
        attr = node.attributes.get("value")
        arr = attr.value.numpy() if attr is not None else None
        return [int(a) for a in arr.reshape(-1)] if arr is not None and arr.dtype.kind in "iu" else None
    if op == "Shape" and ins[0].shape is not None:
        dims = list(ins[0].shape)
        start = node.attributes["start"].as_int() if "start" in node.attributes else 0
        end = node.attributes["end"].as_int() if "end" in node.attributes else len(dims)
        dims = dims[start:end]
        return dims if all(isinstance(d, int) for d in dims) else None
    args = [static_ints(i, depth - 1) for i in ins]
    if op in ("Unsqueeze", "Squeeze", "Cast", "Identity", "Reshape") and args and args[0] is not None:
        return args[0]
    if op == "Concat" and all(a is not None for a in args):
        return [x for a in args for x in a]
    if op == "Gather" and ins[0].producer() is not None and ins[0].producer().op_type == "Shape":
        shape_node = ins[0].producer()
        dims = list(shape_node.inputs[0].shape or [])
        start = shape_node.attributes["start"].as_int() if "start" in shape_node.attributes else 0
        idx = args[1]
        if idx is None or not dims:
            return None
        picked = [dims[start:][i] for i in idx]
        return picked if all(isinstance(d, int) for d in picked) else None
    binary = {"Div": lambda a, b: a // b, "Mul": lambda a, b: a * b, "Add": lambda a, b: a + b,
              "Sub": lambda a, b: a - b}
    if op in binary and len(args) == 2 and None not in args and (len(args[0]) == len(args[1]) or
                                                                  1 in (len(args[0]), len(args[1]))):
        a, b = args
        n = max(len(a), len(b))
        a, b = a * n if len(a) == 1 else a, b * n if len(b) == 1 else b
        return [binary[op](x, y) for x, y in zip(a, b)]
    return None
