"""Materialized attention inside a partition: ``MatMul(Q, K^T) -> [Mul | Div by a scalar constant] -> [Add(mask)]
-> Softmax(last axis) -> MatMul(., V)`` becomes one synthetic ``npu::AttentionChain``.

Why: exporters write a decoder's or encoder's attention out op by op (torch's eager attention and its SDPA
decomposition). Run as written, each layer's [S, T] scores per head go to memory and back four times; on the NPU
(and in the native kernel) the scores of a few query rows stay in SRAM between the two products, as in a fused
attention. ``npu-rewrite`` turns a decoder's attention into GroupQueryAttention; this covers the graphs that are
run as exported, and the encoders that rule does not match.

Rules (all must hold): float32 throughout; Q and K^T are runtime values (K^T is usually a Transpose of K, which
stays a step of its own: a view); the scale is a scalar constant (rank <= 1, one element) multiplying the scores
or dividing them; the mask, if any, is the Add's other operand, of rank <= 4; the Softmax normalizes the last
axis, or its input's rank is unknown (checked on every call; at any opset: the legacy 2-D rows are the last axis
then); its output, or the exporters' NaN guard on it (``Where(IsNaN(p), 0, p)``: rows a Softmax makes NaN become
zeros), is the second MatMul's input A; every intermediate has exactly one consumer (the guard's two) and is not a
graph output; Q, K^T and V have rank 2..4 or unknown ranks; the target lists ``npu::AttentionChain``.
Where(mask, scores, -inf) masks are not taken.

repeat_kv: where K^T or V is the exporters' ``Reshape(Expand(Unsqueeze(x, axes=[2])))`` of a KV head tensor x
(``Transpose(perm=[0, 1, 3, 2])`` after it for K^T), each intermediate read by the next alone, the fused node takes
x and the path (``_repeat_kv``): the kernel reads each KV head for its G query heads instead of a G-fold copy.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..ops.softmax import last_axis
from ..target import Target
from ._graph import consumers_of, float_scalar, only_reader, producers_of, splice_chains

FUSED_DOMAIN, FUSED_OP = "npu", "AttentionChain"
_MISSING = ValueInfo("", None, None)  # an omitted input (no mask)
SCALE_KINDS = {"Mul": 1, "Div": 2}  # kernels.attention_chain's scale_kind (0: no scale)


def _f32(v: ValueInfo | None) -> bool:
    return v is not None and v.dtype is not None and v.dtype == np.float32


def _rank_ok(v: ValueInfo) -> bool:
    """Rank 2..4, or unknown (the kernel reads ranks at run time)."""
    return v.shape is None or 2 <= len(v.shape) <= 4


def _scale(nd: NodeInfo, x: str) -> float | None:
    """The scalar constant a Mul/Div applies to value ``x`` (Div only as x / c), else None."""
    if nd.key not in (("", "Mul"), ("", "Div")) or len(nd.inputs) != 2:
        return None
    a, b = nd.inputs
    if nd.op_type == "Mul" and b.name == x:
        a, b = b, a
    if a.name != x or b.value is None or b.value.ndim > 1:
        return None
    return float_scalar(b)


def _softmax(nd: NodeInfo) -> tuple[int, bool] | None:
    """(axis, legacy) of a Softmax that may normalize the last axis: known to, or of unknown rank (checked on every
    call: elsewhere the fused node runs the chain as written); None for one that does not."""
    if nd.key != ("", "Softmax"):
        return None
    legacy = 0 < nd.since_version < 13
    axis = int(nd.attr("axis", 1 if legacy else -1))
    x = nd.input(0)
    if x.shape is not None and not last_axis(axis, len(x.shape)):
        return None
    return axis, legacy


def _nan_guard(nodes: list[NodeInfo], users: dict[str, list[int]], probs: ValueInfo) -> list[int] | None:
    """Indices of (IsNaN, Where) computing ``Where(IsNaN(p), 0, p)`` from the Softmax output ``p`` and read by
    nothing else, or None."""
    readers = users.get(probs.name, [])
    if len(readers) != 2 or probs.is_graph_output:
        return None
    isnan = next((i for i in readers if nodes[i].key == ("", "IsNaN")), None)
    where = next((i for i in readers if nodes[i].key == ("", "Where")), None)
    if isnan is None or where is None or only_reader(nodes[isnan].outputs[0], users) != where:
        return None
    cond, zero, x = nodes[where].inputs
    if cond.name != nodes[isnan].outputs[0].name or x.name != probs.name or not _f32(zero):
        return None
    if zero.value is None or zero.value.size != 1 or zero.value.ndim > 1 or float(zero.value.reshape(())) != 0.0:
        return None
    return [isnan, where]


def _unsqueeze_axes(nd: NodeInfo) -> list[int] | None:
    axes = nd.input(1)
    if axes is not None and not axes.missing:
        return None if axes.value is None else [int(a) for a in np.asarray(axes.value).reshape(-1)]
    a = nd.attr("axes")
    return None if a is None else [int(x) for x in a]


def _repeat_kv(nodes: list[NodeInfo], users: dict[str, list[int]], producer: dict[str, int], value: ValueInfo,
               reader: int, transposed: bool) -> tuple[ValueInfo, list[int]] | None:
    """The exporters' repeat_kv in front of ``value``: ``Unsqueeze(x, axes=[2]) -> Expand -> Reshape`` (then
    ``Transpose(perm=[0, 1, 3, 2])`` for K^T), each read by the next alone, from a 4-D float32 ``x``; returns x and
    the path's node indices from x on, or None. ``reader``: the chain's node reading ``value``, its only reader.
    Whether the Expand and Reshape repeat each of x's heads in place is checked on every call (their shapes may be
    runtime values); where they do not, the path runs as written."""
    if only_reader(value, users) != reader:
        return None
    path: list[int] = []
    cur = value
    wanted = (("Transpose", "Reshape", "Expand", "Unsqueeze") if transposed else ("Reshape", "Expand", "Unsqueeze"))
    for op in wanted:
        i = producer.get(cur.name)
        if i is None or nodes[i].key != ("", op) or (path and only_reader(cur, users) != path[-1]):
            return None
        nd = nodes[i]
        if op == "Transpose" and [int(a) for a in nd.attr("perm", [])] != [0, 1, 3, 2]:
            return None
        if op == "Unsqueeze" and _unsqueeze_axes(nd) != [2]:
            return None
        path.append(i)
        cur = nd.inputs[0]
    if not _f32(cur) or cur.shape is None or len(cur.shape) != 4:
        return None
    return cur, path[::-1]


def _match(nodes: list[NodeInfo], users: dict[str, list[int]], producer: dict[str, int], i: int
           ) -> tuple[list[int], NodeInfo] | None:
    """The chain starting at MatMul ``nodes[i]``: (indices of its nodes, the fused node), or None."""
    qk = nodes[i]
    if qk.key != ("", "MatMul") or len(qk.inputs) != 2:
        return None
    q, kt = qk.inputs
    if any(not _f32(v) or v.is_constant or not _rank_ok(v) for v in (q, kt)):
        return None
    chain, cur = [i], qk
    scale_kind, scale, mask = 0, 1.0, None
    nxt = only_reader(cur.outputs[0], users)
    if nxt is not None and (c := _scale(nodes[nxt], cur.outputs[0].name)) is not None:
        scale_kind, scale = SCALE_KINDS[nodes[nxt].op_type], c
        chain.append(nxt)
        cur = nodes[nxt]
        nxt = only_reader(cur.outputs[0], users)
    if nxt is not None and nodes[nxt].key == ("", "Add") and len(nodes[nxt].inputs) == 2:
        a, b = nodes[nxt].inputs
        other = b if a.name == cur.outputs[0].name else a
        if other.name == cur.outputs[0].name or not _f32(other) or other.shape is None or len(other.shape) > 4:
            return None
        mask = other
        chain.append(nxt)
        cur = nodes[nxt]
        nxt = only_reader(cur.outputs[0], users)
    softmax = _softmax(nodes[nxt]) if nxt is not None else None
    if softmax is None:
        return None
    chain.append(nxt)
    probs = nodes[nxt].outputs[0]
    guard = _nan_guard(nodes, users, probs)
    if guard is not None:
        chain.extend(guard)
        probs = nodes[guard[-1]].outputs[0]
    pv_i = only_reader(probs, users)
    if pv_i is None:
        return None
    pv = nodes[pv_i]
    if pv.key != ("", "MatMul") or pv.inputs[0].name != probs.name:
        return None
    v = pv.inputs[1]
    if not _f32(v) or not _rank_ok(v) or not _f32(pv.outputs[0]):
        return None
    chain.append(pv_i)
    inputs = [q, kt, v, mask if mask is not None else _MISSING]
    paths: dict[str, list[NodeInfo]] = {}
    for slot, which, reader in ((1, "k", i), (2, "v", pv_i)):
        found = _repeat_kv(nodes, users, producer, inputs[slot], reader, which == "k")
        if found is None:
            continue
        inputs[slot], path = found
        chain[:0] = path
        paths[which] = [nodes[j] for j in path]
        for nd in paths[which]:  # the path's shape / axes operands: runtime values become inputs of the fused node
            inputs.extend(v for v in nd.inputs[1:] if not v.missing and v.value is None)
    if not paths and mask is None:
        inputs = inputs[:3]
    members = [nodes[j] for j in chain]
    fused = NodeInfo(
        index=pv.index, name="+".join(n.name for n in members), op_type=FUSED_OP, domain=FUSED_DOMAIN,
        inputs=tuple(inputs), outputs=pv.outputs,
        attrs={"scale_kind": scale_kind, "scale": scale, "softmax": softmax, "zero_nan_rows": guard is not None,
               "repeat_kv": paths, "fused_nodes": [n.name for n in members]},
        since_version=1)
    return chain, fused


def fuse_attention(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with each materialized attention chain replaced by ``npu::AttentionChain``, placed
    where its last MatMul was (every input of the chain exists by then)."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    users, producer = consumers_of(nodes), producers_of(nodes)
    return splice_chains(nodes, target, lambda i: _match(nodes, users, producer, i))
