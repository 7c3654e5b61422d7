"""Emulated NPU timeline for ``npu-report``: per partition and per op cycles, DMA bytes, SRAM peak, utilization.

Two sources, same output shape:
- ``from_programs``: the compiled programs of a live session after a run (``Program.cost_for(signature)``, one
  entry per distinct input-shape signature: e.g. prefill and decode of a KV-cache model);
- ``from_static``: every partition compiled by the real compiler and its Program costed on the model file's
  static shapes (``--dim`` resolves symbolic dims); steps whose shapes stay unresolved are listed with the reason
  instead of a number.
Cycles at the target clock; seconds = cycles / clock; utilization = MACs / (cycles * peak MACs per cycle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...ep.capability import Capability
from ...ep.compiler import compile_partition
from ...ep.partition import boundary
from ...ep.program import Program, Step
from ...kernels.node import NodeInfo
from ...kernels.projection import weight_bytes
from ...kernels.registry import OpCost
from ...kernels.target import Target
from .model import layer_of


def _op_entry(step: Step, c: OpCost, target: Target) -> dict[str, Any]:
    return {"node": step.node_name, "op": step.op, "unit": c.unit, "mode": c.mode, "cycles": float(c.cycles),
            "compute_cycles": float(c.compute_cycles), "dma_cycles": float(c.dma_cycles), "dma_bytes": int(c.dma_bytes),
            "weight_bytes": weight_bytes(step.prepared.consts.values(), target), "sram_peak": int(c.sram_peak),
            "macs": int(c.macs), "utilization": float(c.utilization), "us": target.cycles_to_seconds(c.cycles) * 1e6,
            "layer": layer_of(step.node_name)}


def _partition_entry(name: str, signature: Any, ops: list[dict], target: Target, calls: int = 0,
                     skipped: Sequence[dict] = ()) -> dict[str, Any]:
    cycles = sum(o["cycles"] for o in ops)
    peak = max((float(r) for r in target.matrix["macs_per_cycle"].values()), default=1.0)
    macs = sum(o["macs"] for o in ops)
    return {"partition": name, "signature": signature, "calls": calls, "cycles": cycles,
            "us": target.cycles_to_seconds(cycles) * 1e6, "dma_bytes": sum(o["dma_bytes"] for o in ops),
            "sram_peak": max((o["sram_peak"] for o in ops), default=0),
            "utilization": macs / (cycles * peak) if cycles else 0.0, "ops": ops, "skipped": list(skipped)}


def from_programs(programs: Mapping[str, Program], target: Target) -> list[dict[str, Any]]:
    """One entry per (partition, input signature) the session actually ran."""
    out = []
    for name, prog in programs.items():
        for sig, calls in prog.signatures.items():
            cost = prog.cost_for(sig)
            if cost is None:
                continue
            ops = [_op_entry(step, c, target) for step, c in zip(prog.steps, cost.steps)]
            out.append(_partition_entry(name, [list(s) for s in sig], ops, target, calls))
    return out


def from_static(nodes: Sequence[NodeInfo], cap: Capability, names: Sequence[str], target: Target,
                dims: Mapping[str, int]) -> list[dict[str, Any]]:
    """Each partition compiled by the real compiler (fusions included) and its Program costed on the file's shapes
    (``nodes`` carry them, with ``--dim`` applied): the same programs and cost model as a run, one call each."""
    by_index = {n.index: n for n in nodes}
    out = []
    for name, group in zip(names, cap.partitions):
        inputs, outputs = boundary(group, nodes)
        try:
            program = compile_partition(name, [by_index[i] for i in group], inputs, outputs, target)
        except Exception as exc:  # noqa: BLE001 - report it, do not hide the partition
            skipped = [{"node": by_index[group[0]].name, "reason": f"compile failed: {type(exc).__name__}: {exc}"}]
            out.append(_partition_entry(name, None, [], target, 0, skipped))
            continue
        cost, unresolved = program.static_cost()
        unresolved_ids = {id(step) for step, _ in unresolved}
        steps = [s for s in program.steps if id(s) not in unresolved_ids]
        ops = [_op_entry(step, c, target) for step, c in zip(steps, cost.steps)]
        skipped = [{"node": step.node_name, "reason": reason} for step, reason in unresolved]
        out.append(_partition_entry(name, None, ops, target, 0, skipped))
    return out
