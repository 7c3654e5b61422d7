"""Softmax on the vector unit (max-subtracted, in the input dtype)."""

from __future__ import annotations

import numpy as np

from ..cost import vector_cost
from ..node import NodeInfo
from ..registry import KernelDef, Prepared, register
from ..target import Target
from ._util import arg, nbytes


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    default_axis = -1 if node.since_version >= 13 or node.since_version == 0 else 1
    return Prepared({"axis": int(node.attr("axis", default_axis)),
                     "itemsize": node.outputs[0].dtype.itemsize if node.outputs[0].dtype is not None else 4}, {}, target)


def _run(p: Prepared, inputs):
    x = arg(p, inputs, 0)
    e = np.exp(x - x.max(axis=p.attrs["axis"], keepdims=True))
    return [e / e.sum(axis=p.attrs["axis"], keepdims=True)]


def _check(node: NodeInfo, target: Target) -> str | None:
    if 0 < node.since_version < 13:
        return f"{node.describe()}: opset<13 Softmax (coerced-2D semantics) not supported"
    return None


def _cost(p: Prepared, shapes):
    n = int(np.prod(shapes[0], dtype=np.int64))
    return vector_cost(p.target, n, nbytes(shapes[0], p.attrs["itemsize"]), nbytes(shapes[0], p.attrs["itemsize"]), 6.0)


register(KernelDef("", "Softmax", _prepare, _run, _cost, _check))
