"""BLAS threads for the emulated NPU's kernels.

The kernels run numpy BLAS inside ORT's process, whose intra-op thread pool also wants both cores. OpenBLAS's own
worker threads then contend with ORT's (spinning) threads: on a 2-core machine the prefill of a tiny LLM measured
46 ms median / 502 ms worst with the default BLAS threads versus 7.7 ms with one (an ad-hoc
profiling script, not kept; ``python -m npu_ep.tools.bench_llm`` shows TTFT as it is now). The NPU is one device
driven from one thread, so while NpuEP sessions are alive BLAS runs with a fixed thread count (provider option
``blas_threads``, default 1; 0 leaves the process setting alone) and the host's setting comes back when the last
session is released. Switching per partition call was tried and dropped:
OpenBLAS resizes its thread pool on every change, which cost ~10 us per call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import numpy as np

_GUARDS: dict[int, "BlasThreads"] = {}


@lru_cache(maxsize=1)
def _blas_controllers() -> tuple[Any, ...]:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a declared dependency; degrade to "leave alone"
        return ()
    return tuple(c for c in ThreadpoolController().lib_controllers if c.user_api == "blas")


# A matmul this large amortizes a BLAS thread-count switch (~10 us) many times over: it gets the host's threads
# back for its duration. Two measures of "large": MACs (compute-bound GEMMs) and the bytes of B it streams
# (memory-bound GEMVs: a decode step's 1x2048x2048 fp32 GEMV reads 16 MiB for 4 M MACs and ran 0.56 ms on one
# thread, 0.27 ms on two, ad-hoc). Below both, one thread (no contention with ORT's pool) wins.
WIDE_MACS = 1 << 24
WIDE_B_BYTES = 1 << 22


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` that uses the host's BLAS threads for large products while NpuEP holds BLAS at fewer."""
    macs = (a.size // max(a.shape[-1], 1)) * b.shape[-1] * a.shape[-1] if b.ndim >= 2 else a.size
    guard = _active_guard()
    if (macs < WIDE_MACS and b.nbytes < WIDE_B_BYTES) or guard is None:
        return np.matmul(a, b)
    with guard.widened():
        return np.matmul(a, b)


def _active_guard() -> "BlasThreads | None":
    for guard in _GUARDS.values():
        if guard.holding:
            return guard
    return None


@lru_cache(maxsize=None)
def blas_threads(n: int) -> "BlasThreads":
    """One shared guard per thread count, so concurrent sessions nest instead of fighting over the setting."""
    return BlasThreads(n)


class BlasThreads:
    """Set BLAS to ``n`` threads while at least one holder (an NpuEP session) is alive; restore after the last."""

    def __init__(self, n: int):
        self.n = n
        self._controllers = _blas_controllers() if n > 0 else ()
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: list[int] = []
        self._wide = 0  # calls currently running with the host's thread count
        _GUARDS[n] = self

    @property
    def holding(self) -> bool:
        return self._depth > 0 and bool(self._controllers)

    @contextlib.contextmanager
    def widened(self) -> Iterator[None]:
        """Give BLAS the host's thread count for one large call (nested and concurrent calls share it)."""
        with self._lock:
            if self._wide == 0 and self._depth > 0:
                for c, prev in zip(self._controllers, self._saved):
                    if prev > self.n:
                        c.set_num_threads(prev)
            self._wide += 1
        try:
            yield
        finally:
            with self._lock:
                self._wide -= 1
                if self._wide == 0 and self._depth > 0:
                    for c, prev in zip(self._controllers, self._saved):
                        if prev > self.n:
                            c.set_num_threads(self.n)

    def __enter__(self) -> None:
        if not self._controllers:
            return
        with self._lock:
            if self._depth == 0:
                self._saved = [c.num_threads for c in self._controllers]
                for c, prev in zip(self._controllers, self._saved):
                    if prev != self.n:
                        c.set_num_threads(self.n)
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        if not self._controllers:
            return
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for c, prev in zip(self._controllers, self._saved):
                    if prev != self.n:
                        c.set_num_threads(prev)
