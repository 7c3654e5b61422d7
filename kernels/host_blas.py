"""Host threads for the emulated NPU's matmuls.

The kernels run numpy BLAS inside ORT's process, whose intra-op thread pool also wants the cores. OpenBLAS's own
worker threads busy-wait for each other, so they stall whenever anything else runs (several times slower, with
long tails; PERF.md has the numbers). So while NpuEP sessions are alive OpenBLAS runs with a fixed thread count
(provider option ``blas_threads``, default 1; 0 leaves the process setting alone; with several values alive the
smallest applies) and the host's setting comes back when the last session is released, whatever the order.

Large products still use two cores: ``matmul`` cuts them in halves of B's columns, the second on one helper
thread (provider option ``host_threads``, default 2; the cut depends on the shape only, so the bits do not depend
on the thread count; see the constants below). Tried and dropped on the way (PERF.md):
- switching OpenBLAS's thread count per partition call: it resizes its pool on every change;
- giving large matmuls OpenBLAS's threads back for their duration: under any other load (ORT's spinning
  workers, another process) its threads stall each other.
"""
from __future__ import annotations

import threading
from functools import cache, lru_cache
from typing import Any

import numpy as np


@lru_cache(maxsize=1)
def _blas_controllers() -> tuple[Any, ...]:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a declared dependency; degrade to "leave alone"
        return ()
    return tuple(c for c in ThreadpoolController().lib_controllers if c.user_api == "blas")


class _BlasSetting:
    """The process-wide BLAS thread count and the sessions that asked for one.

    BLAS has one setting per process, so sessions with different ``blas_threads`` cannot each have their own: while
    any of them lives BLAS runs with the smallest value among the live ones (the point of the option is to keep
    BLAS's workers from fighting other threads, so the most cautious request wins). Each release re-applies that
    rule to the sessions left, and when the last one goes the value the host had before the first one came
    returns, in whatever order the sessions are released.

    The lock is re-entrant: a garbage-collected session may be released (its EP destroyed by ORT, which calls back
    into Python) on a thread that is inside ``hold`` or ``release`` already, and ``_apply`` applies again until the
    holders it applied are the holders there are."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._held: list[int] = []  # one value per live holder
        self._host: list[int] = []  # each controller's thread count before the first holder

    def hold(self, n: int) -> None:
        controllers = _blas_controllers()
        if not controllers:
            return
        with self._lock:
            if not self._held:
                self._host = [c.num_threads for c in controllers]
            self._held.append(n)
            self._apply(controllers)

    def release(self, n: int) -> None:
        controllers = _blas_controllers()
        if not controllers:
            return
        with self._lock:
            self._held.remove(n)
            self._apply(controllers)

    def _apply(self, controllers: tuple[Any, ...]) -> None:
        while True:
            applied = list(self._held)
            wanted = [min(applied)] * len(controllers) if applied else self._host
            for c, n in zip(controllers, wanted):
                if c.num_threads != n:
                    c.set_num_threads(n)
            if self._held == applied:
                return


_SETTING = _BlasSetting()


def blas_threads(n: int) -> BlasThreads:
    """A holder of ``n`` BLAS threads for one session (``_BlasSetting`` says what several holders get)."""
    return BlasThreads(n)


class BlasThreads:
    """One session's claim on the BLAS thread count: entered when the session is created, left when released
    (leaving twice is harmless)."""

    def __init__(self, n: int):
        if n <= 0:
            raise ValueError(f"blas_threads must be >= 1 for a holder (0 means: hold nothing), got {n}")
        self.n = n
        self._held = False

    def __enter__(self) -> None:
        if not self._held:
            _SETTING.hold(self.n)
            self._held = True

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            _SETTING.release(self.n)


# --- large products on two host threads ---------------------------------------------------------------------
# OpenBLAS's own threads busy-wait for each other, which turns any other load on the machine into stalls.
# Instead, a large product is cut in two halves of B's columns and the second half runs on one helper thread, each
# half single-threaded BLAS; under load the halves simply take turns. The hand-off is a pair of locks (cheaper
# than a ThreadPoolExecutor). Not split, because they ran slower split: products under 16 M MACs, and one-row
# products (two threads streaming one matrix's pages). PERF.md has the measurements. A session's float32 products
# run their halves through the native kernels instead (kernels/native/sgemm_columns.cc: on ORT's own threads).
#
# Determinism: whether a product is cut, and where, depends on its shape only. When the helper is busy or no
# session allows it (host_threads=1), the same two halves run one after the other on the calling thread, so the
# bits never depend on the thread count or the load. (Cutting only when the helper was free gave different bits:
# BLAS takes another code path for another shape, e.g. numpy runs a one-row half as a GEMV and the whole as a
# GEMM.) Columns rather than rows: each half reads half of B, and two halves in sequence cost what the whole does
# (row halves each pack all of B).
SPLIT_MACS = 1 << 24


class _Helper:
    """One helper thread that runs the second half of a split matmul; one caller at a time owns it."""

    def __init__(self) -> None:
        self._owner = threading.Lock()  # held by the caller whose half is in flight
        self._go = threading.Lock()     # released by the owner to start the helper
        self._done = threading.Lock()   # released by the helper when its half is written
        self._go.acquire()
        self._done.acquire()
        self._job: tuple | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._loop, name="npu_ep-matmul", daemon=True).start()

    def _loop(self) -> None:
        np.seterr(all="ignore")  # this thread runs only our products: IEEE results, no warnings (ep/program.py)
        while True:
            self._go.acquire()
            a, b, out = self._job
            try:
                np.matmul(a, b, out=out)
            except BaseException as exc:  # noqa: BLE001 - handed to the owner, which raises it
                self._error = exc
            self._done.release()

    def start(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """Start ``out[...] = a @ b`` on the helper; False (nothing started) if another caller owns it."""
        if not self._owner.acquire(blocking=False):
            return False
        self._job = (a, b, out)
        self._go.release()
        return True

    def wait(self) -> None:
        self._done.acquire()
        error, self._job, self._error = self._error, None, None
        self._owner.release()
        if error is not None:
            raise error


_state_lock = threading.Lock()
_helper: _Helper | None = None
_split_enabled = 0  # live sessions that allow it (provider option host_threads >= 2)


def allow_split(enable: bool) -> None:
    """Count a session in (``enable``) or out of the split; matmuls split while at least one allows it."""
    global _split_enabled, _helper
    with _state_lock:
        _split_enabled = max(0, _split_enabled + (1 if enable else -1))
        if _split_enabled and _helper is None:
            _helper = _Helper()


def splits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a @ b`` runs as two column halves: a function of the shapes only (see above)."""
    return (b.ndim == 2 and a.ndim >= 2 and a.shape[-2] >= 2 and b.shape[1] >= 2
            and (a.size // max(a.shape[-1], 1)) * b.shape[0] * b.shape[1] >= SPLIT_MACS)


def matmul(a: np.ndarray, b: np.ndarray, native: Any = None, threads: int = 1) -> np.ndarray:
    """``np.matmul``; with a 2-D ``b``, a large product of many rows runs as two halves of B's columns. A float32
    product given the native kernels (``native``, the session's ``threads``) runs them as two sgemm calls through
    the kernels' ParallelFor (on ORT's threads inside a session); else the second half runs on the helper thread
    while a session allows it and the helper is free, or after the first on this thread."""
    if not splits(a, b):
        return np.matmul(a, b)
    sgemm = sgemm_address() if native is not None and a.dtype == b.dtype == np.float32 else None
    if sgemm:
        rows = np.ascontiguousarray(a).reshape(-1, a.shape[-1])
        out = native.sgemm_columns(rows, np.ascontiguousarray(b), b.shape[1] // 2, sgemm, threads)
        return out.reshape(*a.shape[:-1], b.shape[1])
    out = np.empty((*a.shape[:-1], b.shape[1]), np.result_type(a.dtype, b.dtype))
    h = b.shape[1] // 2
    helper = _helper if _split_enabled else None
    if helper is None or not helper.start(a, b[:, h:], out[..., h:]):
        np.matmul(a, b[:, h:], out=out[..., h:])
        np.matmul(a, b[:, :h], out=out[..., :h])
        return out
    try:
        np.matmul(a, b[:, :h], out=out[..., :h])
    finally:
        helper.wait()
    return out


def sgemm_address() -> int | None:
    """Address of ``cblas_sgemm`` with 64-bit integers in the BLAS numpy uses (OpenBLAS as numpy's wheels ship
    it), for native kernels that call the same library (and honour the same thread setting); None when that BLAS
    has no such symbol (then those kernels take their numpy path)."""
    return _cblas_address("sgemm")


def sdot_address() -> int | None:
    """Address of ``cblas_sdot`` (64-bit integers) in numpy's BLAS: numpy's float32 dot calls it, so a native
    kernel calling it too gets numpy's bits; None when absent (the kernel then sums sequentially)."""
    return _cblas_address("sdot")


@cache
def _cblas_address(routine: str) -> int | None:
    import ctypes

    try:
        from threadpoolctl import ThreadpoolController
        libs = [c.filepath for c in ThreadpoolController().lib_controllers
                if c.user_api == "blas" and c.internal_api == "openblas"]
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    for path in libs:
        lib = ctypes.CDLL(path)  # already loaded by numpy: the same library instance
        for name in (f"scipy_cblas_{routine}64_", f"cblas_{routine}64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value
    return None
