"""BLAS threads for the emulated NPU's kernels.

The kernels run numpy BLAS inside ORT's process, whose intra-op thread pool also wants both cores. OpenBLAS's own
worker threads then contend with ORT's (spinning) threads: on a 2-core machine the prefill of a tiny LLM measured
46 ms median / 502 ms worst with the default BLAS threads versus 7.7 ms with one (an ad-hoc
profiling script, not kept; ``python -m npu_ep.tools.bench_llm`` shows TTFT as it is now). The NPU is one device
driven from one thread, so while NpuEP sessions are alive BLAS runs with a fixed thread count (provider option
``blas_threads``, default 1; 0 leaves the process setting alone) and the host's setting comes back when the last
session is released. Two ways of using more threads were tried and dropped:
- switching per partition call: OpenBLAS resizes its thread pool on every change, ~10 us per call;
- giving large matmuls the host's threads back for their duration: ORT spins its intra-op workers for the whole
  ``session.run`` (``session.intra_op.allow_spinning``, on by default), so a second BLAS thread fights a spinning
  ORT worker for the other core. A 128x1024x1024 MatMul took 19 ms per run that way instead of 3 ms (ad-hoc), and
  the tiny Llama's 128-token prefill 173 ms instead of 14 ms (``bench_llm``).
Whoever runs NpuEP sessions with ``allow_spinning=0`` on an otherwise idle machine can raise ``blas_threads``.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _blas_controllers() -> tuple[Any, ...]:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a declared dependency; degrade to "leave alone"
        return ()
    return tuple(c for c in ThreadpoolController().lib_controllers if c.user_api == "blas")


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
