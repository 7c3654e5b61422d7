"""Cost model primitives: cycles from unit rates, DMA bytes and cycles, overlap from double buffering.

Formulas (all per op execution, at the target clock):
- DMA:      dma_cycles = n_transfers * latency_cycles + bytes / bytes_per_cycle
- vector:   compute_cycles = ceil(elements / lanes) * cycles_per_element_op
- overlap:  with double buffering, cycles = max(compute, dma) + the first tile's load (not hidden)
"""

from __future__ import annotations

import math

from .registry import OpCost
from .target import Target


def dma_cycles(target: Target, nbytes: int, transfers: int = 1) -> float:
    dma = target.dma
    return transfers * float(dma["latency_cycles"]) + nbytes / float(dma["bytes_per_cycle"])


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
