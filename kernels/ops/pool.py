"""MaxPool, AveragePool (1-D and 2-D: NCL, NCHW), GlobalAveragePool and GlobalMaxPool (any rank) on the vector unit,
as strided window views. GlobalMaxPool is a max-reduce over each channel's pixels: a NaN makes its channel NaN, as
ONNX Max does (ORT's Eigen reduction keeps or drops it by its position); an image without pixels is an error.

Geometry per spatial axis follows ORT's CPU EP (``PoolAttributes``): explicit ``pads``, or ``auto_pad`` VALID
(none) / SAME_UPPER / SAME_LOWER (output ``ceil(size/stride)``, the odd pad at the end resp. the start), resolved
at run time since SAME depends on the input size. ``ceil_mode`` adds windows that start inside the input or the
leading pad; their extension past the declared pads never counts.

AveragePool sums each window in float32 separably (each window row's taps from the first on, then the row sums
from the first row on, 0.0 outside the input: a defined order the native kernel repeats bit for bit, and computes
each input row's sums once), then divides by the window's element count, separable per axis: with
``count_include_pad=1`` the window positions inside the declared-padded input, else those inside the real input.
A 1-D pool runs as a 2-D one over H = 1. Cost: one vector op per window element per output (``kh*kw``
ops/output). A float32, float16, uint8 or int8 MaxPool and a float32 or float16 AveragePool run on the native
kernels (``kernels/native/pool.cc``; float16 widened per plane, pooled in float32, rounded once), a float32
GlobalMaxPool on ``reduce_max_rows`` (reduce.cc), a float16 one on ``global_max_pool_half``, unless the session asks
for the reference model.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..cost import vector_cost
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants

_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
_GLOBAL = ("GlobalAveragePool", "GlobalMaxPool")


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if node.op_type in _GLOBAL:
        if x.shape is not None and len(x.shape) < 3:
            return f"{node.describe()}: input {x.describe()} has no spatial axis"
        return None
    k = node.attr("kernel_shape")
    if k is None or len(k) not in (1, 2):
        return f"{node.describe()}: only 1-D and 2-D pooling is supported (kernel_shape {k})"
    if x.shape is not None and len(x.shape) != len(k) + 2:
        return f"{node.describe()}: input {x.describe()} does not match kernel_shape {list(k)}"
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and not node.outputs[1].missing:
        return f"{node.describe()}: the Indices output is not supported"
    if node.attr("storage_order", 0):
        return f"{node.describe()}: storage_order=1 is not supported"
    auto = node.attr("auto_pad", "NOTSET")
    if auto not in _AUTO_PADS:
        return f"{node.describe()}: auto_pad={auto} is not an ONNX padding mode"
    return None


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    if node.op_type in _GLOBAL:
        return Prepared({"op": node.op_type}, stash_constants(node), target)
    k = [int(v) for v in node.attr("kernel_shape")]
    n = len(k)
    strides = [int(v) for v in node.attr("strides", [1] * n)]
    dilations = [int(v) for v in node.attr("dilations", [1] * n)]
    pads = [int(v) for v in node.attr("pads", [0] * 2 * n)]
    if n == 1:  # NCL -> NC1L
        k, strides, dilations, pads = [1] + k, [1] + strides, [1] + dilations, [0, pads[0], 0, pads[1]]
    attrs: dict[str, Any] = {"op": node.op_type, "kernel": k, "strides": strides, "dilations": dilations,
                             "pads": pads, "auto_pad": node.attr("auto_pad", "NOTSET"),
                             "ceil": int(node.attr("ceil_mode", 0)),
                             "include_pad": int(node.attr("count_include_pad", 0)), "one_d": n == 1}
    return Prepared(attrs, stash_constants(node), target)


def _axis(size: int, k: int, s: int, d: int, p0: int, p1: int, ceil: int, auto: str) -> tuple[int, int, int]:
    """(output size, leading pad, trailing pad) of one spatial axis, as ORT's PoolAttributes computes them."""
    span = (k - 1) * d + 1
    if auto == "VALID":
        p0 = p1 = 0
    elif auto in ("SAME_UPPER", "SAME_LOWER"):  # ORT sizes the pad with the undilated kernel
        need = (-(-size // s) - 1) * s + k - size
        p0 = int(need / 2) if auto == "SAME_UPPER" else int((need + 1) / 2)
        return int((size + need - span) / s) + 1, p0, need - p0
    total = size + p0 + p1 - span  # ORT divides in float and truncates: a window up to s-1 too large still fits
    out = math.ceil(total / s + 1) if ceil else int(total / s) + 1
    if ceil and out > 0 and (out - 1) * s >= size + p0:  # the last window must start inside the input or lead pad
        out -= 1
    return out, p0, p1


def _geometry(x: np.ndarray, at: dict[str, Any]):
    (kh, kw), (sh, sw), (dh, dw) = at["kernel"], at["strides"], at["dilations"]
    t, l, b, r = at["pads"]
    h, w = x.shape[2:]
    oh, t, b = _axis(h, kh, sh, dh, t, b, at["ceil"], at["auto_pad"])
    ow, l, r = _axis(w, kw, sw, dw, l, r, at["ceil"], at["auto_pad"])
    if oh < 0 or ow < 0:
        raise ValueError(f"{at['op']}: input {list(x.shape)} is smaller than the window (kernel {at['kernel']}, "
                         f"dilations {at['dilations']}, pads {[t, l, b, r]})")
    return (oh, t, b), (ow, l, r)


def _windows(x: np.ndarray, at: dict[str, Any], fill: Any, geo) -> np.ndarray:
    """[N, C, oh, ow, kh, kw] view of the windows over ``x`` padded with ``fill``."""
    (kh, kw), (sh, sw), (dh, dw) = at["kernel"], at["strides"], at["dilations"]
    (oh, t, b), (ow, l, r) = geo
    h, w = x.shape[2:]
    eb = max(b, (oh - 1) * sh + (kh - 1) * dh + 1 - h - t)  # ceil_mode windows may reach past the pads
    er = max(r, (ow - 1) * sw + (kw - 1) * dw + 1 - w - l)
    # SAME with a kernel smaller than the stride can give a negative pad: windows then start inside the input
    x = x[:, :, max(-t, 0):, max(-l, 0):]
    xp = np.pad(x, ((0, 0), (0, 0), (max(t, 0), max(eb, 0)), (max(l, 0), max(er, 0))), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow]


def _counted(out: int, size: int, k: int, s: int, d: int, p0: int, p1: int, include_pad: int) -> np.ndarray:
    """Per output position of one axis: how many window positions the average divides by."""
    pos = (np.arange(out) * s - p0)[:, None] + np.arange(k) * d
    lo, hi = (-p0, size + p1) if include_pad else (0, size)
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _as_2d(p: Prepared, x: np.ndarray) -> np.ndarray:
    return x[:, :, None, :] if p.attrs["one_d"] else x


def _from_2d(p: Prepared, y: np.ndarray) -> np.ndarray:
    return y[:, :, 0, :] if p.attrs["one_d"] else y


def _native_max_call(p: Prepared, x: np.ndarray, geo) -> tuple | None:
    """(kernel, its arguments after x) of the native MaxPool for x (2-D view), or None where it does not apply."""
    nat = runtime.native(p)
    if nat is None or x.dtype not in (np.float32, np.float16, np.uint8, np.int8):  # kernels/native/pool.cc walks these
        return None
    at = p.attrs
    (oh, t, _), (ow, l, _) = geo
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    fn = nat.max_pool_half if x.dtype == np.float16 else nat.max_pool
    return fn, ([oh, ow, *at["kernel"], *at["strides"], *at["dilations"], t, l], float(low), runtime.threads(p))


def _run_max(p: Prepared, inputs) -> list[np.ndarray]:
    x = _as_2d(p, arg(p, inputs, 0))
    geo = _geometry(x, p.attrs)
    (oh, _, _), (ow, _, _) = geo
    if oh == 0 or ow == 0:
        return [_from_2d(p, np.empty((*x.shape[:2], oh, ow), x.dtype))]
    call = _native_max_call(p, x, geo)
    if call is not None:
        return [_from_2d(p, call[0](np.ascontiguousarray(x), *call[1]))]
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    return [_from_2d(p, _windows(x, p.attrs, low, geo).max(axis=(-2, -1)))]


def _bind_pool(p: Prepared, inputs, outs, native_call) -> Any:
    """A pool as one native call for x's shape (a 1-D pool's x viewed as 4-D, its result back as 3-D), as its run
    function does (ep/step_binding.py); ``native_call`` is ``_native_max_call`` or ``_native_avg_call``."""
    x = inputs[0] if inputs else None
    if not isinstance(x, np.ndarray) or x.ndim not in (3, 4) or not x.flags.c_contiguous or outs[0].size == 0:
        return None
    x4 = _as_2d(p, x)
    call = native_call(p, x4, _geometry(x4, p.attrs))
    if call is None:
        return None
    one_d = p.attrs["one_d"]
    return runtime.call_step(p, call[0], (None, *call[1]), [(0, 0, x.dtype, x.shape, x4.shape if one_d else None)],
                             [(-1, outs[0].shape if one_d else None)])


def _bind_max(p: Prepared, inputs, outs) -> Any:
    return _bind_pool(p, inputs, outs, _native_max_call)


def _divisor(x: np.ndarray, at: dict[str, Any], geo) -> np.ndarray:
    """[oh, ow] float32: how many window positions each average divides by."""
    (kh, kw), (sh, sw), (dh, dw) = at["kernel"], at["strides"], at["dilations"]
    (oh, t, b), (ow, l, r) = geo
    h, w = x.shape[2:]
    ch = _counted(oh, h, kh, sh, dh, t, b, at["include_pad"])
    cw = _counted(ow, w, kw, sw, dw, l, r, at["include_pad"])
    return (ch[:, None] * cw[None, :]).astype(np.float32)


def _native_avg_call(p: Prepared, x: np.ndarray, geo) -> tuple | None:
    """(kernel, its arguments after x) of the native AveragePool for x (2-D view), or None where it does not apply."""
    nat = runtime.native(p)
    if nat is None or x.dtype not in (np.float32, np.float16):
        return None
    at = p.attrs
    (oh, t, _), (ow, l, _) = geo
    fn = nat.avg_pool_half if x.dtype == np.float16 else nat.avg_pool
    return fn, ([oh, ow, *at["kernel"], *at["strides"], *at["dilations"], t, l], _divisor(x, at, geo),
                runtime.threads(p))


def _run_avg(p: Prepared, inputs) -> list[np.ndarray]:
    x = _as_2d(p, arg(p, inputs, 0))
    at = p.attrs
    geo = _geometry(x, at)
    (oh, _, _), (ow, _, _) = geo
    if oh == 0 or ow == 0:
        return [_from_2d(p, np.empty((*x.shape[:2], oh, ow), x.dtype))]
    call = _native_avg_call(p, x, geo)
    if call is not None:
        return [_from_2d(p, call[0](np.ascontiguousarray(x), *call[1]))]
    win = _windows(x.astype(np.float32), at, 0.0, geo)
    kh, kw = at["kernel"]
    with np.errstate(all="ignore"):  # IEEE results (Inf - Inf, a window wholly in padding: 0/0), as in ORT
        s = None
        for i in range(kh):
            row = win[..., i, 0].copy()
            for j in range(1, kw):
                row += win[..., i, j]
            s = row if s is None else s + row
        return [_from_2d(p, (s / _divisor(x, at, geo)).astype(x.dtype))]


def _bind_avg(p: Prepared, inputs, outs) -> Any:
    return _bind_pool(p, inputs, outs, _native_avg_call)


def _run_gap(p: Prepared, inputs) -> list[np.ndarray]:
    """The mean over every axis after N, C: one float32 add-reduce over each channel's flattened pixels (what
    ``mean`` does for contiguous axes, without its Python wrapper and copies), then one division. Float16 is
    widened first, so the add-reduce is numpy's float32 pairwise sum, which ``global_average_pool_half`` and
    (float32) ``global_average_pool`` repeat natively."""
    x = arg(p, inputs, 0)
    n, c = x.shape[:2]
    count = math.prod(x.shape[2:])
    nat = runtime.native(p)
    if nat is not None and x.dtype == np.float16 and x.size:
        return [nat.global_average_pool_half(np.ascontiguousarray(x), runtime.threads(p))]
    if nat is not None and x.dtype == np.float32 and x.size:
        return [nat.global_average_pool(np.ascontiguousarray(x), runtime.threads(p))]
    flat = np.ascontiguousarray(x).reshape(n, c, count)
    if x.dtype == np.float16:
        flat = flat.astype(np.float32)
    s = np.add.reduce(flat, axis=2, dtype=np.float32, keepdims=True)
    s /= np.float32(count) if count else np.float32(0.0)  # no pixels: 0/0, NaN as ORT
    return [s.reshape((n, c) + (1,) * (x.ndim - 2)).astype(x.dtype, copy=False)]


def _run_gmp(p: Prepared, inputs) -> list[np.ndarray]:
    """The max over every axis after N, C: one max-reduce over each channel's flattened pixels (float32 natively:
    ``reduce_max_rows``, exact)."""
    x = arg(p, inputs, 0)
    n, c = x.shape[:2]
    if n * c and not math.prod(x.shape[2:]):
        raise ValueError(f"GlobalMaxPool: input of shape {list(x.shape)} has no pixels to take the maximum of")
    flat = np.ascontiguousarray(x).reshape(n, c, -1)
    nat = runtime.native(p)
    if nat is not None and x.dtype == np.float32 and x.size:
        return [nat.reduce_max_rows(flat.reshape(n * c, -1), runtime.threads(p)).reshape(_pooled_shape(x))]
    if nat is not None and x.dtype == np.float16 and x.size:
        return [nat.global_max_pool_half(flat.reshape(x.shape), runtime.threads(p))]
    return [np.maximum.reduce(flat, axis=2).reshape(_pooled_shape(x))]


def _pooled_shape(x: np.ndarray) -> tuple[int, ...]:
    """A global pool's output shape: [N, C, 1, ...]."""
    return x.shape[:2] + (1,) * (x.ndim - 2)


def _bind_gmp(p: Prepared, inputs, outs) -> Any:
    """A float32 GlobalMaxPool as one native step (``reduce_max_rows`` over [N * C, pixels]), a float16 one as
    ``global_max_pool_half``."""
    nat = runtime.native(p)
    x = inputs[0] if inputs else None
    if (nat is None or not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16) or x.ndim < 3
            or not x.size or not x.flags.c_contiguous):
        return None
    if x.dtype == np.float16:
        return runtime.call_step(p, nat.global_max_pool_half, (None, runtime.threads(p)),
                                 [(0, 0, np.float16, x.shape, None)], [(-1, None)])
    n, c = x.shape[:2]
    return runtime.call_step(p, nat.reduce_max_rows, (None, runtime.threads(p)),
                             [(0, 0, np.float32, x.shape, (n * c, x.size // (n * c)))], [(-1, _pooled_shape(x))])


def _bind_gap(p: Prepared, inputs, outs) -> Any:
    """A float32 or float16 GlobalAveragePool as one native step making ``_run_gap``'s call (ep/step_binding.py)."""
    nat = runtime.native(p)
    x = inputs[0] if inputs else None
    if (nat is None or not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16) or x.ndim < 3
            or not x.size or not x.flags.c_contiguous):
        return None
    if x.dtype == np.float16:
        return runtime.call_step(p, nat.global_average_pool_half, (None, runtime.threads(p)),
                                 [(0, 0, np.float16, x.shape, None)], [(-1, None)])
    return runtime.call_step(p, nat.global_average_pool, (None, runtime.threads(p)),
                             [(0, 0, np.float32, x.shape, None)], [(-1, None)])


def _cost(p: Prepared, shapes) -> OpCost:
    s = tuple(shapes[0])
    item = 4
    if p.attrs["op"] in _GLOBAL:
        n_out, ops = s[0] * s[1], math.prod(s[2:])
    else:
        kh, kw = p.attrs["kernel"]
        n_out, ops = int(np.prod(s, dtype=np.int64)) // math.prod(p.attrs["strides"]), kh * kw
    return vector_cost(p.target, max(n_out, 1), nbytes(s, item), max(n_out, 1) * item, float(ops))


register(KernelDef("", "MaxPool", _prepare, _run_max, _cost, _check, bind=_bind_max))
register(KernelDef("", "AveragePool", _prepare, _run_avg, _cost, _check, bind=_bind_avg))
register(KernelDef("", "GlobalAveragePool", _prepare, _run_gap, _cost, _check, bind=_bind_gap))
register(KernelDef("", "GlobalMaxPool", _prepare, _run_gmp, _cost, _check, bind=_bind_gmp))
