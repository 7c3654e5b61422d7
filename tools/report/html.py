"""One self-contained HTML file for an ``npu-report`` document: plotly figures with plotly.js inlined (no network
needed to view it): coverage by op type, partition map of the graph, per-layer timeline; when the document has
them, prefill vs decode, the three-way numerics of a quantized model, and decode steps with and without KV
residency (the KV's copies as DMA segments)."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from .boundaries import boundaries_line
from .latency import describe
from .tables import (STYLE, crossings_table, declined_table, entries_table, kv_per_token_table, partitions_table,
                     text)

FIGURE_IDS = ("coverage-by-op", "partition-map", "layer-timeline")  # always present
PHASES_ID, THREE_WAY_ID = "prefill-decode", "three-way-numerics"  # present when the document has the data
KV_RESIDENCY_ID = "kv-residency"  # present when generators ran decode steps on the session (entries.kv_per_decode_step)
KV_SEGMENTS = (("DMA: KV across the boundary", "across_boundary", "#d62728"),
               ("DMA: append in place in NPU memory", "in_place", "#2ca02c"),
               ("DMA: full copies of the past", "full_copies", "#ff7f0e"))


def coverage_figure(doc: Mapping[str, Any]) -> go.Figure:
    rows = doc["coverage"]["by_op"]
    ops = [text(r["op"]) for r in rows]
    fig = go.Figure([go.Bar(name="NpuEP", x=ops, y=[r["claimed"] for r in rows]),
                     go.Bar(name="CPU", x=ops, y=[r["total"] - r["claimed"] for r in rows])])
    fig.update_layout(barmode="stack", title="coverage by op type (nodes)")
    return fig


def partition_map_figure(doc: Mapping[str, Any]) -> go.Figure:
    """Every node in graph order as a square, one legend entry per NpuEP partition and one for the CPU; hover shows
    the node, its op and, for CPU nodes, the reason."""
    reasons = {d["node"]: d["reason"] for d in doc["coverage"]["declined_nodes"]}
    nodes = list(dict.fromkeys([*(n for p in doc["partitions"] for n in p["nodes"]), *reasons]))
    position = {n: i for i, n in enumerate(nodes)}
    groups = [(p.get("label", p["name"]), p["nodes"]) for p in doc["partitions"]] + [("CPU", list(reasons))]
    fig = go.Figure([go.Scatter(x=[position[n] for n in members], y=[0] * len(members), mode="markers",
                                name=text(name),
                                marker={"symbol": "square", "size": 12, **({"color": "#d62728"} if name == "CPU"
                                                                         else {})},
                                text=[f"{text(n)}<br>{text(reasons.get(n, name))}" for n in members], hoverinfo="text")
                     for name, members in groups if members])
    fig.update_layout(title="partition map (nodes in graph order)", height=240, yaxis={"visible": False},
                      xaxis_title="node index")
    return fig


def timeline_figure(doc: Mapping[str, Any]) -> go.Figure:
    """Two stacks per layer: the emulated NPU (compute, exposed DMA; labelled compute- or bandwidth-bound on the
    target, whichever of the two is larger) and the measured host time (CPU fallback
    nodes, NpuEP partition calls without and with their bridge share). Without a run the second stack is the
    estimated boundary cost (crossings x ``bridge_cost_us_default``): the title and legend say which."""
    rows = doc["per_layer"]
    labels = ["outside layers" if r["layer"] is None else f"layer {r['layer']}" for r in rows]
    bound = ["bandwidth-bound" if r["dma_us"] > r["npu_compute_us"] else "compute-bound" for r in rows]
    bars = [go.Bar(name="NPU compute (emulated)", x=labels, y=[r["npu_compute_us"] for r in rows],
                   offsetgroup="emulated"),
            go.Bar(name=f"DMA exposed (emulated); label: what bounds the layer on {doc['target']}", x=labels,
                   y=[r["dma_us"] for r in rows], offsetgroup="emulated", base=[r["npu_compute_us"] for r in rows],
                   text=bound, textposition="outside")]
    if doc["measurement"] is not None:
        cpu = [r["cpu_fallback_us"] for r in rows]
        inner = [max(0.0, r["partition_us"] - r["boundary_us"]) for r in rows]
        bars += [go.Bar(name="CPU fallback (measured)", x=labels, y=cpu, offsetgroup="host"),
                 go.Bar(name="NpuEP partitions excl. bridge (measured)", x=labels, y=inner, offsetgroup="host",
                        base=cpu),
                 go.Bar(name="boundaries: bridge (measured)", x=labels, y=[r["boundary_us"] for r in rows],
                        offsetgroup="host", base=[c + i for c, i in zip(cpu, inner)])]
        second = "measured host (ORT profiler, bridge counters)"
    else:
        per = doc.get("bridge_cost_us_default")
        bars.append(go.Bar(name=f"CPU<->NPU boundaries (estimated: {per:g} us per crossing)" if per is not None
                           else "CPU<->NPU boundaries (estimated)", x=labels, y=[r["boundary_us"] for r in rows],
                           offsetgroup="host"))
        second = "estimated boundary cost (not measured: npu-report --run measures the host)"
    fig = go.Figure(bars)
    fig.update_layout(barmode="group", title=f"per-layer timeline (us per run): emulated NPU | {second}",
                      yaxis_title="us")
    return fig


def phases_figure(doc: Mapping[str, Any]) -> go.Figure | None:
    """Prefill vs decode: emulated NPU time split into compute / DMA cycles, and host time on NpuEP and CPU EP."""
    ph = doc.get("phases")
    if not ph or "skipped" in ph:
        return None
    keys = ["prefill", "decode"]
    labels = [f"{k} ({ph[k]['new_tokens']} new, {ph[k]['past_tokens']} past)" for k in keys]
    fig = go.Figure([
        go.Bar(name="NPU total (emulated)", x=labels, y=[ph[k]["npu_us"] for k in keys]),
        go.Bar(name="host NpuEP (measured)", x=labels, y=[ph[k]["host_us"] for k in keys]),
        go.Bar(name="host CPU EP (measured)", x=labels, y=[ph[k]["cpu_host_us"] for k in keys]),
    ])
    text = "; ".join(f"{k}: {ph[k]['npu_cycles']:,.0f} cycles ({ph[k]['npu_compute_cycles']:,.0f} compute, "
                     f"{ph[k]['npu_dma_cycles']:,.0f} DMA), {ph[k]['dma_bytes']:,} DMA bytes" for k in keys)
    fig.update_layout(barmode="group", title=f"prefill vs decode (us per execution)<br><sup>{html.escape(text)}</sup>",
                      yaxis_title="us", yaxis_type="log")
    return fig


def three_way_figure(doc: Mapping[str, Any]) -> go.Figure | None:
    """Per tensor (graph outputs first): max abs error from quantization vs from the compiler/kernels (log)."""
    tw = (doc.get("compare") or {}).get("three_way")
    if not tw:
        return None
    rows = tw["outputs"] + tw["nodes"]
    names = [text(r["tensor"]) for r in rows]
    tiny = 1e-12  # log axis: exact zeros drawn at the floor

    def ys(key):
        return [max(r[key] or 0.0, tiny) for r in rows]
    fig = go.Figure([go.Bar(name="float ref -> quantized ref (quantization)", x=names, y=ys("quant_max_abs")),
                     go.Bar(name="quantized ref -> NpuEP (compiler/kernel)", x=names, y=ys("kernel_max_abs"))])
    fig.update_layout(barmode="group", yaxis_type="log", yaxis_title="max abs diff",
                      title=f"three-way numerics (float reference: {tw['float_source']}); dominant on the first "
                            f"output: {tw['dominant'] or 'none'}")
    return fig


def kv_residency_figure(doc: Mapping[str, Any]) -> go.Figure | None:
    """One decode step per KV mode that ran on the session, as a timeline of the same decode entry: the emulated
    step, then the KV's copies as DMA segments (across the boundary, in place, full copies) priced on the target."""
    rows = (doc.get("entries") or {}).get("kv_per_decode_step") or []
    if not rows:
        return None
    modes = [f"{r['mode']} ({r['decode_steps']} steps)" for r in rows]
    bars = [go.Bar(name="decode step on the NPU (emulated)", y=modes, x=[r["npu_us"] for r in rows],
                   orientation="h", marker={"color": "#1f77b4"})]
    for label, key, color in KV_SEGMENTS:
        bars.append(go.Bar(name=label, y=modes, x=[r["dma_us"][key] for r in rows], orientation="h",
                           marker={"color": color},
                           text=[_kv_bytes(r, key) for r in rows], hoverinfo="text+x+name"))
    fig = go.Figure(bars)
    fig.update_layout(barmode="stack", height=160 + 60 * len(rows), xaxis_title="us per decode token",
                      title="decode step with and without KV residency (emulated us; the KV's copies as DMA)")
    return fig


def _kv_bytes(row: Mapping[str, Any], key: str) -> str:
    nbytes = {"across_boundary": row["kv_across_boundary_bytes"] or 0, "in_place": row["moved_in_npu_memory_bytes"],
              "full_copies": row["past_copied_bytes"] + row["appended_into_copy_bytes"]}[key]
    copies = f", {row['full_copies']:g} full copies" if key == "full_copies" else ""
    return f"{nbytes:,.0f} bytes{copies}"


def figures(doc: Mapping[str, Any]) -> list[tuple[str, go.Figure]]:
    """(div id, figure) for every figure the document has data for, in page order."""
    out = list(zip(FIGURE_IDS, (coverage_figure(doc), partition_map_figure(doc), timeline_figure(doc))))
    for fid, fig in ((PHASES_ID, phases_figure(doc)), (THREE_WAY_ID, three_way_figure(doc)),
                     (KV_RESIDENCY_ID, kv_residency_figure(doc))):
        if fig is not None:
            out.append((fid, fig))
    return out


def render_html(doc: Mapping[str, Any]) -> str:
    divs = [pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=fid)
            for i, (fid, fig) in enumerate(figures(doc))]
    cov = doc["coverage"]
    summary = (f"{cov['claimed']}/{cov['total']} nodes on NpuEP, {len(doc['partitions'])} partition(s), "
               f"{len(doc['crossings'])} crossing(s) per run, target {doc['target']}")
    m = doc["measurement"]
    if m is not None:
        r = m["ratio"]
        summary += (f"; measured host time NpuEP {m['npu_latency_us']:,.1f} us, CPU EP {m['cpu_latency_us']:,.1f} "
                    f"us (medians of {m['runs']} runs, the EPs alternating in {r['blocks']} blocks): "
                    f"{r['median']:.2f}x the CPU EP, {r['min']:.2f}-{r['max']:.2f}x across blocks")
        if m.get("boundaries"):
            summary += "; " + boundaries_line(m["boundaries"])
    tables = (declined_table(doc) + partitions_table(doc) + crossings_table(doc) + entries_table(doc)
              + kv_per_token_table(doc))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>npu-report</title>" + STYLE + "</head><body>"
            f"<h1>npu-report: {text(doc['model'])}</h1><p>{text(summary)}</p><p>{text(describe(doc))}</p>"
            + "".join(divs) + tables
            + "<details><summary>report JSON</summary><pre>"
            + html.escape(json.dumps(doc, indent=1, default=str)) + "</pre></details></body></html>")


def write_html(doc: Mapping[str, Any], path: str | os.PathLike) -> None:
    from ..._atomic import atomic_write_bytes  # temp file, fsync, rename: a failed write leaves what was there

    atomic_write_bytes(path, render_html(doc).encode("utf-8"))
