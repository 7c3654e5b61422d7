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
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..node import NodeInfo
from ..registry import kernel_for
from ..support import dtype_name, why_not
from ..target import Target
from ._graph import consumers_of, producers_of
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


def fuse_qdq_bytes(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with 8-bit movement/MaxPool QDQ units running on the bytes."""
    users = consumers_of(nodes)
    producer = producers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for i, op in enumerate(nodes):
        if not _moves_only(op) or not op.inputs or any(v.value is None for v in op.inputs[1:] if not v.missing):
            continue
        j = producer.get(op.inputs[0].name)
        dq = nodes[j] if j is not None else None
        y = op.outputs[0]
        readers = users.get(y.name, [])
        if dq is None or dq.key not in DQ_OPS or dq.inputs[0].value is not None or y.is_graph_output \
                or len(readers) != 1:
            continue
        q = nodes[readers[0]]
        pq, pd = (_params(q) if q.key in Q_OPS else None), _params(dq)
        if pq is None or pq != pd or pd[0] <= 0 or q.inputs[0].name != y.name:
            continue
        if not _roundtrip_exact(dq, q, target, pd[2]):
            continue
        src = dq.inputs[0]
        fused = dataclasses.replace(op, name=f"{op.name}+{q.name}", inputs=(src, *op.inputs[1:]),
                                    outputs=(q.outputs[0], *op.outputs[1:]),
                                    attrs={**op.attrs, "fused_nodes": [dq.name, op.name, q.name]})
        if why_not(fused, target) is not None:
            continue
        replace[i] = fused
        absorbed.add(readers[0])
    if not replace:
        return nodes
    out = [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
    # DequantizeLinears left without readers go too
    users = consumers_of(out)
    return [nd for nd in out if not (nd.key in DQ_OPS and all(
        v.missing or (not v.is_graph_output and v.name not in users) for v in nd.outputs))]
