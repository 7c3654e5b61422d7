"""Graph helpers shared by the fusion passes."""

from __future__ import annotations

from ..node import NodeInfo


def consumers_of(nodes: list[NodeInfo]) -> dict[str, list[int]]:
    """Value name -> indices of the nodes that read it (shared by every fusion pass)."""
    users: dict[str, list[int]] = {}
    for i, nd in enumerate(nodes):
        for v in nd.inputs:
            if not v.missing:
                users.setdefault(v.name, []).append(i)
    return users


def producers_of(nodes: list[NodeInfo]) -> dict[str, int]:
    """Value name -> index of the node that writes it (shared by every fusion pass)."""
    return {v.name: i for i, nd in enumerate(nodes) for v in nd.outputs if not v.missing}
