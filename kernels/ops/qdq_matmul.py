"""``npu::QdqMatMul``: a ``DQ(x) -> MatMul(DQ(W)) -> Q`` unit with 8- or 16-bit activations and 8- or 4-bit
constant weights (QNN-style a16w8 / a16w4 graphs), built by ``kernels.fusion.qdq``.

Inputs (all constant but x): x, x_scale, x_zp (per tensor), W ``[K, N]`` (int4/uint4 unpacked), w_scale and w_zp
(per tensor or per column), y_scale, y_zp (per tensor). The output type is y_zp's.

Numerics: ``acc = (x - x_zp) @ (W - w_zp)`` is exact integer math in an accumulator of
``matrix.a16_accumulator_bits`` bits (the check declines a K whose worst case could overflow it); the host computes
it with float64 BLAS, exact because every partial sum stays below 2^53. Requantization as the unoptimized graph
does it: ``y = float32(acc * x_scale * w_scale)`` then QuantizeLinear (``rint(y / y_scale) + y_zp``, saturating).
ORT with optimizations disabled sums dequantized products in float32, so results agree within one quantum.
Natively (kernels/native/qdq_matmul.cc), bound as the step for x's shape: ``qdq_matmul_int`` computes acc as an
exact integer GEMM on W - w_zp packed once here as int16 panels (int32 lanes flushed to int64 before they could
wrap: ``chunk_pairs``), then the same float32 steps; a weight whose |W - w_zp| does not fit that (over 32767) takes
``qdq_matmul_small`` (float64, exact) for a small product and the reference otherwise.
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
SMALL_PRODUCT = 1 << 16  # M * K * N up to which the float64 native loop beats a BLAS call
_INT32_MAX = 2 ** 31 - 1
_XS_BOUND = 32768  # |x as the kernel's int16|: x itself, or x - 32768 for uint16


def pack_int_weights(w: np.ndarray) -> dict[str, np.ndarray] | None:
    """W - w_zp ``[K, N]`` (integers) as ``qdq_matmul_int``'s int16 panels ``[ceil(N/16), ceil(K/2), 16, 2]`` with
    its column sums and the pairs of K after which its int32 lanes go to int64: a pair adds at most
    2 * 32768 * max|W - w_zp| to a lane, so ``chunk_pairs`` of them stay below 2^31 (128 for 8-bit weights).
    None when max|W - w_zp| > 32767 (not int16, or one pair could already wrap)."""
    k, n = w.shape
    wmax = int(np.abs(w).max(initial=0))
    if wmax > 32767:
        return None
    padded = np.zeros((k + k % 2, -(-n // 16) * 16), np.int16)
    padded[:k, :n] = w
    panels = padded.reshape(padded.shape[0] // 2, 2, padded.shape[1] // 16, 16).transpose(2, 0, 3, 1)
    return {"wp": np.ascontiguousarray(panels), "colsum": padded.sum(axis=0, dtype=np.int64),
            "chunk_pairs": np.int64(max(1, _INT32_MAX // (2 * _XS_BOUND * max(wmax, 1))))}


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
    w = c(3).astype(np.int64) - c(5).astype(np.int64).reshape(-1)
    act, wt = dtype_name(node.input(0)), dtype_name(node.input(3))
    consts = {"xzp": c(2).astype(np.float64).reshape(()),
              "mult": (c(1).astype(np.float64).reshape(()) * c(4).astype(np.float64).reshape(-1)),
              "ys": c(6).astype(np.float32).reshape(()), "yzp": c(7).reshape(())}
    packed = pack_int_weights(w)
    consts.update(packed or {"w": np.ascontiguousarray(w, np.float64)})
    attrs = {"k": int(w.shape[0]), "n": int(w.shape[1]), "act": act,
             "out": dtype_name(node.outputs[0]) or c(7).dtype.name, "plan_a": "int8",
             "plan_b": "int4" if wt in ("int4", "uint4") else "int8", "plan_out": "int8",
             "passes": 2 if act in ("int16", "uint16") else 1}
    return Prepared(attrs, consts, target)


def _float_weights(p: Prepared) -> np.ndarray:
    """W - w_zp as float64 for the reference's BLAS. Prepare keeps it only when W was not packed (it is 8 bytes a
    weight, the panels 2); otherwise the first reference run unpacks the panels into the kernel's cache."""
    c = p.consts
    if "w" in c:
        return c["w"]
    w = p.kernel_cache.get("w_f64")
    if w is None:
        wp = c["wp"]
        w = wp.transpose(1, 3, 0, 2).reshape(wp.shape[1] * 2, wp.shape[0] * 16)[:p.attrs["k"], :p.attrs["n"]]
        w = p.kernel_cache["w_f64"] = np.ascontiguousarray(w, np.float64)
    return w


def _native_args(p: Prepared, x) -> tuple | None:
    """(native function, its arguments after x, the index of its ``out`` argument or None) for this x: the integer
    GEMM when W was packed, else the float64 loop for a small product; None when the reference runs."""
    nat = runtime.native(p)
    c = p.consts
    k, n = p.attrs["k"], p.attrs["n"]
    out = np.dtype(container_dtype(p.attrs["out"]))
    if nat is None or not isinstance(x, np.ndarray) or x.dtype.name not in ("int8", "uint8", "int16", "uint16") \
            or out.itemsize > 2 or not x.ndim or x.shape[-1] != k:
        return None
    lo, hi = QRANGE[p.attrs["out"]]
    mult = np.ascontiguousarray(c["mult"], np.float64).reshape(-1)
    quant = (mult, np.float32(c["ys"]), np.float32(c["yzp"]), np.float32(lo), np.float32(hi), out)
    if "wp" in c:
        return nat.qdq_matmul_int, (c["wp"], c["colsum"], n, int(c["xzp"]), int(c["chunk_pairs"]), *quant,
                                    runtime.threads(p), None), 13
    if x.size * n > SMALL_PRODUCT:
        return None
    return nat.qdq_matmul_small, (_float_weights(p), float(c["xzp"]), *quant), None


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    c = p.consts
    x = arg(p, inputs, 0)
    fast = _native_args(p, x)
    if fast is not None and x.flags.c_contiguous:
        fn, args, _ = fast
        return [fn(x, *args)]
    x = x.astype(np.float64)
    x -= c["xzp"]
    acc = x @ _float_weights(p)  # exact integers (checked bound)
    y = (acc * c["mult"]).astype(np.float32)
    return [quantize_float(y, c["ys"], c["yzp"], p.attrs["out"])]


def _bind(p: Prepared, inputs, outs):
    """The native product as one call for this input shape, into ORT's buffer when the output is a partition
    output (the integer GEMM)."""
    x = arg(p, inputs, 0)
    fast = _native_args(p, x)
    if fast is None or not inputs or inputs[0] is None:
        return None
    fn, args, out_at = fast
    where = p.runtime.partition_outputs
    into = [(out_at, where[0], list(outs[0].shape))] if out_at is not None and where and 0 in where else []
    return runtime.call_step(p, fn, (None, *args), [(0, 0, x.dtype, x.shape, None)], [(-1, None)], None, into)


def _cost(p: Prepared, shapes) -> OpCost:
    k, n = p.attrs["k"], p.attrs["n"]
    m, n, k, batch = matmul_dims(shapes[0], (k, n))
    cost = planned_cost(p, m, n, k, batch)
    passes = p.attrs["passes"]  # a 16-bit activation is two int8 passes through the array
    cost.compute_cycles *= passes
    cost.cycles *= passes
    return cost


register(KernelDef("npu", "QdqMatMul", _prepare, _run, _cost, _check, bind=_bind))
