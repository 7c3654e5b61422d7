"""The plugin shim's plain dicts (see ep/native/graph_view.h) -> the compiler's NodeInfo/ValueInfo."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..quantization.int4 import unpack_int4
from ..kernels.node import NodeInfo, UnreadableAttribute, ValueInfo, canonical_domain
from ..kernels.ops.control_flow import BranchGraph
from ..dtypes import TensorProto, numpy_dtype


def _unpack_4bit(packed: np.ndarray, elem_type: int, shape: Sequence[int]) -> np.ndarray:
    """ONNX int4/uint4 bytes -> ml_dtypes int4/uint4 array (the representation onnx.numpy_helper gives)."""
    import ml_dtypes

    signed = elem_type == TensorProto.INT4
    count = int(np.prod(shape, dtype=np.int64))
    values = unpack_int4(packed, count, signed).reshape(tuple(shape))
    return values.astype(ml_dtypes.int4 if signed else ml_dtypes.uint4)


def value_from_dict(d: Mapping[str, Any]) -> ValueInfo:
    shape = d.get("shape")
    elem_type = int(d.get("elem_type", 0))
    value = d.get("value")
    if value is None and d.get("packed_value") is not None:
        value = _unpack_4bit(d["packed_value"], elem_type, shape or ())
    return ValueInfo(
        name=d["name"],
        dtype=numpy_dtype(elem_type),
        shape=tuple(shape) if shape is not None else None,
        value=value,
        onnx_type=elem_type,
        is_constant=bool(d.get("is_constant", False)),
        is_graph_input=bool(d.get("is_graph_input", False)),
        is_graph_output=bool(d.get("is_graph_output", False)),
    )


def node_from_dict(d: Mapping[str, Any]) -> NodeInfo:
    """A node; one holding graphs (If/Loop/Scan) gets each as a ``BranchGraph`` under its attribute name, and the
    outer-scope values they read appended to its inputs (they are inputs of whatever partition claims it)."""
    attrs = {k: UnreadableAttribute(int(v["unreadable"])) if isinstance(v, Mapping) and "unreadable" in v else v
             for k, v in d.get("attrs", {}).items()}
    inputs = [value_from_dict(v) for v in d["inputs"]]
    for attr, g in (d.get("subgraphs") or {}).items():
        attrs[attr] = BranchGraph(g["name"], tuple(node_from_dict(n) for n in g["nodes"]),
                                  tuple(value_from_dict(v) for v in g["outputs"]),
                                  tuple(value_from_dict(v) for v in g.get("inputs", ())))
    if d.get("subgraphs"):
        inputs += [value_from_dict(v) for v in d.get("implicit_inputs", ())]
    return NodeInfo(
        index=int(d["index"]),
        name=d["name"] or f"{d['op_type']}_{d['index']}",
        op_type=d["op_type"],
        domain=canonical_domain(d["domain"]),
        inputs=tuple(inputs),
        outputs=tuple(value_from_dict(v) for v in d["outputs"]),
        attrs=attrs,
        since_version=int(d.get("since_version", 0)),
    )
