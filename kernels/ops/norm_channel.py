"""Per-channel normalization of images and feature maps on the vector unit: BatchNormalization (inference),
InstanceNormalization and GroupNormalization (opset 18: scale/bias per group; opset 21: per channel).

Layout: X [N, C, D1, ...] (channel axis 1). Statistics accumulate in float32 (float16 widens once; stash_type=1).
- BatchNormalization: y = x * a[c] + b[c] with a = scale / sqrt(var + eps), b = B - mean * a, folded at compile
  time (float64, rounded once to float32) when the four parameters are constant, else per call. Only inference
  (training_mode=0, one output).
- InstanceNormalization: mean/var over D1... per (n, c); y = (x - mean) * rsqrt(var + eps) * scale[c] + B[c].
- GroupNormalization: C split into num_groups groups; mean/var over (C/G, D1...) per (n, g), then scale/bias.

Cost per element: 2 vector ops (BatchNorm: multiply-add) or 6 (sum, centre, square, accumulate, scale, shift) plus
one rsqrt per statistics row; DMA reads X and writes Y (parameters are small).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen

_F32 = np.float32


def _bn_fold(scale, bias, mean, var, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) with BatchNorm(x) = x * a + b, computed in float64 and rounded once to float32."""
    a = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    b = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * a
    return a.astype(_F32), b.astype(_F32)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    op = node.op_type
    attrs: dict[str, Any] = {"op": op, "epsilon": float(node.attr("epsilon", 1e-5)),
                             "itemsize": itemsize_of(node.inputs[0]),
                             "groups": int(node.attr("num_groups", 1)), "since": int(node.since_version or 0)}
    consts = stash_constants(node)
    if op == "BatchNormalization" and all(f"in{i}" in consts for i in range(1, 5)):
        a, b = _bn_fold(*(consts.pop(f"in{i}") for i in range(1, 5)), attrs["epsilon"])
        consts["a"], consts["b"] = a, b
    return Prepared(attrs, consts, target)


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x is None or x.dtype is None or not np.issubdtype(x.dtype, np.floating):
        return f"{node.describe()}: normalization needs a float input"
    if x.shape is not None and len(x.shape) < 2:
        return f"{node.describe()}: input of rank {len(x.shape)} has no channel axis"
    if node.op_type == "BatchNormalization" and (int(node.attr("training_mode", 0))
                                                 or sum(not v.missing for v in node.outputs) > 1):
        return f"{node.describe()}: BatchNormalization training mode (running statistics outputs) not supported"
    if node.op_type == "GroupNormalization" and int(node.attr("stash_type", 1)) != 1:
        return f"{node.describe()}: stash_type={node.attr('stash_type')} (only float32 statistics) not supported"
    return None


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel vector shaped [1, C, 1, ...] against an ndim-rank X."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _bn_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    key = ("ab", x.ndim)
    ab = p.kernel_cache.get(key)
    if ab is None:
        if "a" in p.consts:
            a, b = p.consts["a"], p.consts["b"]
        else:
            a, b = _bn_fold(*(arg(p, inputs, i) for i in range(1, 5)), p.attrs["epsilon"])
        ab = (_channel(a, x.ndim), _channel(b, x.ndim))
        if "a" in p.consts:
            p.kernel_cache[key] = ab
    y = widen(x) * ab[0]
    y += ab[1]
    return [y.astype(x.dtype, copy=False)]


def _normalize(xf: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over ``axes`` (float32, biased variance)."""
    mean = xf.mean(axis=axes, keepdims=True, dtype=_F32)
    centered = xf - mean
    var = np.square(centered).mean(axis=axes, keepdims=True, dtype=_F32)
    var += _F32(eps)
    centered /= np.sqrt(var)
    return centered


def _instance_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    xf = widen(x).astype(_F32, copy=False)
    y = _normalize(xf, tuple(range(2, x.ndim)), p.attrs["epsilon"])
    y *= _channel(widen(arg(p, inputs, 1)), x.ndim)
    y += _channel(widen(arg(p, inputs, 2)), x.ndim)
    return [y.astype(x.dtype, copy=False)]


def _group_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    n, c = x.shape[:2]
    g = p.attrs["groups"]
    if g <= 0 or c % g:
        raise ValueError(f"GroupNormalization: {c} channels not divisible into num_groups={g}")
    xf = widen(x).astype(_F32, copy=False).reshape((n, g, -1))
    y = _normalize(xf, (2,), p.attrs["epsilon"]).reshape(x.shape)
    scale, bias = widen(arg(p, inputs, 1)), widen(arg(p, inputs, 2))
    if scale.size == g and g != c:  # opset 18: one scale/bias per group
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    y *= _channel(scale, x.ndim)
    y += _channel(bias, x.ndim)
    return [y.astype(x.dtype, copy=False)]


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    n = elems(x)
    moved = nbytes(x, p.attrs["itemsize"])
    if p.attrs["op"] == "BatchNormalization":
        return stream_cost(p, n, moved, moved, 2.0)
    rows = x[0] * (p.attrs["groups"] if p.attrs["op"] == "GroupNormalization" else x[1]) if len(x) > 1 else 1
    return stream_cost(p, n, moved, moved, 6.0, rows / max(n, 1))


register(KernelDef("", "BatchNormalization", _prepare, _bn_run, _cost, _check))
register(KernelDef("", "InstanceNormalization", _prepare, _instance_run, _cost, _check))
register(KernelDef("", "GroupNormalization", _prepare, _group_run, _cost, _check))
