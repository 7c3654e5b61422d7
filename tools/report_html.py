"""One self-contained HTML file for an ``npu-report`` document: plotly figures with plotly.js inlined (no network
needed to view it): coverage by op type, partition map of the graph, per-layer timeline."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

FIGURE_IDS = ("coverage-by-op", "partition-map", "layer-timeline")


def coverage_figure(doc: Mapping[str, Any]) -> go.Figure:
    rows = doc["coverage"]["by_op"]
    ops = [r["op"] for r in rows]
    fig = go.Figure([go.Bar(name="NpuEP", x=ops, y=[r["claimed"] for r in rows]),
                     go.Bar(name="CPU", x=ops, y=[r["total"] - r["claimed"] for r in rows])])
    fig.update_layout(barmode="stack", title="coverage by op type (nodes)")
    return fig


def partition_map_figure(doc: Mapping[str, Any]) -> go.Figure:
    """Every node in graph order as a cell: colour = partition (or CPU), hover = node, op, reason."""
    placed = {n: p["name"] for p in doc["partitions"] for n in p["nodes"]}
    reasons = {d["node"]: d["reason"] for d in doc["coverage"]["declined_nodes"]}
    order = [p["name"] for p in doc["partitions"]]
    nodes = list(dict.fromkeys([*(n for p in doc["partitions"] for n in p["nodes"]), *reasons]))
    xs = list(range(len(nodes)))
    colour = [order.index(placed[n]) + 1 if n in placed else 0 for n in nodes]
    text = [f"{n}<br>{placed.get(n, 'CPU')}<br>{reasons.get(n, '')}" for n in nodes]
    fig = go.Figure(go.Heatmap(z=[colour], x=xs, text=[text], hoverinfo="text", colorscale="Turbo",
                               showscale=False))
    fig.update_layout(title="partition map (node order; 0 = CPU, k = NpuEP partition k)", height=260,
                      yaxis={"visible": False})
    return fig


def timeline_figure(doc: Mapping[str, Any]) -> go.Figure:
    rows = doc["per_layer"]
    labels = ["outside layers" if r["layer"] is None else f"layer {r['layer']}" for r in rows]
    parts = (("npu_compute_us", "NPU compute (emulated)"), ("dma_us", "DMA exposed (emulated)"),
             ("cpu_fallback_us", "CPU fallback (measured, spread)"), ("boundary_us", "boundaries"))
    fig = go.Figure([go.Bar(name=name, x=labels, y=[r[key] for r in rows]) for key, name in parts])
    fig.update_layout(barmode="stack", title="per-layer timeline (us per run)", yaxis_title="us")
    return fig


def render_html(doc: Mapping[str, Any]) -> str:
    figs = zip(FIGURE_IDS, (coverage_figure(doc), partition_map_figure(doc), timeline_figure(doc)))
    divs = [pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=fid)
            for i, (fid, fig) in enumerate(figs)]
    cov = doc["coverage"]
    summary = (f"{cov['claimed']}/{cov['total']} nodes on NpuEP, {len(doc['partitions'])} partition(s), "
               f"{len(doc['crossings'])} crossing(s) per run, target {doc['target']}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>npu-report</title></head><body>"
            f"<h1>npu-report: {html.escape(doc['model'])}</h1><p>{html.escape(summary)}</p>"
            + "".join(divs)
            + "<details><summary>report JSON</summary><pre>"
            + html.escape(json.dumps(doc, indent=1, default=str)) + "</pre></details></body></html>")


def write_html(doc: Mapping[str, Any], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(doc))
