"""``If`` on the NPU: both branches are compiled into programs of their own when the If is compiled, and the If step
runs the program its condition selects, with the outer-scope values that branch reads.

The If node's inputs are its condition followed by its implicit inputs (the outer-scope values read anywhere in
its branches, nested Ifs included; ``ep.graph_convert`` appends them), so the partition holding the If receives
them like any other input. A branch's program is stored as plain parts (``ep.program_io``) in the step's attrs and
consts, so a cached or EPContext program rebuilds it without compiling again.

Cost: the costlier branch program's cost on its declared shapes (the same cost model as every partition).
Compiling and reloading branches goes through ``kernels.subprograms``, which the compiler fills in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..node import NodeInfo, ValueInfo
from .. import subprograms
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

    def outer_values(self) -> list[ValueInfo]:
        """Runtime values the branch reads but does not produce (outer scope), in order of first use."""
        produced = {v.name for n in self.nodes for v in n.outputs if not v.missing}
        seen: dict[str, ValueInfo] = {}
        for n in self.nodes:
            for v in n.inputs:
                if not v.missing and not v.is_constant and v.name not in produced and v.name not in seen:
                    seen[v.name] = v
        return list(seen.values())

    def cache_digest(self) -> str:
        """Everything in the branch that changes its compiled program (compile-cache key part)."""
        from ...context_cache.keys import cache_key

        parts: list[Any] = [self.name, [[v.name, str(v.dtype), _shape(v.shape)] for v in self.outputs]]
        for n in self.nodes:
            parts.append({"op": [n.domain, n.op_type],
                          "attrs": {k: (v.cache_digest() if isinstance(v, BranchGraph) else _plain(v))
                                    for k, v in sorted(n.attrs.items())},
                          "in": [[v.name, str(v.dtype), _shape(v.shape), v.is_constant] for v in n.inputs],
                          "out": [[v.name, str(v.dtype), _shape(v.shape)] for v in n.outputs]})
            parts.extend(np.asarray(v.value) for v in n.inputs if v.value is not None)
        return cache_key(*parts)


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
    return found if all(isinstance(g, BranchGraph) for g in found.values()) else None  # type: ignore[return-value]


def _check(node: NodeInfo, target: Target) -> str | None:
    reason = _branch_reason(node, target)
    return None if reason is None else f"{reason}; the If stays on the CPU EP, its branches go to NpuEP as graphs"


def _branch_reason(node: NodeInfo, target: Target) -> str | None:
    from ..support import why_not

    graphs = branches(node)
    if graphs is None:
        return f"{node.describe()}: its branch graphs are not visible to the EP"
    for attr, g in graphs.items():
        produced = {v.name for n in g.nodes for v in n.outputs}
        for out in g.outputs:
            if out.name not in produced:
                return f"{node.describe()}: a branch returns an outer-scope value without computing it"
        for n in g.nodes:
            reason = why_not(n, target)
            if reason is not None:  # that node's own reason is reported with its branch graph
                return f"{node.describe()}: a branch holds a {n.op_type} node target {target.name} does not run"
    return None


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    graphs = branches(node)
    if graphs is None:
        raise ValueError("branch graphs are not visible")
    consts: dict[str, np.ndarray] = {}  # constant outer-scope values live in the branch programs that read them
    attrs: dict[str, Any] = {"outer": [v.name for v in node.inputs[1:]], "n_outputs": len(node.outputs)}
    for attr, g in graphs.items():
        header, arrays = subprograms.compile_parts(f"{node.name}/{attr}", list(g.nodes), g.outer_values(),
                                                   list(g.outputs), target)
        attrs[attr] = header
        consts.update({f"{attr}/{k}": v for k, v in arrays.items()})
    return Prepared(attrs, consts, target)


def _branch_program(p: Prepared, attr: str):
    program = p.memo.get(attr)
    if program is None:
        prefix = f"{attr}/"
        arrays = {k[len(prefix):]: v for k, v in p.consts.items() if k.startswith(prefix)}
        program = p.memo[attr] = subprograms.load_program(p.attrs[attr], arrays, p.target)
    return program


def _run(p: Prepared, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    cond = arg(p, inputs, 0)
    if cond is None or np.asarray(cond).size != 1:
        raise ValueError(f"If: condition must be one element, got shape {None if cond is None else cond.shape}")
    program = _branch_program(p, BRANCHES[0] if bool(np.asarray(cond).reshape(-1)[0]) else BRANCHES[1])
    outer = {name: arg(p, inputs, i + 1) for i, name in enumerate(p.attrs["outer"])}
    missing = [io.name for io in program.inputs if outer.get(io.name) is None]
    if missing:
        raise ValueError(f"If: branch '{program.name}' reads {missing}, which the If node does not receive")
    return list(program(*[outer[io.name] for io in program.inputs]))


def _cost(p: Prepared, in_shapes) -> OpCost:
    """The costlier branch on its declared shapes (unknown dims as 1): which one runs is known only per call."""
    costs = [_branch_program(p, attr).static_cost(unknown_dim=1)[0] for attr in BRANCHES]
    worst = max(costs, key=lambda c: c.cycles)
    return OpCost(compute_cycles=worst.cycles, cycles=worst.cycles, dma_bytes=worst.dma_bytes,
                  macs=sum(c.macs for c in worst.steps), unit="vector")


IF = register(KernelDef("", "If", _prepare, _run, _cost, check=_check, rank_free=True))
