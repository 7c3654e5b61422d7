"""Graph helpers shared by the fusion passes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..support import why_not
from ..target import Target


def consumers_of(nodes: list[NodeInfo]) -> dict[str, list[int]]:
    """Value name -> indices of the nodes that read it (shared by every fusion pass)."""
    users: dict[str, list[int]] = {}
    for i, nd in enumerate(nodes):
        for v in nd.inputs:
            if not v.missing:
                users.setdefault(v.name, []).append(i)
    return users


def float_scalar(v: ValueInfo | None) -> float | None:
    """The value of a one-element float32 constant, else None."""
    if v is None or v.missing or v.value is None:
        return None
    a = np.asarray(v.value)
    return float(a.reshape(())) if a.size == 1 and a.dtype == np.float32 else None


def other_operand(nd: NodeInfo, name: str) -> ValueInfo | None:
    """The operand of a binary ``nd`` that is not value ``name`` (None unless exactly one of its two inputs is)."""
    if len(nd.inputs) != 2:
        return None
    a, b = nd.inputs
    if (a.name == name) == (b.name == name):
        return None
    return b if a.name == name else a


def only_reader(v: ValueInfo, users: dict[str, list[int]]) -> int | None:
    """The index of the one node reading ``v``, if exactly one does and ``v`` is not a graph output."""
    readers = users.get(v.name, [])
    return readers[0] if len(readers) == 1 and not v.is_graph_output else None


def producers_of(nodes: list[NodeInfo]) -> dict[str, int]:
    """Value name -> index of the node that writes it (shared by every fusion pass)."""
    return {v.name: i for i, nd in enumerate(nodes) for v in nd.outputs if not v.missing}


def splice_chains(nodes: list[NodeInfo], target: Target,
                  match: Callable[[int], tuple[list[int], NodeInfo] | None],
                  overlaps: Callable[[int, NodeInfo], None] | None = None,
                  place: Callable[[list[int]], int] = max) -> list[NodeInfo]:
    """``nodes`` with each chain ``match(i)`` finds (the indices of its nodes, the fused node) replaced by the fused
    node at its last member's place (every input of the chain exists by then; ``place`` picks another member
    where the fused node's inputs exist earlier), where the target takes the fused node and no member already
    belongs to an earlier chain (``overlaps(i, fused)`` is told of such a chain)."""
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for i in range(len(nodes)):
        if i in absorbed:
            continue
        found = match(i)
        if found is None or why_not(found[1], target) is not None:
            continue
        chain, fused = found
        if any(j in absorbed or j in replace for j in chain):
            if overlaps is not None:
                overlaps(i, fused)
            continue
        at = place(chain)
        replace[at] = fused
        absorbed.update(j for j in chain if j != at)
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
