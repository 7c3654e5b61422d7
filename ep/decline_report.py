"""One decline report per session: which nodes stay on the CPU and why, every op type named under its reason.

ORT calls GetCapability once per graph, subgraphs (If/Loop branches) before the graph that holds them, the main
graph last; and when nodes no EP took are functions without a CPU kernel (Swish, Bernoulli, SequenceMap...) it
inlines them and asks every EP again, subgraphs and main graph. Each call replaces that graph's declines (an inlined
node is gone, its body's nodes are new); the one warning is written when the main graph arrives and ORT has nothing
left to inline, or, if ORT never calls again (it failed on such a node), when the session is released. A call after
the warning (ORT may partition again) reports only declines not reported yet. Every declined node with its full
reason goes to the debug level. Model-supplied strings are escaped (``log.escape``).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from ..kernels.node import NodeInfo
from .capability import Capability
from ..dtypes import type_name
from ..log import escape, logger

NAMES_PER_OP = 3  # node names shown per op type and reason; the debug level lists all of them

GraphKey = tuple[bool, str, int, str]  # (is a subgraph, holding node's name, its index, graph name)
Entry = tuple[str, str, str]  # (reason without the node prefix, op type, node name), all escaped


@functools.cache
def _cpu_kernels() -> dict[tuple[str, str], list[tuple[int, int, frozenset[str]]]] | None:
    """(domain, op) -> (first opset, last opset, tensor types it takes) of each of ORT's CPU EP kernels, asked of
    the onnxruntime Python module the application already loaded; None in a C++ host (importing it there would
    load a second ORT into the process): then every main-graph call is taken to be the last, as before."""
    ort_c = sys.modules.get("onnxruntime.capi.onnxruntime_pybind11_state")
    if ort_c is None:
        return None
    try:
        defs = ort_c.get_all_opkernel_def()
    except Exception:  # noqa: BLE001 - a report must never break capability
        return None
    kernels: dict[tuple[str, str], list[tuple[int, int, frozenset[str]]]] = defaultdict(list)
    for d in defs:
        types = frozenset(t for allowed in d.type_constraints.values() for t in allowed)
        kernels[("" if d.domain == "ai.onnx" else d.domain, d.op_name)].append((*d.version_range, types))
    return dict(kernels)


def _ort_type(elem_type: int) -> str:
    name = {"float32": "float", "float64": "double"}.get(type_name(elem_type), type_name(elem_type))
    return f"tensor({name})"


def _has_cpu_kernel(node: NodeInfo, kernels: Mapping[tuple[str, str], list[tuple[int, int, frozenset[str]]]]) -> bool:
    """Whether ORT's CPU EP has a kernel for this node's opset and first input's element type (where known)."""
    first = node.input(0)
    wanted = _ort_type(first.onnx_type) if first is not None and first.onnx_type else None
    return any(lo <= node.since_version <= hi and (wanted is None or not types or wanted in types)
               for lo, hi, types in kernels.get(node.key, ()))


def ort_will_inline(result: Capability) -> bool:
    """Whether a node this graph leaves to ORT has no CPU kernel: ORT then inlines it (a function) and calls
    GetCapability again, or fails the session."""
    kernels = _cpu_kernels()
    if kernels is None:
        return False
    return any("already assigned" not in d.reason and not _has_cpu_kernel(d.node, kernels) for d in result.declined)


def _graph_key(graph: Mapping[str, Any]) -> GraphKey:
    parent = graph.get("parent") or {}
    return (bool(graph.get("is_subgraph", False)), str(parent.get("name", "")), int(parent.get("index", -1)),
            str(graph.get("name", "")))


class DeclineReport:
    def __init__(self, target_name: str):
        self.target_name = target_name
        self.where = "graph"
        self.graphs: dict[GraphKey, tuple[int, list[Entry]]] = {}  # the latest call's (node count, declines)
        self.reported: set[tuple[GraphKey, str]] = set()  # (graph, node name) already in a warning
        self.inlining = False  # the main graph's last call left ORT a node to inline: it will call again
        self.seen: set[GraphKey] = set()  # subgraphs offered since the last main-graph call (this pass)

    def add(self, result: Capability, graph: Mapping[str, Any]) -> None:
        key = _graph_key(graph)
        gname = escape(key[3])
        if key[0]:
            self.seen.add(key)
        else:  # the pass ends: a subgraph not offered in it went away with its node (inlined: SequenceMap's body)
            self.graphs = {k: v for k, v in self.graphs.items() if k in self.seen}
            self.seen = set()
            self.where = escape(graph.get("model_path") or key[3] or "graph")
            self.inlining = ort_will_inline(result)
        logger.debug("target %s, graph %s: %s", self.target_name, gname or "?", result.summary())
        entries = []
        for d in result.declined:
            if "already assigned" in d.reason:
                continue
            op = f"{d.node.domain}::{d.node.op_type}" if d.node.domain else d.node.op_type
            entries.append((escape(d.reason.split(": ", 1)[-1]), escape(op), escape(d.node.name)))
            logger.debug("declined: %s", escape(d.reason))
        self.graphs[key] = (len(result.decisions), entries)

    def flush(self, final: bool = False, session_level: int | None = None) -> None:
        """Write the warning, unless ORT is about to call again (``final``: the session ends, write it anyway, at
        ``session_level``: the release runs outside the session's ``log.session_scope``)."""
        if self.inlining and not final:
            return
        pending = [(key, e) for key, (_, entries) in self.graphs.items() for e in entries
                   if (key, e[2]) not in self.reported]
        if not pending:
            return
        self.reported.update((key, e[2]) for key, e in pending)
        by_reason: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for _, (reason, op, name) in pending:
            by_reason[reason][op].append(name)
        lines = []
        for reason, ops in sorted(by_reason.items(), key=lambda kv: -sum(len(v) for v in kv[1].values())):
            count = sum(len(v) for v in ops.values())
            lines.append(f"  {count} x {reason}: " + ", ".join(_op_entry(op, names) for op, names in ops.items()))
        subgraphs = sum(key[0] for key in self.graphs)
        nodes = sum(n for n, _ in self.graphs.values())
        inside = f" (in the main graph and {subgraphs} subgraph(s))" if subgraphs else ""
        message = "%d of %d nodes of %s stay on the CPU%s (target %s):\n%s"
        args = (len(pending), nodes, self.where, inside, self.target_name, "\n".join(lines))
        if final:
            logger.log_for(session_level, logging.WARNING, message, *args)
        else:
            logger.warning(message, *args)


def _op_entry(op: str, names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:NAMES_PER_OP]) + (", ..." if len(names) > NAMES_PER_OP else "")
    return f"{op} x{len(names)} ({shown})"
