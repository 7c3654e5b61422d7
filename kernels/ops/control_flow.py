"""``If`` on the NPU: both branches are compiled into programs of their own when the If is compiled, and the If step
runs the program its condition selects, with the outer-scope values that branch reads. Once bound, the choice is
made in the program's C++ loop (``ep/native/control_flow_steps.cc``): the branch program runs on its own native call.

The If node's inputs are its condition followed by its implicit inputs (the outer-scope values read anywhere in
its branches, nested Ifs included; ``ep.graph_convert`` appends them), so the partition holding the If receives
them like any other input. A branch's program is stored as plain parts (``ep.program_io``) in the step's attrs and
consts, so a cached or EPContext program rebuilds it without compiling again.

Cost: the costlier branch program's cost on its declared shapes (the same cost model as every partition).
Compiling and reloading branches goes through ``kernels.subprograms``, which the compiler fills in.

``BranchGraph`` (a branch or body as the shim exports it: nodes, formal inputs, outputs) is shared with ``Loop``
(``loop.py``) and ``Scan`` (``scan.py``): its outer-scope values, why a target cannot run it, how it compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..node import NodeInfo, ValueInfo
from .. import runtime, subprograms
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg

BRANCHES = ("then_branch", "else_branch")


@dataclasses.dataclass(frozen=True)
class BranchGraph:
    """A branch/body graph as the plugin shim exports it (``graph_view.h`` DescribeGraph)."""

    name: str
    nodes: tuple[NodeInfo, ...]
    outputs: tuple[ValueInfo, ...]
    inputs: tuple[ValueInfo, ...] = ()  # formal inputs in order (a Loop/Scan body's; an If branch has none)

    def outer_values(self) -> list[ValueInfo]:
        """Runtime values the graph reads (or returns) but neither produces nor receives as formal inputs: the outer
        scope, in order of first use."""
        local = {v.name for n in self.nodes for v in n.outputs if not v.missing} | {v.name for v in self.inputs}
        seen: dict[str, ValueInfo] = {}
        for v in (*(v for n in self.nodes for v in n.inputs), *self.outputs):
            if not v.missing and not v.is_constant and v.name not in local and v.name not in seen:
                seen[v.name] = v
        return list(seen.values())

    def program_inputs(self) -> list[ValueInfo]:
        """The inputs of this graph's compiled program: its formal inputs, then its outer-scope values."""
        return [*self.inputs, *self.outer_values()]

    def reason(self, owner: NodeInfo, target: Target, what: str) -> str | None:
        """Why ``owner`` cannot run this graph (``what``: 'a branch', 'its body') on ``target``, naming the op."""
        local = {v.name for n in self.nodes for v in n.outputs if not v.missing} | {v.name for v in self.inputs}
        for out in self.outputs:
            if out.name not in local and out.is_constant:
                return f"{owner.describe()}: {what} returns the constant '{out.name}' without computing it"
        ops = self.blocking_ops(target)
        if not ops:
            return None
        held = f"a {ops[0]} node" if len(ops) == 1 else f"{', '.join(ops)} nodes"
        return f"{owner.describe()}: {what} holds {held} target {target.name} does not run"

    def blocking_ops(self, target: Target) -> list[str]:
        """The op types in this graph (nested graphs included) that ``target`` does not run, first seen first.

        Each blocking node's own reason is reported with its graph. A nested If/Loop/Scan is named by what blocks
        inside it. When the graph holding the owner is offered, ORT has already fused the subgraph's claimed nodes
        (domain = the EP's name): the ops left over are named."""
        from ..support import why_not

        blocking = [n for n in self.nodes if why_not(n, target) is not None]
        ops: list[str] = []
        for n in blocking:
            if _fused(n):
                continue
            inner = [op for g in n.attrs.values() if isinstance(g, BranchGraph) for op in g.blocking_ops(target)]
            ops += inner or [n.op_type]
        return list(dict.fromkeys(ops)) or [n.op_type for n in blocking[:1]]

    def compile_into(self, owner: NodeInfo, attr: str, target: Target, attrs: dict[str, Any],
                     consts: dict[str, np.ndarray]) -> None:
        """Compile this graph into a program stored as plain parts under ``attr`` of the owner's Prepared
        (``kernels.subprograms.program`` loads it back)."""
        header, arrays = subprograms.compile_parts(f"{owner.name}/{attr}", list(self.nodes), self.program_inputs(),
                                                   list(self.outputs), target)
        attrs[attr] = header
        consts.update({f"{attr}/{k}": v for k, v in arrays.items()})

    def cache_digest(self) -> str:
        """Everything in the branch that changes its compiled program (compile-cache key part)."""
        from ...context_cache.keys import cache_key

        parts: list[Any] = [self.name, [[v.name, str(v.dtype), _shape(v.shape)] for v in self.outputs],
                            [[v.name, str(v.dtype), _shape(v.shape)] for v in self.inputs]]
        for n in self.nodes:
            parts.append({"op": [n.domain, n.op_type],
                          "attrs": {k: (v.cache_digest() if isinstance(v, BranchGraph) else _plain(v))
                                    for k, v in sorted(n.attrs.items())},
                          "in": [[v.name, str(v.dtype), _shape(v.shape), v.is_constant] for v in n.inputs],
                          "out": [[v.name, str(v.dtype), _shape(v.shape)] for v in n.outputs]})
            parts.extend(np.asarray(v.value) for v in n.inputs if v.value is not None)
        return cache_key(*parts)


def _fused(n: NodeInfo) -> bool:
    """A node ORT made of an EP's partition (op ``<EP>_<hash>_<i>`` in domain ``<EP>``)."""
    return bool(n.domain) and n.op_type.startswith(f"{n.domain}_")


def _shape(shape) -> list | None:
    return None if shape is None else [d if d is not None else "?" for d in shape]


def _plain(v: Any) -> Any:
    if hasattr(v, "tolist"):
        return {"tensor": v.tolist(), "dtype": str(v.dtype)}
    if isinstance(v, bytes):
        return v.hex()
    return v


def branches(node: NodeInfo) -> dict[str, BranchGraph] | None:
    """The If's branch graphs, or None when the shim did not export them."""
    found = {a: node.attrs.get(a) for a in BRANCHES}
    return found if all(isinstance(g, BranchGraph) for g in found.values()) else None  # type: ignore[return-value] - all() checked


def _check(node: NodeInfo, target: Target) -> str | None:
    reason = _branch_reason(node, target)
    return None if reason is None else f"{reason}; the If stays on the CPU EP, its branches go to NpuEP as graphs"


def _branch_reason(node: NodeInfo, target: Target) -> str | None:
    graphs = branches(node)
    if graphs is None:
        return f"{node.describe()}: its branch graphs are not visible to the EP"
    for g in graphs.values():
        produced = {v.name for n in g.nodes for v in n.outputs}
        if any(out.name not in produced for out in g.outputs):
            return f"{node.describe()}: a branch returns an outer-scope value without computing it"
        reason = g.reason(node, target, "a branch")
        if reason is not None:
            return reason
    return None


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    graphs = branches(node)
    if graphs is None:
        raise ValueError("branch graphs are not visible")
    consts: dict[str, np.ndarray] = {}  # constant outer-scope values live in the branch programs that read them
    attrs: dict[str, Any] = {"outer": [v.name for v in node.inputs[1:]], "n_outputs": len(node.outputs)}
    for attr, g in graphs.items():
        g.compile_into(node, attr, target, attrs, consts)
    return Prepared(attrs, consts, target)


def _branch_call(p: Prepared, attr: str) -> tuple[Any, tuple[int, ...], tuple[int, ...] | None]:
    """The branch's program, the If input that carries each program input, and, for a branch that only forwards
    outer values (Identity steps: exporters' pass-through branches), the If input each output is; looked up once
    per branch."""
    calls = p.kernel_cache.setdefault("branch_calls", {})
    found = calls.get(attr)
    if found is None:
        program = subprograms.program(p, attr)
        position = {name: i + 1 for i, name in enumerate(p.attrs["outer"])}
        missing = [io.name for io in program.inputs if io.name not in position]
        if missing:
            raise ValueError(f"If: branch '{program.name}' reads {missing}, which the If node does not receive")
        positions = tuple(position[io.name] for io in program.inputs)
        forwarded = forwarded_inputs(program)
        found = calls[attr] = (program, positions,
                               None if forwarded is None else tuple(positions[k] for k in forwarded))
    return found


def _lend_outputs(p: Prepared) -> None:
    """The If's outputs that are outputs of the partition are computed by the branch's steps straight into ORT's
    buffers (``Program.mark_partition_outputs`` through the If's own marks), so the If's result is not copied;
    stamped again whenever the If's runtime record changes."""
    if p.kernel_cache.get("lent") == p.runtime.generation:
        return
    where = p.runtime.partition_outputs or {}
    for attr in BRANCHES:
        program = subprograms.program(p, attr)
        first: dict[int, int] = {}
        for j, slot in enumerate(program.output_slots):
            if j in where:
                first.setdefault(slot, where[j])
        for st in program.steps:
            st.prepared.runtime.partition_outputs = {i: first[s] for i, s in enumerate(st.out_slots)
                                                     if s in first} or None
    p.kernel_cache["lent"] = p.runtime.generation


def forwarded_inputs(program: Any) -> tuple[int, ...] | None:
    """Per program output, the program input it is, when every step is an Identity (the program computes nothing);
    else None. A program's input k lives in slot k."""
    source = {k: k for k in range(len(program.inputs))}  # slot -> program input
    for st in program.steps:
        if st.op != "Identity" or not st.in_slots or st.in_slots[0] not in source:
            return None
        for slot in st.out_slots:
            if slot >= 0:
                source[slot] = source[st.in_slots[0]]
    if any(s not in source for s in program.output_slots):
        return None
    return tuple(source[s] for s in program.output_slots)


def _run(p: Prepared, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    cond = arg(p, inputs, 0)
    if cond is None or cond.size != 1:
        raise ValueError(f"If: condition must be one element, got shape {None if cond is None else cond.shape}")
    _lend_outputs(p)
    program, positions, forwarded = _branch_call(p, BRANCHES[0] if cond.reshape(-1)[0] else BRANCHES[1])
    args = [inputs[i] if i < len(inputs) else None for i in positions]
    for a in args:
        if a is None:
            missing = [io.name for io, a in zip(program.inputs, args) if a is None]
            raise ValueError(f"If: branch '{program.name}' reads {missing}, which the If node does not receive")
    if forwarded is not None:  # the branch only forwards outer values: no program call
        return [inputs[i] for i in forwarded]
    return list(program(*args))


def _bind(p: Prepared, inputs, outs):
    """The If as a native step: the condition picks a branch in the program's C++ loop, which calls the branch
    program's own ProgramCall (or forwards the If inputs a pass-through branch returns) with no Python frame."""
    if runtime.native(p) is None:
        return None
    _lend_outputs(p)
    picks = []
    for attr in BRANCHES:
        program, positions, forwarded = _branch_call(p, attr)
        picks.append((None, list(forwarded)) if forwarded is not None else (program.native_call, list(positions)))
    return runtime.branch_step(p, picks)


def _cost(p: Prepared, in_shapes) -> OpCost:
    """The costlier branch on its declared shapes (unknown dims as 1): which one runs is known only per call."""
    costs = [subprograms.program(p, attr).static_cost(unknown_dim=1)[0] for attr in BRANCHES]
    worst = max(costs, key=lambda c: c.cycles)
    return OpCost(compute_cycles=worst.cycles, cycles=worst.cycles, dma_bytes=worst.dma_bytes,
                  macs=sum(c.macs for c in worst.steps), unit="vector")


IF = register(KernelDef("", "If", _prepare, _run, _cost, check=_check, rank_free=True, bind=_bind))
