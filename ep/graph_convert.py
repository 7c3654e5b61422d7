"""The plugin shim's plain dicts (see ep/native/graph_view.h) -> the compiler's NodeInfo/ValueInfo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kernels.node import NodeInfo, ValueInfo, canonical_domain
from .dtypes import numpy_dtype


def value_from_dict(d: Mapping[str, Any]) -> ValueInfo:
    shape = d.get("shape")
    return ValueInfo(
        name=d["name"],
        dtype=numpy_dtype(d.get("elem_type", 0)),
        shape=tuple(shape) if shape is not None else None,
        value=d.get("value"),
        is_constant=bool(d.get("is_constant", False)),
        is_graph_input=bool(d.get("is_graph_input", False)),
        is_graph_output=bool(d.get("is_graph_output", False)),
    )


def node_from_dict(d: Mapping[str, Any]) -> NodeInfo:
    return NodeInfo(
        index=int(d["index"]),
        name=d["name"] or f"{d['op_type']}_{d['index']}",
        op_type=d["op_type"],
        domain=canonical_domain(d["domain"]),
        inputs=tuple(value_from_dict(v) for v in d["inputs"]),
        outputs=tuple(value_from_dict(v) for v in d["outputs"]),
        attrs=dict(d.get("attrs", {})),
        since_version=int(d.get("since_version", 0)),
    )
