"""The whole-model latency ``npu-report`` projects for its target, with the precision it assumed and how well that
target's projection matched measured devices (``kernels/projection.py``, ``python -m npu_ep.tools.bench.silicon``).

One inference is one call of each partition: from the file, its static shapes; from a session, the first input
signature each partition ran (a KV-cache model's prefill and decode are separate calls: ``phases`` has both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...kernels.projection import has_projection, project_seconds, terms, timeline_work
from ...kernels.target import Target

_PRECISION_NAMES = {"float32": "fp32", "float16": "fp16", "int8": "int8", "int4": "int4 weights"}


def precision(timeline: Sequence[Mapping[str, Any]]) -> str:
    """The matrix modes the projection assumed, e.g. "fp16", "int8", "int8 + fp16"; "none" without matrix ops."""
    modes = {op.get("mode") for p in timeline for op in p["ops"] if op["unit"] == "matrix" and op.get("mode")}
    names = sorted({_PRECISION_NAMES.get(m, m) for m in modes}, key=lambda n: (n.startswith("fp"), n))
    return " + ".join(names) or "none"


def latency(timeline: Sequence[Mapping[str, Any]], target: Target) -> dict[str, Any]:
    """Top-level fields of the report: ``projected_latency_ms``, ``precision`` and ``latency`` (its basis)."""
    first: dict[str, Mapping[str, Any]] = {}
    for entry in timeline:
        first.setdefault(entry["partition"], entry)
    work = timeline_work(first.values(), target)
    calibration = target.raw.get("projection", {}).get("calibration") if has_projection(target) else None
    return {"projected_latency_ms": project_seconds(work, terms(target)) * 1e3, "precision": precision(timeline),
            "latency": {"calibrated": has_projection(target), "calibration": calibration, "ops": work.count,
                        "partitions": len(first)}}


def describe(doc: Mapping[str, Any]) -> str:
    """One line: the projection and, beside it, the target's calibration error (or that it has none)."""
    lat = doc["latency"]
    head = f"projected latency on {doc['target']}: {doc['projected_latency_ms']:.3f} ms ({doc['precision']})"
    cal = lat["calibration"]
    if cal:
        return (f"{head}; this target's calibration error: median {cal['median_error']:.0%}, max "
                f"{cal['max_error']:.0%} over {cal['rows']} measured rows")
    return f"{head}; this target has no calibration against a device (the bare cost model's cycle sum)"
