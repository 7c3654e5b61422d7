"""Which nodes NpuEP takes, and for every node it leaves to the CPU, why.

Per-node rules come from the target description and the kernels (``kernels.support.why_not``); graph-level
rules (nodes ORT already assigned, EPContext nodes of other EPs, QDQ node units, the partition policy) are applied
here. The result is plain data that the EP, ``npu-report`` and the logs all show.

QDQ graphs (``kernels.fusion.qdq``): a DequantizeLinear of a constant read by one node is that node's constant
input (the compiler folds it), so the reader is checked as if its weight were a float constant; such a weight DQ
goes wherever its reader goes. A whole ``DQ -> Conv/MatMul -> Q`` unit that runs as one integer node is claimed
even where the float op alone would not be (an integer-only target). No partition is ever only weight DQs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..kernels.fusion import qdq
from ..kernels.node import NodeInfo
from ..kernels.support import why_not
from ..kernels.target import Target
from .partition import partition

EPCONTEXT = ("com.microsoft", "EPContext")
BRANCH_OF_IF = "compiled as part of its"  # + the claimed If/Loop/Scan holding this branch/body
HOLDS_GRAPHS = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})  # claimed whole, their graphs compiled inside


@dataclasses.dataclass(frozen=True)
class Decision:
    node: NodeInfo
    reason: str | None  # None: claimed by NpuEP
    in_parent: bool = False  # a branch/body node compiled with its claimed If/Loop/Scan: not on the CPU, not claimed here

    @property
    def claimed(self) -> bool:
        return self.reason is None


@dataclasses.dataclass
class Capability:
    decisions: list[Decision]
    partitions: list[list[int]]  # node indices per NpuEP partition

    @property
    def declined(self) -> list[Decision]:
        """Nodes left to other EPs; a branch compiled with its claimed If is not one of them (it runs on NpuEP)."""
        return [d for d in self.decisions if not d.claimed and not d.in_parent]

    def summary(self) -> str:
        claimed = sum(d.claimed for d in self.decisions)
        return f"{claimed}/{len(self.decisions)} nodes in {len(self.partitions)} partition(s)"


def _epcontext_reason(node: NodeInfo, ep_name: str) -> str | None:
    source = node.attr("source", "")
    if source != ep_name:
        return f"{node.describe()}: EPContext node belongs to EP {source!r}, not {ep_name}"
    return None


def _check(n: NodeInfo, target: Target, weights) -> str | None:
    try:
        return why_not(qdq.constant_view(n, weights), target)
    except Exception as exc:  # a buggy check must not hide the node: decline it, loudly
        return f"{n.describe()}: capability check failed: {type(exc).__name__}: {exc}"


def _qdq_rules(nodes: Sequence[NodeInfo], reasons: list[str | None], free: list[bool], target: Target,
               weights) -> None:
    """Claim integer QDQ units as a whole; send each folded weight DQ where its only reader goes."""
    for i, (_, members) in qdq.integer_units(list(nodes), target).items():
        if reasons[i] is not None and all(free[j] for j in members):
            for j in members:
                reasons[j] = None
    pos = {v.name: i for i, n in enumerate(nodes) for v in n.inputs if v.name in weights}
    for i, n in enumerate(nodes):
        if n.key in qdq.DQ_OPS and n.outputs[0].name in weights and free[i]:
            reader = pos.get(n.outputs[0].name)
            if reader is not None and reasons[reader] is not None:
                reasons[i] = (f"{n.describe()}: weight DequantizeLinear stays with its only reader "
                              f"{nodes[reader].describe()}, which is not on {target.name}")


def _drop_lone_weight_dqs(nodes: Sequence[NodeInfo], decisions: list[Decision],
                          groups: list[list[int]]) -> list[list[int]]:
    by_index = {n.index: pos for pos, n in enumerate(nodes)}
    kept = []
    for g in groups:
        if all(qdq.is_weight_dq(nodes[by_index[i]]) for i in g):
            for i in g:
                n = nodes[by_index[i]]
                decisions[by_index[i]] = Decision(n, f"{n.describe()}: a partition of weight DequantizeLinear "
                                                     "nodes alone would only move data; it stays with its readers")
            continue
        kept.append(g)
    return kept


def analyze(nodes: Sequence[NodeInfo], target: Target, *, ep_name: str = "NpuEP",
            assigned: dict[int, str] | None = None, policy=None, parent: NodeInfo | None = None) -> Capability:
    """Decide every node. ``assigned``: node index -> EP already chosen by ORT (such nodes are left alone).

    ``policy``, if given, is called as ``policy(nodes, decisions, partitions) -> (decisions, partitions)`` to
    decline whole partitions after the fact (the cost-aware boundary policy).

    ``parent``: the If/Loop/Scan node holding this graph when it is a branch or body. ORT offers subgraphs before
    the graph holding their node; when that node will be claimed there (every node of its graphs runs on the
    target), this graph claims nothing: it is compiled as part of the node's partition.
    """
    if parent is not None and parent.key in HOLDS_GRAPHS and _check(parent, target, {}) is None:
        return Capability([Decision(n, f"{n.describe()}: {BRANCH_OF_IF} {parent.describe()}", in_parent=True)
                           for n in nodes], [])
    assigned = assigned or {}
    weights = qdq.foldable_weights(nodes)
    reasons: list[str | None] = []
    free: list[bool] = []  # a node this EP may decide (not assigned elsewhere, not an EPContext node)
    context_groups: list[list[int]] = []
    for n in nodes:
        is_free = False
        if n.index in assigned and assigned[n.index]:
            reason = f"{n.describe()}: already assigned to {assigned[n.index]}"
        elif n.key == EPCONTEXT:
            reason = _epcontext_reason(n, ep_name)
            if reason is None:
                context_groups.append([n.index])  # one precompiled partition each, never merged
        else:
            is_free = True
            reason = _check(n, target, weights)
        reasons.append(reason)
        free.append(is_free)
    _qdq_rules(nodes, reasons, free, target, weights)
    decisions = [Decision(n, r) for n, r in zip(nodes, reasons)]
    compute = {d.node.index for d in decisions if d.claimed and d.node.key != EPCONTEXT}
    groups = _drop_lone_weight_dqs(nodes, decisions, partition(nodes, compute))
    if policy is not None:
        decisions, groups = policy(nodes, decisions, groups)
    return Capability(decisions, sorted(groups + context_groups, key=lambda g: g[0]))
