"""Normalization on the vector unit: LayerNormalization, RMSNormalization (opset 23), SimplifiedLayerNormalization
(ORT registers it in the default ONNX domain) and com.microsoft SkipSimplifiedLayerNormalization.

Layout: X [..., D] normalized over the trailing axes from ``axis`` (default -1; Skip* always the last axis).
Inputs are read in float32 (float16 widens once) and sums accumulate in float32 (``stash_type=1``, and the vector
unit's accumulator):
  LayerNorm:  mean = E[x], var = E[(x - mean)^2], y = (x - mean) * rsqrt(var + eps) * scale + bias
  RMS/Simplified: y = (x * scale) * rsqrt(E[x^2] + eps)
  SkipSimplified: s = input + skip (+ bias); y = s / sqrt(E[s^2] + eps) * gamma; optional outputs: mean
  (always 0, as ORT CPU), inv_std_var [..., 1] and input_skip_bias_sum s (in the input dtype).
SkipSimplified follows ORT's CPU kernel operation for operation (``skip_rms``: s^2 summed left to right in float32,
sqrt in float32, then a division and a multiplication), so given the same inputs its output has ORT's bits. That
matters more than the last ulp of accuracy: a following MatMulNBits with accuracy_level 4 quantizes this output to
int8 per block, and a 1-ulp difference that moves a value across a rounding boundary changes a code (one quantum,
~1e-4 relative on that matmul's output), which later layers amplify.
The RMS kernels take sum(x^2) per row as a float32 dot product and evaluate the per-row scalar
rsqrt(sum / D + eps) in double, rounded once to float32 (a correctly rounded rsqrt; ORT's CPU kernels keep these
statistics in double as well). A single row (a decode step) does that scalar math on Python floats, which is
cheaper than numpy calls on one-element arrays, and scales by a 0-d array (cheaper than by a Python float).
Optional statistics outputs have shape X.shape[:axis] + (1,) * (rank - axis).

Native kernels (``kernels.norm_rows``, kernels/native/norm.cc; skip_layernorm.py uses it too): float32 or float16
in memory, the same operations in float32 with the sums in 16 lanes (SkipSimplified's sum of squares in order, so
its bits stay ORT's; RMS/Simplified's on numpy's BLAS sdot, so its bits are the reference's and a fused
NormMatMul's), in the kernel and as its bound step, threaded over rows. ``native_rows`` says when it runs. An
omitted optional output is not computed (None), so such a node binds no step (``ep.step_binding`` binds all-array
outputs only) and its Python kernel calls norm_rows.

Cost per element: ~6 vector ops (sum, sub/square, accumulate, scale, shift) plus one rsqrt per row; DMA reads X
(and skip/bias), scale, and writes Y plus the optional outputs.
"""

from __future__ import annotations

import math

import numpy as np

from .. import host_blas, runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..shape_memo import memo_per_shape
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost

_F32 = np.dtype(np.float32)
_UNSET = object()


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
    return np.dtype(dts[i]) if i < len(dts) and dts[i] else _F32


def _setup(p: Prepared, ndim: int) -> tuple[int, int, np.dtype, np.dtype]:
    """Per-rank constants of this node, resolved on the first call: (first normalized axis, number of outputs,
    dtype of output 1, dtype of output 2); kept in ``p.kernel_cache`` so a call does no attribute parsing."""
    s = p.kernel_cache.get(ndim)
    if s is None:
        s = p.kernel_cache[ndim] = (p.attrs["axis"] % ndim, len(p.attrs["outputs"]), _stats_dtype(p, 1),
                                    _stats_dtype(p, 2))
    return s


def _f32(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 (a copy only when it is not float32 already)."""
    return x if x.dtype == _F32 else x.astype(_F32)


def _param(p: Prepared, inputs, i: int, ndim: int) -> np.ndarray | None:
    """Input ``i`` (scale, gamma, bias) as float32. A constant one is converted once per rank and shaped to
    ``ndim`` dims (leading 1s, kept in ``p.kernel_cache``): numpy multiplies equal-rank operands faster than it
    broadcasts a missing leading dim."""
    if i < len(inputs) and inputs[i] is not None:
        return _f32(inputs[i])
    key = (i, ndim)
    v = p.kernel_cache.get(key, _UNSET)
    if v is _UNSET:
        v = arg(p, inputs, i)  # constant or omitted (None), the same on every call
        if v is not None:
            v = _f32(v)
            v = v.reshape((1,) * (ndim - v.ndim) + v.shape) if v.ndim < ndim else v
        p.kernel_cache[key] = v
    return v


def _store(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``y`` rounded to ``dtype`` on store (no copy when it already is)."""
    return y if y.dtype == dtype else y.astype(dtype)


def _rsqrt(v: float) -> float:
    """1 / sqrt(v) with numpy's IEEE results where math would raise: inf at 0, nan below 0 or for nan."""
    if v > 0.0:
        return 1.0 / math.sqrt(v)
    return math.inf if v == 0.0 else math.nan


def inv_rms(s: np.ndarray, axis: int, eps: float) -> np.ndarray:
    """rsqrt(sum(s^2) / D + eps) over the axes from ``axis`` of float32 ``s`` (see the module docstring), as a
    float32 array of the statistics shape; a single row gives a 0-d array (numpy multiplies by a 0-d array
    faster than by a Python float)."""
    d = s.shape[-1] if axis == s.ndim - 1 else math.prod(s.shape[axis:])
    if s.size == d and d:
        flat = s.ravel()
        v = float(flat.dot(flat)) / d + eps
        return np.array(1.0 / math.sqrt(v) if v > 0.0 else _rsqrt(v), _F32)
    lead = s.shape[:axis]
    rows = s.reshape(lead + (d,))
    ms = np.vecdot(rows, rows).astype(np.float64)
    ms /= d
    ms += eps
    np.sqrt(ms, out=ms)
    np.divide(1.0, ms, out=ms)
    return ms.astype(_F32).reshape(lead + (1,) * (s.ndim - axis))


def skip_rms(s: np.ndarray, eps: float) -> np.ndarray:
    """sqrt(sum(s^2) / D + eps) over the last axis of float32 ``s`` with ORT's SkipSimplifiedLayerNormalization
    arithmetic: float32 squares summed sequentially in float32, float32 division and sqrt; shape [..., 1]."""
    d = s.shape[-1]
    sq = np.multiply(s, s)
    if s.size == d and d:  # one row (a decode step): the scalar tail on a float32 scalar, not on 1-element arrays
        flat = sq.reshape(-1)
        np.add.accumulate(flat, out=flat)
        ms = flat[-1] / _F32.type(d) + _F32.type(eps)  # float32 scalar arithmetic, as the array ops round
        tail = sq[..., -1:]
        # sqrt of a float32 in double, rounded once to float32: equals the float32 sqrt (53 >= 2 * 24 + 2 bits)
        tail[...] = math.sqrt(ms) if ms >= 0 else np.sqrt(ms)  # numpy's NaN bits below 0 and for NaN
        return tail
    total = np.add.accumulate(sq, axis=-1, out=sq)[..., -1:]
    ms = total / _F32.type(d)
    ms += _F32.type(eps)
    return np.sqrt(ms, out=ms)


def _inv_stat(inv: np.ndarray, ndim: int, dtype: np.dtype) -> np.ndarray:
    """The inv_std_var output from ``inv_rms``'s result (a single row's 0-d array becomes [1, ..., 1])."""
    if inv.ndim != ndim:
        inv = inv.reshape((1,) * ndim)
    return _store(inv, dtype)


def _zero_mean(p: Prepared, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """SkipSimplified's mean output (zeros [..., 1]); a single row's is one read-only array kept per shape
    (``shape_memo``; outputs are only read downstream and copied out to ORT)."""
    shape = x.shape[:-1] + (1,)
    if x.size != x.shape[-1]:
        return np.zeros(shape, dtype)
    return memo_per_shape(p, "zeros", shape, _read_only_zeros, shape, dtype)


def _read_only_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    z = np.zeros(shape, dtype)
    z.flags.writeable = False
    return z


# per op: native kind, {input index: norm_rows argument index}, (y, mean, inv, sum) result index of each output
ROW_KINDS: dict[str, tuple[int, dict[int, int], tuple[int, ...]]] = {
    "LayerNormalization": (0, {0: 0, 1: 3, 2: 4}, (0, 1, 2)),
    "RMSNormalization": (1, {0: 0, 1: 3}, (0, 2)),
    "SimplifiedLayerNormalization": (1, {0: 0, 1: 3}, (0, 2)),
    "SkipSimplifiedLayerNormalization": (2, {0: 0, 1: 1, 2: 3, 3: 2}, (0, 1, 2, 3)),
    "SkipLayerNormalization": (3, {0: 0, 1: 1, 2: 3, 3: 4, 4: 2}, (0, 1, 2, 3)),
}
_OUT_ARG = 11  # norm_rows' ``out``
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _rows_repeat(skip: tuple[int, ...], x: tuple[int, ...]) -> bool:
    """Whether a skip of shape ``skip`` is whole rows of ``x`` repeating over its leading axes."""
    while skip and skip[0] == 1 and len(skip) > 1:
        skip = skip[1:]
    return len(skip) <= len(x) and tuple(x[len(x) - len(skip):]) == tuple(skip)


def _const_param(p: Prepared, i: int, v: np.ndarray) -> np.ndarray:
    """A constant parameter as the C-order float32 vector norm_rows reads (converted once)."""
    key = ("native", i)
    held = p.kernel_cache.get(key)
    if held is None:
        held = p.kernel_cache[key] = np.ascontiguousarray(v, np.float32).reshape(-1)
    return held


def native_rows(p: Prepared, inputs) -> tuple | None:
    """(norm_rows, its arguments, {input index: argument index} of the runtime inputs, result index per output, the
    statistics shape) for this node and these inputs, or None where the reference runs: no native kernels, x not a
    non-empty C-order float32/float16 array, a statistics output that is not float32, a parameter that is not one
    value per normalized element, or a skip that is not whole rows of x."""
    nat = runtime.native(p)
    x = arg(p, inputs, 0)
    if nat is None or not isinstance(x, np.ndarray) or x.dtype not in _FLOATS or not x.flags.c_contiguous or not x.size:
        return None
    kind, arg_of, result_of = ROW_KINDS[p.attrs["op"]]
    want = p.attrs["outputs"]  # an omitted optional output is not computed (None: nothing reads it)
    axis = p.attrs["axis"] % x.ndim
    d = math.prod(x.shape[axis:])
    dts = p.attrs["out_dtypes"]
    for i, w in enumerate(want[1:], 1):
        if w and result_of[i] in (1, 2) and (dts[i] or "float32") != "float32":
            return None
    args: list = [None, None, None, None, None, kind, d, p.attrs["epsilon"], *(
        any(w and result_of[i] == r for i, w in enumerate(want)) for r in (1, 2, 3)), None, runtime.threads(p),
        host_blas.sdot_address() or 0 if kind == 1 else 0]
    live = {}
    for i, a in arg_of.items():
        v = arg(p, inputs, i)
        given = i < len(inputs) and inputs[i] is not None
        if v is None:
            continue
        if not isinstance(v, np.ndarray) or v.dtype not in _FLOATS:
            return None
        if a == 1:
            if v.dtype != x.dtype or not v.flags.c_contiguous or not _rows_repeat(v.shape, x.shape):
                return None
        elif a != 0 and v.size != d:
            return None
        if given:
            live[i] = a
            args[a] = v
        else:
            args[a] = _const_param(p, i, v)
    if args[3] is None:
        return None
    stats = x.shape[:axis] + (1,) * (x.ndim - axis)
    return nat.norm_rows, args, live, result_of, stats


def run_native_rows(p: Prepared, inputs) -> list | None:
    """The node's outputs from norm_rows, or None where ``native_rows`` declines."""
    call = native_rows(p, inputs)
    if call is None:
        return None
    fn, args, _, result_of, stats = call
    res = fn(*args)
    return [None if not w else res[r] if r in (0, 3) else res[r].reshape(stats)
            for w, r in zip(p.attrs["outputs"], result_of)]


def bind_rows(p: Prepared, inputs, outs):
    """norm_rows as the bound step for these input shapes: constants held as float32, y into ORT's buffer when it is
    a partition output."""
    call = native_rows(p, inputs)
    if call is None:
        return None
    fn, args, live, result_of, stats = call
    held = [None if i in (0, *live.values()) else a for i, a in enumerate(args)]
    ins = [(a, i, inputs[i].dtype, inputs[i].shape, None) for i, a in ((0, 0), *live.items())]
    outputs = [(r, None if r in (0, 3) or o is None else stats) for o, r in zip(outs, result_of)]
    where = p.runtime.partition_outputs
    into = [(_OUT_ARG, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, fn, tuple(held), ins, outputs, None, into)


def _bind(p: Prepared, inputs, outs):
    return bind_rows(p, inputs, outs)


def _layer_norm_run(p: Prepared, inputs) -> list[np.ndarray]:
    outs = run_native_rows(p, inputs)
    if outs is not None:
        return outs
    x = arg(p, inputs, 0)
    axis, n_out, mean_dt, inv_dt = _setup(p, x.ndim)
    xf = _f32(x)
    axes = tuple(range(axis, x.ndim))
    d = math.prod(x.shape[axis:])
    mean = np.add.reduce(xf, axis=axes, keepdims=True)
    mean /= d
    centered = xf - mean
    var = np.add.reduce(np.square(centered), axis=axes, keepdims=True)
    var /= d
    var += _F32.type(p.attrs["epsilon"])
    inv_std = np.sqrt(var, out=var)
    np.divide(1.0, inv_std, out=inv_std)
    y = np.multiply(centered, inv_std, out=centered)
    y *= _param(p, inputs, 1, x.ndim)
    bias = _param(p, inputs, 2, x.ndim)
    if bias is not None:
        y += bias
    return [_store(y, x.dtype), _store(mean, mean_dt), _store(inv_std, inv_dt)][:n_out]


def _rms_norm_run(p: Prepared, inputs) -> list[np.ndarray]:
    """RMSNormalization (opset 23) and SimplifiedLayerNormalization (output 1: inv_std_var)."""
    outs = run_native_rows(p, inputs)
    if outs is not None:
        return outs
    x = arg(p, inputs, 0)
    axis, n_out, inv_dt, _ = _setup(p, x.ndim)
    xf = _f32(x)
    inv = inv_rms(xf, axis, p.attrs["epsilon"])
    y = np.multiply(xf, _param(p, inputs, 1, x.ndim))
    y *= inv
    if n_out == 1:
        return [_store(y, x.dtype)]
    return [_store(y, x.dtype), _inv_stat(inv, x.ndim, inv_dt)]


def _skip_rms_norm_run(p: Prepared, inputs) -> list[np.ndarray]:
    outs = run_native_rows(p, inputs)
    if outs is not None:
        return outs
    x, skip = arg(p, inputs, 0), arg(p, inputs, 1)
    ndim = x.ndim
    _, n_out, mean_dt, inv_dt = _setup(p, ndim)
    s = np.add(x, skip) if x.dtype == _F32 == skip.dtype else np.add(x, skip, dtype=_F32)
    bias = _param(p, inputs, 3, ndim)
    if bias is not None:
        s += bias
    ms = skip_rms(s, p.attrs["epsilon"])
    y = np.divide(s, ms)
    y *= _param(p, inputs, 2, ndim)
    outs = [_store(y, x.dtype)]
    wanted = p.attrs["outputs"]  # an omitted optional output is not computed (None: nothing reads it)
    if n_out > 1:  # ORT's CPU kernel leaves the (meaningless) mean at 0
        outs.append(_zero_mean(p, x, mean_dt) if wanted[1] else None)
    if n_out > 2:
        outs.append(_store(np.divide(_F32.type(1.0), ms), inv_dt) if wanted[2] else None)
    if n_out > 3:
        outs.append(_store(s, x.dtype))
    return outs


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


register(KernelDef("", "LayerNormalization", _prepare, _layer_norm_run, _cost, _check, rank_free=True,
                   bind=_bind))
register(KernelDef("", "RMSNormalization", _prepare, _rms_norm_run, _cost, _check, rank_free=True,
                   bind=_bind))
register(KernelDef("", "SimplifiedLayerNormalization", _prepare, _rms_norm_run, _cost, _check, rank_free=True,
                   bind=_bind))
register(KernelDef("com.microsoft", "SkipSimplifiedLayerNormalization", _prepare, _skip_rms_norm_run, _cost, _check,
                   rank_free=True, bind=_bind))
