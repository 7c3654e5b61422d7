"""The cost-aware partition policy (provider option ``partition_policy=cost_aware``).

Why: "supported op count" is the wrong objective. Every NpuEP partition is a separate call through the bridge,
and every tensor entering or leaving it crosses the CPU<->NPU boundary. A tiny island of NPU-capable ops
(an Add between two CPU-only ops) saves less than its crossings cost, once per layer, once per token.

Rule: for each partition found by max-coverage partitioning,

    boundary_us = crossings * bridge_us          (crossings = non-constant partition inputs + outputs)
    gain_us     = sum over its nodes of (cpu_estimate_us - npu_estimate_us)

and when ``boundary_us > gain_us`` the whole partition stays on the CPU, every node with the reason
``declined: boundary cost X us > gain Y us``. One pass, in graph order (declining an island never adds crossings
to another NpuEP partition: its neighbours are CPU nodes or partitions whose inputs/outputs do not change).

Estimates (deliberately simple, documented, cheap enough for GetCapability on a large model):

- NPU: matrix ops ``macs / macs_per_cycle[mode]``, other ops ``elements / vector.lanes``, plus DMA of every
  non-constant input and output byte at ``dma.bytes_per_cycle`` and one ``dma.latency_cycles``; at ``clock_mhz``.
- CPU: ``macs / CPU_MACS_PER_S + elements / CPU_ELEMENTS_PER_S`` (one host core; numbers below).
- bridge_us: the measured cost of one crossing, calibrated by ``tools/bench_bridge.py``; default
  ``DEFAULT_BRIDGE_US``; override with the environment variable ``NPU_EP_BRIDGE_US`` (microseconds).
- Symbolic/unknown dims count as 1 (a decode step: the case where boundaries dominate).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.target import Target
from .capability import Decision

DEFAULT_BRIDGE_US = 10.0  # per crossing [us]; bench_bridge measures ~2.5 us per call + Python program entry
BRIDGE_ENV = "NPU_EP_BRIDGE_US"
CPU_MACS_PER_S = 4e9  # host fp32 MACs per second (one core, BLAS)
CPU_ELEMENTS_PER_S = 1e9  # host element-wise ops per second (one core, vectorized)
MATRIX_OPS = {"MatMul", "Gemm", "MatMulNBits", "MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat",
              "MatMulEpilogue"}

Policy = Callable[[Sequence[NodeInfo], list[Decision], list[list[int]]], tuple[list[Decision], list[list[int]]]]


def bridge_cost_us() -> float:
    """Cost of one CPU<->NPU crossing [us]: ``$NPU_EP_BRIDGE_US`` if set (must be a number >= 0), else the default."""
    raw = os.environ.get(BRIDGE_ENV, "").strip()
    if not raw:
        return DEFAULT_BRIDGE_US
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{BRIDGE_ENV}={raw!r}: expected a number of microseconds") from None
    if value < 0 or math.isnan(value):
        raise ValueError(f"{BRIDGE_ENV}={raw!r}: expected a number of microseconds >= 0")
    return value


def _numel(v: ValueInfo) -> int:
    if v.shape is None:
        return 1
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in v.shape)


def _nbytes(v: ValueInfo) -> int:
    return _numel(v) * (v.dtype.itemsize if v.dtype is not None else 4)


def _macs(node: NodeInfo) -> int:
    if node.op_type not in MATRIX_OPS or not node.outputs:
        return 0
    if node.op_type == "MatMulNBits":
        k = int(node.attr("K", 1))
    else:
        a = node.input(0)
        k = a.shape[-1] if a is not None and a.shape and isinstance(a.shape[-1], int) else 1
        if node.op_type == "Gemm" and node.attr("transA", 0) and a is not None and a.shape:
            k = a.shape[0] if isinstance(a.shape[0], int) else 1
    return _numel(node.outputs[0]) * k


def _mode(node: NodeInfo, target: Target) -> str | None:
    a = node.input(0)
    name = a.dtype.name if a is not None and a.dtype is not None else "float32"
    if name in ("int8", "uint8"):
        return "int8" if target.has_mode("int8") else None
    if node.op_type == "MatMulNBits" and target.has_mode("int4") and int(node.attr("accuracy_level", 0)) == 4:
        return "int4"
    return target.float_mode(name) or next(iter(target.matrix["macs_per_cycle"]), None)


def npu_estimate_us(node: NodeInfo, target: Target) -> float:
    """Emulated NPU time of one node [us] (see module docstring)."""
    macs = _macs(node)
    mode = _mode(node, target) if macs else None
    elements = sum(_numel(o) for o in node.outputs if not o.missing)
    compute = macs / target.mac_rate(mode) if mode else elements / float(target.vector["lanes"])
    moved = sum(_nbytes(v) for v in (*node.inputs, *node.outputs) if not v.missing and not v.is_constant)
    dma = float(target.dma["latency_cycles"]) + moved / float(target.dma["bytes_per_cycle"])
    return target.cycles_to_seconds(compute + dma) * 1e6


def cpu_estimate_us(node: NodeInfo) -> float:
    """Host CPU time of one node [us] (see module docstring)."""
    elements = sum(_numel(o) for o in node.outputs if not o.missing)
    return (_macs(node) / CPU_MACS_PER_S + elements / CPU_ELEMENTS_PER_S) * 1e6


def crossings(group: Sequence[int], nodes: Sequence[NodeInfo]) -> int:
    """Tensors crossing the bridge per call of this partition: its non-constant inputs and its outputs that are
    read outside it (or are graph outputs)."""
    members = set(group)
    by_index = {n.index: n for n in nodes}
    produced = {v.name for i in members for v in by_index[i].outputs if not v.missing}
    inputs = {v.name for i in members for v in by_index[i].inputs
              if not v.missing and not v.is_constant and v.name not in produced}
    read_outside = {v.name for n in nodes if n.index not in members for v in n.inputs if not v.missing}
    outputs = {v.name for i in members for v in by_index[i].outputs
               if not v.missing and (v.is_graph_output or v.name in read_outside)}
    return len(inputs) + len(outputs)


def cost_aware_policy(target: Target, bridge_us: float | None = None) -> Policy:
    """A policy for ``capability.analyze``: decline partitions whose boundary cost exceeds their estimated gain."""
    per_crossing = bridge_cost_us() if bridge_us is None else float(bridge_us)

    def policy(nodes: Sequence[NodeInfo], decisions: list[Decision],
               partitions: list[list[int]]) -> tuple[list[Decision], list[list[int]]]:
        by_index = {n.index: n for n in nodes}
        kept, declined_reason = [], {}
        for group in partitions:
            gain = sum(cpu_estimate_us(by_index[i]) - npu_estimate_us(by_index[i], target) for i in group)
            cost = crossings(group, nodes) * per_crossing
            if cost > gain:
                reason = f"declined: boundary cost {cost:.1f} us > gain {gain:.1f} us"
                declined_reason.update({i: reason for i in group})
            else:
                kept.append(group)
        if not declined_reason:
            return decisions, partitions
        out = [Decision(d.node, f"{d.node.describe()}: {declined_reason[d.node.index]}")
               if d.node.index in declined_reason else d for d in decisions]
        return out, kept

    return policy
