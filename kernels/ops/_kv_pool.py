"""Per-node pool of GroupQueryAttention's present-KV buffers (one [2, B, Nkv, T, H] buffer holds both presents).

Why a pool: a fresh present costs a memset of its zero tail, and once glibc trims the heap (multi-MB presents) a
page fault per 4 KiB; ORT's own arena has neither. A buffer is reused only when nothing but its pool slot refers
to it (every numpy view holds a reference to its base), i.e. ORT has copied the previous outputs and dropped
them; callers that keep an output keep its buffer out of the pool. CPython reference counts decide that.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

from ..registry import Prepared

POOL_BYTES = 16 << 20  # present buffers up to this size are kept per node and reused (larger: allocated per call)
POOL_SLOTS = 2  # per node: one in flight to ORT, one being filled
_POOL_LOCK = threading.Lock()


def _calibrate(pool: list) -> int:
    for slot in pool:  # the same expression as the check in present_buffer
        return sys.getrefcount(slot[0])


_FREE_REFS = _calibrate([[np.empty(0), 0]])  # reference count of a buffer that only its pool slot holds


def present_buffer(p: Prepared, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, list]:
    """A [2, B, Nkv, T, H] buffer for both presents and its slot [buffer, dirty rows]: rows >= dirty are zero."""
    if math.prod(shape) * dtype.itemsize > POOL_BYTES:
        return np.empty(shape, dtype), [None, shape[3]]
    with _POOL_LOCK:  # check-and-take is atomic: the caller's reference marks the buffer busy from here on
        pool = p.kernel_cache.get("present_pool")
        if pool is None:
            pool = p.kernel_cache["present_pool"] = []
        for slot in pool:
            if sys.getrefcount(slot[0]) == _FREE_REFS:
                if slot[0].shape != shape or slot[0].dtype != dtype:
                    slot[:] = [np.empty(shape, dtype), shape[3]]
                return slot[0], slot
        slot = [np.empty(shape, dtype), shape[3]]
        if len(pool) < POOL_SLOTS:
            pool.append(slot)
        return slot[0], slot
