"""``npu::QdqMatMul``: a ``DQ(x) -> MatMul(DQ(W)) -> Q`` unit with 8- or 16-bit activations and 8- or 4-bit
constant weights (QNN-style a16w8 / a16w4 graphs), built by ``kernels.fusion.qdq``.

Inputs (all constant but x): x, x_scale, x_zp (per tensor), W ``[K, N]`` (int4/uint4 unpacked), w_scale and w_zp
(per tensor or per column), y_scale, y_zp (per tensor). The output type is y_zp's.

Numerics: ``acc = (x - x_zp) @ (W - w_zp)`` is exact integer math in an accumulator of
``matrix.a16_accumulator_bits`` bits (the check declines a K whose worst case could overflow it); the host computes
it with float64 BLAS, exact because every partial sum stays below 2^53. Requantization as the unoptimized graph
does it: ``y = float32(acc * x_scale * w_scale)`` then QuantizeLinear (``rint(y / y_scale) + y_zp``, saturating).
ORT with optimizations disabled sums dequantized products in float32, so results agree within one quantum.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..support import dtype_name
from ..target import Target
from ._matrix import QRANGE, int_bound, matmul_dims, planned_cost, quantize_float
from ._util import arg

_F64_EXACT = 2 ** 53


def _bits(target: Target, act: str) -> int:
    """Accumulator bits: the 16-bit-activation width from the target table, int32 for 8-bit activations."""
    if act in ("int16", "uint16"):
        return int(target.matrix.get("a16_accumulator_bits", 0))
    return 32


def _check(node: NodeInfo, target: Target) -> str | None:
    x, w = node.input(0), node.input(3)
    act = dtype_name(x)
    if act not in QRANGE or w is None or w.value is None or np.ndim(w.value) != 2:
        return f"{node.describe()}: needs integer activations and a constant 2-D integer weight"
    bits = _bits(target, act)
    if not bits:
        return (f"{node.describe()}: 16-bit activations need a wide accumulator; target {target.name} has none "
                "(matrix.a16_accumulator_bits)")
    k = np.shape(w.value)[0]
    wz = np.asarray(node.input(5).value, np.int64)
    worst = k * int_bound(act, node.input(2).value) * int(np.abs(np.asarray(w.value, np.int64) - wz).max(initial=1))
    if worst >= min(2 ** (bits - 1), _F64_EXACT):
        return (f"{node.describe()}: K={k} can overflow the {bits}-bit accumulator of target {target.name} "
                f"(worst case {worst})")
    return None


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    c = lambda i: np.asarray(node.input(i).value)
    w = c(3).astype(np.float64) - c(5).astype(np.float64).reshape(-1)
    act, wt = dtype_name(node.input(0)), dtype_name(node.input(3))
    consts = {"w": np.ascontiguousarray(w), "xzp": c(2).astype(np.float64).reshape(()),
              "mult": (c(1).astype(np.float64).reshape(()) * c(4).astype(np.float64).reshape(-1)),
              "ys": c(6).astype(np.float32).reshape(()), "yzp": c(7).reshape(())}
    attrs = {"act": act, "out": dtype_name(node.outputs[0]) or c(7).dtype.name, "plan_a": "int8",
             "plan_b": "int4" if wt in ("int4", "uint4") else "int8", "plan_out": "int8",
             "passes": 2 if act in ("int16", "uint16") else 1}
    return Prepared(attrs, consts, target)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    c = p.consts
    x = arg(p, inputs, 0).astype(np.float64)
    x -= c["xzp"]
    acc = x @ c["w"]  # exact integers (checked bound)
    y = (acc * c["mult"]).astype(np.float32)
    return [quantize_float(y, c["ys"], c["yzp"], p.attrs["out"])]


def _cost(p: Prepared, shapes) -> OpCost:
    k, n = p.consts["w"].shape
    m, n, k, batch = matmul_dims(shapes[0], (k, n))
    cost = planned_cost(p, m, n, k, batch)
    passes = p.attrs["passes"]  # a 16-bit activation is two int8 passes through the array
    cost.compute_cycles *= passes
    cost.cycles *= passes
    return cost


register(KernelDef("npu", "QdqMatMul", _prepare, _run, _cost, _check))
