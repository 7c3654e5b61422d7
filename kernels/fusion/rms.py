"""An RMS norm written out op by op inside a partition: ``Pow(x, 2) -> ReduceMean(last axis) -> Add(eps) -> Sqrt
-> Div(1, .) | Reciprocal -> Mul(x, .) -> Mul(gamma, .)``, or with ``Div(x, .)`` for the two ops after Sqrt (as ORT's
level-1 optimizer leaves it), becomes one ``SimplifiedLayerNormalization(x, gamma)``.

Why: exporters write Llama's RMSNorm (``w * (x * rsqrt(mean(x^2) + eps))``) as seven ops, six temporaries per norm
and a decoder has 2L + 1 of them. As one norm it is one step, and the norm pass (which runs after this one) folds
a norm read by one projection into it (``npu::NormMatMul``), so the normalized tensor is never stored. ORT's CPU EP
fuses such chains into the same op when it loads a model (its SimplifiedLayerNormFusion): the numerics become the
norm's own (one rounding of the mean, then ``(x * gamma) * inv``) instead of seven rounded steps'.

Rules (all must hold): float32; Pow's exponent is a scalar constant 2; the ReduceMean keeps dims and reduces the last
axis alone (its axes an attribute or a constant input; the rank known); the Add adds a scalar constant eps >= 0;
then Sqrt, then Div(x, .) with x Pow's own input, or Div(scalar constant 1, .) or Reciprocal and a Mul of x by that
(either order); the last Mul multiplies it by a constant gamma of D values along the last axis (D: x's last dim,
any leading dims 1), in either order; every intermediate is read by the next op alone and is not a graph output;
the target lists SimplifiedLayerNormalization.

The chain is ``kernels.fusion.patterns.rms_norm`` in its three forms, the pattern ``rewriter/cleanup.py``'s
RmsNormDivFusion matches too; a candidate that fails a rule above is a ``FusionMiss`` with the rule's reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchResult

from ..node import NodeInfo, ValueInfo
from ..target import Target
from . import patterns
from ._graph import float_scalar, other_operand
from ._rules import FusionMiss, FusionRule, apply_rules, node_info, passed, producer_info

FUSED_DOMAIN, FUSED_OP = "", "SimplifiedLayerNormalization"


def _scalar(v: ValueInfo, want: float | None = None) -> float | None:
    """The value of a float32 constant of one element and rank <= 1 (equal to ``want`` if given), else None."""
    c = float_scalar(v) if v.value is not None and v.value.ndim <= 1 else None
    return c if want is None or c == want else None


def _last_axis_mean(nd: NodeInfo, rank: int) -> str | None:
    """None for a ReduceMean keeping dims over the last axis alone (axes from the attribute or a constant input),
    else why not."""
    if not int(nd.attr("keepdims", 1)):
        return f"ReduceMean '{nd.name}' does not keep dims"
    axes = nd.attr("axes")
    if len(nd.inputs) > 1 and not nd.inputs[1].missing:
        if nd.inputs[1].value is None:
            return f"ReduceMean '{nd.name}' axes are computed at run time"
        axes = nd.inputs[1].value.reshape(-1).tolist()
    if axes is None or len(axes) != 1 or int(axes[0]) % rank != rank - 1:
        return f"ReduceMean '{nd.name}' reduces axes {axes}, not the last axis of rank {rank} alone"
    return None


def _gamma(gmul: NodeInfo, scaled: str, d: Any, rank: int) -> ValueInfo | str:
    """The constant gamma the last Mul multiplies the normalized x by, as D values, else why not."""
    gamma = other_operand(gmul, scaled)
    if gamma is None or gamma.value is None or gamma.dtype != np.float32:
        return f"Mul '{gmul.name}' does not multiply by a float32 constant gamma"
    if not isinstance(d, int) or gamma.value.size != d or gamma.value.ndim > rank \
            or any(n != 1 for n in gamma.value.shape[:-1]):
        return f"gamma {gamma.describe()} is not {d} values along the last axis"
    return dataclasses.replace(gamma, shape=(d,), value=gamma.value.reshape(d))


class RmsNormRule(FusionRule):
    """``gamma * (x / Sqrt(ReduceMean(x^2) + eps))`` in its three forms -> ``SimplifiedLayerNormalization``."""

    name = "rms"
    produces = (FUSED_DOMAIN, FUSED_OP)
    commute = True

    def variants(self) -> list[Callable[..., Any]]:
        def form(f: str) -> Callable[..., Any]:
            return lambda op, x, two, eps, gamma, one: patterns.rms_norm(op, x, two, eps, gamma, f, one)

        return [form(f) for f in patterns.RMS_FORMS]

    def check(self, context, mean: ir.Value, root: ir.Value, scaled: ir.Value, inv: ir.Value | None = None,
              **_: Any) -> MatchResult:
        result = passed()
        pw = producer_info(mean.producer().inputs[0])
        x = pw.inputs[0]
        if x.dtype != np.float32 or not x.shape:
            return result.fail(f"{x.describe()} is not float32 of known rank >= 1", mean)
        if _scalar(pw.inputs[1], 2.0) is None:
            return result.fail(f"Pow '{pw.name}' exponent {pw.inputs[1].describe()} is not the constant 2", mean)
        if (reason := _last_axis_mean(producer_info(mean), len(x.shape))) is not None:
            return result.fail(reason, mean)
        add = producer_info(root.producer().inputs[0])
        eps_v = other_operand(add, mean.name)
        eps = None if eps_v is None else _scalar(eps_v)
        if eps is None or not eps >= 0.0:
            return result.fail(f"Add '{add.name}' does not add a float32 scalar constant eps >= 0", root)
        if inv is not None and producer_info(inv).op_type == "Div" and _scalar(producer_info(inv).inputs[0], 1.0) \
                is None:
            return result.fail(f"Div '{producer_info(inv).name}' does not divide the constant 1", inv)
        gamma = _gamma(node_info(context.root), scaled.name, x.shape[-1], len(x.shape))
        if isinstance(gamma, str):
            return result.fail(gamma, scaled)
        return result

    def fuse(self, members: list[NodeInfo], mean: ir.Value, root: ir.Value, scaled: ir.Value,
             **_: Any) -> NodeInfo:
        x = producer_info(mean.producer().inputs[0]).inputs[0]
        eps = _scalar(other_operand(producer_info(root.producer().inputs[0]), mean.name))
        gmul = members[-1]
        gamma = _gamma(gmul, scaled.name, x.shape[-1], len(x.shape))
        y = gmul.outputs[0]
        return NodeInfo(index=gmul.index, name="+".join(n.name for n in members), op_type=FUSED_OP,
                        domain=FUSED_DOMAIN, inputs=(x, gamma),
                        outputs=(dataclasses.replace(y, dtype=np.dtype(np.float32)),),
                        attrs={"axis": -1, "epsilon": eps, "fused_nodes": [n.name for n in members]},
                        since_version=1)


RULES = (RmsNormRule(),)


def fuse_rms(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with each RMS norm written out op by op replaced by one SimplifiedLayerNormalization,
    placed where its last Mul was."""
    return apply_rules(nodes, target, RULES, misses)
