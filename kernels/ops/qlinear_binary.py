"""com.microsoft QLinearAdd and QLinearMul on the vector unit: int8/uint8 in and out, per-tensor scales and zero
points (scalars, as ORT requires), numpy broadcasting.

Numerics reproduce ORT 1.31's x86-64 MLAS kernels exactly (float32 arithmetic, round half to even, saturation):
  QLinearMul (qlmul.cpp, SSE2): r = sA*sB/sC (float32, left to right);
      y = sat(rint(float32(float32((a - zA) * (b - zB)) * r) + zC))
  QLinearAdd (qladd_avx2.cpp, its multiply-adds contracted to fmas by the compiler): rA = sA/sC, rB = sB/sC,
      fixed = float32(zC) - fma(rA, zA, rB*zB);
      both operands vary along the innermost span: y = sat(rint(fma(a, rA, fma(b, rB, fixed))));
      one operand constant along it (ORT's broadcast looper hands it over as a scalar): that operand is folded
      into the fixed part by an fma, the other goes through one fma. MLAS takes the scalar as its B, so ORT swaps
      the operands for a scalar A: its fixed part is then float32(zC) - fma(rB, zB, rA*zA) (``fixed_a``).
An fma is computed exactly (``fma_f32``): a product of an 8-bit integer and a float32 is exact in float64 and the
sum's rounding error is recovered (TwoSum), so the float32 result is the fused one even where rounding the float64
sum would land on a float32 midpoint.
On the native kernels both ops are ``qlinear_add``/``qlinear_mul`` (kernels/native/qlinear_binary.cc: hardware
float32 fma, as MLAS), the same sequence bit for bit, bound as the step for their input shapes; scales and zero
points fed at run time are held to the bound values.

Cost: ``_vector.stream_cost`` over the output elements, 4 ops each (widen, two multiply-adds, round/saturate).
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._matrix import QRANGE
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost

_F32, _F64 = np.float32, np.float64


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"op": node.op_type, "qtype": node.input(0).dtype.name,
             "in_itemsizes": [itemsize_of(v) for v in node.inputs]}
    return Prepared(attrs, stash_constants(node), target)


def check_quant_params(node: NodeInfo, pairs: tuple[tuple[int, int], ...], data_index: int = 0) -> str | None:
    """Decline reason when a (scale, zero point) pair of ``node`` is not per-tensor or a zero point's dtype differs
    from the data's (input ``data_index``; ORT's rules for the com.microsoft QLinear* ops)."""
    data = node.input(data_index)
    for s_i, z_i in pairs:
        for i in (s_i, z_i):
            v = node.input(i)
            if v is not None and v.shape is not None and any(d != 1 for d in v.shape):
                return f"{node.describe()}: {v.describe()} must be a scalar (per-tensor quantization)"
        s, z = node.input(s_i), node.input(z_i)
        if s is None or s.dtype != np.float32:
            return f"{node.describe()}: input {s_i} (scale) must be a float32 scalar"
        if z is not None and z.dtype != data.dtype:
            return f"{node.describe()}: zero point {z.describe()} must have the data dtype {data.dtype}"
    return None


def _check(node: NodeInfo, target: Target) -> str | None:
    a, b = node.input(0), node.input(3)
    if a is None or b is None or a.dtype not in (np.int8, np.uint8) or b.dtype != a.dtype:
        return f"{node.describe()}: {node.op_type} needs two int8 or two uint8 operands"
    return check_quant_params(node, ((1, 2), (4, 5), (6, 7)))


def scalar(p: Prepared, inputs, i: int, dtype=_F32):
    """A scale or zero point input as a numpy scalar (an omitted zero point is 0)."""
    v = arg(p, inputs, i)
    return dtype(0) if v is None else dtype(np.asarray(v).reshape(-1)[0])


def _scalar_along_span(x: np.ndarray, out_shape: tuple[int, ...]) -> bool:
    """Whether ORT's broadcast looper hands ``x`` to the kernel as a scalar: a single element, or constant along
    the innermost dim that varies in the output."""
    if x.size == 1:
        return True
    shape = (1,) * (len(out_shape) - x.ndim) + x.shape
    last = max((i for i, d in enumerate(out_shape) if d != 1), default=None)
    return last is not None and shape[last] == 1


def _saturate(y: np.ndarray, qtype: str) -> np.ndarray:
    lo, hi = QRANGE[qtype]
    np.rint(y, out=y)
    np.clip(y, lo, hi, out=y)
    return y.astype(qtype)


_PARAMS = (1, 2, 4, 5, 6, 7)  # sA, zA, sB, zB, sC, zC


def _add_params(p: Prepared, inputs) -> tuple:
    """(ra, rb, fixed, fixed_a) of QLinearAdd, float32 (module docstring)."""
    sa, za, sb, zb, sc, zc = (scalar(p, inputs, i) for i in _PARAMS)
    ra, rb = _F32(sa / sc), _F32(sb / sc)
    return (ra, rb, _F32(zc - fma_f32(_F64(za), ra, _F32(rb * zb))[()]),
            _F32(zc - fma_f32(_F64(zb), rb, _F32(ra * za))[()]))


def _mul_params(p: Prepared, inputs) -> tuple:
    """(za, zb, ratio, zc) of QLinearMul: integer zero points of A and B, float32 ratio and zC."""
    sa, za, sb, zb, sc, zc = (scalar(p, inputs, i) for i in _PARAMS)
    return int(za), int(zb), _F32(_F32(sa * sb) / sc), zc


def _native_args(p: Prepared, a, b):
    """The native kernel of this op when it takes these operands (8-bit, one dtype), else None (the reference
    runs)."""
    nat = runtime.native(p)
    ok = (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
          and a.dtype in (np.int8, np.uint8))
    if nat is None or not ok:
        return None
    return nat.qlinear_add if p.attrs["op"] == "QLinearAdd" else nat.qlinear_mul


def fma_f32(x: np.ndarray, r, c) -> np.ndarray:
    """float32 fma(x, r, c) for integer-valued ``x`` of at most 24 bits, float32 ``r`` and ``c``: one rounding of the
    exact x * r + c (the float64 sum's error, from TwoSum, breaks a float32 tie the float64 rounding made)."""
    prod = np.asarray(x, _F64) * _F64(r)  # exact
    c64 = np.asarray(c, _F32).astype(_F64)
    s = prod + c64
    bb = s - prod
    err = (prod - (s - bb)) + (c64 - bb)
    y = np.asarray(s.astype(_F32))
    toward = np.where(s > y, np.inf, -np.inf).astype(_F32)
    other = np.nextafter(y, toward)
    tie = (s != y) & (s - y.astype(_F64) == other.astype(_F64) - s) & (err != 0)
    if tie.any():  # s is a float32 midpoint that the exact sum is not: the error's side decides
        y = np.where(tie & ((err > 0) == (other > y)), other, y)
    return y


def _add_run(p: Prepared, inputs) -> list[np.ndarray]:
    a, b = arg(p, inputs, 0), arg(p, inputs, 3)
    fn = _native_args(p, a, b)
    if fn is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return [fn(a, b, *_add_params(p, inputs), None, runtime.threads(p))]
    ra, rb, fixed, fixed_a = _add_params(p, inputs)
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    a64, b64 = a.astype(_F64), b.astype(_F64)
    if _scalar_along_span(a, out_shape):  # A folds into its own fixed part by an fma, then B's fma
        y = fma_f32(b64, rb, fma_f32(a64, ra, fixed_a))
    else:  # B's fma first, whether B is a scalar folded into the fixed part or a span
        y = fma_f32(a64, ra, fma_f32(b64, rb, fixed))
    return [_saturate(np.broadcast_to(y, out_shape).copy(), p.attrs["qtype"])]


def _mul_run(p: Prepared, inputs) -> list[np.ndarray]:
    a, b = arg(p, inputs, 0), arg(p, inputs, 3)
    fn = _native_args(p, a, b)
    if fn is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return [fn(a, b, *_mul_params(p, inputs), None, runtime.threads(p))]
    za, zb, ratio, zc = _mul_params(p, inputs)
    prod = (a.astype(np.int32) - np.int32(za)) * (b.astype(np.int32) - np.int32(zb))
    y = np.array(prod, _F32)  # an array also for 0-d operands (numpy returns a scalar there)
    y *= ratio
    y += zc
    return [_saturate(y, p.attrs["qtype"])]


def _held_params(inputs) -> list | None:
    """Scales and zero points fed at run time as a bound step's ``fixed`` list (held to these values), None when
    one is not a small array."""
    fixed = []
    for i in _PARAMS:
        v = inputs[i] if i < len(inputs) else None
        if v is None:
            continue
        if not isinstance(v, np.ndarray) or v.nbytes > runtime.FIXED_INPUT_BYTES:
            return None
        fixed.append((i, np.array(v, order="C")))
    return fixed


def _bind(p: Prepared, inputs, outs):
    """QLinearAdd/QLinearMul as one native call for these operand shapes, constant operands held in place, into
    ORT's buffer when the result is a partition output."""
    a, b = arg(p, inputs, 0), arg(p, inputs, 3)
    fn = _native_args(p, a, b)
    fixed = _held_params(inputs)
    if fn is None or fixed is None:
        return None
    params = _add_params(p, inputs) if p.attrs["op"] == "QLinearAdd" else _mul_params(p, inputs)
    given = [i < len(inputs) and inputs[i] is not None for i in (0, 3)]
    live = [(k, i, v.dtype, v.shape, None) for k, (i, v, g) in enumerate(zip((0, 3), (a, b), given)) if g]
    held = [None if g else np.array(v, order="C") for v, g in zip((a, b), given)]  # 0-d stays 0-d
    out_arg = 2 + len(params)
    where = p.runtime.partition_outputs
    into = [(out_arg, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, fn, (*held, *params, None, runtime.threads(p)), live, [(-1, None)], None, into,
                             fixed)


def _cost(p: Prepared, shapes) -> OpCost:
    present = [s for s in (shapes[0], shapes[3]) if s is not None]
    n = elems(np.broadcast_shapes(*present)) if present else 0
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in, n, 4.0)


register(KernelDef("com.microsoft", "QLinearAdd", _prepare, _add_run, _cost, _check, bind=_bind))
register(KernelDef("com.microsoft", "QLinearMul", _prepare, _mul_run, _cost, _check, bind=_bind))
