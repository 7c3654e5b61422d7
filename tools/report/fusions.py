"""``npu-report --explain-fusions``: per NpuEP partition of the file, the in-partition fusions the compiler applies and,
per candidate node a fusion tried, why it did not apply (``kernels.fusion.FusionMiss``, the rule's check reason).

The partitions are the file's (``analyze`` on the file's nodes), each compiled as ``ep/compiler.py`` does: its nodes
in order, the values read outside it marked as outputs. A session's view can differ where ORT's own optimizations
rewrote the graph before NpuEP saw it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...ep.capability import Capability
from ...ep.compiler import outputs_visible
from ...log import escape
from ...kernels.fusion import FusionMiss, fuse_partition
from ...kernels.node import NodeInfo
from ...kernels.target import Target


def _with_outputs_visible(group: list[NodeInfo], all_nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """The partition's nodes with every value read outside it (or a graph output) marked as a graph output."""
    inside = {id(n) for n in group}
    return outputs_visible(group, {v.name for n in all_nodes if id(n) not in inside for v in n.inputs})


def explain_fusions(nodes: Sequence[NodeInfo], cap: Capability, target: Target,
                    names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per partition: its name, the fused nodes it compiles to (op and the nodes each absorbed) and the
    misses (fusion, node, op, reason)."""
    by_index = {n.index: n for n in nodes}
    rows = []
    for p, group in enumerate(cap.partitions):
        members = [by_index[i] for i in sorted(group)]
        misses: list[FusionMiss] = []
        fused = fuse_partition(_with_outputs_visible(members, nodes), target, misses)
        rows.append({"partition": names[p] if names else f"partition_{p}",
                     "fused": [{"op": f"{n.domain}::{n.op_type}" if n.domain else n.op_type,
                                "nodes": list(n.attrs["fused_nodes"])} for n in fused if "fused_nodes" in n.attrs],
                     "misses": [dataclasses.asdict(m) for m in misses]})
    return rows


def render_fusions(rows: Sequence[dict[str, Any]]) -> str:
    """The terminal view: per partition, each fused op with its node count, then each miss with its reason."""
    lines = ["Fusions (--explain-fusions): applied, and why each candidate was not fused"]
    for row in rows:
        if not row["fused"] and not row["misses"]:
            continue
        lines.append(f"  {escape(row['partition'])}:")
        for f in row["fused"]:
            lines.append(f"    fused  {f['op']} <- {len(f['nodes'])} nodes ({escape(f['nodes'][-1])}, ...)")
        for m in row["misses"]:
            lines.append(f"    missed {m['fusion']} at {escape(m['node'])} ({m['op']}): {escape(m['reason'])}")
    if len(lines) == 1:
        lines.append("  no fusion applies and no candidate was declined")
    return "\n".join(lines) + "\n"
