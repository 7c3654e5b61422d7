"""Selection and scans on the vector unit: ArgMax/ArgMin (keepdims, select_last_index), TopK (largest/smallest,
K as input or opset-1 attribute) and CumSum (exclusive, reverse).

Ties: ArgMax/ArgMin take the first index (the last with ``select_last_index=1``); over NaN they follow ORT's CPU
kernel (``_arg_scan_with_nan``). TopK orders equal values by ascending index, as ORT. ``sorted=0`` leaves the order
to the implementation (ONNX); this kernel returns the sorted order. TopK ranks with a stable argsort of the values
(floats negated, integers bit-inverted for "largest", which reverses their order without overflow). CumSum
accumulates sequentially along the axis in the input dtype (float16: float32, one rounding on store), like ORT's
loop.

Native: ArgMax/ArgMin of float32/float16/int32/int64/int8/uint8 run and bind ``arg_extreme`` (reduce.cc) on x viewed
as [outer, n, inner], with the same ties and NaN rules (exact); TopK of those dtypes ``topk`` (select.cc: a
selection per row, the same order as the stable argsort, NaN last; exact); CumSum of float32/float16/int32/int64
``cumsum`` (select.cc: the same sequential sums, float16 rounded once per output, integers wrapping; exact).

Cost: ArgMax/CumSum one vector op per element; TopK ``log2(axis length)`` compare-exchange ops per element (a
sorting network); DMA reads the input and writes the outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen
from .movement import runtime_ints, static_ints


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    op = node.op_type
    attrs: dict[str, Any] = {"op": op, "itemsize": itemsize_of(node.inputs[0]),
                             "axis": int(node.attr("axis", -1 if op == "TopK" else 0)),
                             "keepdims": int(node.attr("keepdims", 1)),
                             "last": int(node.attr("select_last_index", 0)),
                             "largest": int(node.attr("largest", 1)),
                             "exclusive": int(node.attr("exclusive", 0)), "reverse": int(node.attr("reverse", 0)),
                             "k": static_ints(node, 1, "k") if op == "TopK" else None,
                             "scan_axis": static_ints(node, 1) if op == "CumSum" else None}
    return Prepared(attrs, stash_constants(node), target)


_ARG_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float16, np.int32, np.int64, np.int8, np.uint8))


def _arg_native(p: Prepared, x: np.ndarray) -> tuple | None:
    """``arg_extreme``'s arguments after x for this ArgMax/ArgMin (native kernels, a non-empty C-contiguous x of
    rank >= 1 and a dtype it takes), else None."""
    if (runtime.native(p) is None or not isinstance(x, np.ndarray) or x.dtype not in _ARG_DTYPES or x.ndim == 0
            or not x.size or not x.flags.c_contiguous):
        return None
    axis = p.attrs["axis"] % x.ndim
    last = bool(p.attrs["last"])
    view = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    return (*view, p.attrs["op"] == "ArgMax", last, x.ndim == 1 and not last, runtime.threads(p))


def _arg_shape(p: Prepared, shape: tuple[int, ...]) -> tuple[int, ...]:
    axis = p.attrs["axis"] % len(shape)
    return tuple(1 if i == axis else d for i, d in enumerate(shape) if p.attrs["keepdims"] or i != axis)


def _arg_bind(p: Prepared, inputs, outs):
    """ArgMax/ArgMin as one ``arg_extreme`` call for this input shape."""
    x = inputs[0] if inputs else None
    args = _arg_native(p, x)
    if args is None or outs[0].ndim == 0:
        return None  # a 0-d result: a call step reshapes only to a shape of rank >= 1
    return runtime.call_step(p, runtime.native(p).arg_extreme, (None, *args), [(0, 0, x.dtype, x.shape, None)],
                             [(-1, outs[0].shape)])


def _arg_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    args = _arg_native(p, x)
    if args is not None:
        return [runtime.native(p).arg_extreme(x, *args).reshape(_arg_shape(p, x.shape))]
    axis = p.attrs["axis"] % x.ndim
    is_max = p.attrs["op"] == "ArgMax"
    last = bool(p.attrs["last"])
    pick = np.argmax if is_max else np.argmin
    idx = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis) if last else pick(x, axis=axis)
    # NaN anywhere in x makes its maximum NaN: one flat pass, no boolean temporary as isnan(x).any() makes
    if x.dtype.kind == "f" and (x.ndim > 1 or last) and x.size and np.isnan(np.maximum.reduce(x.reshape(-1))):
        idx = _arg_scan_with_nan(x, axis, is_max, last)
    idx = idx.astype(np.int64, copy=False)
    return [np.expand_dims(idx, axis) if p.attrs["keepdims"] else np.asarray(idx)]


def _arg_scan_with_nan(x: np.ndarray, axis: int, is_max: bool, last: bool) -> np.ndarray:
    """ArgMax/ArgMin of a float ``x`` holding NaN, as ORT's CPU kernel: along the axis it keeps the first element and
    replaces it by each later one that compares greater (less; or equal too with select_last_index). Every
    comparison with NaN is false, so a NaN first element wins its row (index 0) and a later NaN is never picked.
    (A rank-1 input without select_last_index goes through Eigen's maxCoeff instead, which returns the first NaN:
    numpy's argmax/argmin, the caller's path.)"""
    nan = np.isnan(x)
    extreme = (np.maximum if is_max else np.minimum).reduce(
        np.where(nan, x.dtype.type(-np.inf if is_max else np.inf), x), axis=axis, keepdims=True)
    hit = x == extreme  # never true at a NaN
    idx = x.shape[axis] - 1 - np.argmax(np.flip(hit, axis), axis=axis) if last else np.argmax(hit, axis=axis)
    return np.where(np.take(nan, 0, axis=axis), 0, idx)


def _topk_native(p: Prepared, x: np.ndarray, k: int) -> tuple | None:
    """``topk``'s arguments after x (native kernels, a non-empty C-contiguous x of rank >= 1 and a dtype it takes,
    a k within the axis), else None."""
    if (runtime.native(p) is None or not isinstance(x, np.ndarray) or x.dtype not in _ARG_DTYPES or x.ndim == 0
            or not x.size or not x.flags.c_contiguous):
        return None
    axis = p.attrs["axis"] % x.ndim
    if not 0 <= k <= x.shape[axis]:
        return None
    view = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    return (*view, k, bool(p.attrs["largest"]), runtime.threads(p))


def _topk_shape(p: Prepared, shape: tuple[int, ...], k: int) -> tuple[int, ...]:
    axis = p.attrs["axis"] % len(shape)
    return (*shape[:axis], k, *shape[axis + 1:])


def _topk_bind(p: Prepared, inputs, outs):
    """TopK as one ``topk`` call for this input shape; a runtime K is held to its bound value (a fixed input)."""
    x = inputs[0] if inputs else None
    fixed = [] if p.attrs["k"] is not None else runtime.fixed_inputs(inputs, 1)
    k = runtime_ints(p, inputs, "k", 1)
    args = None if fixed is None or not k else _topk_native(p, x, k[0])
    if args is None:
        return None
    shape = _topk_shape(p, x.shape, k[0])
    where = p.runtime.partition_outputs or {}
    into = [(len(args) + 1 + i, where[i], list(shape)) for i in (0, 1) if i in where]  # ORT's buffers: written in place
    return runtime.call_step(p, runtime.native(p).topk, (None, *args, None, None), [(0, 0, x.dtype, x.shape, None)],
                             [(0, shape), (1, shape)], None, into, fixed)


def _topk_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    axis = p.attrs["axis"] % x.ndim
    k = runtime_ints(p, inputs, "k", 1)[0]
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"TopK: k={k} outside [0, {x.shape[axis]}] on axis {axis} of shape {x.shape}")
    args = _topk_native(p, x, k)
    if args is not None:
        values, indices = runtime.native(p).topk(x, *args)
        shape = _topk_shape(p, x.shape, k)
        return [values.reshape(shape), indices.reshape(shape)]
    if p.attrs["largest"]:
        key = np.negative(x) if np.issubdtype(x.dtype, np.floating) else np.invert(x)
    else:
        key = x
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64, copy=False)]


_CUMSUM_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float16, np.int32, np.int64))


def _cumsum_native(p: Prepared, x: np.ndarray, axis: int) -> tuple | None:
    """``cumsum``'s arguments after x (native kernels, a non-empty C-contiguous x of rank >= 1 and a dtype it
    takes), else None."""
    if (runtime.native(p) is None or not isinstance(x, np.ndarray) or x.dtype not in _CUMSUM_DTYPES or x.ndim == 0
            or not x.size or not x.flags.c_contiguous):
        return None
    view = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    return (*view, bool(p.attrs["exclusive"]), bool(p.attrs["reverse"]), runtime.threads(p))


def _cumsum_bind(p: Prepared, inputs, outs):
    """CumSum as one ``cumsum`` call for this input shape; a runtime axis is held to its bound value."""
    x = inputs[0] if inputs else None
    fixed = [] if p.attrs["scan_axis"] is not None else runtime.fixed_inputs(inputs, 1)
    axes = None if fixed is None else runtime_ints(p, inputs, "scan_axis", 1)
    args = None if not axes or not isinstance(x, np.ndarray) else _cumsum_native(p, x, axes[0] % max(x.ndim, 1))
    if args is None:
        return None
    return runtime.call_step(p, runtime.native(p).cumsum, (None, *args), [(0, 0, x.dtype, x.shape, None)],
                             [(-1, None)], None, None, fixed)


def _cumsum_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    (axis,) = runtime_ints(p, inputs, "scan_axis", 1)
    axis %= max(x.ndim, 1)
    args = _cumsum_native(p, x, axis)
    if args is not None:
        return [runtime.native(p).cumsum(x, *args)]
    xc = widen(x)
    if p.attrs["reverse"]:
        xc = np.flip(xc, axis)
    y = np.cumsum(xc, axis=axis, dtype=xc.dtype)
    if p.attrs["exclusive"]:
        y = np.roll(y, 1, axis=axis)
        index = [slice(None)] * y.ndim
        index[axis] = 0
        y[tuple(index)] = 0
    if p.attrs["reverse"]:
        y = np.flip(y, axis)
    return [np.ascontiguousarray(y, dtype=x.dtype)]


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x is None or x.dtype is None:
        return f"{node.describe()}: input has a dtype the NPU cannot carry"
    if node.op_type == "TopK" and node.input(1) is None and node.attr("k") is None:
        return f"{node.describe()}: TopK without K"
    return None


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    n = elems(x)
    size = p.attrs["itemsize"]
    op = p.attrs["op"]
    if op == "TopK":
        length = x[p.attrs["axis"] % len(x)] if x else 1
        k = p.attrs["k"][0] if p.attrs["k"] else length
        out = n // max(length, 1) * k
        return stream_cost(p, n, n * size, out * (size + 8), max(math.log2(max(length, 2)), 1.0))
    if op == "CumSum":
        return stream_cost(p, n, n * size, n * size, 1.0)
    axis_len = x[p.attrs["axis"] % len(x)] if x else 1
    return stream_cost(p, n, n * size, n // max(axis_len, 1) * 8, 1.0)


register(KernelDef("", "ArgMax", _prepare, _arg_run, _cost, _check, rank_free=True, bind=_arg_bind))
register(KernelDef("", "ArgMin", _prepare, _arg_run, _cost, _check, rank_free=True, bind=_arg_bind))
register(KernelDef("", "TopK", _prepare, _topk_run, _cost, _check, rank_free=True, bind=_topk_bind))
register(KernelDef("", "CumSum", _prepare, _cumsum_run, _cost, _check, rank_free=True, bind=_cumsum_bind))
