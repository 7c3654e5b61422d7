"""8-bit ``DQ -> op -> Q`` units whose op only moves or selects elements run on the bytes: ``DQ(x) -> MaxPool ->
Q`` becomes ``MaxPool(x)`` when the Q has the DQ's own scale, zero point and type (as ``quantize_static`` writes
for MaxPool, Resize, Flatten, Reshape, Transpose, Squeeze, Unsqueeze).

Why: the unit costs a dequantized float copy of the feature map and a quantization pass around an op that neither
needs nor changes the values.

Exactness: a movement op (Flatten, Reshape, Transpose, Squeeze, Unsqueeze, nearest Resize without
tf_crop_and_resize) picks elements, and MaxPool picks a maximum, which a nondecreasing DequantizeLinear (scale > 0)
preserves; a window wholly in the padding gives the float lowest value, which quantizes to the type's lowest
byte, the byte kernel's value there. What is left is ``Q(DQ(v)) == v``, which is checked at compile time by
running the two kernels on all 256 bytes (the unit stays float where it does not hold).

Rules: the op's data input is a per-tensor DequantizeLinear of an 8-bit tensor (constant float32 scale > 0 and
zero point); the op has one used output, read only by one per-tensor QuantizeLinear with equal scale, zero point
and type, not a graph output; its other inputs are constants; the target runs the op on the 8-bit type.

The unit is ``kernels.fusion.patterns.qdq_moved``, the pattern ``rewriter/qdq.py``'s QdqPassThrough rules match
too; a candidate (the Q) that fails a rule above is a ``FusionMiss`` with the rule's reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchResult

from ..node import NodeInfo
from ..registry import kernel_for
from ..support import dtype_name
from ..target import Target
from . import patterns
from ._graph import consumers_of
from ._rules import TARGET, FusionMiss, FusionRule, apply_rules, failed, passed, producer_info
from .qdq import DQ_OPS, Q_OPS

MOVES = frozenset({"MaxPool", "Resize", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze"})


def _params(nd: NodeInfo) -> tuple[float, int, str] | None:
    """(scale, zero point, 8-bit type) of a per-tensor Q/DQ with constant float32 parameters, else None."""
    s, z = nd.input(1), nd.input(2)
    if s is None or s.value is None or np.asarray(s.value).dtype != np.float32 or np.size(s.value) != 1:
        return None
    if int(nd.attr("block_size", 0)) or (z is not None and (z.value is None or np.size(z.value) != 1)):
        return None
    qtype = dtype_name(z) if z is not None else (dtype_name(nd.inputs[0]) if nd.key in DQ_OPS else "uint8")
    if nd.key in Q_OPS and z is None and int(nd.attr("output_dtype", 0)):
        return None
    if qtype not in ("uint8", "int8"):
        return None
    return float(np.asarray(s.value).reshape(())), int(np.asarray(z.value).reshape(())) if z is not None else 0, qtype


def _roundtrip_exact(dq: NodeInfo, q: NodeInfo, target: Target, qtype: str) -> bool:
    """Q(DQ(v)) == v for every byte v, by the two kernels."""
    every = np.arange(256, dtype=np.uint8).view(qtype)
    vals = []
    for nd, arg in ((dq, every), (q, None)):
        k = kernel_for(nd.domain, nd.op_type)
        p = k.prepare(nd, target)
        p.target = target
        vals.append(k.run(p, [arg if arg is not None else vals[-1]])[0])
    return bool(np.array_equal(vals[-1], every))


def _moves_only(op: NodeInfo) -> bool:
    if op.domain != "" or op.op_type not in MOVES:
        return False
    if op.op_type == "Resize":
        return (str(op.attr("mode", "nearest")) == "nearest"
                and str(op.attr("coordinate_transformation_mode", "half_pixel")) != "tf_crop_and_resize")
    if op.op_type == "MaxPool":
        return sum(not v.missing for v in op.outputs) == 1
    return True


class QdqBytesRule(FusionRule):
    """``Q(op(DQ(x), ...))`` for an op in ``MOVES`` with the DQ's own parameters -> ``op(x, ...)`` on the bytes, in
    the op's place; the DQ stays for its other readers (it goes where none is left)."""

    name = "qdq_bytes"
    produces = None  # the op itself, on the 8-bit type (support.why_not decides)
    place = min  # after the DQ leaves the chain, the op is its first member
    only_readers = False  # the DQ may feed others; the check asks that the op's output feed the Q alone

    def variants(self) -> list[Callable[..., Any]]:
        def around(op_type: str) -> Callable[..., Any]:
            return lambda op, x, s1, s2: patterns.qdq_moved(op, op_type, x, s1, s2)

        return [around(t) for t in sorted(MOVES)]

    def check(self, context, deq: ir.Value, moved: ir.Value, y: ir.Value, **_: Any) -> MatchResult:
        dq, op, q = producer_info(deq), producer_info(moved), producer_info(y)
        reason = _reason(dq, op, q, len(moved.uses()) == 1 and not moved.is_graph_output(), context.model)
        return passed() if reason is None else failed(reason, y)

    def kept(self, deq: ir.Value, **_: Any) -> list[ir.Node]:
        return [deq.producer()]

    def fuse(self, members: list[NodeInfo], deq: ir.Value, moved: ir.Value, y: ir.Value, **_: Any) -> NodeInfo:
        dq, op, q = producer_info(deq), producer_info(moved), producer_info(y)
        return dataclasses.replace(op, name=f"{op.name}+{q.name}", inputs=(dq.inputs[0], *op.inputs[1:]),
                                   outputs=(q.outputs[0], *op.outputs[1:]),
                                   attrs={**op.attrs, "fused_nodes": [dq.name, op.name, q.name]})


def _reason(dq: NodeInfo, op: NodeInfo, q: NodeInfo, q_alone: bool, model: Any) -> str | None:
    """Why the unit does not run on the bytes, or None."""
    if not _moves_only(op):
        return f"{op.describe()} does not only move or select elements (Resize: nearest only; MaxPool: one output)"
    if any(v.value is None for v in op.inputs[1:] if not v.missing):
        return f"{op.describe()}: its other inputs are not constants"
    if dq.inputs[0].value is not None:
        return f"{dq.describe()} dequantizes a constant"
    if op.outputs[0].is_graph_output or not q_alone or q.inputs[0].name != op.outputs[0].name:
        return f"{op.describe()}: its output is read outside the unit"
    pq, pd = _params(q), _params(dq)
    if pq is None or pq != pd or pd[0] <= 0:
        return (f"{q.describe()} and {dq.describe()} are not per tensor 8-bit with the same constant scale > 0, zero "
                "point and type")
    if not _roundtrip_exact(dq, q, model.graph.meta[TARGET], pd[2]):
        return f"{q.describe()}(DequantizeLinear(v)) is not v for every byte"
    return None


RULES = (QdqBytesRule(),)


def fuse_qdq_bytes(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with 8-bit movement/MaxPool QDQ units running on the bytes."""
    out = apply_rules(nodes, target, RULES, misses)
    if out is nodes or len(out) == len(nodes):
        return nodes
    # DequantizeLinears left without readers go too
    users = consumers_of(out)
    return [nd for nd in out if not (nd.key in DQ_OPS and all(
        v.missing or (not v.is_graph_output and v.name not in users) for v in nd.outputs))]
