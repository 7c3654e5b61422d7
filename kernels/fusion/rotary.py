"""The rotary embedding as exporters write it out, inside a partition: ``Add(Mul(x, cos), Mul(Concat(Neg(Slice(x,
h/2:)), Slice(x, :h/2)), sin))`` (Hugging Face's ``q * cos + rotate_half(q) * sin``) becomes one ``npu::RotateHalf``.

Why: a decoder layer applies it to Q and K, seven steps each, and four temporaries of the size of Q or K; a decode
step of a small exported decoder spends more on those steps' calls than on their arithmetic. As one step, each
element is read once and written once. ``npu-rewrite`` turns the rotation into com.microsoft RotaryEmbedding on
graphs it rewrites; this covers the graphs run as exported.

Rules (all must hold): x is float32; the two Slices take the same constant axis of x with step 1, from 0 to h/2 and
from h/2 to at least h where their bounds are constants (torch's TorchScript exporter computes h / 2 from x's shape
at run time: the fused node takes such bounds as inputs); the Concat joins Neg(second) and first; where x's rank is
known, that axis and the Concat's are its last and its last dim is h (ORT often knows no dim of x after the Reshape
that splits heads); one Mul multiplies x by cos, the other the Concat by sin (either operand order), cos and sin
float32 with last dim h where known; the Add sums the two products (either order); every intermediate is read by
the next op alone and is not a graph output; the target lists ``npu::RotateHalf``. What is known only at run time,
the kernel checks on every call: where the rotation is not the one above it runs the ops as written.

The chain is ``kernels.fusion.patterns.rotary`` over ``rotate_half``, the pattern ``rewriter/rotary.py`` matches too;
a candidate that fails a rule above is a ``FusionMiss`` with the rule's reason (``_rules.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchResult

from ..node import NodeInfo, ValueInfo
from ..target import Target
from . import patterns
from ._rules import FusionMiss, FusionRule, apply_rules, passed, producer_info

FUSED_DOMAIN, FUSED_OP = "npu", "RotateHalf"


def _const_int(v: ValueInfo) -> int | None:
    """The value of a one-element integer constant, else None."""
    if v.value is None or v.value.size != 1 or v.value.dtype.kind not in "iu":
        return None
    return int(v.value.reshape(()))


def _one_int(v: ValueInfo) -> bool:
    return v.dtype is not None and v.dtype.kind in "iu" and (v.shape is None or v.shape in ((1,), ()))


def _slice(nd: NodeInfo) -> tuple[int, ValueInfo, ValueInfo] | str:
    """(axis, start, end) of a Slice of one constant axis with step 1, else why not; start and end are one-element
    integer values, constants or computed at run time (torch's TorchScript exporter computes h / 2 from x's shape)."""
    if len(nd.inputs) < 4 or nd.inputs[3].missing:
        return f"Slice '{nd.name}' has no axes input"
    step = _const_int(nd.inputs[4]) if len(nd.inputs) > 4 and not nd.inputs[4].missing else 1
    axis = _const_int(nd.inputs[3])
    if axis is None or step != 1:
        return f"Slice '{nd.name}' is not of one constant axis with step 1"
    if not (_one_int(nd.inputs[1]) and _one_int(nd.inputs[2])):
        return f"Slice '{nd.name}' bounds are not one integer each"
    return axis, nd.inputs[1], nd.inputs[2]


def _product_operand(nd: NodeInfo, x: str) -> ValueInfo | str:
    """The operand a Mul multiplies value ``x`` by, float32 of known rank >= 1, else why not."""
    a, b = nd.inputs
    if a.name == b.name:
        return f"Mul '{nd.name}' squares its input"
    other = b if a.name == x else a
    if other.dtype != np.float32 or not other.shape:
        return f"Mul '{nd.name}': {other.describe()} is not float32 of known rank >= 1"
    return other


def _bounds_reason(start1: int | None, half: int | None, start2: int | None, end2: int | None) -> str | None:
    if start1 not in (0, None):
        return f"the first half starts at {start1}, not 0"
    if half is not None and (half <= 0 or start2 not in (half, None) or (end2 is not None and end2 < 2 * half)):
        return f"the halves x[..., :{half}] and x[..., {start2}:{end2}] do not split the last axis in two"
    return None


class RotateHalfRule(FusionRule):
    """``x * cos + rotate_half(x) * sin`` (either operand order) -> ``npu::RotateHalf(x, cos, sin, bounds)``."""

    name = "rotary"
    produces = (FUSED_DOMAIN, FUSED_OP)
    commute = True

    def pattern(self, op, x, cos, sin):
        return patterns.rotary(op, x, cos, sin, patterns.rotate_half(op, x))

    def check(self, context, x: ir.Value, hi: ir.Value, lo: ir.Value, rotated: ir.Value, x_cos: ir.Value,
              rot_sin: ir.Value, **_: Any) -> MatchResult:
        result = passed()
        xi = producer_info(lo).inputs[0]
        if xi.dtype != np.float32:
            return result.fail(f"{xi.describe()} is not float32", x)
        s1, s2 = _slice(producer_info(lo)), _slice(producer_info(hi))
        if isinstance(s1, str) or isinstance(s2, str):
            return result.fail(s1 if isinstance(s1, str) else s2, [lo, hi])
        if s1[0] != s2[0]:
            return result.fail(f"the halves slice axes {s1[0]} and {s2[0]}", [lo, hi])
        start1, half, start2, end2 = (_const_int(v) for v in (s1[1], s1[2], s2[1], s2[2]))
        if (reason := _bounds_reason(start1, half, start2, end2)) is not None:
            return result.fail(reason, [lo, hi])
        cat = producer_info(rotated)
        rank, axis, cat_axis = (len(xi.shape) if xi.shape is not None else None), s1[0], int(cat.attr("axis", 0))
        last = xi.shape[-1] if rank else None
        if rank is not None and (axis % rank != rank - 1 or cat_axis % rank != rank - 1):
            return result.fail(f"the halves (axis {axis}) or the Concat (axis {cat_axis}) are not on the last axis "
                               f"of rank {rank}", rotated)
        if rank is not None and isinstance(last, int) and half is not None and last != 2 * half:
            return result.fail(f"the halves split {2 * half} channels, x's last dim is {last}", rotated)
        cos = _product_operand(producer_info(x_cos), xi.name)
        sin = _product_operand(producer_info(rot_sin), cat.outputs[0].name)
        for v, value in ((x_cos, cos), (rot_sin, sin)):
            if isinstance(value, str):
                return result.fail(value, v)
        if half is not None and any(isinstance(v.shape[-1], int) and v.shape[-1] != 2 * half for v in (cos, sin)):
            return result.fail(f"cos {cos.describe()} or sin {sin.describe()} do not have last dim {2 * half}",
                               [x_cos, rot_sin])
        return result

    def fuse(self, members: list[NodeInfo], lo: ir.Value, hi: ir.Value, rotated: ir.Value, x_cos: ir.Value,
             rot_sin: ir.Value, **_: Any) -> NodeInfo:
        first, second, cat, add = producer_info(lo), producer_info(hi), producer_info(rotated), members[-1]
        x = first.inputs[0]
        cos = _product_operand(producer_info(x_cos), x.name)
        sin = _product_operand(producer_info(rot_sin), cat.outputs[0].name)
        add = next(n for n in members if n.key == ("", "Add"))
        return NodeInfo(index=add.index, name="+".join(n.name for n in members), op_type=FUSED_OP,
                        domain=FUSED_DOMAIN, inputs=(x, cos, sin, *first.inputs[1:3], *second.inputs[1:3]),
                        outputs=add.outputs,
                        attrs={"axis": _slice(first)[0], "concat_axis": int(cat.attr("axis", 0)),
                               "fused_nodes": [n.name for n in members]},
                        since_version=1)


RULES = (RotateHalfRule(),)


def fuse_rotary(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with each rotation written out replaced by ``npu::RotateHalf``, placed where its Add
    was (x, cos and sin exist by then)."""
    return apply_rules(nodes, target, RULES, misses)
