"""``npu::QdqMatMul``: a ``DQ(x) -> MatMul(DQ(W)) -> Q`` unit with 8- or 16-bit activations and 8- or 4-bit
constant weights (QNN-style a16w8 / a16w4 graphs), built by ``kernels.fusion.qdq``.

Inputs (all constant but x): x, x_scale, x_zp (per tensor), W ``[K, N]`` (int4/uint4 unpacked), w_scale and w_zp
(per tensor or per column), y_scale, y_zp (per tensor). The output type is y_zp's.

Numerics: ``acc = (x - x_zp) @ (W - w_zp)`` is exact integer math in an accumulator of
``matrix.a16_accumulator_bits`` bits (the check declines a K whose worst case could overflow it); the host computes
it with float64 BLAS, exact because every partial sum stays below 2^53. Requantization as the unoptimized graph
does it: ``y = float32(acc * x_scale * w_scale)`` then QuantizeLinear (``rint(y / y_scale) + y_zp``, saturating).
ORT with optimizations disabled sums dequantized products in float32, so results agree within one quantum.
A small product (M * K * N up to ``SMALL_PRODUCT``) runs natively as ``qdq_matmul_small``
(kernels/native/qdq_matmul.cc, the same float64 and float32 steps), bound as the step for its input shape: there
a BLAS call's fixed cost is most of the time; larger products stay on the float64 BLAS (the reference).
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..support import dtype_name
from ..target import Target
from ._matrix import QRANGE, container_dtype, int_bound, matmul_dims, planned_cost, quantize_float
from ._util import arg

_F64_EXACT = 2 ** 53
SMALL_PRODUCT = 1 << 16  # M * K * N up to which the native loop beats a BLAS call


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


def _native_args(p: Prepared, x) -> tuple | None:
    """(native function, its arguments after x) for a small product of this x, else None (the reference runs)."""
    nat = runtime.native(p)
    c = p.consts
    k, n = c["w"].shape
    out = np.dtype(container_dtype(p.attrs["out"]))
    if nat is None or not isinstance(x, np.ndarray) or x.dtype.name not in ("int8", "uint8", "int16", "uint16") \
            or out.itemsize > 2 or not x.ndim or x.shape[-1] != k or x.size * n > SMALL_PRODUCT:
        return None
    lo, hi = QRANGE[p.attrs["out"]]
    mult = np.ascontiguousarray(c["mult"], np.float64).reshape(-1)
    return nat.qdq_matmul_small, (c["w"], float(c["xzp"]), mult, np.float32(c["ys"]), np.float32(c["yzp"]),
                                  np.float32(lo), np.float32(hi), out)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    c = p.consts
    x = arg(p, inputs, 0)
    fast = _native_args(p, x)
    if fast is not None and x.flags.c_contiguous:
        fn, args = fast
        return [fn(x, *args)]
    x = x.astype(np.float64)
    x -= c["xzp"]
    acc = x @ c["w"]  # exact integers (checked bound)
    y = (acc * c["mult"]).astype(np.float32)
    return [quantize_float(y, c["ys"], c["yzp"], p.attrs["out"])]


def _bind(p: Prepared, inputs, outs):
    """A small product as one ``qdq_matmul_small`` call for this input shape."""
    x = arg(p, inputs, 0)
    fast = _native_args(p, x)
    if fast is None or not inputs or inputs[0] is None:
        return None
    fn, args = fast
    return runtime.call_step(p, fn, (None, *args), [(0, 0, x.dtype, x.shape, None)], [(-1, None)])


def _cost(p: Prepared, shapes) -> OpCost:
    k, n = p.consts["w"].shape
    m, n, k, batch = matmul_dims(shapes[0], (k, n))
    cost = planned_cost(p, m, n, k, batch)
    passes = p.attrs["passes"]  # a 16-bit activation is two int8 passes through the array
    cost.compute_cycles *= passes
    cost.cycles *= passes
    return cost


register(KernelDef("npu", "QdqMatMul", _prepare, _run, _cost, _check, bind=_bind))
