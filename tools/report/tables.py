"""HTML tables of an ``npu-report`` document: what a reader needs beside the plots: every declined node with its
reason, the partitions with their I/O, and every CPU<->NPU crossing with its size and (measured) cost."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...log import escape as printable

STYLE = ("<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
         "th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#f0f0f5}"
         "td.num{text-align:right}</style>")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"<td class='num'>{value:,.2f}</td>"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"<td class='num'>{value:,}</td>"
    if value is None:
        return "<td></td>"
    if isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value)
    return f"<td>{text(value)}</td>"


def text(value: Any) -> str:
    """A model-supplied string (node, tensor, op name) as HTML text: control characters (newlines, ANSI/OSC
    escapes) written as escapes (``log.escape``), then HTML-escaped."""
    return html.escape(printable(value))


def partition_labels(doc: Mapping[str, Any]) -> dict[str, str]:
    """EP partition name -> what the report calls it (``p0: layers 0-3, 65 nodes``)."""
    return {p["name"]: p.get("label", p["name"]) for p in doc["partitions"]}


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> str:
    rows = list(rows)
    if not rows:
        return f"<h2>{html.escape(title)}</h2><p>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in rows)
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def declined_table(doc: Mapping[str, Any]) -> str:
    rows = [(d["node"], d["op"], d.get("layer"), d["reason"].split(": ", 1)[-1])
            for d in doc["coverage"]["declined_nodes"]]
    return table("nodes left to the CPU, and why", ("node", "op", "layer", "reason"), rows,
                 "none: every node runs on NpuEP")


def partitions_table(doc: Mapping[str, Any]) -> str:
    rows = [(p.get("label", p["name"]), len(p["nodes"]), p.get("layers"), len(p["inputs"]), len(p["outputs"]),
             ", ".join(sorted({op.split("::")[-1] for op in p["ops"]})), p["name"])
            for p in doc["partitions"]]
    return table("NpuEP partitions", ("partition", "nodes", "layers", "inputs", "outputs", "op types",
                                      "ORT node (profiles, EPContext)"), rows,
                 "no partitions: nothing runs on NpuEP")


def crossings_table(doc: Mapping[str, Any]) -> str:
    """``measured us``: the crossing's share of its partition's bridge time, measured by ``--run``; "not measured"
    without one (a blank read as a missing value)."""
    labels = partition_labels(doc)
    rows = [(c["name"], c["direction"].replace("_", " "), labels.get(c["partition"], c["partition"]), c.get("dtype"),
             c.get("shape"), c.get("bytes"), c.get("per_run"),
             "not measured" if c.get("measured_us") is None else c["measured_us"])
            for c in doc["crossings"]]
    return table("CPU <-> NPU crossings (per run)",
                 ("tensor", "direction", "partition", "dtype", "shape", "bytes", "per run", "measured us"), rows,
                 "no crossings")


def entries_table(doc: Mapping[str, Any]) -> str:
    """A generator's entry points on the session (``tools.generation.entries``); nothing when none ran."""
    entries = doc.get("entries")
    if not entries:
        return ""
    rows = [(e["name"], e["kind"], e["new_tokens"], e["past_slots"], e["calls"],
             f"{e['logical_tokens']}/{e['executed_tokens']}", round(e["host_s"] * 1e3, 2), round(e["npu_s"] * 1e3, 3))
            for e in entries["entries"]]
    return table(f"generation entry points: one weight copy ({entries['weight_bytes']:,} bytes) for all",
                 ("entry", "kind", "S", "P", "calls", "tokens logical/executed", "host ms", "NPU ms (emulated)"), rows,
                 "no entries")


def kv_per_token_table(doc: Mapping[str, Any]) -> str:
    """Issue 41's three KV facts per decode token per KV mode (``entries.kv_per_decode_step``); nothing without."""
    kv = (doc.get("entries") or {}).get("kv_per_decode_step") or []
    if not kv:
        return ""
    rows = [(r["mode"], r["decode_steps"], "-" if r["kv_across_boundary_bytes"] is None
             else f"{r['kv_across_boundary_bytes']:,.0f}", f"{r['moved_in_npu_memory_bytes']:,.0f}",
             f"{r['full_copies']:g}", f"{r['past_copied_bytes']:,.0f}", round(r["npu_us"], 1),
             round(r["inter_token_us"])) for r in kv]
    return table("KV per decode token", ("KV mode", "decode steps", "KV bytes across the boundary",
                                         "bytes moved inside NPU memory (in place)", "full copies",
                                         "past bytes copied", "NPU us (emulated)", "inter-token us"), rows, "")
