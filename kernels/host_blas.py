"""Host threads for the emulated NPU's matmuls.

The kernels run numpy BLAS inside ORT's process, whose intra-op thread pool also wants the cores. OpenBLAS's own
worker threads busy-wait for each other, so they stall whenever anything else runs: on a 2-core machine the
prefill of a tiny LLM measured 46 ms median / 502 ms worst with the default BLAS threads versus 7.7 ms with one
(an ad-hoc profiling script, not kept; ``python -m npu_ep.tools.bench_llm`` shows TTFT as it is now). So while
NpuEP sessions are alive OpenBLAS runs with a fixed thread count (provider option ``blas_threads``, default 1; 0
leaves the process setting alone) and the host's setting comes back when the last session is released.

Large products still use two cores: ``matmul`` cuts them in halves, the second on one helper thread (provider
option ``host_threads``, default 2; see the constants below). Tried and dropped on the way:
- switching OpenBLAS's thread count per partition call: it resizes its pool on every change, ~10 us per call;
- giving large matmuls OpenBLAS's threads back for their duration: under any other load (ORT's spinning
  workers, another process) its threads stall each other. A 128x1024x1024 MatMul took 19 ms per run that way
  instead of 3 ms (ad-hoc), and the tiny Llama's 128-token prefill 173 ms instead of 14 ms (``bench_llm``).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np


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


# --- large products on two host threads ---------------------------------------------------------------------
# OpenBLAS's own threads busy-wait for each other, which turns any other load on the machine into stalls (a
# 128x1024x1024 MatMul took 19 ms instead of 3 ms). Instead, a large product is cut in two halves (rows of A, or
# columns of B for one-row products) and the second half runs on one helper thread, each half single-threaded
# BLAS; under load the halves simply take turns. Below these sizes the hand-off (~50 us on this VM) costs more
# than it saves (ad-hoc: 32x256x1024 0.32 -> 0.37 ms; 128x1024x1024 4.3 -> 2.7 ms; 1x2048x2048 0.59 -> 0.40 ms).
SPLIT_MACS = 1 << 26
SPLIT_B_BYTES = 8 << 20

_helper_lock = threading.Lock()
_helper: "ThreadPoolExecutor | None" = None
_split_enabled = 0  # live sessions that allow it (provider option host_threads >= 2)


def allow_split(enable: bool) -> None:
    """Count a session in (``enable``) or out of the split; matmuls split while at least one allows it."""
    global _split_enabled
    with _helper_lock:
        _split_enabled = max(0, _split_enabled + (1 if enable else -1))


def _executor() -> "ThreadPoolExecutor":
    global _helper
    with _helper_lock:
        if _helper is None:
            _helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="npu_ep-matmul")
        return _helper


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` for float operands with a 2-D ``b``; large products run as two halves on two threads."""
    k = a.shape[-1]
    rows = a.size // k if k else 0
    n = b.shape[-1]
    if (not _split_enabled or b.ndim != 2 or a.ndim < 1 or (rows * n * k < SPLIT_MACS and b.nbytes < SPLIT_B_BYTES)
            or (rows < 2 and n < 2)):
        return np.matmul(a, b)
    out = np.empty((*a.shape[:-1], n), np.result_type(a.dtype, b.dtype))
    if a.ndim >= 2 and a.shape[-2] >= 2:
        h = a.shape[-2] // 2
        parts = ((a[..., :h, :], b, out[..., :h, :]), (a[..., h:, :], b, out[..., h:, :]))
    else:
        h = n // 2
        parts = ((a, b[:, :h], out[..., :h]), (a, b[:, h:], out[..., h:]))
    second = _executor().submit(np.matmul, *parts[1][:2], out=parts[1][2])
    np.matmul(*parts[0][:2], out=parts[0][2])
    second.result()
    return out
