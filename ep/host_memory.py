"""Keep freed host memory for reuse (glibc malloc), as ORT's own arena does for its tensors.

Why: the kernels allocate their outputs with numpy, i.e. with malloc. glibc serves blocks >= 128 KiB (its
``M_MMAP_THRESHOLD``, raised dynamically up to the largest block freed so far) from fresh mmaps, and trims freed
memory at the heap top beyond ``M_TRIM_THRESHOLD`` back to the OS. A decode step of a small LLM frees about 1 MiB
of KV-cache-sized arrays at its end, so glibc gives those pages back and the next step faults every page in
again (a page fault costs microseconds in a VM). With the thresholds below, blocks under 32 MiB come from the heap
and up to ``trim_bytes`` of free heap stays mapped: the next step reuses warm pages.

This is process-wide and only ever raises the thresholds once (first NpuEP session, provider option
``retain_host_memory``, default on); freed memory beyond ``trim_bytes`` still goes back to the OS and blocks of
32 MiB or more (large weights) still use their own mmaps. Other C libraries: nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from ..log import logger

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's maximum on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_BYTES = 128 << 20

_lock = threading.Lock()
_applied: bool | None = None


def retain_freed_memory(trim_bytes: int = TRIM_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if they are set (now or before)."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and _mallopt(M_TRIM_THRESHOLD, trim_bytes)
            logger.info("host memory: glibc thresholds %s (mmap %d B, trim %d B)",
                        "set" if _applied else "not available", MMAP_THRESHOLD_BYTES, trim_bytes)
        return _applied


def _mallopt(param: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): keep the allocator's defaults
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(param, value) == 1
