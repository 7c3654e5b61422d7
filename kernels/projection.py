"""Whole-model latency projected for a real-NPU target, from the emulated timeline's per-op work.

The cost model prices each op in cycles of the target's units (``kernels/cost.py``: matrix tiles, vector lanes,
DMA). A real device adds what a per-op roofline leaves out: a fixed cost per inference (graph launch, I/O), a fixed
cost per op (dispatch, synchronisation between units), and units that reach a fraction of their peak. The target's
``[projection]`` section holds those terms, fitted on measured latencies by
``python -m npu_ep.tools.bench.silicon --fit`` (every efficiency a fraction of its peak, in (0, 1]):

    latency = graph_overhead + max(sum over ops the device runs of (op_overhead + matrix / matrix_efficiency[mode]
                                                                    + vector / vector_efficiency
                                                                    + unpack / int4_unpack_efficiency),
                                   sum over ops of dram / dram_efficiency)

Matrix and vector are an op's compute seconds at the target's peak rates, dram its DRAM bytes over the peak
bandwidth, unpack the vector-unit seconds that turn an int4-weight product's weights into the matrix unit's 8-bit
operands on every call (Hexagon's HMX takes no int4: a decode step pays it per token, a prefill once per window).
The DMA engine streams weights ahead of the ops that read them, so DRAM traffic overlaps compute across
the whole graph: a CNN is bound by its compute, an LLM's decode step by its weights.

The ops counted are the ones the device runs, not the emulator's steps one for one (``partition_work``):
- a QuantizeLinear/DequantizeLinear is a tensor encoding the device compiler folds into the ops around it: no work
  of its own, except beside a product the emulator runs in fp16 (a 16-bit layer of a w8a8 graph: attention's
  activation products), where it is a real 8-bit <-> 16-bit conversion pass, counted in that product;
- element-wise ops right after a matrix op (bias, activation, residual add, the exported erf-GELU) are its
  epilogue: one op with it, their vector work added;
- shape arithmetic on a few scalars is folded at compile time (the device compiles static shapes);
- a Div by a constant is a multiply by its reciprocal, not a division;
- vector work is priced at the width the device computes in: fp32 lanes hold two fp16 elements (float graphs) or
  four 8-bit ones (quantized graphs), except reductions and normalisations (softmax, LayerNorm, average pools),
  which compute in 32 bits on quantized data;
- DRAM bytes are an op's weights as the NPU stores them plus the part of its activations (at the device's width:
  fp16 for float graphs) that does not fit in on-chip memory; activations stay on chip between ops otherwise.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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


QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "com.microsoft::QuantizeLinear",
                     "com.microsoft::DequantizeLinear"})
# element-wise ops a device compiler folds into the matrix op whose output they read
EPILOGUE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid",
                          "HardSwish", "Tanh", "Erf", "Gelu", "Sqrt", "Neg", "Abs", "Pow", "Exp", "Max", "Min",
                          "Where", "Cast", "npu::QdqLut"})
# vector ops that reduce or normalise (a sum, a mean, an exp): they compute in 32 bits on a quantized graph too
WIDE_OPS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "SimplifiedLayerNormalization",
                      "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNormalization",
                      "InstanceNormalization", "GlobalAveragePool", "AveragePool", "ReduceMean", "ReduceSum",
                      "Resize"})
FLOAT_WIDTH = 0.5  # an fp32 lane holds two fp16 elements: float graphs compute and store in fp16 on the NPU
QUANT_WIDTH = 0.25  # or four 8-bit ones: a quantized graph's element-wise work and its 8-bit activations


def is_quantized(ops: Iterable[Mapping[str, Any]]) -> bool:
    """A partition whose activations the device keeps in 8 bits: it holds Q/DQ or quantized units."""
    return any(op["op"] in QDQ_OPS or op["op"].split("::")[-1].startswith(("QLinear", "Qdq")) for op in ops)


def vector_width(op: Mapping[str, Any], quantized: bool) -> float:
    """Device time of a vector op per emulated fp32-lane second (module docstring)."""
    if not quantized:
        return FLOAT_WIDTH
    return 1.0 if op["op"] in WIDE_OPS else QUANT_WIDTH


def activation_width(op: Mapping[str, Any], quantized: bool) -> float:
    """Device bytes of an op's activations per emulated byte: float32 tensors are fp16 on the NPU; a quantized
    graph's float steps (between a DQ and a Q) are 8-bit; integer products and 8-bit units move what they move."""
    if op["unit"] == "matrix":
        return 1.0 if op.get("mode") in INT_MODES else FLOAT_WIDTH
    if not quantized:
        return FLOAT_WIDTH
    return 1.0 if op["unit"] == "dma" or op["op"].split("::")[-1].startswith("Qdq") else QUANT_WIDTH


def dram_bytes(op: Mapping[str, Any], target: Target, width: float = 1.0) -> float:
    """What an op moves between DRAM and the NPU: its weights, plus the part of its activations (``width`` device
    bytes per emulated byte) that does not fit in on-chip memory (``sram_bytes``). An op that moves less than its
    constants (a Gather reads a few rows of its table) reads only what it moves."""
    weights = min(int(op.get("weight_bytes", 0)), int(op["dma_bytes"]))
    activations = (int(op["dma_bytes"]) - weights) * width
    return weights + max(0.0, activations - target.sram_bytes)


def op_work(op: Mapping[str, Any], target: Target, quantized: bool = False) -> OpWork | None:
    """One timeline op entry (``tools/report/timeline.py``) as the device runs it, in a partition whose
    activations are 8-bit (``quantized``) or fp16; None for an op that does nothing (a view)."""
    if op["cycles"] <= 0:
        return None
    compute = target.cycles_to_seconds(op["compute_cycles"])
    dram = (dram_bytes(op, target, activation_width(op, quantized))
            / (float(target.dma["bytes_per_cycle"]) * target.clock_hz))
    if op["unit"] != "matrix":
        if op["op"] == "Div" and op.get("weight_bytes", 0) > 0:  # x / c runs as x * (1 / c): one op, not 1 + exp
            compute /= 1.0 + float(target.vector.get("transcendental_cycles", 4))  # as kernels/ops/_vector.py
        return OpWork(vector_s=compute * vector_width(op, quantized), dram_s=dram)
    if op.get("mode") == "int4":  # two weights a byte, unpacked at the vector unit's int8 width (4 per lane)
        unpack = 2 * int(op.get("weight_bytes", 0)) / (int(target.vector["lanes"]) * 4 * target.clock_hz)
        return OpWork(int_matrix_s=compute, dram_s=dram, unpack_s=unpack)
    if op.get("mode") in INT_MODES:
        return OpWork(int_matrix_s=compute, dram_s=dram)
    return OpWork(float_matrix_s=compute, dram_s=dram)


def folded_at_compile_time(op: Mapping[str, Any], target: Target) -> bool:
    """Shape arithmetic on a few scalars (a Shape->Gather->Mul chain): a step other than a product that moves at
    most one vector of fp32 lanes. The device compiles static shapes and computes those once."""
    return op["unit"] != "matrix" and int(op["dma_bytes"]) <= int(target.vector["lanes"]) * 4


def _float_product(op: Mapping[str, Any] | None) -> bool:
    return op is not None and op["unit"] == "matrix" and op.get("mode") not in INT_MODES


def _plus(a: OpWork, b: OpWork) -> OpWork:
    return OpWork(*(x + y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b))))


def partition_work(ops: Sequence[Mapping[str, Any]], target: Target) -> list[OpWork]:
    """One partition's steps (program order) as the ops the device runs (module docstring): Q/DQ folded away or,
    beside an fp16 product, into it as a conversion; element-wise epilogues into their matrix op."""
    quantized = is_quantized(ops)
    live = [op for op in ops if op["cycles"] > 0 and not folded_at_compile_time(op, target)]
    out: list[OpWork] = []
    group: OpWork | None = None  # the open matrix op with its epilogue
    conversion = 0.0  # a DQ's pass waiting for the fp16 product after it
    for i, op in enumerate(live):
        if op["op"] in QDQ_OPS:
            before, after = live[i - 1] if i else None, live[i + 1] if i + 1 < len(live) else None
            if _float_product(after) or _float_product(before):
                seconds = target.cycles_to_seconds(op["compute_cycles"]) * QUANT_WIDTH
                if _float_product(after) or group is None:
                    conversion += seconds
                else:
                    group = _plus(group, OpWork(vector_s=seconds))
            continue
        work = op_work(op, target, quantized)
        if op["unit"] == "matrix":
            if group is not None:
                out.append(group)
            group, conversion = _plus(work, OpWork(vector_s=conversion)), 0.0
        elif group is not None and op["op"] in EPILOGUE_OPS:
            group = _plus(group, work)
        else:
            if group is not None:
                out.append(group)
            group = None
            out.append(work)
    if group is not None:
        out.append(group)
    return out


def timeline_work(timeline: Iterable[Mapping[str, Any]], target: Target) -> Work:
    """A timeline's partitions (one call each) as the device's ops."""
    return Work.of(w for partition in timeline for w in partition_work(partition["ops"], target))


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
