"""``Scan`` (opset 9 and later) on the NPU: the body is compiled into a program of its own when the Scan is
compiled, and the Scan step runs it once per element of the scanned sequence.

The Scan node's inputs are the N initial state values, the M scanned inputs (``num_scan_inputs``), then its implicit
inputs (outer-scope values read anywhere in the body, appended by ``ep.graph_convert``). The body program's inputs
are the body's formal inputs (N states, M scan elements) followed by the outer-scope values it reads; its outputs
are N states and K scan-output elements. The node's outputs are the N final states and the K scan outputs.

Layout: scanned input j is sliced along ``scan_input_axes[j]`` (default 0, negative counts from the end), from the
last element first when ``scan_input_directions[j]`` is 1; scan output k stacks the per-iteration elements along
``scan_output_axes[k]`` of the output (rank + 1), in reverse iteration order when ``scan_output_directions[k]`` is
1. Every scanned input has the same length along its axis. Scan-8 (batch axis, ``sequence_lens``) is declined.

Cost: the body program's cost on its declared shapes (unknown dims as 1) per element of the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..node import NodeInfo
from .. import subprograms
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, stash_constants
from .control_flow import BranchGraph

BODY = "body"


def _body(node: NodeInfo) -> BranchGraph | None:
    g = node.attrs.get(BODY)
    return g if isinstance(g, BranchGraph) else None


def _layout(node: NodeInfo, body: BranchGraph) -> dict[str, Any]:
    """Counts, axes and directions from the attributes (defaults filled in), or ValueError naming the attribute."""
    n_scan_in = int(node.attr("num_scan_inputs", 0))
    n_state = len(body.inputs) - n_scan_in
    n_scan_out = len(body.outputs) - n_state
    if n_scan_in < 1 or n_state < 0 or n_scan_out < 0:
        raise ValueError(f"num_scan_inputs={n_scan_in} does not fit a body with {len(body.inputs)} inputs and "
                         f"{len(body.outputs)} outputs")
    if len(node.outputs) != n_state + n_scan_out:
        raise ValueError(f"the node has {len(node.outputs)} outputs, its body {n_state + n_scan_out}")

    def listed(name: str, count: int) -> list[int]:
        values = [int(v) for v in node.attr(name, None) or [0] * count]
        if len(values) != count:
            raise ValueError(f"{name} has {len(values)} entries, expected {count}")
        return values

    layout = {"n_state": n_state, "n_scan_in": n_scan_in, "n_scan_out": n_scan_out,
              "in_axes": listed("scan_input_axes", n_scan_in), "in_dirs": listed("scan_input_directions", n_scan_in),
              "out_axes": listed("scan_output_axes", n_scan_out),
              "out_dirs": listed("scan_output_directions", n_scan_out)}
    if any(d not in (0, 1) for d in (*layout["in_dirs"], *layout["out_dirs"])):
        raise ValueError("scan directions must be 0 (forward) or 1 (reverse)")
    return layout


def _check(node: NodeInfo, target: Target) -> str | None:
    reason = _body_reason(node, target)
    return None if reason is None else f"{reason}; the Scan stays on the CPU EP, its body goes to NpuEP as a graph"


def _body_reason(node: NodeInfo, target: Target) -> str | None:
    if 0 < node.since_version < 9:
        return f"{node.describe()}: Scan-{node.since_version} (batch axis, sequence_lens) is not supported; opset 9+"
    body = _body(node)
    if body is None:
        return f"{node.describe()}: its body graph is not visible to the EP"
    if not body.inputs:
        return f"{node.describe()}: the body's formal inputs are not visible to the EP (plugin shim too old)"
    try:
        _layout(node, body)
    except ValueError as exc:
        return f"{node.describe()}: {exc}"
    untyped = [v.name for v in (*node.outputs, *body.outputs) if not v.missing and v.dtype is None]
    if untyped:
        return f"{node.describe()}: {untyped[0]} is not a tensor of a known type"
    return body.reason(node, target, "its body")


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    body = _body(node)
    if body is None or not body.inputs:
        raise ValueError("the body graph or its formal inputs are not visible")
    attrs: dict[str, Any] = _layout(node, body)
    n_explicit = attrs["n_state"] + attrs["n_scan_in"]
    consts = {k: v for k, v in stash_constants(node).items() if int(k[2:]) < n_explicit}
    attrs["outer"] = {v.name: i for i, v in enumerate(node.inputs) if i >= n_explicit}
    attrs["scan_out"] = [[None if v.shape is None else [d if isinstance(d, int) and d >= 0 else 0 for d in v.shape],
                          v.dtype.name] for v in body.outputs[attrs["n_state"]:]]
    body.compile_into(node, BODY, target, attrs, consts)
    return Prepared(attrs, consts, target)


def _sequence_length(p: Prepared, scanned: Sequence[np.ndarray]) -> tuple[list[int], int]:
    axes, lengths = [], []
    for j, x in enumerate(scanned):
        axis = p.attrs["in_axes"][j]
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"Scan: scan_input_axes[{j}]={axis} is out of range for scanned input {j} of shape "
                             f"{list(x.shape)}")
        axes.append(axis % x.ndim)
        lengths.append(x.shape[axes[-1]])
    if len(set(lengths)) > 1:
        raise ValueError(f"Scan: scanned inputs have different lengths along their axes: {lengths}")
    return axes, lengths[0]


def _run(p: Prepared, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    n_state, n_scan_in = p.attrs["n_state"], p.attrs["n_scan_in"]
    body = subprograms.program(p, BODY)
    states = [arg(p, inputs, j) for j in range(n_state)]
    scanned = [np.asarray(arg(p, inputs, n_state + j)) for j in range(n_scan_in)]
    by_name = {name: arg(p, inputs, i) for name, i in p.attrs["outer"].items()}
    extra = body.inputs[n_state + n_scan_in:]
    missing = [io.name for io in extra if by_name.get(io.name) is None]
    if missing:
        raise ValueError(f"Scan: body '{body.name}' reads {missing}, which the Scan node does not receive")
    outer = [by_name[io.name] for io in extra]
    axes, length = _sequence_length(p, scanned)
    elements: list[list[np.ndarray]] = [[] for _ in range(p.attrs["n_scan_out"])]
    for t in range(length):
        sliced = [x[(slice(None),) * axes[j] + (length - 1 - t if p.attrs["in_dirs"][j] else t,)]
                  for j, x in enumerate(scanned)]
        outs = body(*states, *sliced, *outer)
        states = list(outs[:n_state])
        for k, value in enumerate(outs[n_state:]):
            elements[k].append(value)
    return [*states, *(_stack(p, k, values) for k, values in enumerate(elements))]


def _stack(p: Prepared, k: int, values: list[np.ndarray]) -> np.ndarray:
    shape, dtype = p.attrs["scan_out"][k]
    if p.attrs["out_dirs"][k]:
        values = values[::-1]
    rank = (values[0].ndim if values else len(shape or ())) + 1
    axis = p.attrs["out_axes"][k]
    if not -rank <= axis < rank:
        raise ValueError(f"Scan: scan_output_axes[{k}]={axis} is out of range for an output of rank {rank}")
    axis %= rank
    if values:
        if any(v.shape != values[0].shape for v in values):
            raise ValueError(f"Scan: scan output {k} changes shape across iterations "
                             f"({sorted({tuple(v.shape) for v in values})})")
        return np.stack(values, axis=axis)
    dims = list(shape or ())
    dims.insert(axis, 0)
    return np.zeros(tuple(dims), np.dtype(dtype))


def _cost(p: Prepared, in_shapes) -> OpCost:
    """One body run on its declared shapes (unknown dims as 1) per element of the scanned sequence."""
    first = in_shapes[p.attrs["n_state"]] if len(in_shapes) > p.attrs["n_state"] else None
    if first is None:
        first = p.runtime.const_shapes.get(p.attrs["n_state"])
    steps = 1
    if first:
        axis = p.attrs["in_axes"][0] % len(first)
        steps = first[axis] if isinstance(first[axis], int) and first[axis] >= 0 else 1
    body = subprograms.program(p, BODY).static_cost(unknown_dim=1)[0]
    return OpCost(compute_cycles=body.cycles * steps, cycles=body.cycles * steps, dma_bytes=body.dma_bytes * steps,
                  macs=sum(c.macs for c in body.steps) * steps, unit="vector")


SCAN = register(KernelDef("", "Scan", _prepare, _run, _cost, check=_check, rank_free=True))
