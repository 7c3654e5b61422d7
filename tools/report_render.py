"""Terminal summary of an ``npu-report`` document (rich tables): coverage, declines, partitions, crossings,
timeline and measurements. Reads only the JSON document, so a saved report renders the same."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def render(doc: Mapping[str, Any], console: Console | None = None, *, max_rows: int = 30) -> None:
    con = console or Console()
    cov = doc["coverage"]
    con.print(f"[bold]npu-report[/] {escape(doc['model'])}  target [cyan]{doc['target']}[/]  policy {doc['policy']}  "
              f"graph: {doc['source']}")
    con.print(f"coverage: [bold]{cov['claimed']}/{cov['total']}[/] nodes on NpuEP in {len(doc['partitions'])} "
              f"partition(s); {len(doc['crossings'])} crossing(s) per run")
    t = Table(title="coverage by op type")
    for col in ("op", "claimed", "total"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for r in cov["by_op"][:max_rows]:
        t.add_row(escape(r["op"]), str(r["claimed"]), str(r["total"]))
    con.print(t)
    if cov["declined_nodes"]:
        t = Table(title="why nodes stay on the CPU")
        t.add_column("count", justify="right")
        t.add_column("reason")
        t.add_column("e.g. node")
        reasons = Counter(d["reason"].split(": ", 1)[-1] for d in cov["declined_nodes"])
        for reason, n in reasons.most_common(max_rows):
            ex = next(d["node"] for d in cov["declined_nodes"] if d["reason"].endswith(reason))
            t.add_row(str(n), escape(reason), escape(ex))
        con.print(t)
    t = Table(title="partitions")
    for col in ("partition", "nodes", "inputs", "outputs", "emulated us"):
        t.add_column(col)
    emu = {e["partition"]: e["us"] for e in doc["timeline"]}
    for p in doc["partitions"][:max_rows]:
        t.add_row(p["name"], str(len(p["nodes"])), ", ".join(i["name"] for i in p["inputs"])[:60],
                  ", ".join(o["name"] for o in p["outputs"])[:60], _us(emu.get(p["name"])))
    con.print(t)
    t = Table(title="CPU<->NPU crossings")
    for col in ("tensor", "dtype", "shape", "bytes", "dir", "peer", "layer", "measured us"):
        t.add_column(col)
    for c in doc["crossings"][:max_rows]:
        t.add_row(c["name"], str(c["dtype"]), str(c["shape"]), str(c["bytes"]), c["direction"],
                  ", ".join(c["peer"])[:40], str(c["layer"]), _us(c.get("measured_us")))
    con.print(t)
    ly = doc["layers"]
    if ly["count"]:
        con.print(f"layers: {ly['count']} (from {ly['source']}), {ly['crossings_per_layer']:.1f} crossings per layer")
    m, pr = doc["measurement"], doc["projection"]
    if m:
        con.print(f"measured over {m['runs']} runs: NpuEP {_us(m['npu_latency_us'])} us, CPU EP "
                  f"{_us(m['cpu_latency_us'])} us (median); bridge per crossing t_b = {pr['t_b_us']:.2f} us, "
                  f"boundaries {_us(pr['boundary_us_per_run'])} us per run")
        if pr["layers"]:
            con.print(f"per token: L*n_b*t_b = {pr['layers']} x {pr['crossings_per_layer']:.1f} x "
                      f"{pr['t_b_us']:.2f} = {_us(pr['per_token_us'])} us; full coverage would save "
                      f"{_us(pr['full_coverage_saving_us'])} us per run")
    cmp_ = doc.get("compare")
    if cmp_:
        t = Table(title="per-node numerics vs CPU EP")
        for col in ("node", "tensor", "dtype", "max abs", "max rel", "ok"):
            t.add_column(col)
        for r in cmp_["nodes"][:max_rows]:
            fmt = (lambda v: "-" if v is None else f"{v:.3g}")
            t.add_row(r["node"], r["tensor"], r["dtype"], fmt(r["max_abs"]), fmt(r["max_rel"]),
                      "[green]ok[/]" if r["ok"] else "[red]FAIL[/]")
        con.print(t)
        con.print(f"first node out of tolerance: {cmp_['first_failure'] or 'none'}")
