"""Whole-model latency projected for a real-NPU target, from the emulated timeline's per-op work.

The cost model prices each op in cycles of the target's units (``kernels/cost.py``: matrix tiles, vector lanes,
DMA). A real device adds what a per-op roofline leaves out: a fixed cost per inference (graph launch, I/O), a fixed
cost per op (dispatch, synchronisation between units), and units that reach a fraction of their peak. The target's
``[projection]`` section holds those terms, fitted on measured latencies by
``python -m npu_ep.tools.bench.silicon --fit``:

    latency = graph_overhead + max(sum over ops that do work of (op_overhead + matrix / matrix_efficiency[mode]
                                                                    + vector / vector_efficiency
                                                                    + unpack / int4_unpack_efficiency),
                                   sum over ops of dram / dram_efficiency)

Matrix and vector are an op's compute seconds at the target's peak rates, dram its DRAM bytes over the peak
bandwidth, unpack the vector-unit seconds that turn an int4-weight product's weights into the matrix unit's 8-bit
operands on every call (Hexagon's HMX takes no int4: a decode step pays it per token, a prefill once per window).
The DMA engine streams weights ahead of the ops that read them, so DRAM traffic overlaps compute across
the whole graph: a CNN is bound by its compute, an LLM's decode step by its weights. DRAM bytes are the op's
weights, plus its activations when they do not fit in on-chip memory (they stay there between ops otherwise, as NPU
compilers keep them). Float and integer matrix modes get one efficiency each.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .target import Target

INT_MODES = ("int8", "int4")


@dataclasses.dataclass(frozen=True)
class OpWork:
    """What one op asks of the target, in seconds at peak rates."""

    float_matrix_s: float = 0.0
    int_matrix_s: float = 0.0
    vector_s: float = 0.0
    dram_s: float = 0.0
    unpack_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Terms:
    """A target's projection terms: seconds per inference and per op, then seconds per second of peak work (the
    reciprocals of the efficiencies)."""

    graph_s: float = 0.0
    op_s: float = 0.0
    float_matrix: float = 1.0
    int_matrix: float = 1.0
    vector: float = 1.0
    dram: float = 1.0
    unpack: float = 1.0

    def compute_s(self, work: Work) -> float:
        """Seconds the units take over ``work``, per-op overheads included."""
        return sum(n * (self.op_s + op.float_matrix_s * self.float_matrix + op.int_matrix_s * self.int_matrix
                        + op.vector_s * self.vector + op.unpack_s * self.unpack) for op, n in work.ops)

    def dram_s(self, work: Work) -> float:
        return sum(n * op.dram_s for op, n in work.ops) * self.dram

    def dram_bound(self, work: Work) -> bool:
        return self.dram_s(work) > self.compute_s(work)


@dataclasses.dataclass(frozen=True)
class Work:
    """A model's ops that do work, as (op, how many times) pairs: equal ops (a decoder's layers) are counted."""

    ops: tuple[tuple[OpWork, int], ...] = ()

    @staticmethod
    def of(ops: Iterable[OpWork]) -> Work:
        return Work(tuple(Counter(ops).items()))

    def __add__(self, other: Work) -> Work:
        c = Counter(dict(self.ops))
        c.update(dict(other.ops))
        return Work(tuple(c.items()))

    def scaled_difference(self, smaller: Work, times: int) -> Work:
        """``self`` plus ``times`` copies of what ``self`` has beyond ``smaller`` (one more decoder layer)."""
        extra = Counter(dict(self.ops))
        extra.subtract(dict(smaller.ops))
        if any(n < 0 for n in extra.values()):
            raise ValueError("the larger model lacks ops of the smaller one: its layers are not repeats")
        c = Counter(dict(self.ops))
        for op, n in extra.items():
            c[op] += n * times
        return Work(tuple((op, n) for op, n in c.items() if n))

    @property
    def count(self) -> int:
        return sum(n for _, n in self.ops)

    def to_json(self) -> list:
        return [[*dataclasses.astuple(op), n] for op, n in self.ops]

    @staticmethod
    def from_json(rows: list) -> Work:
        return Work(tuple((OpWork(*r[:-1]), int(r[-1])) for r in rows))


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
    memory (``sram_bytes``; the tile plan's streaming traffic is then all DRAM traffic). An op that moves less than
    its constants (a Gather reads a few rows of its table) reads only what it moves."""
    weights = min(int(op.get("weight_bytes", 0)), int(op["dma_bytes"]))
    activations = max(0, int(op["dma_bytes"]) - weights)
    return int(op["dma_bytes"]) if activations > target.sram_bytes else weights


def op_work(op: Mapping[str, Any], target: Target) -> OpWork | None:
    """One timeline op entry (``tools/report/timeline.py``); None for an op that does nothing (a view)."""
    if op["cycles"] <= 0:
        return None
    compute = target.cycles_to_seconds(op["compute_cycles"])
    dram = dram_bytes(op, target) / (float(target.dma["bytes_per_cycle"]) * target.clock_hz)
    if op["unit"] != "matrix":
        return OpWork(vector_s=compute, dram_s=dram)
    if op.get("mode") == "int4":  # two weights a byte, unpacked at the vector unit's int8 width (4 per lane)
        unpack = 2 * int(op.get("weight_bytes", 0)) / (int(target.vector["lanes"]) * 4 * target.clock_hz)
        return OpWork(int_matrix_s=compute, dram_s=dram, unpack_s=unpack)
    if op.get("mode") in INT_MODES:
        return OpWork(int_matrix_s=compute, dram_s=dram)
    return OpWork(float_matrix_s=compute, dram_s=dram)


def timeline_work(timeline: Iterable[Mapping[str, Any]], target: Target) -> Work:
    ops = (op_work(op, target) for partition in timeline for op in partition["ops"])
    return Work.of(o for o in ops if o is not None)


def has_projection(target: Target) -> bool:
    return "projection" in target.raw


def terms(target: Target) -> Terms:
    """The target's ``[projection]`` section (a target without one: no overheads, every unit at its peak)."""
    if not has_projection(target):
        return Terms()
    p = target.raw["projection"]
    eff = p["matrix_efficiency"]
    float_eff = eff.get("float16", eff.get("float32"))
    int_eff = eff.get("int8", eff.get("int4", float_eff))
    return Terms(float(p["graph_overhead_us"]) * 1e-6, float(p["op_overhead_us"]) * 1e-6, 1.0 / float(float_eff),
                 1.0 / float(int_eff), 1.0 / float(p["vector_efficiency"]), 1.0 / float(p["dram_efficiency"]),
                 1.0 / float(p["int4_unpack_efficiency"]))


def project_seconds(work: Work, t: Terms) -> float:
    """Projected latency of one inference [s]."""
    return t.graph_s + max(t.compute_s(work), t.dram_s(work))
