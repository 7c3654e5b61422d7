"""A tiny ONNX graph builder for the model generators.

Why not onnxscript's builder: the generators must emit the exact node soup exporters produce (Constant nodes
vs. initializers, Shape plumbing), so a thin, explicit wrapper over ``onnx.helper`` is the clearest tool.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


class GraphBuilder:
    """Collects nodes and initializers; names every value uniquely.

    ``constants_as_nodes`` mimics the legacy TorchScript exporter, which emits small constants as ``Constant``
    nodes; the dynamo exporter stores them as initializers.
    """

    def __init__(self, *, constants_as_nodes: bool = False) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.constants_as_nodes = constants_as_nodes
        self._counts: dict[str, int] = {}
        self._const_cache: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        n = self._counts.get(hint, 0)
        self._counts[hint] = n + 1
        return f"{hint}_{n}" if n else hint

    def op(self, op_type: str, *inputs: str, outputs: int | list[str] = 1, name: str | None = None,
           domain: str = "", **attrs) -> str | list[str]:
        """Add a node; returns its output name (or names when ``outputs`` > 1 or a list of names)."""
        node_name = name or self.fresh(f"/{op_type}")
        if isinstance(outputs, int):
            out_names = [self.fresh(f"{node_name.strip('/')}_out{i}") for i in range(outputs)]
        else:
            out_names = list(outputs)
        self.nodes.append(helper.make_node(op_type, list(inputs), out_names, name=node_name, domain=domain,
                                           **attrs))
        return out_names[0] if len(out_names) == 1 else out_names

    def weight(self, name: str, array: np.ndarray) -> str:
        """A named initializer (weights are always initializers, in both exporter styles)."""
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value, dtype=np.int64) -> str:
        """A small constant: a Constant node (TorchScript style) or an initializer (dynamo style)."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if not self.constants_as_nodes and key in self._const_cache:
            return self._const_cache[key]
        if self.constants_as_nodes:
            name = self.op("Constant", value=numpy_helper.from_array(array, "value"))
        else:
            name = self.weight(self.fresh("val"), array)
            self._const_cache[key] = name
        return name

    def make_model(self, graph_name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
                   opset: int = 18) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="npu_ep.models")
        model.ir_version = 10
        return model
