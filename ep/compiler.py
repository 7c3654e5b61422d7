"""Partition -> Program: run the fusion passes in the order ``kernels.fusion.PASSES`` declares them (QDQ units,
conv tails, attention, rotary, epilogues, sibling matmuls, RMS norms, norm prologues, ...), assign value slots,
prepare each kernel, plan slot lifetimes."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np

from ..context_cache.file_pages import release_weight_pages
from ..kernels.fusion import fuse_partition
from ..kernels.layout import assign_layouts
from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.registry import Prepared, kernel_for
from ..kernels.runtime import borrowed_from_ort
from ..kernels.target import Target
from ..log import escape
from .program import UNKNOWN_RANK, IoSpec, Program, Step


class CompileError(RuntimeError):
    """Compilation of a partition failed; the message names the node and op."""


def _io(values: Sequence[ValueInfo]) -> list[IoSpec]:
    return [IoSpec(v.name, v.dtype.name if v.dtype is not None else "?", v.shape) for v in values]


@np.errstate(all="ignore")  # folding constants (alpha into B, gamma into weights) yields IEEE inf/nan, no warnings
def compile_partition(name: str, nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo],
                      outputs: Sequence[ValueInfo], target: Target, *, record: bool = False) -> Program:
    """Compile the nodes of one partition; ``inputs``/``outputs`` are the fused node's I/O in ORT's order."""
    nodes = assign_layouts(fuse_partition(outputs_visible(nodes, {v.name for v in outputs}), target), target)
    slot: dict[str, int] = {v.name: i for i, v in enumerate(inputs)}
    steps: list[Step] = []
    for n in nodes:
        kernel = kernel_for(n.domain, n.op_type)
        if kernel is None:
            raise CompileError(f"partition '{name}': {n.describe()} has no NPU kernel")
        try:
            prepared = kernel.prepare(n, target)
        except Exception as exc:
            shapes = ", ".join(v.describe() for v in n.inputs if not v.missing)
            raise CompileError(f"partition '{name}': compiling {n.describe()} with inputs ({shapes}) failed: "
                               f"{type(exc).__name__}: {escape(str(exc))}") from exc
        prepared.target = target
        release_weight_pages(_read_initializers(n, prepared))
        in_slots = []
        for v in n.inputs:
            if v.missing or v.is_constant:
                in_slots.append(-1)
            elif v.name in slot:
                in_slots.append(slot[v.name])
            else:
                raise CompileError(f"partition '{name}': {n.describe()} reads '{escape(v.name)}', which is neither a "
                                   "partition input, a constant nor produced earlier in the partition")
        out_slots = []
        for v in n.outputs:
            if v.missing:
                out_slots.append(-1)
            else:
                slot[v.name] = len(slot)
                out_slots.append(slot[v.name])
        op = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
        declared = tuple(None if v.missing or v.is_constant else UNKNOWN_RANK if v.shape is None else tuple(v.shape)
                         for v in n.inputs)
        # the cost model needs every input's shape; constants are not runtime arguments, so the step keeps theirs
        const_shapes = {i: tuple(v.shape) for i, v in enumerate(n.inputs) if v.is_constant and v.shape is not None}
        steps.append(Step(n.name, op, kernel, prepared, tuple(in_slots), tuple(out_slots), declared=declared,
                          const_shapes=const_shapes))
    missing = [escape(v.name) for v in outputs if v.name not in slot]
    if missing:
        raise CompileError(f"partition '{name}': outputs {missing} are not produced by its nodes")
    output_slots = tuple(slot[v.name] for v in outputs)
    _plan_releases(steps, output_slots)
    return Program(name, _io(inputs), _io(outputs), steps, len(slot), output_slots, target, record=record)


def _read_initializers(node: NodeInfo, prepared: Prepared) -> list[np.ndarray]:
    """The node's initializers ORT holds that its prepared step does not read in place: ``prepare`` has made what
    it needs of them (level 4's int8 tiles from B, ...), so the pages of ORT's external-data mapping that reading
    them faulted in can go (``release_weight_pages``) instead of adding the file to the compile's peak RSS."""
    kept = [c for c in prepared.consts.values() if isinstance(c, np.ndarray) and borrowed_from_ort(c)]
    return [v.value for v in node.inputs
            if v.is_constant and isinstance(v.value, np.ndarray) and borrowed_from_ort(v.value)
            and not any(np.may_share_memory(v.value, c) for c in kept)]


def outputs_visible(nodes: Sequence[NodeInfo], names: Collection[str]) -> list[NodeInfo]:
    """The partition's nodes with the values ``names`` (its outputs) marked as graph outputs: to the fusion passes
    they are the outputs of the graph being compiled, so no pass absorbs a value that is read outside the
    partition."""
    out = []
    for n in nodes:
        if any(v.name in names and not v.is_graph_output for v in n.outputs):
            n = dataclasses.replace(n, outputs=tuple(dataclasses.replace(v, is_graph_output=True)
                                                     if v.name in names else v for v in n.outputs))
        out.append(n)
    return out


def _plan_releases(steps: list[Step], keep: tuple[int, ...]) -> None:
    """Free each intermediate slot right after its last reader, so peak host memory follows the NPU buffer plan."""
    last_use: dict[int, int] = {}
    for i, s in enumerate(steps):
        for slot in (*s.in_slots, *s.out_slots):
            if slot >= 0:
                last_use[slot] = i
    for slot in keep:
        last_use.pop(slot, None)
    by_step: dict[int, list[int]] = {}
    for slot, i in last_use.items():
        by_step.setdefault(i, []).append(slot)
    for i, s in enumerate(steps):
        s.release = tuple(sorted(by_step.get(i, ())))


def compile_parts(name: str, nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo],
                  target: Target):
    """A graph a kernel holds (If branch, Loop/Scan body) compiled into plain parts (``kernels.subprograms``)."""
    from .program_io import program_to_parts

    return program_to_parts(compile_partition(name, nodes, inputs, outputs, target))


def load_program(header, arrays, target: Target) -> Program:
    """A graph's program back from its parts (``kernels.subprograms.program``)."""
    from .program_io import program_from_parts

    return program_from_parts(header, arrays, target)


