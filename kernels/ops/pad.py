"""Pad: constant, reflect, edge and wrap modes, negative pads (crop), opset-18 ``axes``, opset-2 attributes.

``pads`` is ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]`` over ``axes`` (default every axis). A negative pad
removes elements: the input is cropped first and the crop is padded (what ORT does), so reflect/edge/wrap read the
cropped data. Reflect needs every padded axis longer than its pad (numpy would reflect repeatedly; ORT refuses).

Native: ``kernels.pad`` (kernels/native/pad.cc) writes the output axis by axis, each pad slab one memcpy of the
centre slab it mirrors or a fill of the value, for any dtype of 1, 2, 4 or 8 bytes (bits moved, so the result is
the reference's byte for byte); bound as the step for the input shape and pads it was bound for, into ORT's buffer
when the result is a partition output.

Cost: one DMA pass, the cropped input read and the output written (``movement.copy_cost``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..shape_memo import memo_per_shape
from ..target import Target
from .. import runtime
from ._util import arg, stash_constants
from ._vector import elems, itemsize_of
from .movement import copy_cost, movable, ort_buffer, runtime_ints, static_ints

_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    legacy = node.input(1) is None and node.attr("pads") is not None
    attrs: dict[str, Any] = {"mode": str(node.attr("mode", "constant")), "itemsize": itemsize_of(node.inputs[0]),
                             "pads": static_ints(node, 1, "pads"), "axes": static_ints(node, 3),
                             "legacy_value": float(node.attr("value", 0.0)) if legacy else None}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    mode = str(node.attr("mode", "constant"))
    if mode not in _MODES:
        return f"{node.describe()}: Pad mode {mode!r} unknown (constant, reflect, edge, wrap)"
    return None


def pad_widths(rank: int, pads: list[int], axes: list[int] | None) -> list[tuple[int, int]]:
    """Per-axis (begin, end) pads from ONNX ``pads`` over ``axes`` (negative axes allowed)."""
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad: {len(pads)} pads for {len(axes)} axes (need 2 per axis)")
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[i + len(axes)])
    return widths


Geometry = tuple[tuple[slice, ...], list[tuple[int, int]], list[tuple[int, int]]]


def _geometry(p: Prepared, inputs, x: np.ndarray) -> Geometry:
    """(crop index, per-axis (begin, end) growth, per-axis signed (begin, end) pads); made once per input shape when
    pads and axes are constants."""
    if all(v is None for v in inputs[1:2] + inputs[3:4]):
        return memo_per_shape(p, "pad_geometry", x.shape, _geometry_of, p, inputs, x.shape)
    return _geometry_of(p, inputs, x.shape)


def _geometry_of(p: Prepared, inputs, shape: tuple[int, ...]) -> Geometry:
    widths = pad_widths(len(shape), runtime_ints(p, inputs, "pads", 1), runtime_ints(p, inputs, "axes", 3))
    crop = tuple(slice(-b if b < 0 else 0, shape[i] + e if e < 0 else None) for i, (b, e) in enumerate(widths))
    return crop, [(max(b, 0), max(e, 0)) for b, e in widths], widths


def _constant_value(p: Prepared, inputs, dtype: np.dtype) -> np.ndarray | None:
    """Constant mode's value as one element of ``dtype`` (the legacy attribute or input 2), None when omitted (0)."""
    if p.attrs["legacy_value"] is not None:
        return np.asarray(p.attrs["legacy_value"]).reshape(1).astype(dtype)
    v = arg(p, inputs, 2)
    return None if v is None else np.asarray(v).reshape(-1)[:1].astype(dtype)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    """The reference's crop and pad; on the native kernels ``kernels.pad`` (the same bytes)."""
    x = arg(p, inputs, 0)
    crop, grow, widths = _geometry(p, inputs, x)
    mode = p.attrs["mode"]
    value = _constant_value(p, inputs, x.dtype) if mode == "constant" else None
    nat = runtime.native(p)
    if nat is not None and movable(x) and x.ndim:
        begins, ends = (list(w) for w in zip(*widths))
        return [nat.pad(x, begins, ends, mode, value, None, runtime.threads(p))]
    x = x[crop]
    if not any(b or e for b, e in grow):
        return [x]
    if mode == "constant":
        return [padded(x, grow, "constant", np.zeros((), x.dtype) if value is None else value[0])]
    for i, (b, e) in enumerate(grow):
        if (b or e) and x.shape[i] == 0:
            raise ValueError(f"Pad: mode {mode} cannot pad empty axis {i} of shape {x.shape}")
        if mode == "reflect" and (b or e) and max(b, e) >= x.shape[i]:
            raise ValueError(f"Pad: reflect pads {(b, e)} need axis {i} longer than them, shape {x.shape}")
    return [padded(x, grow, mode) if mode != "wrap" else np.pad(x, grow, mode="wrap")]


def padded(x: np.ndarray, grow: list[tuple[int, int]], mode: str, value: Any = 0) -> np.ndarray:
    """``np.pad(x, grow, mode)`` for constant, reflect (pads shorter than the axis) and edge, element for element:
    the centre copied once, then each axis' borders filled over the earlier axes' full (padded) extent, as np.pad
    does, without np.pad's per-call Python (~30 us on a speech model's 1-D reflect pad)."""
    y = np.empty([d + b + e for d, (b, e) in zip(x.shape, grow)], x.dtype)
    centre = tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, grow))
    y[centre] = x
    for axis, (b, e) in enumerate(grow):
        if not (b or e):
            continue
        d = x.shape[axis]
        tail = centre[axis + 1:]
        full = (slice(None),) * axis

        def at(s: slice) -> tuple:
            return full + (s,) + tail  # noqa: B023 - called in this iteration only
        if mode == "constant":
            y[at(slice(0, b))] = value
            y[at(slice(b + d, None))] = value
        elif mode == "edge":
            y[at(slice(0, b))] = y[at(slice(b, b + 1))]
            y[at(slice(b + d, None))] = y[at(slice(b + d - 1, b + d))]
        else:  # reflect: position b - 1 - k mirrors b + 1 + k, b + d + k mirrors b + d - 2 - k
            stop = b + d - 2 - e
            y[at(slice(0, b))] = y[at(slice(2 * b, b, -1))]
            y[at(slice(b + d, None))] = y[at(slice(b + d - 2, stop if stop >= 0 else None, -1))]
    return y


def _bind(p: Prepared, inputs, outs):
    """Pad as one ``kernels.pad`` call for this input shape and these pads/axes (runtime ones must hold their bound
    values), a runtime constant value put in per call, into ORT's buffer when the result is a partition output."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    if nat is None or not movable(x) or not x.ndim:
        return None
    fixed = [(i, np.array(inputs[i], order="C")) for i in (1, 3) if i < len(inputs) and inputs[i] is not None]
    if any(v.nbytes > runtime.FIXED_INPUT_BYTES for _, v in fixed):
        return None
    widths = _geometry(p, inputs, x)[2]
    begins, ends = (tuple(w) for w in zip(*widths))
    mode = p.attrs["mode"]
    live = [(0, 0, x.dtype, x.shape, None, True)]
    value = _constant_value(p, inputs, x.dtype) if mode == "constant" else None
    runtime_value = mode == "constant" and p.attrs["legacy_value"] is None and len(inputs) > 2 and inputs[2] is not None
    if runtime_value:
        v = inputs[2]
        if not isinstance(v, np.ndarray) or v.dtype != x.dtype or v.size != 1:
            return None
        live.append((4, 2, v.dtype, v.shape, None, True))
        value = None
    return runtime.call_step(p, nat.pad, (None, begins, ends, mode, value, None, runtime.threads(p)), live,
                             [(-1, None)], None, ort_buffer(p, outs, 5), fixed)


def _cost(p: Prepared, shapes) -> OpCost:
    size, x = p.attrs["itemsize"], shapes[0]
    pads = p.attrs["pads"]
    if pads is None:  # runtime pads: count the input twice
        return copy_cost(p, elems(x) * size, elems(x) * size)
    widths = pad_widths(len(x), pads, p.attrs["axes"])
    kept = [d + min(b, 0) + min(e, 0) for d, (b, e) in zip(x, widths)]
    out = [d + b + e for d, (b, e) in zip(x, widths)]
    return copy_cost(p, elems(kept) * size, elems(out) * size)


register(KernelDef("", "Pad", _prepare, _run, _cost, _check, bind=_bind))
