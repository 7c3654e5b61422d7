"""Whole-model latency projected for a real-NPU target, from the emulated timeline's per-op work.

The cost model prices each op in cycles of the target's units (``kernels/cost.py``: matrix tiles, vector lanes,
DMA). A real device adds what a per-op roofline leaves out: a fixed cost per inference (graph launch, I/O), a fixed
cost per op (dispatch, synchronisation between units), and units that reach a fraction of their peak. The target's
``[projection]`` section holds those terms, fitted on measured latencies by
``python -m npu_ep.tools.bench.silicon --fit``:

    latency = graph_overhead + sum over ops that do work of
              (op_overhead + matrix / matrix_efficiency[mode] + vector / vector_efficiency + dram / dram_efficiency)

where matrix, vector and dram are each op's compute seconds at the target's peak rates and its DRAM bytes over the
peak bandwidth. DRAM bytes are an op's weights, plus its activations when they do not fit in on-chip memory (they
stay there between ops otherwise, as NPU compilers keep them). Float and integer matrix modes get one efficiency
each (``FLOAT_MODES``/``INT_MODES``): the data has one float and one integer precision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .target import Target

FLOAT_MODES = ("float32", "float16")
INT_MODES = ("int8", "int4")
TERMS = ("graph_overhead_us", "op_overhead_us", "float_matrix", "int_matrix", "vector_efficiency",
         "dram_efficiency")


@dataclasses.dataclass(frozen=True)
class Work:
    """What a timeline asks of the target's units, in seconds at peak rates."""

    ops: int = 0
    float_matrix_s: float = 0.0
    int_matrix_s: float = 0.0
    vector_s: float = 0.0
    dram_s: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def features(self) -> tuple[float, ...]:
        """The terms the projection is linear in, in ``TERMS`` order: (1, ops, matrix float, matrix int, vector,
        dram)."""
        return 1.0, float(self.ops), self.float_matrix_s, self.int_matrix_s, self.vector_s, self.dram_s


def weight_bytes(consts: Iterable[Any], target: Target) -> int:
    """Bytes of an op's constant inputs as the NPU stores them: float32 weights in the target's float mode's
    width (fp16 on targets whose float matmuls run in fp16), others as they are."""
    half = target.float_mode("float32") == "float16"
    total = 0
    for c in consts:
        nbytes = int(getattr(c, "nbytes", 0))
        total += nbytes // 2 if half and getattr(c, "dtype", None) == np.float32 else nbytes
    return total


def dram_bytes(op: Mapping[str, Any], target: Target) -> int:
    """What an op moves between DRAM and the NPU: its weights, plus its activations when they exceed on-chip
    memory (``sram_bytes``; the tile plan's streaming traffic is then all DRAM traffic)."""
    weights = int(op.get("weight_bytes", 0))
    activations = max(0, int(op["dma_bytes"]) - weights)
    return int(op["dma_bytes"]) if activations > target.sram_bytes else weights


def op_work(op: Mapping[str, Any], target: Target) -> Work:
    """One timeline op entry (``tools/report/timeline.py``) as Work; ops that do nothing (views) count as none."""
    if op["cycles"] <= 0:
        return Work()
    compute = target.cycles_to_seconds(op["compute_cycles"])
    dram = dram_bytes(op, target) / (float(target.dma["bytes_per_cycle"]) * target.clock_hz)
    if op["unit"] != "matrix":
        return Work(1, vector_s=compute, dram_s=dram)
    if op.get("mode") in INT_MODES:
        return Work(1, int_matrix_s=compute, dram_s=dram)
    return Work(1, float_matrix_s=compute, dram_s=dram)


def timeline_work(timeline: Iterable[Mapping[str, Any]], target: Target) -> Work:
    total = Work()
    for partition in timeline:
        for op in partition["ops"]:
            total = total + op_work(op, target)
    return total


def has_projection(target: Target) -> bool:
    return "projection" in target.raw


def coefficients(target: Target) -> tuple[float, ...]:
    """The target's projection terms in ``Work.features`` order: seconds per inference and per op, then seconds
    per second of peak work (reciprocal efficiencies)."""
    p = target.raw["projection"]
    eff = p["matrix_efficiency"]
    float_eff = eff.get("float16", eff.get("float32"))
    int_eff = eff.get("int8", eff.get("int4", float_eff))
    return (float(p["graph_overhead_us"]) * 1e-6, float(p["op_overhead_us"]) * 1e-6, 1.0 / float(float_eff),
            1.0 / float(int_eff), 1.0 / float(p["vector_efficiency"]), 1.0 / float(p["dram_efficiency"]))


def project_seconds(work: Work, target: Target) -> float:
    """Projected latency of one inference [s]; a target without ``[projection]`` gives the bare sum of the work."""
    if not has_projection(target):
        return sum(work.features()[2:])
    return float(sum(c * f for c, f in zip(coefficients(target), work.features())))


def bound(op: Mapping[str, Any]) -> str:
    """Which resource an op's time goes to on its target: "compute" or "bandwidth" (DRAM)."""
    return "bandwidth" if op["dma_cycles"] > op["compute_cycles"] else "compute"
