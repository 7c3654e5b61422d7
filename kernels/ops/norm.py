"""Normalization on the vector unit: LayerNormalization, RMSNormalization (opset 23), SimplifiedLayerNormalization
(ORT registers it in the default ONNX domain) and com.microsoft SkipSimplifiedLayerNormalization.

Layout: X [..., D] normalized over the trailing axes from ``axis`` (default -1; Skip* always the last axis).
Statistics are computed in float32 (``stash_type=1``, and the vector unit's accumulator), so float16 inputs widen once:
  LayerNorm:  mean = E[x], var = E[(x - mean)^2], y = (x - mean) * rsqrt(var + eps) * scale + bias
  RMS/Simplified: y = x * rsqrt(E[x^2] + eps) * scale
  SkipSimplified: s = input + skip (+ bias); y = RMS(s) * gamma; optional outputs: mean (always 0, as ORT CPU),
  inv_std_var [..., 1] and input_skip_bias_sum s (in the input dtype).
Optional statistics outputs have shape X.shape[:axis] + (1,) * (rank - axis).

Cost per element: ~6 vector ops (sum, sub/square, accumulate, scale, shift) plus one rsqrt per row; DMA reads X
(and skip/bias), scale, and writes Y plus the optional outputs.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen

_F32 = np.float32


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    skip = node.op_type == "SkipSimplifiedLayerNormalization"
    attrs = {"op": node.op_type, "axis": -1 if skip else int(node.attr("axis", -1)),
             "epsilon": float(node.attr("epsilon", 1e-5)),
             "outputs": [not v.missing for v in node.outputs],
             "out_dtypes": [v.dtype.name if v.dtype is not None else None for v in node.outputs],
             "in_itemsizes": [itemsize_of(v) for v in node.inputs]}
    return Prepared(attrs, stash_constants(node), target)


def _stats_dtype(p: Prepared, i: int) -> np.dtype:
    dts = p.attrs["out_dtypes"]
    return np.dtype(dts[i]) if i < len(dts) and dts[i] else np.dtype(_F32)


def _rms(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    """rsqrt(E[x^2] + eps) over ``axes`` (keepdims), float32 accumulation."""
    ms = np.mean(np.square(x), axis=axes, keepdims=True, dtype=_F32)
    return 1.0 / np.sqrt(ms + _F32(eps))


def _axes(x: np.ndarray, axis: int) -> tuple[int, ...]:
    return tuple(range(axis % x.ndim, x.ndim))


def _layer_norm_run(p: Prepared, inputs) -> list[np.ndarray]:
    x, scale, bias = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    xf = widen(x).astype(_F32, copy=False)
    axes = _axes(x, p.attrs["axis"])
    mean = np.mean(xf, axis=axes, keepdims=True, dtype=_F32)
    centered = xf - mean
    inv_std = 1.0 / np.sqrt(np.mean(np.square(centered), axis=axes, keepdims=True) + _F32(p.attrs["epsilon"]))
    y = centered * inv_std * widen(scale)
    if bias is not None:
        y += widen(bias)
    return [y.astype(x.dtype, copy=False), mean.astype(_stats_dtype(p, 1), copy=False),
            inv_std.astype(_stats_dtype(p, 2), copy=False)][:len(p.attrs["outputs"])]


def _rms_norm_run(p: Prepared, inputs) -> list[np.ndarray]:
    """RMSNormalization (opset 23) and SimplifiedLayerNormalization (output 1: inv_std_var)."""
    x, scale = arg(p, inputs, 0), arg(p, inputs, 1)
    xf = widen(x).astype(_F32, copy=False)
    inv = _rms(xf, _axes(x, p.attrs["axis"]), p.attrs["epsilon"])
    y = (xf * inv * widen(scale)).astype(x.dtype, copy=False)
    return [y, inv.astype(_stats_dtype(p, 1), copy=False)][:len(p.attrs["outputs"])]


def _skip_rms_norm_run(p: Prepared, inputs) -> list[np.ndarray]:
    x, skip, gamma, bias = (arg(p, inputs, i) for i in range(4))
    s = widen(x).astype(_F32, copy=False) + widen(skip)
    if bias is not None:
        s = s + widen(bias)
    inv = _rms(s, (s.ndim - 1,), p.attrs["epsilon"])
    y = (s * inv * widen(gamma)).astype(x.dtype, copy=False)
    outs = [y, np.zeros(inv.shape, _stats_dtype(p, 1)),  # ORT's CPU kernel leaves the (meaningless) mean at 0
            inv.astype(_stats_dtype(p, 2), copy=False), s.astype(x.dtype, copy=False)]
    return outs[:len(p.attrs["outputs"])]


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    n = elems(x)
    axis = p.attrs["axis"] % len(x) if x else 0
    rows = int(np.prod(x[:axis], dtype=np.int64)) if x else 1
    size = p.attrs["in_itemsizes"][0]
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    n_big = 1 + (p.attrs["op"] == "SkipSimplifiedLayerNormalization" and len(p.attrs["outputs"]) > 3)
    b_out = n * size * n_big + rows * 4 * max(0, min(2, len(p.attrs["outputs"]) - 1))
    return stream_cost(p, n, b_in, b_out, 6.0, rows / max(n, 1))


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x is None or x.dtype is None or not np.issubdtype(x.dtype, np.floating):
        return f"{node.describe()}: normalization needs a float input"
    if node.attr("stash_type", 1) != 1:
        return f"{node.describe()}: stash_type={node.attr('stash_type')} (only float32 statistics) not supported"
    return None


register(KernelDef("", "LayerNormalization", _prepare, _layer_norm_run, _cost, _check))
register(KernelDef("", "RMSNormalization", _prepare, _rms_norm_run, _cost, _check))
register(KernelDef("", "SimplifiedLayerNormalization", _prepare, _rms_norm_run, _cost, _check))
register(KernelDef("com.microsoft", "SkipSimplifiedLayerNormalization", _prepare, _skip_rms_norm_run, _cost, _check))
