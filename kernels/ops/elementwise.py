"""Element-wise ops on the vector unit (numpy broadcasting == ONNX multidirectional broadcasting)."""

from __future__ import annotations

import numpy as np

from ..cost import vector_cost
from ..node import NodeInfo
from ..registry import KernelDef, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants

_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_UNARY = {
    "Relu": (lambda x: np.maximum(x, x.dtype.type(0)), 1.0),
    "Sigmoid": (lambda x: (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False), 4.0),
    "Tanh": (np.tanh, 4.0),
}


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    out = node.outputs[0]
    return Prepared({"op": node.op_type, "itemsize": out.dtype.itemsize if out.dtype is not None else 4},
                    stash_constants(node), target)


def _cost(p: Prepared, shapes) -> OpCost:  # noqa: F821 - annotation only
    item = p.attrs["itemsize"]
    out = np.broadcast_shapes(*[s for s in shapes if s is not None]) if any(shapes) else ()
    n = int(np.prod(out, dtype=np.int64))
    ops = _UNARY[p.attrs["op"]][1] if p.attrs["op"] in _UNARY else 1.0
    return vector_cost(p.target, n, sum(nbytes(s, item) for s in shapes), n * item, ops)


def _binary_run(p: Prepared, inputs):
    a, b = arg(p, inputs, 0), arg(p, inputs, 1)
    return [_BINARY[p.attrs["op"]](a, b)]


def _unary_run(p: Prepared, inputs):
    return [_UNARY[p.attrs["op"]][0](arg(p, inputs, 0))]


for _op in _BINARY:
    register(KernelDef("", _op, _prepare, _binary_run, _cost))
for _op in _UNARY:
    register(KernelDef("", _op, _prepare, _unary_run, _cost))
