"""Shared pieces of the matrix-family kernels: exact integer matmul on BLAS, requantization, epilogues, plans.

Integer products run on float32 BLAS and stay exact: every partial sum over a K chunk is an integer of magnitude
<= chunk * max|a - a_zp| * max|b - b_zp| <= 2^24, which float32 represents exactly whatever order BLAS adds in.
Chunks (multiples of the plan's K tile) are summed in int32 — the NPU's accumulation order over K tiles.

Requantization (QLinearMatMul/QLinearConv/fused quantize epilogue), as ORT's MLAS ``MlasRequantizeOutput``:
``y = clip(rint(float32(acc) * multiplier), qmin - zp, qmax - zp) + zp`` with ``multiplier = float32(a_scale *
b_scale) / y_scale`` in float32 per output column, round half to even, saturating; a NaN product (an infinite
multiplier times a zero sum) takes the lowest code, as MLAS's clip (maxps(v, lo) returns lo for a NaN).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...quantization.rounding import QUANT_RANGES, container_dtype, quantize_float  # kernels import it from here
from .. import host_blas
from ..cost import matmul_cost
from ..planner import SCALE_BYTES_PER_BLOCK, SCALE_BYTES_PER_COLUMN, PlanError, plan_matmul
from ..tile_plan import TilePlan
from ..registry import OpCost, Prepared
from ..shape_memo import memo_per_shape

# integer operand ranges: QuantizeLinear's types (quantization.rounding) and int32 (bias, accumulators)
QRANGE = {**QUANT_RANGES, "int32": (-2**31, 2**31 - 1)}
_EXACT = float(2 ** 24)


def int_bound(dtype: str, zp: np.ndarray | None) -> int:
    """max |q - zp| over the dtype's range (the worst-case operand magnitude after zero-point removal)."""
    lo, hi = QRANGE[dtype]
    z = np.asarray(0 if zp is None else zp, np.int64)
    return int(max(np.abs(lo - z).max(), np.abs(hi - z).max()))


def exact_int_matmul(a: np.ndarray, b: np.ndarray, bound_a: int, bound_b: int, tk: int) -> np.ndarray:
    """``a @ b`` for integer-valued float32 operands (zero points removed), exact, as int32 (or as float32 when
    the whole K fits one exact chunk: then the float32 result already holds the exact integers)."""
    k = a.shape[-1]
    chunk = max(1, int(_EXACT // max(1, bound_a * bound_b)))
    if chunk >= k:
        return host_blas.matmul(a, b)
    chunk = max(tk, chunk // tk * tk) if chunk >= tk else chunk
    acc = None
    for k0 in range(0, k, chunk):  # accumulation order over K tiles, int32 like the NPU accumulator
        part = host_blas.matmul(a[..., k0:k0 + chunk], b[..., k0:k0 + chunk, :]).astype(np.int32)
        acc = part if acc is None else np.add(acc, part, out=acc)
    return acc


def requantize(acc: np.ndarray, multiplier: np.ndarray, zp: np.ndarray, qtype: str) -> np.ndarray:
    """MLAS requantization of int32 (or exact float32) accumulators to ``qtype`` (module docstring)."""
    lo, hi = QUANT_RANGES[qtype]
    z = np.asarray(zp, np.float32)
    with np.errstate(invalid="ignore"):  # an infinite multiplier times 0
        y = acc.astype(np.float32, copy=False) * np.asarray(multiplier, np.float32)
    np.fmax(y, np.float32(lo) - z, out=y)  # clips before rounding, as MLAS; fmax: a NaN gives the lowest code
    np.minimum(y, np.float32(hi) - z, out=y)
    np.rint(y, out=y)
    y += z
    return y.astype(container_dtype(qtype))


# --- epilogue (bias / relu / quantize), applied in place on the accumulator tile -----------------------------
def epilogue_ops(ep: dict[str, Any]) -> float:
    """Vector ops per output element of an epilogue (cost model): bias 1, relu 1, quantize 3."""
    return float(bool(ep.get("bias"))) + float(bool(ep.get("relu"))) + 3.0 * bool(ep.get("quantize"))


def apply_float_epilogue(y: np.ndarray, ep: dict[str, Any], consts: dict[str, np.ndarray]) -> np.ndarray:
    """Bias add and ReLU in place on a float32 accumulator, then optional QuantizeLinear."""
    if ep.get("bias"):
        y += consts["ep_bias"]
    if ep.get("relu"):
        np.maximum(y, 0, out=y)
    q = ep.get("quantize")
    if q:
        return quantize_float(y, consts["ep_qscale"], consts["ep_qzp"], q)
    return y


# --- plans and cost --------------------------------------------------------------------------------------------
def matmul_dims(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, int, int, int]:
    """``(m, n, k, batch)`` of an ONNX MatMul; a 2-D B is shared by every batch, so batch folds into m."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    k = a_shape[-1]
    n = b_shape[-1] if len(b_shape) > 1 else 1
    m = a_shape[-2] if len(a_shape) > 1 else 1
    a_batch = int(np.prod(a_shape[:-2], dtype=np.int64)) if len(a_shape) > 2 else 1
    if len(b_shape) <= 2:
        return m * a_batch, n, k, 1
    out_batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return m, n, k, int(np.prod(out_batch, dtype=np.int64))


def plan_for(p: Prepared, m: int, n: int, k: int, batch: int) -> TilePlan:
    """The tile plan of this kernel for concrete dims (memoized per shape at run time, ``shape_memo``)."""
    a = p.attrs
    return memo_per_shape(p, "plans", (m, n, k, batch), lambda: plan_matmul(
        m, n, k, a["plan_a"], a["plan_b"], p.target, block_size=a.get("block_size"), batch=batch,
        out_dtype=a.get("plan_out")))


def planned_cost(p: Prepared, m: int, n: int, k: int, batch: int) -> OpCost:
    return matmul_cost(plan_for(p, m, n, k, batch), p.target, epilogue_ops(p.attrs.get("epilogue", {})))


def static_plan(p: Prepared, dims: tuple[Any, ...] | None) -> None:
    """Put the plan in ``attrs['plan']`` when the dims are static at compile time (shown in reports, stored
    in context binaries)."""
    if dims is not None and all(isinstance(d, int) for d in dims):
        try:
            p.attrs["plan"] = plan_for(p, *dims).to_dict()
        except PlanError:
            pass


# --- DMA accounting of the native kernels -----------------------------------------------------------------------
# A Prepared whose StepRuntime.dma_counts is a list asks its native matrix kernel to run the plan's output tiles
# and count their DMA; each call appends (plan, {"a", "b", "scales", "out": bytes, "transfers": n}).
_RESIDENT = {"none": 0, "a": 1, "b": 2, "weights": 3}


def native_plan_args(plan: TilePlan) -> tuple[int, ...]:
    """The plan as the native kernels take it (``kernels/native/tile_dma.h``): tiles, residency, and DRAM
    half-bytes per element of A, B, the output and the scales (per block and column, or per column in int8 mode)."""
    scale = SCALE_BYTES_PER_BLOCK if plan.block_size else (SCALE_BYTES_PER_COLUMN if plan.mode == "int8" else 0)
    return (plan.tm, plan.tn, plan.tk, _RESIDENT[plan.resident], round(2 * plan.a_bytes), round(2 * plan.b_bytes),
            round(2 * plan.out_bytes), round(2 * scale), plan.block_size or 0)


def run_native_counted(p: Prepared, fn, args: tuple, tail: tuple, m: int, n: int, k: int):
    """``fn(*args, plan, count_dma, *tail)`` (a native matrix kernel; positional, as pybind11 parses keywords ~1 us
    slower), with the plan of ``[m, k] x [k, n]`` to run and count when ``p.runtime`` asks for DMA counts
    (``StepRuntime.dma_counts``), else no plan; returns the kernel's result."""
    counts = p.runtime.dma_counts
    if counts is None:
        return fn(*args, None, False, *tail)
    plan = plan_for(p, m, n, k, 1)
    y, half = fn(*args, native_plan_args(plan), True, *tail)
    counts.append((plan, {key: (v if key == "transfers" else v / 2) for key, v in half.items()}))
    return y


def matmul_operand_dims(node, a_index: int, b_index: int, *, gemm: bool = False) -> tuple[Any, Any, Any] | str | None:
    """``(m, n, k)`` of a matmul-family node for the capability check, a decline sentence when an operand's rank
    cannot be a matmul's (ONNX: MatMul operands have rank >= 1, Gemm's exactly 2), or None when a rank is unknown
    (the generic rules of ``support.why_not`` decide those). With only A's rank unknown, (None, n, k) from B: the
    rows are known at run time, the plan is made per concrete shape."""
    a, b = node.input(a_index), node.input(b_index)
    if a is None or b is None:
        return f"{node.describe()}: matrix operand {a_index if a is None else b_index} is missing"
    if b.shape is not None and a.shape is None and not gemm and len(b.shape) >= 1:
        return None, (b.shape[-1] if len(b.shape) > 1 else 1), b.shape[-2] if len(b.shape) > 1 else b.shape[0]
    if a.shape is None or b.shape is None:
        return None
    for v in (a, b):
        if (len(v.shape) != 2) if gemm else (len(v.shape) < 1):
            return f"{node.describe()}: operand {v.describe()} has rank {len(v.shape)}, {node.op_type} needs " + \
                ("rank 2" if gemm else "rank >= 1")
    sa, sb = a.shape, b.shape
    if gemm:
        m, k = (sa[1], sa[0]) if node.attr("transA", 0) else (sa[0], sa[1])
        return m, (sb[0] if node.attr("transB", 0) else sb[1]), k
    return (sa[-2] if len(sa) > 1 else 1), (sb[-1] if len(sb) > 1 else 1), sa[-1]


def check_fits(m: Any, n: Any, k: Any, plan_a: str, plan_b: str, target, block_size: int | None = None) -> str | None:
    """Decline reason when even the smallest plan misses SRAM or the unit lacks the mode; symbolic dims are taken
    at their smallest (1): the plan for the real shape is made at first use."""
    dims = [d if isinstance(d, int) else 1 for d in (m, n, k)]
    try:
        plan_matmul(*dims, plan_a, plan_b, target, block_size=block_size)
    except PlanError as exc:
        return str(exc)
    return None


def prod(dims: Sequence[Any]) -> Any:
    """Product of dims, or None if any is symbolic."""
    if any(not isinstance(d, int) for d in dims):
        return None
    return math.prod(dims)
