"""com.microsoft SkipLayerNormalization (the BERT residual + LayerNorm fusion) on the vector unit.

Inputs: input [..., D], skip (same shape, or [S, D] / [1, S, D] broadcast over the batch), gamma [D], optional beta
[D], optional bias [D]. Outputs: y, optional mean [..., 1], inv_std_var [..., 1] and input_skip_bias_sum s.

As ORT 1.31's CPU kernel: s = input + skip (+ bias) in float32 (float16 widens once),
  mean = E[s], var = E[s^2] - mean^2 (one pass, as ORT), y = (s - mean) / sqrt(var + eps) * gamma (+ beta),
the statistics rows in float32; y and s rounded once to the input dtype.
(SkipSimplifiedLayerNormalization, the RMS variant, is in norm.py.) Native kernels: norm.py's ``norm_rows`` (the same
operations, the sums in 16 float32 lanes), in the kernel and as its bound step.

Cost: ``_vector.stream_cost`` over the elements with ~7 vector ops each (2 adds, square-accumulate, sum,
subtract, scale, shift) and one rsqrt per row; DMA of every input and every requested output.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost
from .norm import bind_rows, run_native_rows

_F32 = np.dtype(np.float32)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    stat_dtypes = [v.dtype.name if v.dtype is not None else "float32" for v in node.outputs]
    attrs = {"op": "SkipLayerNormalization", "axis": -1, "epsilon": float(node.attr("epsilon", 1e-12)),
             "outputs": [not v.missing for v in node.outputs], "stat_dtypes": stat_dtypes,
             "out_dtypes": stat_dtypes,
             "in_itemsizes": [itemsize_of(v) for v in node.inputs]}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    x, skip, gamma = node.input(0), node.input(1), node.input(2)
    if x is None or x.dtype is None or not np.issubdtype(x.dtype, np.floating):
        return f"{op}: SkipLayerNormalization needs a float input"
    if skip is None or gamma is None:
        return f"{op}: SkipLayerNormalization needs its skip and gamma inputs"
    if x.shape is not None and len(x.shape) != 3:
        return f"{op}: input {x.describe()} must be 3-D [batch, sequence, hidden] (ORT's rule)"
    d = x.shape[-1] if x.shape is not None else None
    for i, what in ((2, "gamma"), (3, "beta"), (4, "bias")):
        v = node.input(i)
        if v is not None and v.shape is not None and isinstance(d, int) and tuple(v.shape) != (d,):
            return f"{op}: {what} {v.describe()} must be 1-D of the hidden size {d}"
    return None


def _f32(p: Prepared, inputs, i: int) -> np.ndarray | None:
    v = arg(p, inputs, i)
    return v if v is None or v.dtype == _F32 else v.astype(_F32)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    outs = run_native_rows(p, inputs)
    if outs is not None:
        return outs
    x, skip = arg(p, inputs, 0), arg(p, inputs, 1)
    gamma, beta, bias = (_f32(p, inputs, i) for i in (2, 3, 4))
    s = np.add(x, skip, dtype=_F32)
    if bias is not None:
        s += bias
    d = s.shape[-1]
    mean = np.add.reduce(s, axis=-1, keepdims=True) / _F32.type(d)
    var = np.vecdot(s, s)[..., None] / _F32.type(d)
    var -= mean * mean
    var += _F32.type(p.attrs["epsilon"])
    std = np.sqrt(var, out=var)
    y = s - mean
    y /= std
    y *= gamma
    if beta is not None:
        y += beta
    want = p.attrs["outputs"]
    dts = p.attrs["stat_dtypes"]
    outs = [y.astype(x.dtype, copy=False)]
    if len(want) > 1:
        outs.append(mean.astype(dts[1], copy=False))
    if len(want) > 2:
        outs.append((_F32.type(1.0) / std).astype(dts[2], copy=False))
    if len(want) > 3:
        outs.append(s.astype(x.dtype, copy=False))
    return outs


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    n = elems(x)
    rows = n // x[-1] if x and x[-1] else 0
    size = p.attrs["in_itemsizes"][0]
    want = p.attrs["outputs"]
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    b_out = n * size * (1 + (len(want) > 3 and want[3])) + rows * 4 * sum(want[1:3])
    return stream_cost(p, n, b_in, b_out, 7.0, rows / max(n, 1))


register(KernelDef("com.microsoft", "SkipLayerNormalization", _prepare, _run, _cost, _check, bind=bind_rows))
