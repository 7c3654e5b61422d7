"""Terminal summary of an ``npu-report`` document (rich tables): coverage, declines, partitions, crossings,
timeline and measurements. Reads only the JSON document, so a saved report renders the same."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape as markup_escape
from rich.table import Table

from ...log import escape as printable
from .boundaries import boundaries_line
from .latency import describe


def escape(text: Any) -> str:
    """A model-supplied string for the terminal: control characters (ANSI/OSC escapes, newlines) written as
    escapes (``log.escape``), and rich's markup brackets escaped."""
    return markup_escape(printable(text))


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def render(doc: Mapping[str, Any], console: Console | None = None, *, max_rows: int = 30) -> None:
    con = console or Console()
    cov = doc["coverage"]
    kv = doc.get("kv_cache_dtype", "float32")
    con.print(f"[bold]npu-report[/] {escape(doc['model'])}  target [cyan]{doc['target']}[/]  policy {doc['policy']}  "
              f"graph: {doc['source']}" + (f"  KV cache [yellow]{kv}[/] (changes numerics)" if kv != "float32" else ""))
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
        t.add_row(escape(p.get("label", p["name"])), str(len(p["nodes"])),
                  escape(", ".join(i["name"] for i in p["inputs"])[:60]),
                  escape(", ".join(o["name"] for o in p["outputs"])[:60]), _us(emu.get(p["name"])))
    con.print(t)
    t = Table(title="CPU<->NPU crossings")
    for col in ("tensor", "dtype", "shape", "bytes", "dir", "peer", "layer", "measured us"):
        t.add_column(col)
    for c in doc["crossings"][:max_rows]:
        t.add_row(escape(c["name"]), str(c["dtype"]), str(c["shape"]), str(c["bytes"]), c["direction"],
                  escape(", ".join(c["peer"])[:40]), str(c["layer"]),
                  "not measured" if c.get("measured_us") is None else _us(c["measured_us"]))
    con.print(t)
    ly = doc["layers"]
    if ly["count"]:
        con.print(f"layers: {ly['count']} (from {ly['source']}), {ly['crossings_per_layer']:.1f} crossings per layer")
    con.print(escape(describe(doc)))
    m, pr = doc["measurement"], doc["projection"]
    if m:
        r = m["ratio"]
        con.print(f"measured over {m['runs']} runs, the EPs alternating in {r['blocks']} blocks: NpuEP "
                  f"{_us(m['npu_latency_us'])} us, CPU EP {_us(m['cpu_latency_us'])} us (medians); NpuEP / CPU EP "
                  f"{r['median']:.2f}x (blocks {r['min']:.2f}-{r['max']:.2f}x); bridge per crossing t_b = "
                  f"{pr['t_b_us']:.2f} us, boundaries {_us(pr['boundary_us_per_run'])} us per run")
        if m.get("boundaries"):
            con.print(escape(boundaries_line(m["boundaries"])))
        if pr["layers"]:
            con.print(f"per token: L*n_b*t_b = {pr['layers']} x {pr['crossings_per_layer']:.1f} x "
                      f"{pr['t_b_us']:.2f} = {_us(pr['per_token_us'])} us; full coverage would save "
                      f"{_us(pr['full_coverage_saving_us'])} us per run")
        prof = m.get("profile")
        if prof:
            by = prof["us_per_run_by_provider"]
            cpu = sum(v for k, v in by.items() if k != "NpuEP")
            wrap = sum(n["us_per_run"] - n["shim_us_per_run"] for n in prof["nodes"] if "shim_us_per_run" in n)
            con.print(f"ORT profiler over {prof['runs']} runs: CPU fallback nodes {_us(cpu)} us, NpuEP partition "
                      f"calls {_us(by.get('NpuEP', 0.0))} us per run (of {_us(prof['run_us'])} us), of which "
                      f"{_us(wrap)} us in ORT's plugin-EP wrapper outside the shim's callback")
    _per_layer_table(con, doc, max_rows)
    _phases(con, doc.get("phases"))
    _entries(con, doc.get("entries"))
    _compare(con, doc.get("compare"), max_rows)


def _per_layer_table(con: Console, doc: Mapping[str, Any], max_rows: int) -> None:
    measured = doc["measurement"] is not None
    t = Table(title="per-layer timeline, us per run (NPU emulated; CPU and partitions measured by ORT's profiler)"
              if measured else "per-layer timeline, us per run (NPU emulated; boundaries estimated)")
    for col in ("layer", "NPU compute", "DMA exposed", "CPU fallback", "partitions", "of which bridge"):
        t.add_column(col, justify="right")
    for r in doc["per_layer"][:max_rows]:
        t.add_row("outside" if r["layer"] is None else str(r["layer"]), _us(r["npu_compute_us"]), _us(r["dma_us"]),
                  _us(r["cpu_fallback_us"]) if measured else "-", _us(r["partition_us"]) if measured else "-",
                  _us(r["boundary_us"]))
    con.print(t)
    skipped = [s for e in doc["timeline"] for s in e["skipped"]]
    if skipped:  # their time is missing from the columns above: say so rather than print a short timeline
        first = skipped[0]
        con.print(f"[yellow]the emulated timeline leaves out {len(skipped)} step(s)[/] (e.g. {escape(first['node'])}: "
                  f"{escape(first['reason'])}); --run costs every step on the shapes it ran")


def _phases(con: Console, phases: Mapping[str, Any] | None) -> None:
    if not phases:
        return
    if "skipped" in phases:
        con.print(f"prefill vs decode: skipped ({escape(phases['skipped'])})")
        return
    t = Table(title="prefill vs decode (one execution each; host time = median)")
    for col in ("phase", "new tokens", "past", "NPU cycles", "NPU us (emul.)", "compute cyc", "DMA cyc", "DMA bytes",
                "host us NpuEP", "host us CPU EP"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for key in ("prefill", "decode"):
        r = phases[key]
        t.add_row(key, str(r["new_tokens"]), str(r["past_tokens"]), f"{r['npu_cycles']:,.0f}", _us(r["npu_us"]),
                  f"{r['npu_compute_cycles']:,.0f}", f"{r['npu_dma_cycles']:,.0f}", f"{r['dma_bytes']:,}",
                  _us(r["host_us"]), _us(r["cpu_host_us"]))
    con.print(t)


def _entries(con: Console, entries: Mapping[str, Any] | None) -> None:
    if not entries:
        return
    t = Table(title=f"generation entry points (one weight copy for all: {entries['weight_bytes']:,} bytes in "
                    f"{len(entries['programs'])} program(s))")
    for col in ("entry", "S", "P", "calls", "tokens logical/executed", "host ms", "NPU ms (emul.)"):
        t.add_column(col, justify="left" if col == "entry" else "right")
    for e in entries["entries"]:
        t.add_row(escape(e["name"]), str(e["new_tokens"]), str(e["past_slots"]), str(e["calls"]),
                  f"{e['logical_tokens']}/{e['executed_tokens']}", f"{e['host_s'] * 1e3:.1f}",
                  f"{e['npu_s'] * 1e3:.3f}")
    con.print(t)
    _kv_per_token(con, entries.get("kv_per_decode_step") or [])


def _kv_per_token(con: Console, rows: Sequence[Mapping[str, Any]]) -> None:
    """Issue 41's three KV facts per decode token, one row per KV mode that ran on the session."""
    if not rows:
        return
    t = Table(title="KV per decode token (three facts apart)")
    for col in ("KV mode", "steps", "KV bytes across boundary", "bytes moved in NPU memory", "full copies",
                "past bytes copied", "DMA us across/in place/copies", "NPU us (emul.)", "inter-token us"):
        t.add_column(col, justify="left" if col == "KV mode" else "right")
    for r in rows:
        across, d = r["kv_across_boundary_bytes"], r["dma_us"]
        t.add_row(r["mode"], str(r["decode_steps"]), "-" if across is None else f"{across:,.0f}",
                  f"{r['moved_in_npu_memory_bytes']:,.0f}", f"{r['full_copies']:g}", f"{r['past_copied_bytes']:,.0f}",
                  f"{d['across_boundary']:.2f}/{d['in_place']:.2f}/{d['full_copies']:.2f}", f"{r['npu_us']:.1f}",
                  f"{r['inter_token_us']:.0f}")
    con.print(t)


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _compare(con: Console, cmp_: Mapping[str, Any] | None, max_rows: int) -> None:
    if not cmp_:
        return
    t = Table(title="per-node numerics vs CPU EP")
    for col in ("node", "tensor", "dtype", "max abs", "max rel", "ok"):
        t.add_column(col)
    for r in cmp_["nodes"][:max_rows]:
        t.add_row(escape(r["node"]), escape(r["tensor"]), r["dtype"], _g(r["max_abs"]), _g(r["max_rel"]),
                  "[green]ok[/]" if r["ok"] else "[red]FAIL[/]")
    con.print(t)
    con.print(f"first node out of tolerance: {escape(cmp_['first_failure'] or 'none')}")
    if cmp_.get("local"):
        agree = sum(c["ok"] for c in cmp_["local"])
        con.print(f"run alone on the CPU EP with NpuEP's own inputs, {agree} of {len(cmp_['local'])} failing nodes "
                  f"agree (their difference came from upstream); first kernel failure: "
                  f"{escape(cmp_['first_kernel_failure'] or 'none')}")
    tw = cmp_.get("three_way")
    if tw is None:
        if cmp_.get("quantized"):
            con.print("quantized model: pass --float-model FLOAT.onnx to separate quantization error from "
                      "compiler/kernel error")
        return
    t = Table(title=f"three-way numerics (float reference: {tw['float_source']}, {tw['substituted']} weights "
                    "substituted)")
    for col in ("tensor", "node", "float->quant abs", "rel", "quant->NpuEP abs", "rel", "dominant"):
        t.add_column(col)
    for r in (tw["outputs"] + tw["nodes"])[:max_rows]:
        t.add_row(escape(r["tensor"]), escape(r["node"] or "(graph output)"), _g(r["quant_max_abs"]),
                  _g(r["quant_max_rel"]), _g(r["kernel_max_abs"]), _g(r["kernel_max_rel"]), r["dominant"] or "-")
    con.print(t)
    if tw["unmatched_weights"]:
        con.print(f"no float weight found for {len(tw['unmatched_weights'])} quantized node(s), e.g. "
                  f"{escape(tw['unmatched_weights'][0])}: the float model itself is the float reference")
    con.print(f"dominant error on the first output: [bold]{tw['dominant'] or 'none'}[/]")
