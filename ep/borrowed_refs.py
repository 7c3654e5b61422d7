"""Cache entries name ORT's initializers instead of copying them.

A compiled program reads its large weights in place from ORT's initializers (``kernels.runtime.borrowed_from_ort``).
Storing those bytes in a cache entry would make a warm start read and hold a second copy of every weight (for a
1B int4 decoder: 0.5 GB read, hashed and re-packed, 2x the peak memory). Instead the entry records, per borrowed
constant, which initializer it views and where; loading re-creates the same view of the loading session's
initializer. The cache key already hashes every initializer's bytes, so a hit refers to identical weights.

EPContext payloads stay self-contained (the ``_ctx.onnx`` model carries no initializers): they never use refs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from ..context_cache.container import DTYPES, MAX_NDIM
from ..kernels.node import NodeInfo
from ..kernels.runtime import borrowed_from_ort


class BorrowedRefError(ValueError):
    """A stored reference does not fit the loading session's initializers (the entry is rebuilt)."""


def _dtype_name(dtype: np.dtype) -> str | None:
    return next((name for name, dt in DTYPES.items() if dt == dtype), None)


class BorrowedRefs:
    """The borrowed constant initializers of a partition's nodes, by name."""

    def __init__(self, nodes: Sequence[NodeInfo]):
        self.values: dict[str, np.ndarray] = {}
        for node in nodes:
            for v in node.inputs:
                if isinstance(v.value, np.ndarray) and v.value.size and v.value.flags.c_contiguous \
                        and borrowed_from_ort(v.value):
                    self.values[v.name] = v.value

    def ref(self, arr: Any) -> dict[str, Any] | None:
        """Where ``arr`` lies inside one of the initializers, or None if it is not a view of one."""
        if not (isinstance(arr, np.ndarray) and arr.size and borrowed_from_ort(arr)) or _dtype_name(arr.dtype) is None:
            return None
        lo, hi = byte_bounds(arr)
        for name, init in self.values.items():
            base = init.ctypes.data
            if base <= lo and hi <= base + init.nbytes:
                return {"init": name, "init_nbytes": int(init.nbytes), "offset": int(arr.ctypes.data - base),
                        "dtype": _dtype_name(arr.dtype), "shape": list(arr.shape), "strides": list(arr.strides)}
        return None

    def resolve(self, ref: Mapping[str, Any], where: str) -> np.ndarray:
        """The read-only view ``ref`` describes, checked against the initializer it names (``ref`` came from disk)."""
        try:
            name, init_nbytes, offset = ref["init"], ref["init_nbytes"], ref["offset"]
            dtype, shape, strides = DTYPES[ref["dtype"]], ref["shape"], ref["strides"]
        except (KeyError, TypeError) as exc:
            raise BorrowedRefError(f"{where}: malformed initializer reference {ref!r}") from exc
        ints = [init_nbytes, offset, *shape, *strides] if isinstance(shape, list) and isinstance(strides, list) else []
        if not ints or not all(type(x) is int for x in ints) or len(shape) != len(strides) or len(shape) > MAX_NDIM \
                or any(d <= 0 for d in shape) or offset < 0:
            raise BorrowedRefError(f"{where}: malformed initializer reference {ref!r}")
        init = self.values.get(name)
        if init is None or init.nbytes != init_nbytes:
            raise BorrowedRefError(f"{where}: the entry reads initializer {name!r} of {init_nbytes} bytes, which this "
                                   "session does not hold")
        first = offset + sum(min(0, (d - 1) * s) for d, s in zip(shape, strides))
        last = offset + sum(max(0, (d - 1) * s) for d, s in zip(shape, strides)) + dtype.itemsize
        if first < 0 or last > init_nbytes:
            raise BorrowedRefError(f"{where}: reference into {name!r} spans bytes [{first}, {last}) outside its "
                                   f"{init_nbytes} bytes")
        view = np.ndarray(tuple(shape), dtype, init.reshape(-1).view(np.uint8), offset, tuple(strides))
        view.flags.writeable = False
        return view
