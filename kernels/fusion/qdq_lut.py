"""8-bit element-wise QDQ units as lookup tables: ``DQ(a) [, DQ(b)] -> op -> Q`` becomes one ``npu::QdqLut`` node.

Why: a QDQ graph from ``quantize_static`` wraps every element-wise op between two convolutions (a scale, a bias,
``x * clip(x + 3) / 6``) in its own DequantizeLinear and QuantizeLinear, so the host runs three float passes per op
over the feature map. With 8-bit activations such a unit is a function of one byte (256 entries) or of two bytes
(65536 entries), and a chain of such units is again a function of its source bytes: the whole tail from one
QLinearConv to the next collapses into one table read.

Exactness: each table is computed by running the unit's own kernels (DequantizeLinear, the op, QuantizeLinear)
on every possible input byte, so the fused node returns exactly what the unfused steps return (ORT's unoptimized
QDQ semantics, which those kernels are tested against). Composition only re-indexes tables.

Rules (all must hold): the op is one of ``OPS`` (ai.onnx, one output, float32); its output is read only by one
per-tensor QuantizeLinear with constant float32 scale and an 8-bit zero point, and is not a graph output; every
other input is either a per-tensor DequantizeLinear of an 8-bit tensor with constant float32 scale and zero point
(at most two distinct tensors), or a constant with one element (possibly itself a DequantizeLinear of a
constant). A unit whose input comes from another unary table node reads that node's source through the composed
table; nodes and DequantizeLinears left without readers are dropped. Last, a one-input table reading a
QLinearConv's output (and nothing else reading it) is folded into that conv as its output table.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..registry import kernel_for
from ..support import dtype_name, why_not
from ..target import Target
from ._graph import consumers_of, producers_of
from ._rules import FusionMiss
from .qdq import DQ_OPS, Q_OPS, dequantized, is_weight_dq

FUSED_DOMAIN, FUSED_OP = "npu", "QdqLut"
OPS = frozenset({"Add", "Sub", "Mul", "Div", "Clip", "Relu", "Max", "Min", "Abs", "Neg"})
BYTES = ("uint8", "int8")
_ALL = np.arange(256, dtype=np.uint8)


def _per_tensor_8bit(nd: NodeInfo, data_dtype: str | None) -> bool:
    s, z = nd.input(1), nd.input(2)
    return (s is not None and s.value is not None and np.asarray(s.value).dtype == np.float32
            and np.size(s.value) == 1 and (z is None or (z.value is not None and np.size(z.value) == 1))
            and not int(nd.attr("block_size", 0)) and data_dtype in BYTES)


def _q_out_dtype(q: NodeInfo) -> str | None:
    z = q.input(2)
    if z is not None:
        return dtype_name(z)
    return "uint8" if not int(q.attr("output_dtype", 0)) else None


def _const(like: ValueInfo, name: str, value: np.ndarray) -> ValueInfo:
    return dataclasses.replace(like, name=name, dtype=value.dtype, shape=tuple(value.shape), value=value,
                               is_constant=True, is_graph_input=False, is_graph_output=False, onnx_type=0)


def _run(nd: NodeInfo, target: Target, inputs: list) -> np.ndarray:
    kernel = kernel_for(nd.domain, nd.op_type)
    p = kernel.prepare(nd, target)
    p.target = target
    with np.errstate(all="ignore"):
        return kernel.run(p, inputs)[0]


def _unit_table(op: NodeInfo, q: NodeInfo, acts: list[tuple[int, NodeInfo]], target: Target,
                sources: list[str]) -> np.ndarray:
    """Q(op(DQ(...))) evaluated by the kernels on every byte of each source: [256] or [256 * 256] (a major)."""
    grids = np.meshgrid(*([_ALL] * len(sources)), indexing="ij")
    ins: list = [None] * len(op.inputs)
    for i, dq in acts:
        raw = grids[sources.index(dq.inputs[0].name)].reshape(-1).view(dtype_name(dq.inputs[0]))
        ins[i] = _run(dq, target, [raw])
    y = _run(op, target, ins)
    return np.ascontiguousarray(_run(q, target, [np.ascontiguousarray(y, np.float32)]).reshape(-1))


def _in_qdq(op: NodeInfo, readers: list[int], nodes: list[NodeInfo], producer: dict) -> bool:
    """Whether the element-wise ``op`` is read by a QuantizeLinear or reads a DequantizeLinear: a QDQ unit's op
    (a candidate), not a float op of a float graph."""
    if any(nodes[j].key in Q_OPS for j in readers):
        return True
    return any(producer.get(v.name) is not None and nodes[producer[v.name]].key in DQ_OPS for v in op.inputs)


def _unit(nodes: list[NodeInfo], i: int, users: dict, producer: dict, target: Target) -> NodeInfo | str | None:
    """The table node replacing element-wise node ``i`` and its QuantizeLinear; else why a QDQ unit's op stays
    (a string), or None for a node that is no candidate."""
    op = nodes[i]
    if op.domain != "" or op.op_type not in OPS or len(op.outputs) != 1:
        return None
    y = op.outputs[0]
    readers = users.get(y.name, [])
    if y.is_graph_output or len(readers) != 1 or y.dtype != np.float32:
        if not _in_qdq(op, readers, nodes, producer):
            return None
        return (f"its output '{y.name}' is a graph output" if y.is_graph_output else
                f"its output '{y.name}' has {len(readers)} readers, not one QuantizeLinear" if len(readers) != 1 else
                f"its output '{y.name}' is not float32")
    q = nodes[readers[0]]
    if q.key not in Q_OPS or q.inputs[0].name != y.name or not _per_tensor_8bit(q, _q_out_dtype(q)):
        if not _in_qdq(op, readers, nodes, producer):
            return None
        if q.key not in Q_OPS or q.inputs[0].name != y.name:
            return f"its output '{y.name}' is read by {q.op_type} '{q.name}', not a QuantizeLinear"
        return (f"QuantizeLinear '{q.name}' is not per-tensor to 8 bits with a constant float32 scale and zero "
                "point")
    inputs, acts, sources, consts = list(op.inputs), [], [], {}
    for k, v in enumerate(op.inputs):
        if v.missing:
            continue
        if v.value is not None:
            if np.size(v.value) != 1:
                return f"input '{v.name}' is a constant of {np.size(v.value)} elements, not one"
            continue
        j = producer.get(v.name)
        dq = nodes[j] if j is not None else None
        if dq is None or dq.key not in DQ_OPS:
            return f"input '{v.name}' does not come from a DequantizeLinear"
        if is_weight_dq(dq):
            value = dequantized(dq)
            if value.size != 1 or value.dtype != np.float32:
                return f"input '{v.name}' dequantizes a constant that is not one float32 element"
            inputs[k] = consts[k] = _const(v, v.name, value)
            continue
        if not _per_tensor_8bit(dq, dtype_name(dq.inputs[0])) or dq.inputs[0].value is not None:
            return (f"DequantizeLinear '{dq.name}' is not per-tensor from 8 bits with a constant float32 scale and "
                    "zero point")
        acts.append((k, dq))
        if dq.inputs[0].name not in sources:
            sources.append(dq.inputs[0].name)
    if not acts or len(sources) > 2:
        return (f"it reads {len(sources)} distinct 8-bit tensors, more than two" if acts else
                "it reads no dequantized 8-bit activation")
    op = dataclasses.replace(op, inputs=tuple(inputs))
    table = _unit_table(op, q, acts, target, sources)
    src = [next(dq.inputs[0] for _, dq in acts if dq.inputs[0].name == s) for s in sources]
    fused = NodeInfo(
        index=op.index, name=f"{op.name}+{q.name}", op_type=FUSED_OP, domain=FUSED_DOMAIN,
        inputs=(*src, _const(src[0], f"{q.outputs[0].name}/lut", table)), outputs=q.outputs,
        attrs={"fused_nodes": [op.name, q.name]}, since_version=op.since_version)
    why = why_not(fused, target)
    return fused if why is None else f"the target rejects {why}"


def _compose(nd: NodeInfo, unary: dict[str, tuple[ValueInfo, np.ndarray, list[str]]]) -> NodeInfo:
    """``nd`` reading, through composed tables, the sources of the unary table nodes that feed it."""
    srcs = nd.inputs[:-1]
    table = np.asarray(nd.inputs[-1].value)
    resolved = [unary.get(v.name, (v, None, [])) for v in srcs]
    if all(t is None for _, t, _ in resolved):
        return nd
    idx = [_ALL if t is None else t.view(np.uint8) for _, t, _ in resolved]
    names = [s.name for s, _, _ in resolved]
    fused = [n for _, _, f in resolved for n in f] + list(nd.attrs["fused_nodes"])
    if len(resolved) == 1:
        new, inputs = table[idx[0]], (resolved[0][0],)
    elif names[0] == names[1]:
        new, inputs = table.reshape(256, 256)[idx[0], idx[1]], (resolved[0][0],)
    else:
        new, inputs = table.reshape(256, 256)[np.ix_(idx[0], idx[1])].reshape(-1), (resolved[0][0], resolved[1][0])
    lut = dataclasses.replace(nd.inputs[-1], shape=(new.size,), value=np.ascontiguousarray(new))
    return dataclasses.replace(nd, inputs=(*inputs, lut), attrs={**nd.attrs, "fused_nodes": fused})


def _drop_dead(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """Remove table nodes and DequantizeLinears whose outputs nothing reads (repeatedly)."""
    while True:
        users = consumers_of(nodes)
        keep = [nd for nd in nodes
                if not ((nd.key == (FUSED_DOMAIN, FUSED_OP) or nd.key in DQ_OPS)
                        and all(v.missing or (not v.is_graph_output and v.name not in users) for v in nd.outputs))]
        if len(keep) == len(nodes):
            return keep
        nodes = keep


def fuse_qdq_lut(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with 8-bit element-wise QDQ units as (composed) lookup-table nodes; each QDQ unit's
    op that stays float goes to ``misses`` with the reason."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    users = consumers_of(nodes)
    producer = producers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for i in range(len(nodes)):
        fused = _unit(nodes, i, users, producer, target)
        if isinstance(fused, str):
            if misses is not None:
                misses.append(FusionMiss("qdq_lut", nodes[i].name, nodes[i].op_type, fused))
        elif fused is not None:
            q = users[nodes[i].outputs[0].name][0]
            replace[q] = fused  # at the Q's place: every input of the unit exists by then
            absorbed.add(i)
    if not replace:
        return nodes
    out, unary = [], {}
    for i, nd in enumerate(nodes):
        if i in absorbed:
            continue
        if i in replace:
            nd = _compose(replace[i], unary)
            if len(nd.inputs) == 2:
                unary[nd.outputs[0].name] = (nd.inputs[0], np.asarray(nd.inputs[-1].value), nd.attrs["fused_nodes"])
        out.append(nd)
    return _fold_into_convs(_drop_dead(out), target)


def _fold_into_convs(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """A one-input table node whose input is a QLinearConv's output read by nothing else becomes that conv's
    output table (``output_lut``: applied to each requantized row while it is in cache)."""
    users = consumers_of(nodes)
    producer = producers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for i, nd in enumerate(nodes):
        if nd.key != (FUSED_DOMAIN, FUSED_OP) or len(nd.inputs) != 2:
            continue
        src = nd.inputs[0]
        j = producer.get(src.name)
        if j is None or j in replace or src.is_graph_output or users.get(src.name) != [i]:
            continue
        conv = nodes[j]
        if conv.key != ("", "QLinearConv") or "output_lut" in conv.attrs:
            continue
        fused = dataclasses.replace(conv, name=f"{conv.name}+{nd.name}", outputs=nd.outputs,
                                    attrs={**conv.attrs, "output_lut": np.asarray(nd.inputs[-1].value),
                                           "fused_nodes": [conv.name, *nd.attrs["fused_nodes"]]})
        if why_not(fused, target) is None:
            replace[j] = fused
            absorbed.add(i)
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
