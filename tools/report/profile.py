"""Measured host time per node from ORT's own profiler, for the per-layer timeline of ``npu-report --run``.

Why the profiler: the time a model spends in CPU fallback nodes is not "latency minus partition calls spread
evenly". ORT times every kernel it runs (``SessionOptions.enable_profiling``): ``end_profiling()`` writes a
Chrome-trace JSON where each executed node is an event ``{"cat": "Node", "name": "<node>_kernel_time",
"dur": us, "args": {"provider": ..., "op_name": ...}}`` and each ``session.run`` a ``{"cat": "Session",
"name": "model_run"}`` event spanning its nodes. NpuEP partitions appear as their fused node (provider
``NpuEP``, name = the partition name the programs carry), so partition time is measured the same way, and it
includes the bridge (the C++ counters still give the bridge's share of it).

``end_profiling()`` also stops the profiler, so the session used here times its later runs without its overhead.

The shim's counters are read over the same kept runs, so each partition's profiler time splits into the shim's
callback time (bridge + program, ``shim_us_per_run``) and what ORT's plugin-EP wrapper adds around the callback
(kernel context, output allocation: ``us_per_run - shim_us_per_run``), which no counter inside the shim can see.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from ...kernels.runtime import extension
from .model import layer_of

SUFFIX = "_kernel_time"


def enable(so: ort.SessionOptions) -> str:
    """Turn profiling on in ``so``; returns the folder the trace goes to (removed by ``profile_runs``)."""
    folder = tempfile.mkdtemp(prefix="npu_report_profile_")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(folder, "ort")
    return folder


def parse(events: list[dict], warmup: int, shim: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Any]:
    """Per-node mean time per run [us] over the ``model_run`` windows after the first ``warmup`` ones; ``shim``:
    the shim's per-partition counters over those same runs (``partition_stats()`` of the extension)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = [r[0] for r in runs]
    kept = range(warmup, len(runs))
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    meta: dict[str, tuple[str, str]] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith(SUFFIX):
            continue
        run = bisect.bisect_right(starts, e["ts"]) - 1
        if run < warmup or run >= len(runs) or e["ts"] > runs[run][1]:
            continue
        name = e["name"][: -len(SUFFIX)]
        args = e.get("args", {})
        meta[name] = (str(args.get("provider", "")), str(args.get("op_name", "")))
        total[name] += float(e["dur"])
        calls[name] += 1
    n = max(len(kept), 1)
    nodes = [{"node": name, "op": meta[name][1], "provider": meta[name][0], "layer": layer_of(name),
              "us_per_run": total[name] / n, "calls_per_run": calls[name] / n} for name in total]
    for r in nodes:
        if shim is not None and r["node"] in shim:
            r["shim_us_per_run"] = shim[r["node"]].get("total_ns", 0) / 1e3 / n
    by = defaultdict(float)
    for r in nodes:
        by[r["provider"]] += r["us_per_run"]
    run_us = float(np.mean([runs[i][1] - runs[i][0] for i in kept])) if len(kept) else 0.0
    return {"runs": len(kept), "run_us": run_us, "us_per_run_by_provider": dict(sorted(by.items())),
            "nodes": nodes}


def profile_runs(sess: ort.InferenceSession, folder: str, feeds: Mapping[str, np.ndarray], runs: int,
                 warmup: int = 1) -> dict[str, Any]:
    """Run ``warmup + runs`` times on a session created with ``enable``, stop the profiler and parse its trace
    (the shim's counters are reset: read them again only after new runs)."""
    try:
        for _ in range(warmup):
            sess.run(None, dict(feeds))
        extension().reset_stats()
        for _ in range(runs):
            sess.run(None, dict(feeds))
        shim = extension().partition_stats()
    finally:  # always stop the profiler: otherwise the session's destructor writes a trace later
        path = sess.end_profiling()
        try:
            with open(path, encoding="utf-8") as f:
                events = json.load(f)
        finally:
            discard(folder)
    return parse(events, warmup, shim)


def discard(folder: str) -> None:
    """Remove the trace folder made by ``enable`` (also when the session never ran)."""
    shutil.rmtree(folder, ignore_errors=True)
