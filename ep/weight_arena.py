"""Pack a program's large constants (weights) into one contiguous arena backed by huge pages.

Why: a decode step streams every weight of the model once (the GEMVs are memory-bound). Separate arrays of
0.25-1 MiB sit on 4 KiB pages, whose boundaries stop the hardware prefetcher and cost a TLB miss each; one arena
of >= 4 MiB is madvised to 2 MiB huge pages by numpy and read as one stream (decode GEMVs ran faster: PERF.md).

The kernels see the same arrays as before (same dtype, shape, values, C-contiguous); only where they live
changes. Constants below ``MIN_BYTES`` stay where they are, and nothing is packed when the total would not reach
the huge-page threshold. Views of ORT's own initializers (read in place for the session, see
``ep/native/execution_provider.h``) are never copied: a copy would double the weights' memory; nor are arrays
already on their own huge pages (``kernels.own_pages``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..kernels.runtime import borrowed_from_ort
from ..kernels.own_pages import on_own_pages
from ..kernels.registry import Prepared

MIN_BYTES = 64 << 10  # smaller constants (scales, biases, norms) are not worth moving
HUGE_PAGE_ARENA = 4 << 20  # numpy madvises allocations from this size on to huge pages
ALIGN = 64


def rebase_borrowed(program: Any, moves: Sequence[tuple[int, int, np.ndarray]]) -> int:
    """Point a program's views of ORT initializers at the memory ORT actually passes at run time.

    ORT can hand Compile a temporary copy of an initializer (weights in an external data file are loaded for the
    graph view, then loaded again into the session state). ``moves`` lists (compile-time address, size, read-only
    uint8 view of the session's buffer); every array reading inside a moved range becomes the same view at the
    same offset of the new buffer. Returns how many arrays were rebased."""
    count = 0

    def rebase(value: Any) -> Any:
        nonlocal count
        if isinstance(value, np.ndarray) and value.size and borrowed_from_ort(value):
            address = value.ctypes.data
            for old, nbytes, new in moves:
                if old <= address < old + nbytes:
                    view = np.ndarray(value.shape, value.dtype, new, address - old, value.strides)
                    view.flags.writeable = False
                    count += 1
                    return view
            return value
        if isinstance(value, Prepared):
            for table in (value.attrs, value.consts, value.kernel_cache):
                for key, item in table.items():
                    table[key] = rebase(item)
        elif isinstance(value, dict):
            for key, item in value.items():
                value[key] = rebase(item)
        elif isinstance(value, list):
            value[:] = [rebase(item) for item in value]
        elif isinstance(value, tuple):
            return type(value)(*map(rebase, value)) if hasattr(value, "_fields") else tuple(map(rebase, value))
        return value

    for step in getattr(program, "steps", ()):
        rebase(step.prepared)
    return count


def _in_loaded_buffer(arr: np.ndarray) -> bool:
    """Whether ``arr`` views a context read from disk (``context_cache.fileio.read_container``: one numpy buffer
    seen through a memoryview) of huge-page size: its constants are already where an arena would put them."""
    base: Any = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    return (isinstance(base, memoryview) and isinstance(base.obj, np.ndarray) and base.obj.flags.owndata
            and base.obj.nbytes >= HUGE_PAGE_ARENA)


def pack_constants(prepared: Iterable[Prepared]) -> int:
    """Move every constant array of ``MIN_BYTES`` or more that we own into one arena; returns its size in bytes."""
    big = [(p, key, arr.nbytes) for p in prepared for key, arr in p.consts.items()
           if isinstance(arr, np.ndarray) and arr.nbytes >= MIN_BYTES and arr.dtype.kind in "fiub"
           and not borrowed_from_ort(arr) and not _in_loaded_buffer(arr) and not on_own_pages(arr)]
    total = sum(-(-nbytes // ALIGN) * ALIGN for _, _, nbytes in big)
    if total < HUGE_PAGE_ARENA:
        return 0
    arena = np.empty(total + ALIGN, np.uint8)
    offset = (-arena.ctypes.data) % ALIGN
    for p, key, nbytes in big:  # each array is released as it moves: the peak is the arena plus one array
        arr = p.consts[key]
        view = arena[offset:offset + nbytes].view(arr.dtype).reshape(arr.shape)
        view[...] = arr
        p.consts[key] = view
        del arr
        offset += -(-nbytes // ALIGN) * ALIGN
    return total
