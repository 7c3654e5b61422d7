"""Which nodes NpuEP takes, and for every node it leaves to the CPU, why.

Per-node rules come from the target description and the kernels (``kernels.support.why_not``); graph-level
rules (nodes ORT already assigned, EPContext nodes of other EPs, the partition policy) are applied here. The
result is plain data that the EP, ``npu-report`` and the logs all show.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..kernels.node import NodeInfo
from ..kernels.support import why_not
from ..kernels.target import Target
from .partition import partition

EPCONTEXT = ("com.microsoft", "EPContext")


@dataclasses.dataclass(frozen=True)
class Decision:
    node: NodeInfo
    reason: str | None  # None: claimed by NpuEP

    @property
    def claimed(self) -> bool:
        return self.reason is None


@dataclasses.dataclass
class Capability:
    decisions: list[Decision]
    partitions: list[list[int]]  # node indices per NpuEP partition

    @property
    def declined(self) -> list[Decision]:
        return [d for d in self.decisions if not d.claimed]

    def summary(self) -> str:
        claimed = sum(d.claimed for d in self.decisions)
        return f"{claimed}/{len(self.decisions)} nodes in {len(self.partitions)} partition(s)"


def _epcontext_reason(node: NodeInfo, ep_name: str) -> str | None:
    source = node.attr("source", "")
    if source != ep_name:
        return f"{node.describe()}: EPContext node belongs to EP {source!r}, not {ep_name}"
    return None


def analyze(nodes: Sequence[NodeInfo], target: Target, *, ep_name: str = "NpuEP",
            assigned: dict[int, str] | None = None, policy=None) -> Capability:
    """Decide every node. ``assigned``: node index -> EP already chosen by ORT (such nodes are left alone).

    ``policy``, if given, is called as ``policy(nodes, decisions, partitions) -> (decisions, partitions)`` to
    decline whole partitions after the fact (the cost-aware boundary policy).
    """
    assigned = assigned or {}
    decisions: list[Decision] = []
    context_groups: list[list[int]] = []
    for n in nodes:
        if n.index in assigned and assigned[n.index]:
            reason = f"{n.describe()}: already assigned to {assigned[n.index]}"
        elif n.key == EPCONTEXT:
            reason = _epcontext_reason(n, ep_name)
            if reason is None:
                context_groups.append([n.index])  # one precompiled partition each, never merged
        else:
            try:
                reason = why_not(n, target)
            except Exception as exc:  # a buggy check must not hide the node: decline it, loudly
                reason = f"{n.describe()}: capability check failed: {type(exc).__name__}: {exc}"
        decisions.append(Decision(n, reason))
    compute = {d.node.index for d in decisions if d.claimed and d.node.key != EPCONTEXT}
    groups = partition(nodes, compute)
    if policy is not None:
        decisions, groups = policy(nodes, decisions, groups)
    return Capability(decisions, sorted(groups + context_groups, key=lambda g: g[0]))
