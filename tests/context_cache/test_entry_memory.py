"""Storing and loading a cache entry with large arrays holds no extra whole copy of it (issue 40 item 6): ``put``
streams the sections from the program's own arrays into the file, ``pack`` makes its one bytes object and nothing
more, and ``get`` reads into the one buffer the arrays are then views of. Memory is what tracemalloc traces
(numpy's buffers included), not time."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from npu_ep.context_cache import container as C
from npu_ep.context_cache.keys import cache_key
from npu_ep.context_cache.store import CacheStore

from ._helpers import meta_for

MB = 1 << 20


def _entry() -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    key = cache_key("large entry")
    rng = np.random.default_rng(3)
    arrays = {"w0": rng.integers(-128, 128, (2048, 4096), dtype=np.int8),
              "w1": rng.standard_normal((1024, 1024), dtype=np.float32),
              "s": np.float32(0.25) * np.ones((), np.float32)}
    return key, {"steps": [{"op": "MatMul"}]}, arrays


def _traced_peak(call: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes allocated at the peak of ``call`` above what was allocated before it, and its result."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = call()
        return tracemalloc.get_traced_memory()[1] - before, result
    finally:
        tracemalloc.stop()


def test_put_streams_the_sections_without_a_copy_of_the_entry(tmp_path: Path) -> None:
    key, header, arrays = _entry()
    store = CacheStore(tmp_path)
    entry_bytes = sum(a.nbytes for a in arrays.values())
    peak, path = _traced_peak(lambda: store.put(key, C.packed(header, arrays, meta=meta_for(key))))
    assert peak < entry_bytes / 8, f"put of a {entry_bytes / MB:.0f} MiB entry allocated {peak / MB:.1f} MiB"
    assert path.read_bytes() == C.pack(header, arrays, meta=meta_for(key))  # the same file as the bytes
    got = C.unpack(store.get(key))
    assert got.header == header and all(np.array_equal(got.arrays[n], a) for n, a in arrays.items())


def test_pack_makes_one_copy_of_the_entry_not_two() -> None:
    key, header, arrays = _entry()
    peak, blob = _traced_peak(lambda: C.pack(header, arrays, meta=meta_for(key)))
    assert peak < 1.1 * len(blob), f"pack of a {len(blob) / MB:.0f} MiB container allocated {peak / MB:.1f} MiB"
    C.verify(blob)


def test_get_reads_into_the_buffer_the_arrays_view(tmp_path: Path) -> None:
    key, header, arrays = _entry()
    store = CacheStore(tmp_path)
    store.put(key, C.packed(header, arrays, meta=meta_for(key)))
    size = store.path_for(key).stat().st_size
    peak, got = _traced_peak(lambda: C.unpack(store.get(key), verify=False))
    assert peak < 1.1 * size, f"get of a {size / MB:.0f} MiB entry allocated {peak / MB:.1f} MiB"
    assert all(not a.flags.owndata for a in got.arrays.values())  # views of the one buffer read
