"""Per-channel normalization of images and feature maps on the vector unit: BatchNormalization (inference),
InstanceNormalization and GroupNormalization (opset 18: scale/bias per group; opset 21: per channel).

Layout: X [N, C, D1, ...] (channel axis 1). Statistics accumulate in float32 (float16 widens once; stash_type=1).
- BatchNormalization: y = x * a[c] + b[c] with a = scale / sqrt(var + eps), b = B - mean * a, folded at compile
  time (float64, rounded once to float32) when the four parameters are constant, else per call. Only inference
  (training_mode=0, one output).
- InstanceNormalization: mean/var over D1... per (n, c); y = (x - mean) * rsqrt(var + eps) * scale[c] + B[c].
- GroupNormalization: C split into num_groups groups; mean/var over (C/G, D1...) per (n, g), then scale/bias.

Native kernels (``kernels.norm_channels``, kernels/native/norm.cc): float32 or float16 in memory, the same operations
in float32 (the statistics' sums in 16 lanes), threaded over planes / groups, in the kernel and as its bound step
(parameters constant, or given per channel).

Cost per element: 2 vector ops (BatchNorm: multiply-add) or 6 (sum, centre, square, accumulate, scale, shift) plus
one rsqrt per statistics row; DMA reads X and writes Y (parameters are small).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import runtime
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


_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_OUT_ARG = 6  # norm_channels' ``out``


def _per_channel(p: Prepared, inputs, i: int, c: int) -> tuple[np.ndarray | None, bool]:
    """(scale or bias ``i`` as C float32 values or a runtime input of C values, whether it is a runtime input);
    (None, False) when it is neither (a runtime per-group vector: the reference's repeat runs)."""
    if "a" in p.consts:  # BatchNorm folded at compile time
        return p.consts["ab"[i - 1]], False
    v = arg(p, inputs, i)
    if i < len(inputs) and inputs[i] is not None:
        ok = v.size == c and v.dtype in _FLOATS and v.flags.c_contiguous
        return (v, True) if ok else (None, False)
    key = ("native", i, c)
    held = p.kernel_cache.get(key)
    if held is None:
        g = p.attrs["groups"]
        w = np.asarray(v, np.float32).reshape(-1)
        if w.size == g and g != c and g > 0 and c % g == 0:  # opset 18: one value per group
            w = np.repeat(w, c // g)
        held = p.kernel_cache[key] = np.ascontiguousarray(w) if w.size == c else None
    return held, False


def native_channels(p: Prepared, inputs) -> tuple | None:
    """(norm_channels, its arguments, {input index: argument index} of runtime parameters) for this node and these
    inputs, or None where the reference runs: no native kernels, x not a C-order float32/float16 [N, C, ...],
    BatchNorm's parameters not constant, parameters not one value per channel, C not divisible by the groups."""
    nat = runtime.native(p)
    x = arg(p, inputs, 0)
    if nat is None or not isinstance(x, np.ndarray) or x.dtype not in _FLOATS or not x.flags.c_contiguous:
        return None
    op = p.attrs["op"]
    if x.ndim < 2 or (op == "BatchNormalization" and "a" not in p.consts):
        return None
    c = x.shape[1]
    groups = {"BatchNormalization": 0, "InstanceNormalization": c}.get(op, p.attrs["groups"])
    if op != "BatchNormalization" and (groups <= 0 or c % groups):
        return None
    args: list = [None, None, None, int(op != "BatchNormalization"), groups, p.attrs["epsilon"], None,
                  runtime.threads(p)]
    live = {}
    for i in (1, 2):
        v, given = _per_channel(p, inputs, i, c)
        if v is None:
            return None
        args[i] = v
        if given:
            live[i] = i
    return nat.norm_channels, args, live


def _run_native(p: Prepared, inputs) -> list[np.ndarray] | None:
    call = native_channels(p, inputs)
    if call is None:
        return None
    fn, args, _ = call
    args[0] = arg(p, inputs, 0)
    return [fn(*args)]


def _bind(p: Prepared, inputs, outs):
    """norm_channels as the bound step for these input shapes, y into ORT's buffer when it is a partition output."""
    call = native_channels(p, inputs)
    if call is None:
        return None
    fn, args, live = call
    held = [None if i == 0 or i in live else a for i, a in enumerate(args)]
    ins = [(a, i, inputs[i].dtype, inputs[i].shape, None) for i, a in ((0, 0), *live.items())]
    where = p.runtime.partition_outputs
    into = [(_OUT_ARG, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, fn, tuple(held), ins, [(-1, None)], None, into)


def _bn_run(p: Prepared, inputs) -> list[np.ndarray]:
    outs = _run_native(p, inputs)
    if outs is not None:
        return outs
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
    outs = _run_native(p, inputs)
    if outs is not None:
        return outs
    x = arg(p, inputs, 0)
    xf = widen(x).astype(_F32, copy=False)
    y = _normalize(xf, tuple(range(2, x.ndim)), p.attrs["epsilon"])
    y *= _channel(widen(arg(p, inputs, 1)), x.ndim)
    y += _channel(widen(arg(p, inputs, 2)), x.ndim)
    return [y.astype(x.dtype, copy=False)]


def _group_run(p: Prepared, inputs) -> list[np.ndarray]:
    outs = _run_native(p, inputs)
    if outs is not None:
        return outs
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


register(KernelDef("", "BatchNormalization", _prepare, _bn_run, _cost, _check, bind=_bind))
register(KernelDef("", "InstanceNormalization", _prepare, _instance_run, _cost, _check, bind=_bind))
register(KernelDef("", "GroupNormalization", _prepare, _group_run, _cost, _check, bind=_bind))
