"""A matmul's tile plan as plain data: what the planner chose and what the cost model and kernels read.

Its own module so that the planner (which scores candidate plans with the cost model) and the cost model (which
costs plans) both import it and not each other. Field meanings: see ``kernels/planner.py``'s docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any


@dataclasses.dataclass(frozen=True)
class TilePlan:
    """One matmul's tiling. Plain data: ``to_dict``/``from_dict`` round-trip through JSON."""

    m: int
    n: int
    k: int
    batch: int
    mode: str  # matrix-unit mode: float32 | float16 | int8 | int4
    acc_dtype: str
    tm: int
    tn: int
    tk: int
    loop_order: str  # "mnk" | "nmk"
    resident: str  # "none" | "a" | "b" | "weights"
    double_buffer: bool
    block_size: int | None
    a_bytes: float  # bytes per element in DRAM
    b_bytes: float
    out_bytes: float
    sram_a: int
    sram_b: int
    sram_scales: int
    sram_acc: int
    sram_out: int
    dma_a: int  # total bytes over all batches
    dma_b: int
    dma_scales: int
    dma_out: int
    transfers: int

    # --- derived -------------------------------------------------------------------------------------------
    @property
    def sram_bytes(self) -> int:
        return self.sram_a + self.sram_b + self.sram_scales + self.sram_acc + self.sram_out

    @property
    def dma_bytes(self) -> int:
        return self.dma_a + self.dma_b + self.dma_scales + self.dma_out

    @property
    def tiles(self) -> tuple[int, int, int]:
        """Number of tiles along (m, n, k), tails included."""
        return -(-self.m // self.tm), -(-self.n // self.tn), -(-self.k // self.tk)

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.n * self.k

    def output_tiles(self) -> Iterator[tuple[int, int, int, int, int]]:
        """``(b, m0, m1, n0, n1)`` of every output tile in loop order (for inspection and coverage tests)."""
        tm_, tn_, _ = self.tiles
        for b in range(self.batch):
            outer, inner = ((tm_, tn_) if self.loop_order == "mnk" else (tn_, tm_))
            for o in range(outer):
                for i in range(inner):
                    mi, ni = (o, i) if self.loop_order == "mnk" else (i, o)
                    yield (b, mi * self.tm, min(self.m, (mi + 1) * self.tm),
                           ni * self.tn, min(self.n, (ni + 1) * self.tn))

    def k_tiles(self) -> list[tuple[int, int]]:
        """``(k0, k1)`` of the accumulation steps of every output tile."""
        return [(k0, min(self.k, k0 + self.tk)) for k0 in range(0, self.k, self.tk)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TilePlan:
        return TilePlan(**d)
