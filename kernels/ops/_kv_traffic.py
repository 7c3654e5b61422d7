"""What a GroupQueryAttention node moves of its KV cache, counted per node (issue 41: "no full copy between calls"
is a fact to verify, not to assume).

Per node, four counters (an int64 array the native bound step adds to as well, ``ep/native/gqa_step.cc``):
  * in_place: calls whose presents were the past buffers themselves (ORT's shared-buffer mode, the stateful KV);
  * appended_bytes: bytes of new K and V rows written into the presents (S rows per batch row, every kv head);
  * copied_bytes: bytes of valid past K and V rows copied into presents that are separate buffers;
  * full_copies: calls that copied a past into a separate present.
Bytes crossing the CPU<->NPU boundary are the bridge's count, not these: a present the kernel writes in place
still crosses if it lives in host memory.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..registry import Prepared

TRAFFIC = "kv_traffic"  # Prepared.kernel_cache key: the node's counters
FIELDS = ("in_place", "appended_bytes", "copied_bytes", "full_copies")


def counters(p: Prepared) -> np.ndarray:
    """The node's counters (created zero on first use); the bound native step holds this same array."""
    c = p.kernel_cache.get(TRAFFIC)
    if c is None:
        c = p.kernel_cache[TRAFFIC] = np.zeros(len(FIELDS), np.int64)
    return c


def count(p: Prepared, in_place: bool, row_bytes: int, new_rows: int, copied_rows: int) -> None:
    """One call: ``new_rows`` positions appended (all batch rows), ``copied_rows`` past positions copied into a
    separate present; ``row_bytes`` is one position's K and V over every kv head."""
    c = counters(p)
    c[0] += in_place
    c[1] += new_rows * row_bytes
    c[2] += copied_rows * row_bytes
    c[3] += copied_rows > 0


def total(prepared: Iterable[Prepared]) -> dict[str, int]:
    """The counters summed over ``prepared`` (e.g. every GroupQueryAttention step of a session's programs)."""
    out = np.zeros(len(FIELDS), np.int64)
    for p in prepared:
        c = p.kernel_cache.get(TRAFFIC)
        if c is not None:
            out += c
    return dict(zip(FIELDS, (int(x) for x in out)))
