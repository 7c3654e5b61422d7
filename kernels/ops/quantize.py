"""QuantizeLinear / DequantizeLinear on the vector unit: per-tensor, per-axis and blocked (opset 21).

Types: int8/uint8/int16/uint16 and int4/uint4. 4-bit values live unpacked in int8/uint8 containers inside the
NPU (one element per byte); constant int4 inputs arrive from onnx's numpy_helper as ml_dtypes int4/uint4 and are
widened at compile time.

QuantizeLinear, as ORT's CPU kernel: ``saturate(rint(float32(x) / scale) + zero_point)`` (round half to even; the
division, not a reciprocal multiply, so results are bit-exact); float16 x into 8- and 16-bit codes as ORT's float16
loops, which convert the rounded quotient to int32 before adding the zero point (``quantize_half_as_ort``: NaN,
+-Inf and quotients past int32 take x86's INT_MIN); com.microsoft's float16 QuantizeLinear clamps first, as float32.
DequantizeLinear: ``float32(x - zp) * scale``, cast to the scale's dtype. Blocked: ``scale`` has x's rank with
``ceil(D_axis / block_size)`` along ``axis``.
Compile time: scale/zero point are expanded to x's broadcast layout (per-axis reshape, blocked repeat).
Per-tensor 8-bit Q of float32 or float16 x and per-tensor DQ of any integer container (8-, 16- or 32-bit) with a
float32 scale run on native kernels (``kernels/native/quantize.cc``, the same float32 operations) unless the session
asks for the reference model; a bound DQ step, and a float16 Q step, write into ORT's buffer when the result is a
partition output (a fresh array of a large tensor costs its page faults).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cost import vector_cost
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..support import dtype_name
from ..target import Target
from .. import runtime
from ._matrix import QUANT_RANGES, container_dtype, quantize_float
from ._util import arg, nbytes

_QTYPES = ("int8", "uint8", "int16", "uint16", "int4", "uint4")
_ONNX_QTYPE = {3: "int8", 2: "uint8", 5: "int16", 4: "uint16", 22: "int4", 21: "uint4"}


def _widen(v: np.ndarray) -> np.ndarray:
    """ml_dtypes int4/uint4 -> int8/uint8 containers; other arrays unchanged."""
    name = v.dtype.name
    if name == "int4":
        return v.astype(np.int8)
    if name == "uint4":
        return v.astype(np.uint8)
    return v


def _expand(p: np.ndarray, rank: int, axis: int, block: int, dim: int | None) -> np.ndarray:
    """Scale/zero point in a layout that broadcasts against x (rank ``rank``)."""
    if p.ndim == 0 or (p.size == 1 and p.ndim <= 1):
        return p.reshape(())
    if block:
        r = np.repeat(p, block, axis=axis)
        return r.take(range(dim), axis=axis) if dim is not None else r
    shape = [1] * rank
    shape[axis] = p.size
    return p.reshape(shape)


def check_q(node: NodeInfo, target: Target) -> str | None:
    s = node.input(1)
    if s is None or not s.is_constant:
        return f"{node.describe()}: scale must be a constant (folded at compile time)"
    z = node.input(2)
    if z is not None and not z.is_constant:
        return f"{node.describe()}: zero point must be a constant (folded at compile time)"
    q = _qtype(node) if node.op_type == "QuantizeLinear" else dtype_name(node.input(0))
    if node.op_type == "QuantizeLinear" and q not in _QTYPES:
        return f"{node.describe()}: output type {q} not supported (supported: {', '.join(_QTYPES)})"
    if q in ("int16", "uint16") and not target.matrix.get("a16_accumulator_bits"):
        return (f"{node.describe()}: 16-bit activations ({q}) need a wide accumulator; target {target.name} has "
                "none (matrix.a16_accumulator_bits)")
    return None


def _qtype(node: NodeInfo) -> str | None:
    z = node.input(2)
    if z is not None:
        return dtype_name(z)
    od = int(node.attr("output_dtype", 0))
    return _ONNX_QTYPE.get(od, "uint8") if od else "uint8"


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    x = node.input(0)
    rank = len(x.shape) if x.shape is not None else (x.value.ndim if x.value is not None else 1)
    axis = int(node.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    block = int(node.attr("block_size", 0))
    dim = x.shape[axis] if x.shape is not None and rank > axis and isinstance(x.shape[axis], int) else None
    scale = np.asarray(node.input(1).value)
    z = node.input(2)
    zp = _widen(np.asarray(z.value)) if z is not None else np.zeros((), np.int64)
    consts = {"scale": _expand(scale, rank, axis, block, dim), "zp": _expand(zp, rank, axis, block, dim)}
    if x.value is not None:
        consts["x"] = _widen(np.asarray(x.value))
    attrs = {"op": node.op_type, "scale_dtype": scale.dtype.name, "qtype": _qtype(node) if node.op_type ==
             "QuantizeLinear" else dtype_name(x), "itemsize": 4 if scale.dtype == np.float32 else 2,
             "f16_int32": node.domain == ""}  # float16 x: ORT's ONNX-domain kernel (quantize_half_as_ort)
    if node.op_type == "DequantizeLinear":
        consts["scale"] = consts["scale"].astype(np.float32)
        consts["zp"] = consts["zp"].astype(np.float32)
    return Prepared(attrs, consts, target)


def _native_per_tensor(p: Prepared) -> tuple | None:
    """(native kernels, scale, zero point) for a per-tensor 8-bit Q with a float32 or float16 scale (widened
    exactly, as the reference divides by it in float32), else None."""
    nat = runtime.native(p)
    c = p.consts
    if nat is None or p.attrs["qtype"] not in ("int8", "uint8") or c["scale"].ndim or c["zp"].ndim \
            or p.attrs["scale_dtype"] not in ("float32", "float16"):
        return None
    return nat, float(c["scale"]), int(c["zp"])


_NATIVE_Q = (np.dtype(np.float32), np.dtype(np.float16))  # quantize_tensor, quantize_half


_DQ_NATIVE = ("int8", "uint8", "int16", "uint16", "int32")


def _native_dq(p: Prepared) -> tuple | None:
    """(native kernels, float32 zero point, scale) for a per-tensor DQ of an integer container with a float32 scale,
    else None."""
    nat = runtime.native(p)
    c = p.consts
    if nat is None or p.attrs["qtype"] not in _DQ_NATIVE or c["scale"].ndim or c["zp"].ndim \
            or p.attrs["scale_dtype"] != "float32":
        return None
    return nat, float(c["zp"]), float(c["scale"])


_INT32_MIN = -(2 ** 31)


def quantize_half_as_ort(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qtype: str) -> np.ndarray:
    """float16 QuantizeLinear as ORT's CPU kernel computes it (qmath.h's MLFloat16 loops, per tensor, per axis and
    blocked): ``q = rint(float32(x) / scale)`` converted to int32 as x86 does (NaN, +-Inf and |q| >= 2^31 become
    INT_MIN), plus the zero point in wrapping int32 arithmetic, clamped to the code range. So those values give the
    lowest code with a zero point >= 0 and the highest with a negative one, where the float32 kernel (MLAS, clamping
    before it converts; ``quantize_float``) gives +Inf the highest code."""
    lo, hi = QUANT_RANGES[qtype]
    q = np.asarray(x.astype(np.float32) / np.asarray(scale, np.float32))  # 0-d stays an array
    np.rint(q, out=q)
    valid = (q >= _INT32_MIN) & (q < -_INT32_MIN)
    wide = np.where(valid, q, _INT32_MIN).astype(np.int64) + np.asarray(zero_point, np.int64)
    wrapped = (wide - _INT32_MIN) % (2 ** 32) + _INT32_MIN
    return np.clip(wrapped, lo, hi).astype(container_dtype(qtype))


def _run_q(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0) if "x" not in p.consts else p.consts["x"]
    fast = _native_per_tensor(p)
    if fast is not None and x.dtype == np.float32:  # kernels/native/quantize.cc: the same float32 steps
        nat, scale, zp = fast
        return [nat.quantize_tensor(np.ascontiguousarray(x), scale, zp, p.attrs["qtype"] == "int8", None,
                                    runtime.threads(p)).reshape(x.shape)]  # ascontiguousarray makes 0-d 1-d
    if fast is not None and x.dtype == np.float16 and x.flags.c_contiguous:  # widened, then the same steps
        nat, scale, zp = fast
        return [nat.quantize_half(x, scale, zp, p.attrs["qtype"] == "int8", p.attrs["f16_int32"], None,
                                  runtime.threads(p))]
    if x.dtype == np.float16 and p.attrs["f16_int32"] and p.attrs["qtype"] not in ("int4", "uint4"):
        return [quantize_half_as_ort(x, p.consts["scale"], p.consts["zp"], p.attrs["qtype"])]
    return [quantize_float(x, p.consts["scale"], p.consts["zp"], p.attrs["qtype"])]


def _run_dq(p: Prepared, inputs) -> list[np.ndarray]:
    x = p.consts["x"] if "x" in p.consts else _widen(arg(p, inputs, 0))
    fast = _native_dq(p)
    if fast is not None and x.dtype.name in _DQ_NATIVE and x.flags.c_contiguous:
        nat, zp, scale = fast
        return [nat.dequantize_into(x, zp, scale, None, runtime.threads(p))]
    y = x.astype(np.float32)
    y -= p.consts["zp"]
    with np.errstate(over="ignore"):  # a float32-min mask constant overflows to -inf, as in ORT's kernel
        y *= p.consts["scale"]
    return [y.astype(p.attrs["scale_dtype"], copy=False)]


def _bind(p: Prepared, inputs, outs) -> Any:
    """A per-tensor Q (8-bit) or DQ of a runtime tensor as one native call for its shape, as ``_run_q``/``_run_dq``
    make it (ep/step_binding.py); DQ into ORT's buffer when its result is a partition output."""
    x = inputs[0] if inputs else None
    if "x" in p.consts or not isinstance(x, np.ndarray) or not x.ndim or not x.flags.c_contiguous:
        return None
    live = [(0, 0, x.dtype, x.shape, None)]
    if p.attrs["op"] == "DequantizeLinear":
        fast = _native_dq(p)
        if fast is None or x.dtype.name not in _DQ_NATIVE:
            return None
        nat, zp, scale = fast
        where = p.runtime.partition_outputs
        into = [(3, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.dequantize_into, (None, zp, scale, None, runtime.threads(p)), live,
                                 [(-1, None)], None, into)
    fast = _native_per_tensor(p)
    if fast is None or x.dtype not in _NATIVE_Q:
        return None
    nat, scale, zp = fast
    args = (None, scale, zp, p.attrs["qtype"] == "int8")
    where = p.runtime.partition_outputs  # into ORT's buffer when the result is a partition output
    if x.dtype == np.float32:
        into = [(4, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.quantize_tensor, (*args, None, runtime.threads(p)), live, [(-1, None)],
                                 None, into)
    into = [(5, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.quantize_half, (*args, p.attrs["f16_int32"], None, runtime.threads(p)), live,
                             [(-1, None)], None, into)


def _cost(p: Prepared, shapes) -> OpCost:
    shape = shapes[0] if shapes[0] is not None else p.consts["x"].shape
    n = int(np.prod(shape, dtype=np.int64))
    q_bytes = 1 if p.attrs["qtype"] in ("int8", "uint8", "int4", "uint4") else 2
    f_bytes = p.attrs["itemsize"]
    src, dst = (f_bytes, q_bytes) if p.attrs["op"] == "QuantizeLinear" else (q_bytes, f_bytes)
    return vector_cost(p.target, n, nbytes(tuple(shape), src), n * dst, ops_per_element=3.0)


def prepare(node: NodeInfo, target: Target | None = None) -> Prepared:
    """Compile-time layout of a Q/DQ node (also used to dequantize constant weights, see kernels.fusion.qdq)."""
    return _prepare(node, target)


run_dq = _run_dq

# com.microsoft Q/DQ (QNN-style 16-bit graphs) have the same semantics (no block_size attribute).
for _domain in ("", "com.microsoft"):
    register(KernelDef(_domain, "QuantizeLinear", _prepare, _run_q, _cost, check_q, bind=_bind))
    register(KernelDef(_domain, "DequantizeLinear", _prepare, _run_dq, _cost, check_q, bind=_bind))
