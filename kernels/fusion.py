"""Epilogue fusion inside a partition: rewrite the node list before ``prepare`` (identity until implemented)."""

from __future__ import annotations

from .node import NodeInfo
from .target import Target


def fuse(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with fusable producer/consumer chains merged into synthetic fused nodes."""
    return nodes
