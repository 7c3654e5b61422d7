"""What the compiler and the kernels are told about one ONNX node (built from the plugin shim's graph view).

Shapes: a tuple with one entry per dimension: ``int`` (static), ``str`` (symbolic name) or ``None`` (unknown);
``shape is None`` means the rank itself is unknown. Domains are canonical: ``""`` for the default ONNX domain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..log import escape

Dim = int | str | None


@dataclasses.dataclass(frozen=True)
class ValueInfo:
    name: str
    dtype: np.dtype | None  # None: non-tensor, unknown, or a dtype numpy cannot represent
    shape: tuple[Dim, ...] | None
    value: np.ndarray | None = None  # constant initializer contents, compile time only
    is_constant: bool = False
    is_graph_input: bool = False
    is_graph_output: bool = False
    onnx_type: int = 0  # ONNX element type (names types numpy lacks, e.g. int4 = 22, uint4 = 21)

    @property
    def missing(self) -> bool:
        """An omitted optional input (empty name)."""
        return self.name == ""

    @property
    def static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def describe(self) -> str:
        dims = "?" if self.shape is None else "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"
        return f"{escape(self.name)}:{self.dtype if self.dtype is not None else '?'}{dims}"


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    since_version: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def input(self, i: int) -> ValueInfo | None:
        """Input ``i``, or None when it is absent or an omitted optional input."""
        if i >= len(self.inputs) or self.inputs[i].missing:
            return None
        return self.inputs[i]

    def describe(self) -> str:
        """``node 'name' (domain::Op)`` for messages, model-supplied strings escaped (``log.escape``)."""
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        return f"node '{escape(self.name)}' ({escape(op)})"


@dataclasses.dataclass(frozen=True)
class UnreadableAttribute:
    """An attribute the plugin shim could not hand over: a tensor of an element type numpy lacks (a string tensor),
    or (``elem_type`` -1) an attribute type the plugin API does not expose (TYPE_PROTO). No kernel can use it."""

    elem_type: int


def canonical_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain
