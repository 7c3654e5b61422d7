"""Timing two (or more) things against each other on a shared host: alternating blocks after a pause.

Why: this machine's load comes and goes (the same GEMM took 2.5-5 ms at different times of one day), so timing one
EP's runs and then the other's puts each phase of the load on whichever ran then. Here every function runs once
(warm-up), then they take turns in ``rounds`` blocks of equal length, each block after ``SETTLE_S`` (ORT's
intra-op workers spin for ~50 ms after a session runs: measured, one core busy 40-50 ms, idle after 200 ms; a block
must not pay for the previous block's spinning threads). Per-block results let a caller report a ratio's spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

SETTLE_S = 0.25


def alternating_blocks(fns: Mapping[str, Callable[[], object]], reps: int, rounds: int = 4,
                       settle_s: float = SETTLE_S, warmup: bool = True) -> dict[str, list[list[float]]]:
    """Seconds of every call, per function, per block: ``{name: [[block 0 calls], [block 1 calls], ...]}``, with
    ``max(1, reps // rounds)`` calls per block (``warmup=False``: the caller warmed them up)."""
    for fn in fns.values() if warmup else ():
        fn()
    per_block = max(1, reps // rounds)
    times: dict[str, list[list[float]]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            time.sleep(settle_s)
            block = []
            for _ in range(per_block):
                t0 = time.perf_counter()
                fn()
                block.append(time.perf_counter() - t0)
            times[k].append(block)
    return times


def interleaved_calls(fns: Mapping[str, Callable[[], object]], calls: int) -> dict[str, list[list[float]]]:
    """Seconds of ``calls`` calls per function, the functions taking turns call by call, as one block each (the
    shape ``medians`` reads).

    Why: for calls of a few microseconds this host has phases of 0.5-10 ms in which the same call takes 8-10 us
    instead of 4.8 (measured on ORT's CPU EP alone, running without pause); blocks of a hundred calls land in
    different phases and decide a ratio by chance. Taking turns call by call puts both in every phase. Only for
    calls that start no parallel section: a worker left spinning would run into the other's call."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    pairs = list(fns.items())
    for _ in range(calls):
        for k, fn in pairs:
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: [v] for k, v in times.items()}


def medians(blocks: Mapping[str, list[list[float]]]) -> dict[str, float]:
    """Median seconds per call of each function over all its blocks."""
    return {k: statistics.median(t for block in v for t in block) for k, v in blocks.items()}


def block_ratios(blocks: Mapping[str, list[list[float]]], num: str, den: str) -> list[float]:
    """Per round, the median call of ``num``'s block over the median call of ``den``'s block (the two blocks ran
    back to back, so the host's slow phases weigh on both)."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(blocks[num], blocks[den])]
