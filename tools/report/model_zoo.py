"""``npu-report --zoo``: which of my models run on this NPU? One row per model, each measured in its own worker
process: nodes, coverage, partitions, crossings, the top decline reasons, numerics against the CPU EP, the
application's decision (for the corpus models) and host time against the CPU EP.

The session is the one a user gets (NpuEP first, CPU EP as fallback, no rewrite); coverage and partitions are
ORT's graph assignment, not a file-level estimate. ORT's record lists the nodes of subgraphs whose If/Loop/Scan runs
on the CPU EP, but not those compiled inside an If/Loop/Scan that NpuEP claimed whole; the EP's own capability
decisions supply those, so ``nodes`` and coverage count every node once, wherever it sits, and
``in_claimed_subgraphs`` says how many of them ORT's record does not show.
"""

from __future__ import annotations

import collections
import os
import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

TARGETS = {"coverage": 0.95, "partitions": 3, "host_ratio": 2.0}  # issue 13's bar per model


def model_paths(sources: Sequence[str]) -> list[tuple[str, str]]:
    """(name, path) for every ``.onnx`` under the given files/folders; ``corpus`` names the installed real
    models of ``npu_ep.models.corpus``."""
    from ...models.corpus import CORPUS

    out: list[tuple[str, str]] = []
    for src in sources:
        if src == "corpus":
            out += [(m.name, str(m.path())) for m in CORPUS if m.path() is not None]
            continue
        p = pathlib.Path(src)
        if p.is_dir():
            out += [(f.stem, str(f)) for f in sorted(p.rglob("*.onnx"))]
        elif p.exists():  # a FIFO or a device too: its row says what it is (it is never opened for reading)
            out.append((p.stem, str(p)))
        else:
            raise FileNotFoundError(f"{src}: no such model file or folder")
    return out


def measure_model(name: str, path: str, target: str, dims: Mapping[str, int], runs: int) -> dict[str, Any]:
    """One zoo row (runs in a worker process: one NpuEP session alive at a time there)."""
    import onnxruntime as ort

    from ...ep.sessions import session_of, tag_session_options
    from ...models.corpus import CORPUS
    from ..model_file import load_model_file
    from .run import make_feeds, resolve_dims

    row: dict[str, Any] = {"model": name, "path": path}
    try:
        model = load_model_file(path)  # a FIFO or a link to a device is an error row, never read
        corpus = next((m for m in CORPUS if m.path() is not None and str(m.path()) == path), None)
        feeds = corpus.feeds(np.random.default_rng(0)) if corpus else make_feeds(model, resolve_dims(model, dims))
        so = ort.SessionOptions()
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        so.log_severity_level = 3
        tag_session_options(so)
        npu = ort.InferenceSession(path, so, providers=[("NpuEP", {"target": target, "cache_dir": "",
                                                                     "log_level": "error"}), "CPUExecutionProvider"],
                                   enable_fallback=0)
        cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        got, want = npu.run(None, feeds), cpu.run(None, feeds)
        groups = npu.get_provider_graph_assignment_info()
        ep = session_of(npu)
        inside = in_claimed_subgraphs(ep, groups)
        recorded = sum(len(g.get_nodes()) for g in groups)
        total = recorded + inside
        on_npu = sum(len(g.get_nodes()) for g in groups if g.ep_name == "NpuEP") + inside
        declined = [d for _, cap in ep.capabilities for d in cap.declined]
        by_op = collections.Counter(d.node.op_type for d in declined)
        example = {d.node.op_type: d.reason.split(": ", 1)[-1] for d in reversed(declined)}
        rel = max((float(np.abs(g.astype(np.float64) - w).max() / max(float(np.abs(w).max()), 1e-12))
                   for g, w in zip(got, want) if w.dtype.kind == "f" and w.size), default=0.0)
        exact = all(np.array_equal(g, w) for g, w in zip(got, want) if w.dtype.kind != "f")
        row.update(nodes=total, on_npu=on_npu, coverage=on_npu / total if total else 0.0,
                   assigned_nodes=recorded, in_claimed_subgraphs=inside,
                   partitions=sum(1 for g in groups if g.ep_name == "NpuEP"),
                   crossings=sum(len(p.inputs) + len(p.outputs) for p in ep.programs.values()),
                   top_reasons=[f"{n} x {op} (e.g. {example[op]})" for op, n in by_op.most_common(3)],
                   max_rel_diff=rel,
                   integer_outputs_equal=exact,
                   same_decision=(bool(np.array_equal(corpus.decision(got), corpus.decision(want)))
                                  if corpus else None),
                   **dict(zip(("host_ratio", "host_ratio_min", "host_ratio_max"), host_ratio(npu, cpu, feeds, runs))))
    except Exception as exc:  # noqa: BLE001 - a model that fails is a row with the reason, not a crash
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return row


def in_claimed_subgraphs(ep, groups) -> int:
    """Nodes compiled inside an If/Loop/Scan that NpuEP claimed whole (nested graphs included): the EP decided them
    as part of their node (``Decision.in_parent``) and ORT's assignment record (``groups``) does not list them. A
    node so decided that ORT does list (its node was declined after all) is counted there, not here."""
    recorded = collections.Counter(n.name for g in groups for n in g.get_nodes())
    inside = collections.Counter(d.node.name for _, cap in ep.capabilities for d in cap.decisions if d.in_parent)
    return sum((inside - recorded).values())


def host_ratio(npu, cpu, feeds, runs: int) -> tuple[float, float, float]:
    """NpuEP's session.run time over the CPU EP's as (median, min, max) of the per-block ratios: the two sessions
    alternate in blocks after a warm-up (``bench.timing``), so load that comes and goes on a shared machine weighs
    on both instead of on whichever ran second, and the range says how much it moved the ratio."""
    from ..bench.timing import alternating_blocks, block_ratios

    blocks = alternating_blocks({"npu": lambda: npu.run(None, feeds), "cpu": lambda: cpu.run(None, feeds)}, runs,
                                rounds=max(1, min(5, runs)))
    ratios = block_ratios(blocks, "npu", "cpu")
    return statistics.median(ratios), min(ratios), max(ratios)


DEFAULT_TIMEOUT_S = 600.0  # per model: a real model's two sessions and runs take seconds to a minute here


def default_memory_mib(workers: int) -> int:
    """Each worker's address-space bound: the machine's memory shared by the workers, at least 4 GiB (virtual
    reservations of ORT's threads and allocators count too)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return max(4096, total // max(1, workers))


def zoo(sources: Sequence[str], *, target: str = "npu-ref", dims: Mapping[str, int] | None = None,
        workers: int | None = None, runs: int = 5, timeout_s: float = DEFAULT_TIMEOUT_S,
        max_memory_mib: int | None = None) -> dict[str, Any]:
    """Measure every model in its own spawned worker process (``isolated``), at most ``workers`` at once; a model
    that hangs past ``timeout_s`` or needs more than ``max_memory_mib`` (default ``default_memory_mib``) is a row
    with that error."""
    from .isolated import JobFailed, run_isolated

    models = model_paths(sources)
    workers = workers or max(1, min(len(models), os.cpu_count() or 1))
    memory = max_memory_mib or default_memory_mib(workers)
    jobs = [(name, path, target, dict(dims or {}), runs) for name, path in models]
    results = run_isolated(measure_model, jobs, workers=workers, timeout_s=timeout_s,
                           max_memory_bytes=memory * 2**20)
    rows = [{"model": name, "path": path, "error": str(r)} if isinstance(r, JobFailed) else r
            for (name, path), r in zip(models, results)]
    return {"target": target, "targets": TARGETS, "models": rows}


HEADER = ("model", "nodes", "nodes in claimed If/Loop/Scan", "on NpuEP", "partitions", "crossings", "max rel diff",
          "same decision", "host x CPU", "top decline reasons")


def rows(doc: Mapping[str, Any]) -> list[list[Any]]:
    out = []
    for r in doc["models"]:
        if "error" in r:
            out.append([r["model"], None, None, None, None, None, None, None, None, r["error"]])
            continue
        out.append([r["model"], r["nodes"], r.get("in_claimed_subgraphs", 0), f"{r['coverage']:.0%}", r["partitions"],
                    r["crossings"],
                    f"{r['max_rel_diff']:.1e}", {None: "-", True: "yes", False: "NO"}[r["same_decision"]],
                    _ratio(r), "; ".join(r["top_reasons"]) or "-"])
    return out


def _ratio(row: Mapping[str, Any]) -> str:
    """``1.21 (1.05-1.40)``: the median per-block ratio and its range."""
    if "host_ratio_min" not in row:
        return f"{row['host_ratio']:.2f}"
    return f"{row['host_ratio']:.2f} ({row['host_ratio_min']:.2f}-{row['host_ratio_max']:.2f})"


def render_terminal(doc: Mapping[str, Any]) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ...log import escape as printable

    t = Table(title=f"Model zoo on {doc['target']} (targets: >= {TARGETS['coverage']:.0%} on NpuEP, <= "
                    f"{TARGETS['partitions']} partitions, host <= {TARGETS['host_ratio']}x CPU EP; host x CPU: median "
                    "(range) of the ratios of alternating blocks)")
    for h in HEADER:
        t.add_column(h, overflow="fold")
    for r in rows(doc):
        t.add_row(*("" if v is None else escape(printable(v)) for v in r))
    console = Console(width=180, record=True)
    with console.capture() as cap:
        console.print(t)
    return cap.get()


def render_html(doc: Mapping[str, Any]) -> str:
    from .tables import table

    return ("<!doctype html><meta charset='utf-8'><title>NpuEP model zoo</title>"
            "<style>td.num{text-align:right}td,th{padding:2px 8px;border-bottom:1px solid #ddd}</style>"
            + table(f"Model zoo on {doc['target']}", HEADER, rows(doc), "no models"))
