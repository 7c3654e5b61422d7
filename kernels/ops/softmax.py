"""Softmax and LogSoftmax on the vector unit: max-subtracted exp, sum, divide (LogSoftmax: subtract the sum's log);
float16 computed in float32.

Opset >= 13 normalizes along one axis (default -1). Opset < 13 coerces the input to 2-D
[prod(shape[:axis]), prod(shape[axis:])] (default axis 1) and normalizes each row: the same kernel on a reshaped view.

Native (C-contiguous, in the kernel and as its bound step): a float32 Softmax over the last axis,
``kernels.softmax_last_axis`` (one pass per row on the session's threads, an exp of its own: the reference's values
within float tolerance); LogSoftmax, Softmax over any other axis and every float16 one, ``kernels.softmax_axis`` on
x viewed as [outer, n, inner] (no transpose: columns of the inner axes 16 at a time, the same exp; float16 widened
to float32 per task and rounded once on store, as the reference's float32 math and astype).

LogSoftmax is (x - max) - log(sum(exp(x - max))), as ORT's MLAS kernel computes it: a row of -inf or holding +inf
or NaN is NaN throughout, as there.

Cost per element: max, subtract, sum, divide (4 ops) + one exp (transcendental); DMA reads and writes the tensor once
(rows fit SRAM; a row larger than SRAM would need two passes, not modelled). LogSoftmax is costed the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen
from .movement import ort_buffer


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Numerically stable softmax of ``x`` along ``axis`` in ``x``'s dtype (fp32/fp64). Ufunc reductions, not the
    ``max``/``sum`` methods (Python wrappers around the same reductions), and one temporary."""
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e


@np.errstate(invalid="ignore", divide="ignore")  # -inf - -inf is NaN and log(0) -inf, as ORT computes them
def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """(x - max) - log(sum(exp(x - max))) of ``x`` along ``axis`` in ``x``'s dtype (fp32/fp64)."""
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
    e -= np.log(np.add.reduce(np.exp(e), axis=axis, keepdims=True))
    return e


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    legacy = 0 < node.since_version < 13
    return Prepared({"op": node.op_type, "axis": int(node.attr("axis", 1 if legacy else -1)), "legacy": legacy,
                     "itemsize": itemsize_of(node.outputs[0])}, stash_constants(node), target)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    call = _native_call(p, x)
    if call is not None:
        return [call[0](x, *call[1])]
    fn = log_softmax if p.attrs.get("op") == "LogSoftmax" else softmax
    y = onnx_softmax(widen(x), p.attrs["axis"], p.attrs["legacy"], fn)
    return [y if y.dtype == x.dtype else y.astype(x.dtype)]


def onnx_softmax(x: np.ndarray, axis: int, legacy: bool,
                 fn: Callable[[np.ndarray, int], np.ndarray] = softmax) -> np.ndarray:
    """ONNX Softmax (``fn``: or LogSoftmax) of a float32/float64 ``x``: along ``axis`` (opset >= 13), or with
    ``legacy`` (opset < 13) over the rows of x coerced to 2-D at ``axis``."""
    axis = axis % max(x.ndim, 1)
    if x.size == 0:  # an empty tensor (an empty normalized axis included) is its own softmax, as ORT returns it
        return x.copy()
    if legacy and axis != x.ndim - 1:  # rows over the trailing axes (the last axis alone: the same)
        return fn(x.reshape(math.prod(x.shape[:axis]), -1), -1).reshape(x.shape)
    return fn(x, -1 if legacy else axis)


def last_axis(axis: int, rank: int) -> bool:
    """Whether an ONNX Softmax of ``axis`` normalizes the last axis of a rank-``rank`` input (at any opset: the
    legacy 2-D rows are the last axis then)."""
    return rank >= 1 and axis % rank == rank - 1


def _cost(p: Prepared, shapes) -> OpCost:
    size = nbytes(shapes[0], p.attrs["itemsize"])
    return stream_cost(p, elems(shapes[0]), size, size, 4.0, 1.0)


def normalized_view(shape: tuple[int, ...], axis: int, legacy: bool) -> tuple[int, int, int]:
    """[outer, n, inner] of an ONNX Softmax over ``axis`` of a rank >= 1 ``shape``: it normalizes n (opset >= 13:
    the axis; ``legacy``: the trailing axes from ``axis`` on, the 2-D coercion's rows)."""
    axis %= len(shape)
    outer = math.prod(shape[:axis])
    if legacy:
        return outer, math.prod(shape[axis:]), 1
    return outer, shape[axis], math.prod(shape[axis + 1:])


_F32 = np.dtype(np.float32)
_NATIVE_DTYPES = (_F32, np.dtype(np.float16))


def _native_call(p: Prepared, x: np.ndarray) -> tuple | None:
    """(native kernel, its arguments after x) computing this Softmax/LogSoftmax (native kernels, a non-empty
    C-contiguous float32 or float16 x of rank >= 1), else None."""
    nat = runtime.native(p)
    if nat is None or x.dtype not in _NATIVE_DTYPES or not x.flags.c_contiguous or x.ndim == 0 or x.size == 0:
        return None
    log = p.attrs.get("op", "Softmax") == "LogSoftmax"
    if not log and x.dtype == _F32 and last_axis(p.attrs["axis"], x.ndim):
        return nat.softmax_last_axis, (runtime.threads(p),)
    return nat.softmax_axis, (*normalized_view(x.shape, p.attrs["axis"], p.attrs["legacy"]), log,
                              runtime.threads(p))


def _bind(p: Prepared, inputs, outs):
    """The native softmax as one call for this input shape, into ORT's buffer when the result is a partition output
    (a new array of a large result is fresh pages per call, then copied)."""
    x = inputs[0] if inputs else None
    call = _native_call(p, x) if isinstance(x, np.ndarray) else None
    if call is None:
        return None
    args = (None, *call[1], None)
    return runtime.call_step(p, call[0], args, [(0, 0, x.dtype, x.shape, None)], [(-1, None)], None,
                             ort_buffer(p, outs, len(args) - 1))


register(KernelDef("", "Softmax", _prepare, _run, _cost, rank_free=True, bind=_bind))
register(KernelDef("", "LogSoftmax", _prepare, _run, _cost, rank_free=True, bind=_bind))
