"""Data movement: Reshape (a view), Transpose (a DMA pass)."""

from __future__ import annotations

import numpy as np

from ..cost import movement_cost
from ..node import NodeInfo
from ..registry import KernelDef, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants


def _reshape_prepare(node: NodeInfo, target: Target) -> Prepared:
    return Prepared({"allowzero": int(node.attr("allowzero", 0))}, stash_constants(node), target)


def _reshape_run(p: Prepared, inputs):
    x, shape = arg(p, inputs, 0), arg(p, inputs, 1)
    shape = [int(s) for s in shape]
    if not p.attrs["allowzero"]:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _transpose_prepare(node: NodeInfo, target: Target) -> Prepared:
    perm = node.attr("perm")
    return Prepared({"perm": list(perm) if perm is not None else None,
                     "itemsize": node.outputs[0].dtype.itemsize if node.outputs[0].dtype is not None else 4},
                    stash_constants(node), target)


def _transpose_run(p: Prepared, inputs):
    return [np.transpose(arg(p, inputs, 0), p.attrs["perm"])]


register(KernelDef("", "Reshape", _reshape_prepare, _reshape_run, lambda p, s: movement_cost(p.target, 0)))
register(KernelDef("", "Transpose", _transpose_prepare, _transpose_run,
                   lambda p, s: movement_cost(p.target, nbytes(s[0], p.attrs["itemsize"]))))
