"""Cost model primitives: cycles from unit rates, DMA bytes and cycles, overlap from double buffering.

Formulas (all per op execution, at the target clock):
- DMA:      dma_cycles = n_transfers * latency_cycles + bytes / bytes_per_cycle
- vector:   compute_cycles = ceil(elements / lanes) * cycles_per_element_op
- overlap:  with double buffering, cycles = max(compute, dma) + the first tile's load (not hidden)
- matrix:   see ``matrix_compute_cycles`` / ``plan_cycles`` (per tile plan from ``kernels.planner``)
- roofline: ``roofline_cycles`` = max(compute-bound, DMA-bound) time, the planner-quality yardstick
"""

from __future__ import annotations

import math

from .registry import OpCost
from .target import Target
from .tile_plan import TilePlan


def dma_cycles(target: Target, nbytes: int, transfers: int = 1) -> float:
    """``transfers * latency_cycles / outstanding + nbytes / bytes_per_cycle``: the DMA engine keeps
    ``dma.outstanding`` (default 1) transfers in flight, so their fixed latencies overlap."""
    dma = target.dma
    return (transfers * float(dma["latency_cycles"]) / float(dma.get("outstanding", 1))
            + nbytes / float(dma["bytes_per_cycle"]))


def vector_cost(target: Target, elements: int, bytes_in: int, bytes_out: int, ops_per_element: float = 1.0) -> OpCost:
    """An element-wise/reduction op streamed through the vector unit, tiles double-buffered."""
    lanes = int(target.vector["lanes"])
    compute = math.ceil(elements / lanes) * ops_per_element
    moved = bytes_in + bytes_out
    dma = dma_cycles(target, moved, transfers=2)
    first_tile = dma_cycles(target, min(moved, target.sram_bytes // 4), transfers=1) if moved else 0.0
    total = max(compute, dma) + min(first_tile, dma)
    return OpCost(compute_cycles=compute, dma_cycles=dma, cycles=total, dma_bytes=moved,
                  sram_peak=min(moved, target.sram_bytes // 2), unit="vector")


def movement_cost(target: Target, nbytes: int) -> OpCost:
    """Pure data movement (Reshape is free: a view; Transpose streams through DMA)."""
    if nbytes == 0:
        return OpCost(unit="dma")
    dma = dma_cycles(target, 2 * nbytes, transfers=2)
    return OpCost(dma_cycles=dma, cycles=dma, dma_bytes=2 * nbytes, unit="dma")


# --- matrix unit ---------------------------------------------------------------------------------------------
_VECTOR_MACS_PER_LANE = {"float32": 1, "float16": 2, "int8": 4, "int4": 4}  # lanes are fp32-wide


def matrix_compute_cycles(plan: TilePlan, target: Target) -> float:
    """MAC cycles: every tile is padded to native tiles, so
    ``batch * ceil(m/tile_m) * ceil(n/tile_n) * ceil(k/tile_k) * tile_m*tile_n*tile_k / macs_per_cycle[mode]``;
    a product the matrix unit would mostly pad (a depthwise conv: per group n = 1, k = kh*kw) runs on the vector
    unit when that is faster, as NPU compilers place it: ``macs / (lanes * MACs per lane of the mode)``."""
    hm, hn, hk = target.tile
    native = math.ceil(plan.m / hm) * math.ceil(plan.n / hn) * math.ceil(plan.k / hk)
    padded = plan.batch * native * hm * hn * hk / target.mac_rate(plan.mode)
    on_vector = plan.macs / (int(target.vector["lanes"]) * _VECTOR_MACS_PER_LANE[plan.mode])
    return min(padded, on_vector)


def epilogue_cycles(plan: TilePlan, target: Target, epilogue_ops: float) -> float:
    """Vector-unit cycles of a fused epilogue: ``batch * ceil(m*n / lanes) * epilogue_ops``."""
    return plan.batch * math.ceil(plan.m * plan.n / int(target.vector["lanes"])) * epilogue_ops


def plan_cycles(plan: TilePlan, target: Target, epilogue_ops: float = 0.0) -> float:
    """Emulated cycles of one planned matmul.

    - dma = ``dma_cycles(dma_bytes, transfers)`` (latencies overlap ``dma.outstanding`` deep)
    - double-buffered: cycles = max(matrix, vector epilogue, dma) + prologue + drain, where prologue is the first
      A and B tile load (latency + bytes / bw) and drain the last output tile's store; nothing hides those two.
    - single-buffered: cycles = matrix + vector epilogue + dma (no overlap).
    """
    bw = float(target.dma["bytes_per_cycle"])
    lat = float(target.dma["latency_cycles"])
    compute = matrix_compute_cycles(plan, target)
    vec = epilogue_cycles(plan, target, epilogue_ops)
    dma = dma_cycles(target, plan.dma_bytes, plan.transfers)
    if not plan.double_buffer:
        return compute + vec + dma
    tk = min(plan.tk, plan.k)
    first = 2 * lat + (min(plan.tm, plan.m) * tk * plan.a_bytes + tk * min(plan.tn, plan.n) * plan.b_bytes) / bw
    drain = lat + min(plan.tm, plan.m) * min(plan.tn, plan.n) * plan.out_bytes / bw
    return max(compute, vec, dma) + first + drain


def matmul_cost(plan: TilePlan, target: Target, epilogue_ops: float = 0.0) -> OpCost:
    """OpCost of a planned matmul; utilization = macs / (cycles * peak MACs/cycle of the plan's mode)."""
    compute = matrix_compute_cycles(plan, target) + epilogue_cycles(plan, target, epilogue_ops)
    dma = dma_cycles(target, plan.dma_bytes, plan.transfers)
    cycles = plan_cycles(plan, target, epilogue_ops)
    rate = target.mac_rate(plan.mode)
    return OpCost(compute_cycles=compute, dma_cycles=dma, cycles=cycles, dma_bytes=plan.dma_bytes,
                  sram_peak=plan.sram_bytes, macs=plan.macs, utilization=plan.macs / (cycles * rate) if cycles else 0.0,
                  unit="matrix", mode=plan.mode)


def roofline_cycles(macs: int, dma_bytes: int, dtype: str, target: Target) -> float:
    """Lower bound of any schedule: ``max(macs / macs_per_cycle[mode], dma_bytes / bytes_per_cycle)``.

    ``dtype`` is the matrix mode (float32/float16/int8/int4); ``dma_bytes`` the compulsory traffic (each operand
    read once, the output written once)."""
    return max(macs / target.mac_rate(dtype), dma_bytes / float(target.dma["bytes_per_cycle"]))


# --- layouts (kernels/layout.py) ---------------------------------------------------------------------------------
def reorder_cycles(target: Target, nbytes: int) -> float:
    """One tensor's change of layout (NCHW <-> NHWC): a transpose streamed through DMA."""
    return movement_cost(target, nbytes).cycles


def conv_reorder_bytes(kind: str, strides: tuple[int, int], layout: str, in_bytes: int, out_bytes: int) -> int:
    """The bytes a float conv's kernel reorders itself when its tensors are in ``layout``: in NCHW a strided
    depthwise conv runs with the channels in the lanes, transposing its input to channels-last and its output back
    (``kernels/native/conv_depthwise.cc``); in NHWC none does, and a pointwise conv is one GEMM in either."""
    if layout == "NCHW" and kind == "depthwise" and max(strides) > 1:
        return in_bytes + out_bytes
    return 0


def conv_lane_cycles(target: Target, kind: str, strides: tuple[int, int], layout: str,
                     dims: tuple[int, int, int, int, int, int]) -> float:
    """Vector cycles of a depthwise conv's taps, ``dims`` = (N, C, OH, OW, kh, kw), a partial lane block costing a
    whole one: the lanes along the output rows in NCHW (``N * C * OH * ceil(OW / lanes) * kh * kw``), along the
    channels in NHWC and in a strided NCHW conv, which runs channels-last between its reorders
    (``N * OH * OW * ceil(C / lanes) * kh * kw``). A pointwise conv is one GEMM in either layout: 0."""
    if kind != "depthwise":
        return 0.0
    lanes = int(target.vector["lanes"])
    n, c, oh, ow, kh, kw = dims
    if layout == "NCHW" and max(strides) == 1:
        return float(n * c * oh * math.ceil(ow / lanes) * kh * kw)
    return float(n * oh * ow * math.ceil(c / lanes) * kh * kw)


def pool_lane_cycles(target: Target, strides: tuple[int, int], layout: str,
                     dims: tuple[int, int, int, int, int, int]) -> float:
    """Vector cycles of a 2-D MaxPool / AveragePool's taps, ``dims`` = (N, C, OH, OW, kh, kw), a partial lane block
    costing a whole one: along the output rows in NCHW, a column-strided tap costing one more for the permute that
    gathers its lanes (``kernels/native/pool.cc``); along the channels in NHWC (``pool_nhwc.cc``)."""
    lanes = int(target.vector["lanes"])
    n, c, oh, ow, kh, kw = dims
    if layout == "NCHW":
        return float(n * c * oh * math.ceil(ow / lanes) * kh * kw * (2 if strides[1] > 1 else 1))
    return float(n * oh * ow * math.ceil(c / lanes) * kh * kw)


def resize_lane_cycles(target: Target, taps: int, layout: str, dims: tuple[int, int, int, int]) -> float:
    """Vector cycles of a 2-D Resize's column pass, ``dims`` = (N, C, OH, OW), ``taps`` source columns per output
    (1 nearest, 2 linear), a partial lane block costing a whole one: along the output columns in NCHW, each tap's
    lanes gathered by a permute (``kernels/native/resize.cc``); along the channels in NHWC, whole pixels. The row
    pass blends or copies whole rows in either layout."""
    lanes = int(target.vector["lanes"])
    n, c, oh, ow = dims
    if layout == "NCHW":
        return float(n * c * oh * math.ceil(ow / lanes) * taps * 2)
    return float(n * oh * ow * math.ceil(c / lanes) * taps)
