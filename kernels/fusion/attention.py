"""Materialized attention inside a partition: ``MatMul(Q, K^T) -> [Mul | Div by a scalar constant] -> [Add(mask)]
-> Softmax(last axis) -> MatMul(., V)`` becomes one synthetic ``npu::AttentionChain``.

Why: exporters write a decoder's or encoder's attention out op by op (torch's eager attention and its SDPA
decomposition). Run as written, each layer's [S, T] scores per head go to memory and back four times; on the NPU
(and in the native kernel) the scores of a few query rows stay in SRAM between the two products, as in a fused
attention. ``npu-rewrite`` turns a decoder's attention into GroupQueryAttention; this covers the graphs that are
run as exported, and the encoders that rule does not match.

Rules (all must hold): float32 throughout; Q and K^T are runtime values; the scale is a scalar constant (rank <= 1,
one element) multiplying the scores or dividing them; the mask, if any, is the Add's other operand, of rank <= 4;
the Softmax normalizes the last axis, or its input's rank is unknown (checked on every call; at any opset: the
legacy 2-D rows are the last axis then); its output, or the exporters' NaN guard on it (``Where(IsNaN(p), 0, p)``:
rows a Softmax makes NaN become zeros), is the second MatMul's input A; every intermediate has exactly one consumer
(the guard's two) and is not a graph output; Q, K^T and V have rank 2..4 or unknown ranks; the target lists
``npu::AttentionChain``.
Where(mask, scores, -inf) masks are not taken.

repeat_kv: where K^T or V is the exporters' ``Reshape(Expand(Unsqueeze(x, axes=[2])))`` of a KV head tensor x
(``Transpose(perm=[0, 1, 3, 2])`` after it for K^T), each intermediate read by the next alone, the fused node takes
x and the path (``_repeat_kv``): the kernel reads each KV head for its G query heads instead of a G-fold copy.

K's transpose: where K^T is otherwise a ``Transpose`` swapping K's last two axes (an explicit perm, rank 2..4) of a
float32 runtime K, read by the chain alone and not a partition output, the fused node takes K and the Transpose
(``_k_transpose``): the kernel reads K's rows as they are, with no step of its own for a view of K.

The chain is ``kernels.fusion.patterns``' ``scaled`` and ``masked_softmax`` between the two MatMuls, and repeat_kv
is ``patterns.repeat_kv``: the pieces ``rewriter/gqa.py`` matches too. A candidate (the second MatMul, where the
chain's structure matched) that fails a rule above is a ``FusionMiss`` with the rule's reason.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchResult
    from onnxscript.rewriter._rewrite_rule import Pattern

from ..node import NodeInfo, ValueInfo
from ..ops.softmax import last_axis
from ..target import Target
from . import patterns
from ._graph import float_scalar, other_operand
from ._rules import FusionMiss, FusionRule, apply_rules, failed, match_at, node_info, passed, producer_info

FUSED_DOMAIN, FUSED_OP = "npu", "AttentionChain"
_MISSING = ValueInfo("", None, None)  # an omitted input (no mask)
SCALE_KINDS = {"Mul": 1, "Div": 2}  # kernels.attention_chain's scale_kind (0: no scale)


def _f32(v: ValueInfo | None) -> bool:
    return v is not None and v.dtype is not None and v.dtype == np.float32


def _rank_ok(v: ValueInfo) -> bool:
    """Rank 2..4, or unknown (the kernel reads ranks at run time)."""
    return v.shape is None or 2 <= len(v.shape) <= 4


def _softmax(nd: NodeInfo) -> tuple[int, bool] | None:
    """(axis, legacy) of a Softmax that may normalize the last axis: known to, or of unknown rank (checked on every
    call: elsewhere the fused node runs the chain as written); None for one that does not."""
    legacy = 0 < nd.since_version < 13
    axis = int(nd.attr("axis", 1 if legacy else -1))
    x = nd.input(0)
    if x.shape is not None and not last_axis(axis, len(x.shape)):
        return None
    return axis, legacy


def _unsqueeze_axes(nd: NodeInfo) -> list[int] | None:
    axes = nd.input(1)
    if axes is not None and not axes.missing:
        return None if axes.value is None else [int(a) for a in np.asarray(axes.value).reshape(-1)]
    a = nd.attr("axes")
    return None if a is None else [int(x) for x in a]


class _Chain:
    """The matched chain's nodes in data-flow order, read from the bindings: the QK MatMul, the scale and mask
    nodes if any, the Softmax, the NaN guard's (IsNaN, Where) if any, the PV MatMul."""

    def __init__(self, qk: ir.Value, probs: ir.Value) -> None:
        self.qk, self.softmax = node_info(qk.producer()), producer_info(probs)
        after = qk.uses()[0].node
        self.scale = node_info(after) if after.op_type in SCALE_KINDS else None
        before_softmax = probs.producer().inputs[0].producer()
        self.mask = node_info(before_softmax) if before_softmax.op_type == "Add" else None
        readers = {u.node.op_type: u.node for u in probs.uses()}
        guarded = "IsNaN" in readers and "Where" in readers
        self.guard = [node_info(readers["IsNaN"]), node_info(readers["Where"])] if guarded else []
        last = readers["Where"].outputs[0] if guarded else probs
        self.pv = node_info(last.uses()[0].node)

    def core(self) -> list[NodeInfo]:
        return [n for n in (self.qk, self.scale, self.mask, self.softmax, *self.guard, self.pv) if n is not None]

    def scale_value(self) -> float | None:
        """The scalar constant the scale node multiplies (either order) or divides (as x / c) the scores by."""
        if self.scale is None:
            return None
        c = other_operand(self.scale, self.qk.outputs[0].name)
        if c is None or (self.scale.op_type == "Div" and self.scale.inputs[1] is not c):
            return None
        return float_scalar(c) if c.value is not None and c.value.ndim <= 1 else None

    def mask_value(self) -> ValueInfo | None:
        scores = (self.scale or self.qk).outputs[0].name
        return None if self.mask is None else other_operand(self.mask, scores)


def _chain_reason(c: _Chain) -> tuple[str, list[NodeInfo]] | None:
    """Why the matched chain is not fused (and where), or None."""
    q, kt = c.qk.inputs
    if any(not _f32(v) or v.is_constant or not _rank_ok(v) for v in (q, kt)):
        return f"Q {q.describe()} and K^T {kt.describe()} are not float32 runtime tensors of rank 2..4", [c.qk]
    if c.scale is not None and c.scale_value() is None:
        return f"{c.scale.describe()} does not scale the scores by a float32 scalar constant", [c.scale]
    if c.mask is not None:
        mask = c.mask_value()
        if mask is None or not _f32(mask) or mask.shape is None or len(mask.shape) > 4:
            return f"{c.mask.describe()}: the mask is not a float32 tensor of known rank <= 4", [c.mask]
    if _softmax(c.softmax) is None:
        return f"{c.softmax.describe()} does not normalize the last axis", [c.softmax]
    if c.guard:
        _, zero, _ = c.guard[1].inputs
        if not _f32(zero) or zero.value is None or zero.value.size != 1 or zero.value.ndim > 1 \
                or float(zero.value.reshape(())) != 0.0:
            return f"{c.guard[1].describe()} does not replace NaN rows by the constant 0", c.guard
    v = c.pv.inputs[1]
    if not _f32(v) or not _rank_ok(v) or not _f32(c.pv.outputs[0]):
        return f"V {v.describe()} is not a float32 tensor of rank 2..4 or the output is not float32", [c.pv]
    return None


@functools.cache
def _repeat_kv_pattern(transposed: bool) -> Pattern:
    """``patterns.repeat_kv`` as the sub-pattern in front of K^T (then a Transpose) or V (compiled once)."""
    from onnxscript.rewriter._rewrite_rule import Pattern

    if transposed:
        return Pattern(lambda op, x: op.Transpose(patterns.repeat_kv(op, x, "k"), _outputs=["kt"]), name="repeat_kv_k")
    return Pattern(lambda op, x: patterns.repeat_kv(op, x, "v"), name="repeat_kv_v")


def _repeat_kv(value: ir.Value, transposed: bool) -> list[ir.Node] | None:
    """The exporters' repeat_kv in front of ``value`` (``Unsqueeze(x, axes=[2]) -> Expand -> Reshape``, then
    ``Transpose(perm=[0, 1, 3, 2])`` for K^T), each read by the next alone and ``value`` by the chain alone, from a
    4-D float32 ``x``: the path's nodes from x on, or None. Whether the Expand and Reshape repeat each of x's heads
    in place is checked on every call (their shapes may be runtime values); where they do not, the path runs as
    written."""
    if value.producer() is None or len(value.uses()) != 1 or value.is_graph_output():
        return None
    match = match_at(_repeat_kv_pattern(transposed), value.producer())
    if match is None:
        return None
    path = sorted(match.nodes, key=lambda n: n.meta["npu_ep.index"])
    infos = [node_info(n) for n in path]
    if transposed and [int(a) for a in infos[-1].attr("perm", [])] != [0, 1, 3, 2]:
        return None
    x = infos[0].inputs[0]
    if _unsqueeze_axes(infos[0]) != [2] or not _f32(x) or x.shape is None or len(x.shape) != 4:
        return None
    return path


@functools.cache
def _k_transpose_pattern() -> Pattern:
    from onnxscript.rewriter._rewrite_rule import Pattern

    return Pattern(lambda op, k: op.Transpose(k, _outputs=["kt"]), name="k_transpose")


def _k_transpose_reason(value: ir.Value) -> str | None:
    """Why K^T ``value`` is not a Transpose of K the fused node can take in its place, or None."""
    if value.producer() is None or match_at(_k_transpose_pattern(), value.producer()) is None:
        return "K^T is not a Transpose's output"
    if len(value.uses()) != 1 or value.is_graph_output():
        return "K^T has other readers or is a partition output"
    nd = node_info(value.producer())
    perm = [int(a) for a in nd.attr("perm", [])]
    if not 2 <= len(perm) <= 4 or perm != [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]:
        return f"{nd.describe()} does not swap the last two axes (perm {perm})"
    k = nd.inputs[0]
    if not _f32(k) or k.is_constant:
        return f"K {k.describe()} is not a float32 runtime tensor"
    return None


def _k_transpose(value: ir.Value) -> ir.Node | None:
    """The Transpose of K that ``value`` (K^T) is, when the fused node may read K in its place (the reason says
    why not), else None."""
    return value.producer() if _k_transpose_reason(value) is None else None


class AttentionChainRule(FusionRule):
    """``MatMul(softmax([scale](Q K^T) [+ mask]) [NaN guard], V)`` -> ``npu::AttentionChain``."""

    name = "attention"
    produces = (FUSED_DOMAIN, FUSED_OP)
    commute = True
    extra_ops = (("", "Transpose"), ("", "Reshape"), ("", "Expand"), ("", "Unsqueeze"))  # repeat_kv

    def variants(self) -> list[Callable[..., Any]]:
        def form(scale_op: str, mask_op: str, guard: bool) -> Callable[..., Any]:
            def chain(op, q, kt, v, scale, mask, zero):
                scores = patterns.scaled(op, op.MatMul(q, kt, _outputs=["qk"]), scale, scale_op)
                return op.MatMul(patterns.masked_softmax(op, scores, mask, mask_op, guard, zero), v)
            return chain

        return [form(*f) for f in itertools.product(("none", "mul", "div"), ("none", "add"), (False, True))]

    def check(self, context, qk: ir.Value, probs: ir.Value, **_: Any) -> MatchResult:
        reason = _chain_reason(_Chain(qk, probs))
        return passed() if reason is None else failed(reason[0], [probs])

    def absorbed(self, qk: ir.Value, kt: ir.Value, v: ir.Value, **_: Any) -> list[ir.Node]:
        k_path = _repeat_kv(kt, True) or ([t] if (t := _k_transpose(kt)) is not None else [])
        return [*k_path, *(_repeat_kv(v, False) or [])]

    def fuse(self, members: list[NodeInfo], qk: ir.Value, probs: ir.Value, kt: ir.Value, v: ir.Value,
             **_: Any) -> NodeInfo:
        c = _Chain(qk, probs)
        q, kt_info = c.qk.inputs
        mask = c.mask_value()
        inputs = [q, kt_info, c.pv.inputs[1], mask if mask is not None else _MISSING]
        chain = c.core()
        paths: dict[str, list[NodeInfo]] = {}
        for slot, which, value in ((1, "k", kt), (2, "v", v)):
            path = _repeat_kv(value, which == "k")
            if path is None:
                continue
            infos = [node_info(n) for n in path]
            inputs[slot] = infos[0].inputs[0]
            chain[:0] = infos
            paths[which] = infos
            for nd in infos:  # the path's shape / axes operands: runtime values become inputs of the fused node
                inputs.extend(x for x in nd.inputs[1:] if not x.missing and x.value is None)
        found = _k_transpose(kt) if "k" not in paths else None
        transpose = node_info(found) if found is not None else None
        if transpose is not None:  # the kernel reads K's rows in its place
            inputs[1] = transpose.inputs[0]
            chain.insert(0, transpose)
        if not paths and mask is None:
            inputs = inputs[:3]
        scale = c.scale_value()
        return NodeInfo(
            index=c.pv.index, name="+".join(n.name for n in chain), op_type=FUSED_OP, domain=FUSED_DOMAIN,
            inputs=tuple(inputs), outputs=c.pv.outputs,
            attrs={"scale_kind": SCALE_KINDS[c.scale.op_type] if c.scale is not None else 0,
                   "scale": scale if scale is not None else 1.0, "softmax": _softmax(c.softmax),
                   "zero_nan_rows": bool(c.guard), "repeat_kv": paths,
                   "k_transpose": transpose, "fused_nodes": [n.name for n in chain]},
            since_version=1)


RULES = (AttentionChainRule(),)


def fuse_attention(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None
                   ) -> list[NodeInfo]:
    """Return the node list with each materialized attention chain replaced by ``npu::AttentionChain``, placed
    where its last MatMul was (every input of the chain exists by then)."""
    return apply_rules(nodes, target, RULES, misses)
