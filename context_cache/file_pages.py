"""Give back the pages of a file mapping that hashing or compiling faulted in, so reading weights does not count
them twice.

Why: ORT maps a model's external data file (one private mapping per initializer); NpuEP's cache key reads every
byte of it, and the compiler reads the weights it derives its own constants from (level 4's int8 tiles from the
int4 B). Each page read joins the process's resident set and stays there until ORT unmaps the file at the end of
session creation, while the compiler allocates its own constants: for a 1B int4 decoder the key alone added the
whole 0.5 GB file to the peak RSS, and deriving the tiles as much again. The page cache keeps those pages, so
dropping them from this process's mapping costs a minor fault if a kernel reads them again.

Only pages the file itself backs are released (``/proc/self/pagemap``: "file page or shared anonymous" or not
present, none swapped): ``MADV_DONTNEED`` on them loses nothing, the next read maps the same file page again. A
page of a private mapping that was written (copy-on-write, now anonymous memory) would be lost, so a range
holding one is left alone; so is any range when pagemap cannot be read (not Linux, restricted /proc). A write
landing between the check and the release would still be lost: callers release only constant data nothing writes
(the initializers a cache key hashes or a compiled step was made from).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterable

import numpy as np

PAGE = mmap.PAGESIZE
_FILE_OR_SHARED = 1 << 61
_PRESENT = 1 << 63
_SWAPPED = 1 << 62
_MADV_DONTNEED = 4
_libc: list = []


def _madvise() -> ctypes._CFuncPtr | None:
    if not _libc:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            fn.restype = ctypes.c_int
            _libc.append(fn)
        except (OSError, AttributeError):
            _libc.append(None)
    return _libc[0]


def _all_file_backed(first_page: int, count: int) -> bool:
    """Whether every page in the range is a file (or shared) page or not in memory at all, and none is swapped out,
    per /proc/self/pagemap."""
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            raw = os.pread(f.fileno(), 8 * count, 8 * first_page)
    except OSError:
        return False
    if len(raw) != 8 * count:
        return False
    entries = np.frombuffer(raw, "<u8")
    kept = entries & np.uint64(_FILE_OR_SHARED | _PRESENT)  # not present and not swapped: nothing to lose either
    return bool(np.all((kept == 0) | ((kept & np.uint64(_FILE_OR_SHARED)) != 0))
                and not np.any(entries & np.uint64(_SWAPPED)))


def release_file_pages(view: memoryview) -> int:
    """Drop the whole pages inside ``view`` from this process's resident set if a file backs every one of them;
    returns the bytes released (0 if any page is anonymous or the platform cannot tell)."""
    if not sys.platform.startswith("linux") or view.nbytes < PAGE:
        return 0
    address = np.frombuffer(view, np.uint8).ctypes.data
    lo = -(-address // PAGE) * PAGE
    hi = (address + view.nbytes) // PAGE * PAGE
    madvise = _madvise()
    if hi <= lo or madvise is None or not _all_file_backed(lo // PAGE, (hi - lo) // PAGE):
        return 0
    return hi - lo if madvise(lo, hi - lo, _MADV_DONTNEED) == 0 else 0


def release_weight_pages(arrays: Iterable[object], min_bytes: int = 1 << 20) -> int:
    """``release_file_pages`` over each C-contiguous array of ``min_bytes`` or more in ``arrays`` (other items are
    skipped): the pages of constant weights a compile step has read and no longer needs resident. Returns bytes."""
    released = 0
    for arr in arrays:
        if isinstance(arr, np.ndarray) and arr.nbytes >= min_bytes and arr.flags.c_contiguous:
            released += release_file_pages(memoryview(arr.reshape(-1).view(np.uint8)))
    return released


__all__ = ["PAGE", "release_file_pages", "release_weight_pages"]
