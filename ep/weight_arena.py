"""Pack a program's large constants (weights) into one contiguous arena backed by huge pages.

Why: a decode step streams every weight of the model once (the GEMVs are memory-bound). Separate arrays of
0.25-1 MiB sit on 4 KiB pages, whose boundaries stop the hardware prefetcher and cost a TLB miss each; one arena
of >= 4 MiB is madvised to 2 MiB huge pages by numpy and read as one stream (decode GEMVs ran faster: PERF.md).

The kernels see the same arrays as before (same dtype, shape, values, C-contiguous); only where they live
changes. Constants below ``MIN_BYTES`` stay where they are, and nothing is packed when the total would not reach
the huge-page threshold. Views of ORT's own initializers (read in place for the session, see
``ep/native/execution_provider.h``) are never copied: a copy would double the weights' memory.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..kernels.registry import Prepared

MIN_BYTES = 64 << 10  # smaller constants (scales, biases, norms) are not worth moving
HUGE_PAGE_ARENA = 4 << 20  # numpy madvises allocations from this size on to huge pages
ALIGN = 64


def _ort_initializer_base():
    try:
        from ._native import ORT_INITIALIZER
    except ImportError:  # extension not built: no session borrows initializers
        return None
    return ORT_INITIALIZER


def borrowed_from_ort(arr: np.ndarray) -> bool:
    """Whether ``arr`` is (a view of) a constant initializer that ORT owns and keeps for the session."""
    owner = _ort_initializer_base()
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return owner is not None and base is owner


def pack_constants(prepared: Iterable[Prepared]) -> int:
    """Move every constant array of ``MIN_BYTES`` or more that we own into one arena; returns its size in bytes."""
    big = [(p, key, arr) for p in prepared for key, arr in p.consts.items()
           if isinstance(arr, np.ndarray) and arr.nbytes >= MIN_BYTES and arr.dtype.kind in "fiub"
           and not borrowed_from_ort(arr)]
    total = sum(-(-arr.nbytes // ALIGN) * ALIGN for _, _, arr in big)
    if total < HUGE_PAGE_ARENA:
        return 0
    arena = np.empty(total + ALIGN, np.uint8)
    offset = (-arena.ctypes.data) % ALIGN
    for p, key, arr in big:
        view = arena[offset:offset + arr.nbytes].view(arr.dtype).reshape(arr.shape)
        view[...] = arr
        p.consts[key] = view
        offset += -(-arr.nbytes // ALIGN) * ALIGN
    return total
