"""The cost-aware partition policy (provider option ``partition_policy=cost_aware``).

Why: "supported op count" is the wrong objective. Every NpuEP partition is a separate call through the bridge,
and every tensor entering or leaving it crosses the CPU<->NPU boundary. A tiny island of NPU-capable ops
(an Add between two CPU-only ops) saves less than its crossings cost, once per layer, once per token.

Rule: for each partition found by max-coverage partitioning,

    boundary_us = crossings * bridge_us          (crossings = non-constant partition inputs + outputs)
    gain_us     = cpu_estimate_us - npu_estimate_us   (of one call of the whole partition)

and when ``boundary_us > max(gain_us, 0)`` the whole partition stays on the CPU, every node with the reason
``declined: boundary cost X us > gain Y us``. A partition whose crossings are free is never declined for them,
whatever its estimated gain (this policy weighs boundaries, not where an op runs faster). One pass, in graph
order (declining an island never adds crossings to another NpuEP partition: its neighbours are CPU nodes or
partitions whose inputs/outputs do not change).

Estimates:

- NPU: the partition is compiled by the real compiler (fusions included) and its Program is costed by the kernels'
  own cost functions on the graph's declared shapes: the same cost model that the run-time timeline and
  ``npu-report`` use. Compiling here means each partition is prepared twice under this policy; only this
  non-default policy pays that.
- CPU: ``nodes * CPU_NODE_US + macs / CPU_MACS_PER_S + elements / CPU_ELEMENTS_PER_S`` (one host core), with the
  MACs the kernels' cost functions counted. ``CPU_NODE_US`` is what ORT's CPU EP spends per node before any
  arithmetic (its kernel dispatch); without it a small partition, or a symbolic-shaped one costed at size 1, cost
  the CPU almost nothing while the NPU's fixed DMA latencies stayed, and its "gain" came out negative.
- bridge_us: the measured cost of one crossing, calibrated by ``python -m npu_ep.tools.bench.bridge``; default
  ``DEFAULT_BRIDGE_US``; override with the environment variable ``NPU_EP_BRIDGE_US`` (microseconds).
- Symbolic/unknown dims count as 1 (a decode step: the case where boundaries dominate).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence

from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.target import Target
from .capability import Decision
from .compiler import compile_partition
from ..log import escape, logger
from .partition import boundary

DEFAULT_BRIDGE_US = 10.0  # per crossing [us]; measure this machine's with python -m npu_ep.tools.bench.bridge
BRIDGE_ENV = "NPU_EP_BRIDGE_US"
CPU_MACS_PER_S = 4e9  # host fp32 MACs per second (one core, BLAS)
CPU_ELEMENTS_PER_S = 1e9  # host element-wise ops per second (one core, vectorized)
CPU_NODE_US = 0.5  # ORT CPU EP's cost per node beyond its arithmetic [us] (a chain of [1, 4] Relu/Neg: 0.5-0.7 us)

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


@dataclasses.dataclass(frozen=True)
class Estimate:
    npu_us: float
    cpu_us: float


def estimate(group: Sequence[int], nodes: Sequence[NodeInfo], target: Target) -> Estimate | None:
    """NPU and CPU time of one call of this partition [us]; None when it does not compile (compile will then say
    why, with the node)."""
    by_index = {n.index: n for n in nodes}
    inputs, outputs = boundary(group, nodes)
    try:
        program = compile_partition("policy", [by_index[i] for i in group], inputs, outputs, target)
        cost, _ = program.static_cost(unknown_dim=1)
    except Exception as exc:  # noqa: BLE001 - an estimate must never break capability
        logger.debug("cost-aware policy: no estimate for partition at %s: %s", by_index[group[0]].describe(),
                     escape(str(exc)))
        return None
    macs = sum(c.macs for c in cost.steps)
    elements = sum(_numel(o) for i in group for o in by_index[i].outputs if not o.missing)
    cpu_us = len(group) * CPU_NODE_US + (macs / CPU_MACS_PER_S + elements / CPU_ELEMENTS_PER_S) * 1e6
    return Estimate(cost.seconds * 1e6, cpu_us)


def crossings(group: Sequence[int], nodes: Sequence[NodeInfo]) -> int:
    """Tensors crossing the bridge per call of this partition (see ``partition.boundary``)."""
    inputs, outputs = boundary(group, nodes)
    return len(inputs) + len(outputs)


def cost_aware_policy(target: Target, bridge_us: float | None = None) -> Policy:
    """A policy for ``capability.analyze``: decline partitions whose boundary cost exceeds their estimated gain."""
    per_crossing = bridge_cost_us() if bridge_us is None else float(bridge_us)

    def policy(nodes: Sequence[NodeInfo], decisions: list[Decision],
               partitions: list[list[int]]) -> tuple[list[Decision], list[list[int]]]:
        kept, declined_reason = [], {}
        for group in partitions:
            est = estimate(group, nodes, target)
            if est is None:
                kept.append(group)
                continue
            gain = est.cpu_us - est.npu_us
            cost = crossings(group, nodes) * per_crossing
            if cost > max(gain, 0.0):  # free crossings never decline a partition
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
