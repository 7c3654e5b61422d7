"""One decline report per session: which nodes stay on the CPU and why, every op type named under its reason.

ORT calls GetCapability once per graph, subgraphs (If/Loop branches) before the graph that holds them, the main
graph last. Declines are collected over those calls and written as one warning when the main graph arrives; a
later call for the main graph (ORT may partition again) reports only declines not reported yet. Every declined
node with its full reason goes to the debug level.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from .capability import Capability
from .log import logger

NAMES_PER_OP = 3  # node names shown per op type and reason; the debug level lists all of them


class DeclineReport:
    def __init__(self, target_name: str):
        self.target_name = target_name
        self.where = "graph"
        self.nodes = 0
        self.subgraphs = 0
        self.pending: list[tuple[str, str, str]] = []  # (reason without the node prefix, op type, node name)
        self.reported: set[tuple[str, str]] = set()  # (graph name, node name)

    def add(self, result: Capability, graph: Mapping[str, Any]) -> None:
        gname = str(graph.get("name", ""))
        if graph.get("is_subgraph", False):
            self.subgraphs += 1
        else:
            self.where = graph.get("model_path") or gname or "graph"
        self.nodes += len(result.decisions)
        logger.debug("target %s, graph %s: %s", self.target_name, gname or "?", result.summary())
        for d in result.declined:
            if "already assigned" in d.reason or (gname, d.node.name) in self.reported:
                continue
            self.reported.add((gname, d.node.name))
            op = f"{d.node.domain}::{d.node.op_type}" if d.node.domain else d.node.op_type
            self.pending.append((d.reason.split(": ", 1)[-1], op, d.node.name))
            logger.debug("declined: %s", d.reason)

    def flush(self) -> None:
        if not self.pending:
            return
        by_reason: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for reason, op, name in self.pending:
            by_reason[reason][op].append(name)
        lines = []
        for reason, ops in sorted(by_reason.items(), key=lambda kv: -sum(len(v) for v in kv[1].values())):
            count = sum(len(v) for v in ops.values())
            lines.append(f"  {count} x {reason}: " + ", ".join(_op_entry(op, names) for op, names in ops.items()))
        inside = f" (in the main graph and {self.subgraphs} subgraph(s))" if self.subgraphs else ""
        logger.warning("%d of %d nodes of %s stay on the CPU%s (target %s):\n%s", len(self.pending), self.nodes,
                       self.where, inside, self.target_name, "\n".join(lines))
        self.pending.clear()


def _op_entry(op: str, names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:NAMES_PER_OP]) + (", ..." if len(names) > NAMES_PER_OP else "")
    return f"{op} x{len(names)} ({shown})"
