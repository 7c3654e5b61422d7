"""``npu::RotateHalf``: ``x * cos + concat(-x[..., h/2:], x[..., :h/2]) * sin``, the rotary embedding as exporters
write it out (``kernels.fusion.rotary``).

Inputs x, cos, sin (float32), then the two Slices' bounds (start, end, start, end: one-element integers, constants
or run-time values). Attributes: the Slices' ``axis``, the Concat's ``concat_axis``: the fused ops exactly, whatever
x's shape and the bounds turn out to be at run time.

Reference: the unfused ops' numpy calls in their order (the two slices, negative, concatenate, multiply, multiply,
add), so the reference model computes what the unfused kernels compute, bit for bit, at any shape.

Native (``kernels.rotate_half``): where both axes are x's last, the bounds are 0, h/2, h/2 and at least h for x's
last dim h, and cos and sin (rank <= 4) broadcast to x's shape with that last dim; on the session's threads (a
bound step holds run-time bounds to the values it was bound for). Each element is the same float32 operations in
the same order (no multiply-add contraction): the reference's bits.

Cost: x, cos and sin streamed through the vector unit once (two multiplies and an add per element).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fusion.rotary import FUSED_DOMAIN, FUSED_OP
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import stream_cost

_F32 = np.dtype(np.float32)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {k: int(node.attrs[k]) for k in ("axis", "concat_axis")}
    return Prepared({**attrs, "fused_nodes": list(node.attrs.get("fused_nodes", []))}, stash_constants(node), target)


_BOUNDS = 3  # inputs from here: start and end of the first Slice, then of the second


def _bounds(p: Prepared, inputs) -> list[int]:
    return [int(np.asarray(arg(p, inputs, i)).reshape(())) for i in range(_BOUNDS, _BOUNDS + 4)]


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x, cos, sin = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    at = p.attrs
    axis = at["axis"] % x.ndim
    start1, end1, start2, end2 = _bounds(p, inputs)
    first = x[(slice(None),) * axis + (slice(start1, end1),)]
    second = x[(slice(None),) * axis + (slice(start2, end2),)]
    rotated = np.concatenate([np.negative(second), first], axis=at["concat_axis"])
    return [np.add(np.multiply(x, cos), np.multiply(rotated, sin))]


def _bind(p: Prepared, inputs, outs) -> Any:
    """The native kernel as one call for these shapes, where it computes the fused ops (module docstring)."""
    nat = runtime.native(p)
    values = [arg(p, inputs, i) for i in range(3)]
    if nat is None or not all(isinstance(v, np.ndarray) and v.dtype == _F32 and v.ndim <= 4 for v in values):
        return None
    x, at = values[0], p.attrs
    fixed = runtime.fixed_inputs(inputs, _BOUNDS)  # run-time bounds: the step is bound for their values
    if x.ndim == 0 or fixed is None:
        return None
    start1, half, start2, end2 = _bounds(p, inputs)
    if (at["axis"] % x.ndim != x.ndim - 1 or at["concat_axis"] % x.ndim != x.ndim - 1 or start1 != 0
            or start2 != half or x.shape[-1] != 2 * half or end2 < x.shape[-1]
            or np.broadcast_shapes(*(v.shape for v in values)) != x.shape
            or any(v.shape[-1:] != x.shape[-1:] for v in values[1:])):
        return None
    live = [(i, i, _F32, v.shape, None, True) for i, v in enumerate(values) if i < len(inputs)
               and inputs[i] is not None]
    args = tuple(None if i < len(inputs) and inputs[i] is not None else v for i, v in enumerate(values))
    return runtime.call_step(p, nat.rotate_half, (*args, half, runtime.threads(p)), live, [(-1, None)],
                             fixed=fixed)


def _cost(p: Prepared, shapes) -> OpCost:
    x = tuple(shapes[0])
    n = int(np.prod(x, dtype=np.int64))
    b_in = sum(nbytes(tuple(s), 4) for s in shapes[:3] if s is not None)
    return stream_cost(p, n, b_in, n * 4, 3.0)


def _check(node: NodeInfo, target: Target) -> str | None:
    if any(v.dtype != _F32 for v in node.inputs[:3]):
        return f"{node.describe()}: float32 operands only"
    return None


register(KernelDef(FUSED_DOMAIN, FUSED_OP, _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
