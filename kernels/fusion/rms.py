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
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..target import Target
from ._graph import consumers_of, float_scalar, only_reader, other_operand, splice_chains

FUSED_DOMAIN, FUSED_OP = "", "SimplifiedLayerNormalization"


def _scalar(v: ValueInfo, want: float | None = None) -> float | None:
    """The value of a float32 constant of one element and rank <= 1 (equal to ``want`` if given), else None."""
    c = float_scalar(v) if v.value is not None and v.value.ndim <= 1 else None
    return c if want is None or c == want else None


def _last_axis_mean(nd: NodeInfo, rank: int) -> bool:
    """A ReduceMean keeping dims over the last axis alone (axes from the attribute or a constant input)."""
    if nd.key != ("", "ReduceMean") or not int(nd.attr("keepdims", 1)):
        return False
    axes = nd.attr("axes")
    if len(nd.inputs) > 1 and not nd.inputs[1].missing:
        if nd.inputs[1].value is None:
            return False
        axes = nd.inputs[1].value.reshape(-1).tolist()
    return axes is not None and len(axes) == 1 and int(axes[0]) % rank == rank - 1


def _match(nodes: list[NodeInfo], users: dict[str, list[int]], i: int) -> tuple[list[int], NodeInfo] | None:
    """The chain starting at ``nodes[i]`` (a Pow): (indices of its nodes, the fused norm), or None."""
    pw = nodes[i]
    if pw.key != ("", "Pow") or len(pw.inputs) != 2:
        return None
    x = pw.inputs[0]
    if x.dtype != np.float32 or x.shape is None or not x.shape or _scalar(pw.inputs[1], 2.0) is None:
        return None
    rank = len(x.shape)
    chain = [i]

    def step(want: str) -> NodeInfo | None:  # the one reader of the chain's last node, if it is a ``want``
        j = only_reader(nodes[chain[-1]].outputs[0], users)
        if j is None or nodes[j].key != ("", want):
            return None
        chain.append(j)
        return nodes[j]

    mean = step("ReduceMean")
    if mean is None or not _last_axis_mean(mean, rank):
        return None
    add = step("Add")
    eps = None if add is None or (v := other_operand(add, mean.outputs[0].name)) is None else _scalar(v)
    if eps is None or not eps >= 0.0:
        return None
    sqrt = step("Sqrt")
    if sqrt is None:
        return None
    j = only_reader(nodes[chain[-1]].outputs[0], users)
    if j is None:
        return None
    chain.append(j)
    root = sqrt.outputs[0].name
    div = nodes[j]
    if div.key == ("", "Div") and [v.name for v in div.inputs] == [x.name, root]:
        scaled = div  # x / s: ORT's level-1 optimizer rewrites x * (1 / s) as this
    elif div.key == ("", "Reciprocal") or (div.key == ("", "Div") and len(div.inputs) == 2
                                            and div.inputs[1].name == root and _scalar(div.inputs[0], 1.0) is not None):
        scaled = step("Mul")
        if scaled is None or (o := other_operand(scaled, div.outputs[0].name)) is None or o.name != x.name:
            return None
    else:
        return None
    gmul = step("Mul")
    gamma = None if gmul is None else other_operand(gmul, scaled.outputs[0].name)
    d = x.shape[-1]
    if gamma is None or gamma.value is None or gamma.dtype != np.float32 or not isinstance(d, int) \
            or gamma.value.size != d or gamma.value.ndim > rank or any(n != 1 for n in gamma.value.shape[:-1]):
        return None
    gamma = dataclasses.replace(gamma, shape=(d,), value=gamma.value.reshape(d))
    y = gmul.outputs[0]
    members = [nodes[j] for j in chain]
    fused = NodeInfo(index=gmul.index, name="+".join(n.name for n in members), op_type=FUSED_OP, domain=FUSED_DOMAIN,
                     inputs=(x, gamma), outputs=(dataclasses.replace(y, dtype=np.dtype(np.float32)),),
                     attrs={"axis": -1, "epsilon": eps, "fused_nodes": [n.name for n in members]}, since_version=1)
    return chain, fused


def fuse_rms(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with each RMS norm written out op by op replaced by one SimplifiedLayerNormalization,
    placed where its last Mul was."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    users = consumers_of(nodes)
    return splice_chains(nodes, target, lambda i: _match(nodes, users, i))
