"""Float MatMul/Gemm on the matrix unit (seed version: numpy matmul; the tiled kernel replaces it)."""

from __future__ import annotations

import numpy as np

from ..cost import dma_cycles
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, stash_constants


def _prepare_matmul(node: NodeInfo, target: Target) -> Prepared:
    return Prepared({"op": node.op_type}, stash_constants(node), target)


def _run_matmul(p: Prepared, inputs):
    return [np.matmul(arg(p, inputs, 0), arg(p, inputs, 1))]


def _prepare_gemm(node: NodeInfo, target: Target) -> Prepared:
    attrs = {k: node.attr(k, d) for k, d in (("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 0))}
    return Prepared({"op": "Gemm", **attrs}, stash_constants(node), target)


def _run_gemm(p: Prepared, inputs):
    a, b, c = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    a = a.T if p.attrs["transA"] else a
    b = b.T if p.attrs["transB"] else b
    y = a @ b
    if p.attrs["alpha"] != 1.0:
        y = y * np.float32(p.attrs["alpha"])
    if c is not None:
        y = y + (c * np.float32(p.attrs["beta"]) if p.attrs["beta"] != 1.0 else c)
    return [y.astype(a.dtype, copy=False)]


def _cost(p: Prepared, shapes) -> OpCost:
    a, b = shapes[0], shapes[1]
    if p.attrs["op"] == "Gemm":
        m, k = (a[1], a[0]) if p.attrs["transA"] else a
        n = b[0] if p.attrs["transB"] else b[1]
        batch = 1
    else:
        m, k, n = a[-2] if len(a) > 1 else 1, a[-1], b[-1]
        batch = int(np.prod(a[:-2], dtype=np.int64)) if len(a) > 2 else 1
    t = p.target
    macs = batch * m * n * k
    rate = float(t.matrix["macs_per_cycle"].get(t.matrix.get("float_compute", "float16"), 1))
    compute = macs / rate
    moved = 2 * batch * (m * k + k * n + m * n)
    dma = dma_cycles(t, moved, transfers=3)
    cycles = max(compute, dma)
    return OpCost(compute_cycles=compute, dma_cycles=dma, cycles=cycles, dma_bytes=moved, macs=macs,
                  utilization=macs / (cycles * rate) if cycles else 0.0, unit="matrix")


register(KernelDef("", "MatMul", _prepare_matmul, _run_matmul, _cost))
register(KernelDef("", "Gemm", _prepare_gemm, _run_gemm, _cost))
