"""com.microsoft BiasGelu and QuickGelu on the vector unit (Gelu, opset-20 Gelu and FastGelu live in elementwise.py).

  BiasGelu:  y = gelu_erf(x + bias), bias [D] broadcast over the last axis of x (ORT's BERT fusion output)
  QuickGelu: y = x * sigmoid(alpha * x), alpha default 1.702 (CLIP-style encoders)

Numerics as the element-wise kernels: float16 widens to float32, the bias add and the activation run in float32,
one rounding on store. Both run natively on the element-wise engine in float32 and float16 and bind as steps:
BiasGelu as ``tail_of_bias`` (the bias add, then GELU_ERF's instructions: the reference's bits), QuickGelu as
``save, mul alpha, sigmoid, mul_saved`` (the engine's sigmoid: its exp within 2 ulp of numpy's, the sigmoid
within 4).
Cost: ``_vector.stream_cost`` over the output elements (BiasGelu: add + Gelu's 3 plain ops and one erf; QuickGelu:
scale, negate, add, divide, multiply and one exp).
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants
from .elementwise import ENGINE_KEY, bias_engine_bind, bias_engine_call, engine_bind, engine_runner
from ._vector import elems, itemsize_of, stream_cost, widen
from ..tail_program import CODES, GELU_ERF
from .float_math import gelu_erf, sigmoid

_OPS = {"BiasGelu": (4.0, 1.0), "QuickGelu": (5.0, 1.0)}  # op -> (plain ops, transcendental ops) per element


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"op": node.op_type, "alpha": float(node.attr("alpha", 1.702)),
             "in_itemsizes": [itemsize_of(v) for v in node.inputs], "out_itemsize": itemsize_of(node.outputs[0]),
             "out_dtype": node.outputs[0].dtype.name if node.outputs[0].dtype is not None else None}
    if node.op_type == "QuickGelu":  # x * sigmoid(alpha x), alpha as the float32 the reference multiplies by
        attrs[ENGINE_KEY] = [["save", 0.0, 0.0], ["mul", float(np.float32(attrs["alpha"])), 0.0],
                             ["sigmoid", 0.0, 0.0], ["mul_saved", 0.0, 0.0]]
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
    """x + bias in float32, then the engine's exact GELU instructions in one native pass (``tail_of_bias``: the
    reference's bits), else the reference."""
    x, bias = arg(p, inputs, 0), arg(p, inputs, 1)
    y = bias_engine_call(p, x, bias, _gelu_program())
    if y is not None:
        return [y]
    return [gelu_erf(widen(x) + widen(bias)).astype(x.dtype, copy=False)]


def _bias_gelu_bind(p: Prepared, inputs, outs):
    return bias_engine_bind(p, inputs, outs, _gelu_program())


_GELU_PROGRAM: list = []


def _gelu_program() -> tuple[np.ndarray, np.ndarray]:
    """(codes, consts) of the engine's exact GELU (``tail_program.GELU_ERF``), made once."""
    if not _GELU_PROGRAM:
        _GELU_PROGRAM.append((np.asarray([CODES[t[0]] for t in GELU_ERF], np.int32),
                              np.asarray([t[1:] for t in GELU_ERF], np.float32).reshape(-1, 2)))
    return _GELU_PROGRAM[0]


def _quick_gelu_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    xc = widen(x)
    return [(xc * sigmoid(xc * xc.dtype.type(p.attrs["alpha"]))).astype(x.dtype, copy=False)]


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    ops, trans = _OPS[p.attrs["op"]]
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in, n * p.attrs["out_itemsize"], ops, trans)


register(KernelDef("com.microsoft", "BiasGelu", _prepare, _bias_gelu_run, _cost, _check, bind=_bias_gelu_bind))
register(KernelDef("com.microsoft", "QuickGelu", _prepare, engine_runner(_quick_gelu_run), _cost, _check,
                   bind=engine_bind))
