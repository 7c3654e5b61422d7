"""Weights the compiler makes (rather than borrows from ORT) on their own pages.

accuracy_level 4's int4 tiles are as large as the model's int4 weights and are made while ORT still holds its
own copy. Each on its own anonymous mapping, they go back to the system as soon as they are dropped (a heap block
of a few MB can stay in the process), and the weight arena leaves them where they are (``ep.weight_arena``): no
second copy, so a session's peak memory is ORT's plus the tiles. Plain 4 KiB pages: the kernels read the tiles as
sequential streams, as fast as from huge pages, and faulting in huge pages slowed a session start (PERF.md).
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import numpy as np


def page_array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zeroed, writeable C-contiguous array on its own anonymous pages."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    pages = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype, count).reshape(shape)


def on_own_pages(arr: np.ndarray) -> bool:
    """Whether ``arr`` views an array made by ``page_array``."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def copy_to_pages(arr: np.ndarray) -> np.ndarray:
    """``arr``'s values in a ``page_array``."""
    out = page_array(arr.shape, arr.dtype)
    np.copyto(out, arr)
    return out
