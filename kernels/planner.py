"""Tile planner for the matrix unit: how one ``[m, k] x [k, n]`` product is cut into SRAM-sized tiles.

Execution model the plan describes (output-stationary, K innermost, one int32/fp32 accumulator tile):

    for each of `batch` independent problems:
      for each output tile (mi, ni) in `loop_order` ("mnk": m outer, "nmk": n outer):
        acc = 0
        for ki in K tiles:            # DMA of the next A/B tile overlaps this tile's MACs (double buffering)
          acc += A[mi, ki] @ B[ki, ni]
        C[mi, ni] = epilogue(acc)      # bias / relu / requantize on the vector unit, then DMA out

Operand residency (``resident``) decides how often operands cross DMA:
- ``"none"``: A and B tiles are reloaded for every (mi, ni, ki).
- ``"a"``: the A row strip ``[tm, K]`` stays while all n tiles of that strip run (A read once).
- ``"b"``: the B column strip ``[K, tn]`` stays while all m tiles run (B read once; loop order "nmk").
- ``"weights"``: all of B ``[K, N]`` stays (loaded during the first m strip) and A strips stream (both read once).

Tile sizes are multiples of the unit's native tile; the last tile along a dim may be partial (tails): the unit pads
it to native tiles (wasted MACs counted by the cost model) while DMA moves only real elements. For blockwise INT4
weights ``tk`` is a multiple of ``lcm(tile_k, block_size)`` so every K tile holds whole quantization blocks.

SRAM budget (each buffer rounded up to ``dma.alignment_bytes``; x2 where double-buffered):
    A: 2 * tm * (K_res if resident a/weights else tk) * a_bytes
    B: 2 * (K_res * tn if "b"; tk * tn otherwise) * b_bytes, or K_res * N_res * b_bytes once if "weights"
       (a resident strip that is the only one along its dim is not double-buffered: nothing to prefetch)
    scales/zero points of B: per block (blockwise int4) or per column (int8 requantize), alongside B
    accumulator: tm * tn * acc_bytes; output staging: 2 * tm * tn * out_bytes
"""

from __future__ import annotations

import math

from .cost import plan_cycles
from .shape_memo import ShapeMemo
from .target import Target
from .tile_plan import TilePlan

# DRAM bytes of B's quantization constants: a float32 scale and a 4-bit zero point per (block, column) of blockwise
# int4 weights; a float32 requantization multiplier and an int32 bias per column in int8 mode
SCALE_BYTES_PER_BLOCK = 4.5
SCALE_BYTES_PER_COLUMN = 8

_BYTES = {"float32": 4.0, "float16": 2.0, "int8": 1.0, "uint8": 1.0, "int16": 2.0, "uint16": 2.0,
          "int32": 4.0, "int4": 0.5, "uint4": 0.5}


class PlanError(ValueError):
    """No tile plan fits the target (the message is a decline reason)."""


def elem_bytes(dtype: str) -> float:
    return _BYTES[dtype]


def matrix_mode(dtype_a: str, dtype_b: str, target: Target) -> str | None:
    """Matrix mode for these operand dtypes on ``target`` (None: the unit has no such mode)."""
    if dtype_b in ("int4", "uint4"):
        mode = "int4"
    elif dtype_a in ("int8", "uint8") and dtype_b in ("int8", "uint8"):
        mode = "int8"
    elif dtype_a in ("float32", "float16"):
        mode = target.float_mode(dtype_a)
    else:
        mode = None
    return mode if mode is not None and target.has_mode(mode) else None


def _candidates(dim: int, unit: int) -> list[int]:
    """Tile sizes: unit * 2^i up to the dim rounded up to the unit, plus that rounded dim itself."""
    top = -(-dim // unit) * unit
    out, t = [], unit
    while t < top:
        out.append(t)
        t *= 2
    out.append(top)
    return out


def _evaluate(m: int, n: int, k: int, batch: int, mode: str, tm: int, tn: int, tk: int, resident: str,
              double: bool, eb: tuple[float, float, float], block_size: int | None, target: Target) -> TilePlan:
    """Fill in SRAM and DMA figures of one candidate tiling (formulas in the module docstring)."""
    ea, eb_, eo = eb
    al = target.align
    acc_bytes = 4
    nb = 2 if double else 1
    Tm, Tn, Tk = -(-m // tm), -(-n // tn), -(-k // tk)
    k_res, n_res = Tk * tk, Tn * tn
    a_k = k_res if resident in ("a", "weights") else tk
    # a resident strip that never changes (one tile along its outer dim) needs no second buffer
    a_bufs = 1 if resident in ("a", "weights") and Tm == 1 else nb
    sram_a = a_bufs * al(math.ceil(tm * a_k * ea))
    if resident == "weights":
        b_elems, b_bufs = k_res * n_res, 1
    elif resident == "b":
        b_elems, b_bufs = k_res * tn, (1 if Tn == 1 else nb)
    else:
        b_elems, b_bufs = tk * tn, nb
    sram_b = b_bufs * al(math.ceil(b_elems * eb_))
    b_cols = b_elems // (k_res if resident in ("weights", "b") else tk)
    b_rows = b_elems // b_cols
    if block_size:  # fp32 scale + 4-bit zero point per (block, column)
        per_col_rows = -(-b_rows // block_size)
        scale_elems_b = per_col_rows * b_cols * SCALE_BYTES_PER_BLOCK
        dma_scales = batch * math.ceil(-(-k // block_size) * n * SCALE_BYTES_PER_BLOCK)
    elif mode == "int8":  # requantize multiplier + bias per column
        scale_elems_b, dma_scales = b_cols * float(SCALE_BYTES_PER_COLUMN), batch * n * SCALE_BYTES_PER_COLUMN
    else:
        scale_elems_b, dma_scales = 0.0, 0
    sram_scales = (b_bufs * al(math.ceil(scale_elems_b))) if scale_elems_b else 0
    sram_acc = al(tm * tn * acc_bytes)
    sram_out = nb * al(math.ceil(tm * tn * eo))

    a_once, b_once = math.ceil(m * k * ea), math.ceil(k * n * eb_)
    dma_a = batch * (a_once if resident in ("a", "weights") else a_once * Tn)
    dma_b = batch * (b_once if resident in ("b", "weights") else b_once * Tm)
    if resident not in ("weights", "b"):  # scales travel with their B tiles
        dma_scales *= Tm
    dma_out = batch * math.ceil(m * n * eo)
    if resident == "weights":
        transfers = Tm + Tk * Tn + Tm * Tn
    elif resident == "a":
        transfers = Tm + Tm * Tn * Tk + Tm * Tn
    elif resident == "b":
        transfers = Tn + Tm * Tn * Tk + Tm * Tn
    else:
        transfers = 2 * Tm * Tn * Tk + Tm * Tn
    return TilePlan(m, n, k, batch, mode, target.accumulator(mode), tm, tn, tk,
                    "nmk" if resident == "b" else "mnk", resident, double, block_size, ea, eb_, eo,
                    sram_a, sram_b, sram_scales, sram_acc, sram_out, dma_a, dma_b, dma_scales, dma_out,
                    batch * transfers)


# plans of every kernel by dims, dtypes and target (compile-time plans of a model's repeated layers, and the run-time
# plans of growing shapes); bounded as the kernels' own shape memos, with room for every node of a large model
PLANS_KEPT = 1024
_CACHE = ShapeMemo(PLANS_KEPT)


def plan_matmul(m: int, n: int, k: int, dtype_a: str, dtype_b: str, target: Target, *,
                block_size: int | None = None, batch: int = 1, out_dtype: str | None = None) -> TilePlan:
    """The fastest tiling (by ``cost.plan_cycles``) of ``batch`` independent ``[m,k] x [k,n]`` products that fits
    ``target``'s SRAM; ties go to the smaller SRAM footprint. Raises PlanError ("exceeds SRAM: needs X B > Y B",
    or no matrix mode) when nothing fits: callers turn that into a decline reason.

    dtype_a/dtype_b: DRAM dtypes of the operands (``int4``/``uint4`` for blockwise 4-bit weights; then
    ``block_size`` is the quantization block along K). out_dtype: DRAM dtype of C (default: the accumulator's
    for integer modes, A's dtype for float modes).
    """

    key = (m, n, k, dtype_a, dtype_b, target.digest, block_size, batch, out_dtype)
    cached = _CACHE.recall(key)
    if cached is not None:
        return cached
    mode = matrix_mode(dtype_a, dtype_b, target)
    if mode is None:
        raise PlanError(f"target {target.name} has no matrix mode for {dtype_a} x {dtype_b} "
                        f"(matrix.macs_per_cycle: {', '.join(target.matrix['macs_per_cycle'])})")
    m, n, k = max(int(m), 1), max(int(n), 1), max(int(k), 1)
    out = out_dtype or (target.accumulator(mode) if mode in ("int8", "int4") and dtype_a not in ("float32", "float16")
                        else dtype_a)
    eb = (elem_bytes(dtype_a), elem_bytes(dtype_b), elem_bytes(out))
    hm, hn, hk = target.tile
    unit_k = math.lcm(hk, block_size) if block_size else hk
    best, best_key, smallest = None, None, None
    for double in (True, False):
        for tm in _candidates(m, hm):
            for tn in _candidates(n, hn):
                for tk in _candidates(k, unit_k):
                    for res in ("none", "a", "b", "weights"):
                        p = _evaluate(m, n, k, batch, mode, tm, tn, tk, res, double, eb, block_size, target)
                        if smallest is None or p.sram_bytes < smallest.sram_bytes:
                            smallest = p
                        if p.sram_bytes > target.sram_bytes:
                            continue
                        score = (plan_cycles(p, target), p.sram_bytes, p.transfers)
                        if best_key is None or score < best_key:
                            best, best_key = p, score
        if best is not None:
            break
    if best is None:
        raise PlanError(f"exceeds SRAM: needs {smallest.sram_bytes} B > {target.sram_bytes} B "
                        f"(smallest {mode} tile plan {smallest.tm}x{smallest.tn}x{smallest.tk} on {target.name})")
    return _CACHE.keep(key, best)


def compulsory_dma_bytes(plan: TilePlan) -> int:
    """Traffic no schedule can avoid: A, B and their scales read once, C written once (the roofline's DMA term)."""
    a = math.ceil(plan.m * plan.k * plan.a_bytes)
    b = math.ceil(plan.k * plan.n * plan.b_bytes)
    scales = plan.dma_scales // (1 if plan.resident in ("b", "weights") else -(-plan.m // plan.tm))
    return plan.batch * (a + b + math.ceil(plan.m * plan.n * plan.out_bytes)) + scales
