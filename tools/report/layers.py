"""Per-layer timeline and the per-token boundary projection of ``npu-report``.

Per layer (``None``: nodes outside any layer), in us per run:

- ``npu_compute_us``, ``dma_us``: emulated (cost model; DMA = cycles not hidden behind compute);
- ``cpu_fallback_us``: measured, the ORT profiler's kernel time of the CPU nodes of that layer (``--run``; 0
  without a measurement: nothing is guessed);
- ``partition_us``: measured, the profiler's time of the NpuEP partition calls (bridge included). A partition
  spanning several layers is split over them in proportion to the emulated cycles of its ops in each layer;
- ``boundary_us``: the bridge's share, from the shim's C++ counters split over crossings by bytes (``--run``), or
  ``bridge_cost_us()`` per crossing as the documented estimate without a run. It is part of ``partition_us``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ...ep.capability import Capability
from ...ep.policy import bridge_cost_us
from ...kernels.node import NodeInfo
from ...kernels.target import Target
from . import model as rm

FIELDS = ("npu_compute_us", "dma_us", "cpu_fallback_us", "partition_us", "boundary_us")


def _main_entries(timeline: Sequence[dict]) -> dict[str, dict]:
    """Per partition the timeline entry of its most frequent input signature (the measured runs' shape)."""
    best: dict[str, dict] = {}
    for entry in timeline:
        if entry["partition"] not in best or entry["calls"] > best[entry["partition"]]["calls"]:
            best[entry["partition"]] = entry
    return best


def _layer_shares(entry: dict | None, partition: dict) -> dict[Any, float]:
    """How a partition's time splits over layers: emulated cycles per layer, else node count per layer."""
    weights: dict[Any, float] = defaultdict(float)
    for op in (entry or {}).get("ops", []):
        weights[op["layer"]] += op["cycles"]
    if not sum(weights.values()):
        weights.clear()
        for node in partition["nodes"]:
            weights[rm.layer_of(node)] += 1.0
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items()} if total else {}


def per_layer(nodes: Sequence[NodeInfo], cap: Capability, partitions: Sequence[dict], timeline: list[dict],
              crossings: list[dict], profile: dict | None, target: Target) -> list[dict]:
    """Rows as in the module docstring, sorted by layer (``None`` last)."""
    rows: dict[Any, dict] = {}

    def row(layer):
        return rows.setdefault(layer, {"layer": layer, **{f: 0.0 for f in FIELDS}})
    best = _main_entries(timeline)
    for entry in best.values():
        for op in entry["ops"]:
            r = row(op["layer"])
            r["npu_compute_us"] += target.cycles_to_seconds(op["compute_cycles"]) * 1e6
            r["dma_us"] += target.cycles_to_seconds(max(0.0, op["cycles"] - op["compute_cycles"])) * 1e6
    for c in crossings:
        r = row(c["layer"])
        r["boundary_us"] += c["measured_us"] * c["per_run"] if c.get("measured_us") is not None else bridge_cost_us()
    for d in cap.declined:
        row(rm.layer_of(d.node.name))
    if profile:
        by_name = {p["name"]: p for p in partitions}
        for n in profile["nodes"]:
            if n["provider"] == "NpuEP" and n["node"] in by_name:
                for layer, share in _layer_shares(best.get(n["node"]), by_name[n["node"]]).items():
                    row(layer)["partition_us"] += n["us_per_run"] * share
            elif n["provider"] != "NpuEP":
                row(n["layer"])["cpu_fallback_us"] += n["us_per_run"]
    return sorted(rows.values(), key=lambda r: (r["layer"] is None, r["layer"] or 0))


def projection(layers: dict, crossings: list[dict]) -> dict[str, Any]:
    """Per-token boundary cost ``L * n_b * t_b`` with the measured t_b, and what full coverage would save."""
    per_run = sum(c["measured_us"] * c["per_run"] for c in crossings if c.get("measured_us") is not None)
    count = sum(c["per_run"] for c in crossings)
    t_b = per_run / count if count else 0.0
    internal = [c for c in crossings if not set(c["peer"]) <= {"graph input", "graph output"}]
    saving = sum(c["measured_us"] * c["per_run"] for c in internal if c.get("measured_us") is not None)
    n_l, n_b = layers["count"], layers["crossings_per_layer"]
    return {"t_b_us": t_b, "boundary_us_per_run": per_run, "crossings_per_run": count, "layers": n_l,
            "crossings_per_layer": n_b, "per_token_us": n_l * n_b * t_b, "full_coverage_saving_us": saving}
