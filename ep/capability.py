"""Which nodes NpuEP takes, and for every node it leaves to the CPU, why.

Per-node rules come from the target description and the kernels (``kernels.support.why_not``); graph-level
rules (nodes ORT already assigned, EPContext nodes of other EPs, QDQ node units, the partition policy) are applied
here. The result is plain data that the EP, ``npu-report`` and the logs all show.

QDQ graphs (``kernels.fusion.qdq.QdqView``, asked once per graph: the QDQ-unit rule and the weight folding the
compiler applies): a DequantizeLinear of a constant read by one node is that node's constant
input (the compiler folds it), so the reader is checked as if its weight were a float constant; such a weight DQ
goes wherever its reader goes. A whole ``DQ -> Conv/MatMul -> Q`` unit that runs as one integer node is claimed
even where the float op alone would not be (an integer-only target). No partition is ever only weight DQs, nor only
Identity nodes (ORT forwards a value itself; a partition of them would only copy it across the boundary twice).

Boundaries: a tensor crosses into or out of a partition as a numpy array, so a partition whose boundary holds a type
numpy lacks (int4, bfloat16, float8, string...; ``dtypes.crosses_boundary``, the rule Compile enforces too) gives
up the nodes touching that tensor, until every boundary crosses.

Subgraphs: ORT keeps the graphs of If/Loop/Scan (and of the contrib ops with graph-running kernels) and runs them;
other graph-holding ops (SequenceMap) are functions ORT inlines when no EP takes them, copying their body with any
fused node in it into a graph that does not import NpuEP's domain. Nothing directly inside those is claimed (the
plugin API names a subgraph's parent node only, not the graph holding that node).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..kernels.fusion import qdq
from ..kernels.node import NodeInfo
from ..kernels.target import Target
from ..dtypes import crosses_boundary, type_name
from ..log import escape
from .partition import boundary, partition

EPCONTEXT = ("com.microsoft", "EPContext")
BRANCH_OF_IF = "compiled as part of its"  # + the claimed If/Loop/Scan holding this branch/body
HOLDS_GRAPHS = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})  # claimed whole, their graphs compiled inside
# Graph-holding ops whose graphs ORT keeps and runs with a kernel of its own (never inlined): nodes inside may be
# claimed. Any other op's graph (SequenceMap's body) may be inlined into its parent graph.
KEEPS_GRAPHS = HOLDS_GRAPHS | {("com.microsoft", op) for op in ("BeamSearch", "GreedySearch", "Sampling",
                                                                 "WhisperBeamSearch")}
FORWARDING_OPS = frozenset({("", "Identity")})  # a partition of these alone only moves data


@dataclasses.dataclass(frozen=True)
class Decision:
    node: NodeInfo
    reason: str | None  # None: claimed by NpuEP
    in_parent: bool = False  # a branch/body node compiled with its claimed If/Loop/Scan: not on the CPU

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
        return f"{node.describe()}: EPContext node belongs to EP '{escape(source)}', not {ep_name}"
    return None


def _check(n: NodeInfo, view: qdq.QdqView) -> str | None:
    try:
        return view.why_not(n)
    except Exception as exc:  # noqa: BLE001 - a buggy check must not hide the node: decline it, loudly
        return f"{n.describe()}: capability check failed: {type(exc).__name__}: {exc}"


def _qdq_rules(nodes: Sequence[NodeInfo], reasons: list[str | None], free: list[bool], view: qdq.QdqView) -> None:
    """Claim integer QDQ units as a whole; send each folded weight DQ where its only reader goes."""
    weights, target = view.weights, view.target
    for i, (_, members) in view.units.items():
        if reasons[i] is not None and all(free[j] for j in members):
            for j in members:
                reasons[j] = None
    pos = {v.name: i for i, n in enumerate(nodes) for v in n.inputs if v.name in weights}
    for i, n in enumerate(nodes):
        if view.folded_weight(n) and free[i]:
            reader = pos.get(n.outputs[0].name)
            if reader is not None and reasons[reader] is not None:
                reasons[i] = (f"{n.describe()}: weight DequantizeLinear stays with its only reader "
                              f"{nodes[reader].describe()}, which is not on {target.name}")


def _data_only_reason(members: Sequence[NodeInfo]) -> str | None:
    """Why a partition of only these nodes is not worth making, or None."""
    if all(qdq.is_weight_dq(n) for n in members):
        return ("a partition of weight DequantizeLinear nodes alone would only move data; "
                "it stays with its readers")
    if all(n.key in FORWARDING_OPS for n in members):
        return "a partition of Identity nodes alone would only copy data across the boundary; ORT forwards it"
    return None


def _drop_data_only(nodes: Sequence[NodeInfo], decisions: list[Decision],
                    groups: list[list[int]]) -> list[list[int]]:
    by_index = {n.index: pos for pos, n in enumerate(nodes)}
    kept = []
    for g in groups:
        reason = _data_only_reason([nodes[by_index[i]] for i in g])
        if reason is None:
            kept.append(g)
            continue
        for i in g:
            n = nodes[by_index[i]]
            decisions[by_index[i]] = Decision(n, f"{n.describe()}: {reason}")
    return kept


def _crossing_refusals(group: Sequence[int], nodes: Sequence[NodeInfo]) -> dict[int, str]:
    """Node index -> reason, for the nodes of ``group`` touching a boundary tensor the NPU runtime cannot carry."""
    in_group = set(group)
    members = [n for n in nodes if n.index in in_group]
    inputs, outputs = boundary(group, nodes)
    refused: dict[int, str] = {}
    for way, values, side in (("enter", inputs, "inputs"), ("leave", outputs, "outputs")):
        for v in values:
            if v.onnx_type == 0 or crosses_boundary(v.onnx_type):  # 0: type unknown (offline, never in ORT)
                continue
            for n in members:
                if n.index not in refused and any(x.name == v.name for x in getattr(n, side)):
                    kind = type_name(v.onnx_type)
                    refused[n.index] = (f"{n.describe()}: {escape(v.name)} ({kind}) would {way} the NPU partition, "
                                        f"and the NPU runtime cannot carry {kind} tensors")
    return refused


def _partition_crossable(nodes: Sequence[NodeInfo], decisions: list[Decision]) -> list[list[int]]:
    """Partitions of the claimed nodes whose boundary tensors all cross; nodes touching one that cannot are
    declined and the rest partitioned again (each round declines at least one node, so this ends)."""
    pos = {n.index: p for p, n in enumerate(nodes)}
    while True:
        compute = {d.node.index for d in decisions if d.claimed and d.node.key != EPCONTEXT}
        groups = _drop_data_only(nodes, decisions, partition(nodes, compute))
        refused = {i: r for g in groups for i, r in _crossing_refusals(g, nodes).items()}
        if not refused:
            return groups
        for i, reason in refused.items():
            decisions[pos[i]] = Decision(nodes[pos[i]], reason)


def _inlined_holder(parent: NodeInfo | None) -> str | None:
    """Why no node of this graph may be claimed because of the node holding it, or None.

    Only the immediate parent is known (the plugin API gives a subgraph's parent node, but not the graph that node
    sits in). An If branch inside a SequenceMap's body may be claimed; ORT then copies that fused node into the
    inlined Loop body's If, where it still runs."""
    if parent is None or parent.key in KEEPS_GRAPHS:
        return None
    op = parent.describe()
    return (f"inside a graph of {op}, which ORT inlines as a function when no EP takes it "
            "(a fused NpuEP node would be copied into a graph that cannot run it)")


def analyze(nodes: Sequence[NodeInfo], target: Target, *, ep_name: str = "NpuEP",
            assigned: dict[int, str] | None = None, policy=None, parent: NodeInfo | None = None) -> Capability:
    """Decide every node. ``assigned``: node index -> EP already chosen by ORT (such nodes are left alone).

    ``policy``, if given, is called as ``policy(nodes, decisions, partitions) -> (decisions, partitions)`` to
    decline whole partitions after the fact (the cost-aware boundary policy).

    ``parent``: the If/Loop/Scan node holding this graph when it is a branch or body. ORT offers subgraphs before
    the graph holding their node; when that node will be claimed there (every node of its graphs runs on the
    target), this graph claims nothing: it is compiled as part of the node's partition. Inside a graph of a node ORT
    may inline as a function (SequenceMap's body), nothing is claimed either.
    """
    if parent is not None and parent.key in HOLDS_GRAPHS and _check(parent, qdq.QdqView(target, {}, {})) is None:
        return Capability([Decision(n, f"{n.describe()}: {BRANCH_OF_IF} {parent.describe()}", in_parent=True)
                           for n in nodes], [])
    held = _inlined_holder(parent)
    assigned = assigned or {}
    view = qdq.QdqView.of(nodes, target)  # the QDQ units and folded weights: one question to the kernels
    reasons: list[str | None] = []
    free: list[bool] = []  # a node this EP may decide (not assigned elsewhere, not an EPContext node)
    context_groups: list[list[int]] = []
    for n in nodes:
        is_free = False
        if assigned.get(n.index):
            reason = f"{n.describe()}: already assigned to {assigned[n.index]}"
        elif held is not None:
            reason = f"{n.describe()}: {held}"
        elif n.key == EPCONTEXT:
            reason = _epcontext_reason(n, ep_name)
            if reason is None:
                context_groups.append([n.index])  # one precompiled partition each, never merged
        else:
            is_free = True
            reason = _check(n, view)
        reasons.append(reason)
        free.append(is_free)
    _qdq_rules(nodes, reasons, free, view)
    decisions = [Decision(n, r) for n, r in zip(nodes, reasons)]
    groups = _partition_crossable(nodes, decisions)
    if policy is not None:
        decisions, groups = policy(nodes, decisions, groups)
    return Capability(decisions, sorted(groups + context_groups, key=lambda g: g[0]))
