"""``Loop`` on the NPU: the body is compiled into a program of its own when the Loop is compiled, and the Loop step
runs it once per iteration; once bound, the iterations run in C++ (``ep/native/control_flow_steps.cc``), each a
call of the body program's own native call.

The Loop node's inputs are ``M`` (max trip count, optional), ``cond`` (optional), the N initial loop-carried values,
then its implicit inputs (outer-scope values read anywhere in the body, appended by ``ep.graph_convert``). The body
program's inputs are the body's formal inputs (iteration number, condition, N carried values) followed by the
outer-scope values it reads; its outputs are the body's (condition, N carried values, K scan outputs). The node's
outputs are the N final carried values and the K scan outputs, each the per-iteration values stacked on a new
leading axis.

Semantics (ONNX Loop, as ORT's CPU EP runs it): iterate while ``i < M`` (when M is given) and the condition holds
(true when ``cond`` is omitted). The body's condition output is the next condition even when ``cond`` is omitted:
the ONNX text says it is then ignored, ORT's CPU EP reads it, and ORT is the reference users compare with. With zero
iterations the carried values are the initial ones and a scan output is empty along its leading axis, with the
body output's inferred shape elsewhere (unknown dims as 0).

Cost: the body program's cost on its declared shapes, times the trip count of the run that first saw this input
signature (the cost model runs after that call), else the constant M, else one iteration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..node import NodeInfo
from .. import runtime, subprograms
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, stash_constants
from .control_flow import BranchGraph

BODY = "body"
_TRIPS = "trips"  # Prepared.kernel_cache key: trip count of the last run


def _body(node: NodeInfo) -> BranchGraph | None:
    g = node.attrs.get(BODY)
    return g if isinstance(g, BranchGraph) else None


def _check(node: NodeInfo, target: Target) -> str | None:
    reason = _body_reason(node, target)
    return None if reason is None else f"{reason}; the Loop stays on the CPU EP, its body goes to NpuEP as a graph"


def _body_reason(node: NodeInfo, target: Target) -> str | None:
    body = _body(node)
    if body is None:
        return f"{node.describe()}: its body graph is not visible to the EP"
    if len(body.inputs) < 2:
        return f"{node.describe()}: the body's formal inputs are not visible to the EP (plugin shim too old)"
    n_carried = len(body.inputs) - 2
    n_scan = len(body.outputs) - 1 - n_carried
    if n_scan < 0 or len(node.outputs) != n_carried + n_scan:
        return (f"{node.describe()}: body has {len(body.inputs)} inputs and {len(body.outputs)} outputs, which do not "
                f"match the node's {len(node.outputs)} outputs")
    untyped = [v.name for v in (*node.outputs, *body.outputs) if not v.missing and v.dtype is None]
    if untyped:
        return f"{node.describe()}: {untyped[0]} is not a tensor of a known type (sequence/optional loop state)"
    return body.reason(node, target, "its body")


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    body = _body(node)
    if body is None or len(body.inputs) < 2:
        raise ValueError("the body graph or its formal inputs are not visible")
    n_carried = len(body.inputs) - 2
    n_explicit = 2 + n_carried
    consts = stash_constants(node)  # M, cond or initial values may be constants; outer constants live in the body
    consts = {k: v for k, v in consts.items() if int(k[2:]) < n_explicit}
    attrs: dict[str, Any] = {
        "n_carried": n_carried,
        "outer": {v.name: i for i, v in enumerate(node.inputs) if i >= n_explicit},
        # the shape of an empty scan output: leading 0, the body output's inferred dims (unknown as 0)
        "empty_scan_shapes": [None if v.shape is None else [0, *(d if isinstance(d, int) and d >= 0 else 0
                                                                 for d in v.shape)]
                              for v in body.outputs[1 + n_carried:]],
        "scan_dtypes": [v.dtype.name for v in body.outputs[1 + n_carried:]],
    }
    body.compile_into(node, BODY, target, attrs, consts)
    return Prepared(attrs, consts, target)


def _scalar(x: np.ndarray, what: str):
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"Loop: {what} must be one element, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


def _run(p: Prepared, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    n_carried = p.attrs["n_carried"]
    body = subprograms.program(p, BODY)
    m, cond = arg(p, inputs, 0), arg(p, inputs, 1)
    trip_limit = None if m is None else int(_scalar(m, "M"))
    keep_going = True if cond is None else bool(_scalar(cond, "cond"))
    carried = [arg(p, inputs, 2 + j) for j in range(n_carried)]
    by_name = {name: arg(p, inputs, i) for name, i in p.attrs["outer"].items()}
    extra = body.inputs[2 + n_carried:]
    missing = [io.name for io in extra if by_name.get(io.name) is None]
    if missing:
        raise ValueError(f"Loop: body '{body.name}' reads {missing}, which the Loop node does not receive")
    outer = [by_name[io.name] for io in extra]
    cond_value = np.array(keep_going)
    scans: list[list[np.ndarray]] = [[] for _ in p.attrs["scan_dtypes"]]
    i = 0
    while keep_going and (trip_limit is None or i < trip_limit):
        outs = body(np.array(i, np.int64), cond_value, *carried, *outer)
        cond_value = np.asarray(outs[0])
        keep_going = bool(_scalar(cond_value, "the body's condition output"))
        carried = list(outs[1:1 + n_carried])
        for k, value in enumerate(outs[1 + n_carried:]):
            scans[k].append(value)
        i += 1
    p.kernel_cache[_TRIPS] = i
    return [*carried, *(_stack(p, k, values) for k, values in enumerate(scans))]


def _stack(p: Prepared, k: int, values: list[np.ndarray]) -> np.ndarray:
    if values:
        if any(v.shape != values[0].shape for v in values):
            raise ValueError(f"Loop: scan output {k} changes shape across iterations "
                             f"({sorted({tuple(v.shape) for v in values})})")
        return np.stack(values)
    shape = p.attrs["empty_scan_shapes"][k]
    return np.zeros((0,) if shape is None else tuple(shape), np.dtype(p.attrs["scan_dtypes"][k]))


def _bind(p: Prepared, inputs, outs):
    """The Loop as a native step: its iterations call the body program's own ProgramCall from C++, no Python frame
    per iteration (a loop with no iteration, or whose scan values change shape, runs this kernel)."""
    if runtime.native(p) is None:
        return None
    body = subprograms.program(p, BODY)
    n_carried = p.attrs["n_carried"]
    outer = [p.attrs["outer"].get(io.name) for io in body.inputs[2 + n_carried:]]
    if None in outer:
        return None
    return runtime.loop_step(p, body.native_call, n_carried, outer)


def _cost(p: Prepared, in_shapes) -> OpCost:
    """One body run on its declared shapes (unknown dims as 1) per iteration."""
    trips = p.kernel_cache.get(_TRIPS)
    if trips is None:
        m = p.consts.get("in0")
        trips = int(np.asarray(m).reshape(-1)[0]) if m is not None else 1
    body = subprograms.program(p, BODY).static_cost(unknown_dim=1)[0]
    return OpCost(compute_cycles=body.cycles * trips, cycles=body.cycles * trips, dma_bytes=body.dma_bytes * trips,
                  macs=sum(c.macs for c in body.steps) * trips, unit="vector")


LOOP = register(KernelDef("", "Loop", _prepare, _run, _cost, check=_check, rank_free=True, bind=_bind))
