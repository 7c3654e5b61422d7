"""com.microsoft BiasGelu and QuickGelu on the vector unit (Gelu, opset-20 Gelu and FastGelu live in elementwise.py).

  BiasGelu:  y = gelu_erf(x + bias), bias [D] broadcast over the last axis of x (ORT's BERT fusion output)
  QuickGelu: y = x * sigmoid(alpha * x), alpha default 1.702 (CLIP-style encoders)

Numerics as the element-wise kernels: float16 widens to float32, the bias add and the activation run in float32,
one rounding on store. Cost: ``_vector.stream_cost`` over the output elements (BiasGelu: add + Gelu's 3 plain ops
and one erf; QuickGelu: scale, negate, add, divide, multiply and one exp).
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen
from .elementwise import _gelu_erf, _sigmoid

_OPS = {"BiasGelu": (4.0, 1.0), "QuickGelu": (5.0, 1.0)}  # op -> (plain ops, transcendental ops) per element


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"op": node.op_type, "alpha": float(node.attr("alpha", 1.702)),
             "in_itemsizes": [itemsize_of(v) for v in node.inputs], "out_itemsize": itemsize_of(node.outputs[0])}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x is None or x.dtype is None or not np.issubdtype(x.dtype, np.floating):
        return f"{node.describe()}: {node.op_type} needs a float input"
    if node.op_type == "BiasGelu":
        b = node.input(1)
        if b is None:
            return f"{node.describe()}: BiasGelu needs its bias input"
        if b.shape is not None and x.shape is not None and (len(b.shape) != 1 or b.shape[0] != x.shape[-1]):
            return f"{node.describe()}: bias {b.describe()} must be 1-D with the last dim of {x.describe()}"
    return None


def _bias_gelu_run(p: Prepared, inputs) -> list[np.ndarray]:
    x, bias = arg(p, inputs, 0), arg(p, inputs, 1)
    return [_gelu_erf(widen(x) + widen(bias)).astype(x.dtype, copy=False)]


def _quick_gelu_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    xc = widen(x)
    return [(xc * _sigmoid(xc * xc.dtype.type(p.attrs["alpha"]))).astype(x.dtype, copy=False)]


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    ops, trans = _OPS[p.attrs["op"]]
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in, n * p.attrs["out_itemsize"], ops, trans)


register(KernelDef("com.microsoft", "BiasGelu", _prepare, _bias_gelu_run, _cost, _check))
register(KernelDef("com.microsoft", "QuickGelu", _prepare, _quick_gelu_run, _cost, _check))
