"""Group claimed nodes into partitions: connected, and never forming a cycle through nodes outside the group.

A partition becomes one fused node in ORT's graph. Merging two groups A and B is illegal when some path leaves
A or B, passes through any other node (a CPU node or another partition) and comes back, because the fused node
would then depend on itself. We merge along producer->consumer edges in topological order and test each merge by
a search over the graph with the other partitions contracted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ..kernels.node import NodeInfo, ValueInfo


def _edges(nodes: Sequence[NodeInfo]) -> dict[int, set[int]]:
    producer = {out.name: n.index for n in nodes for out in n.outputs if not out.missing}
    succ: dict[int, set[int]] = defaultdict(set)
    for n in nodes:
        for v in n.inputs:
            p = producer.get(v.name)
            if p is not None and p != n.index:
                succ[p].add(n.index)
    return succ


class _Clusters:
    def __init__(self, claimed: Sequence[int]):
        self.of = {i: i for i in claimed}
        self.members = {i: {i} for i in claimed}

    def find(self, i: int) -> int | None:
        return self.of.get(i)

    def merge(self, a: int, b: int) -> None:
        keep, gone = (a, b) if len(self.members[a]) >= len(self.members[b]) else (b, a)
        for i in self.members.pop(gone):
            self.of[i] = keep
            self.members[keep].add(i)


def _creates_cycle(a: int, b: int, clusters: _Clusters, succ: dict[int, set[int]]) -> bool:
    merged = clusters.members[a] | clusters.members[b]
    frontier = [s for i in merged for s in succ.get(i, ()) if s not in merged]
    seen: set[int] = set()
    while frontier:
        x = frontier.pop()
        if x in seen:
            continue
        c = clusters.find(x)
        group = clusters.members[c] if c is not None else {x}
        seen |= group
        for y in group:
            for s in succ.get(y, ()):
                if s in merged:
                    return True
                if s not in seen:
                    frontier.append(s)
    return False


def partition(nodes: Sequence[NodeInfo], claimed: set[int]) -> list[list[int]]:
    """Partitions (lists of node indices, each sorted) in order of their first node."""
    succ = _edges(nodes)
    clusters = _Clusters(sorted(claimed))
    for n in nodes:  # topological order
        if n.index not in claimed:
            continue
        for s in sorted(succ.get(n.index, ())):
            if s not in claimed:
                continue
            a, b = clusters.find(n.index), clusters.find(s)
            if a != b and not _creates_cycle(a, b, clusters, succ):
                clusters.merge(a, b)
    groups = [sorted(m) for m in clusters.members.values()]
    return sorted(groups, key=lambda g: g[0])


def boundary(group: Sequence[int], nodes: Sequence[NodeInfo]) -> tuple[list[ValueInfo], list[ValueInfo]]:
    """The values crossing into and out of a partition, in graph order: its non-constant inputs produced outside
    it, and its outputs read outside it or returned by the graph. These are the fused node's I/O, and each one is
    a CPU<->NPU crossing per call."""
    members = set(group)
    inside = [n for n in nodes if n.index in members]
    produced = {v.name for n in inside for v in n.outputs if not v.missing}
    read_outside = {v.name for n in nodes if n.index not in members for v in n.inputs if not v.missing}
    inputs: dict[str, ValueInfo] = {}
    outputs: dict[str, ValueInfo] = {}
    for n in inside:
        for v in n.inputs:
            if not v.missing and not v.is_constant and v.name not in produced:
                inputs.setdefault(v.name, v)
        for v in n.outputs:
            if not v.missing and (v.is_graph_output or v.name in read_outside):
                outputs.setdefault(v.name, v)
    return list(inputs.values()), list(outputs.values())
