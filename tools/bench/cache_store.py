"""Micro-benchmark of the storage layer: ``python -m npu_ep.tools.bench.cache_store [MiB ...]``.

Prints, per container size, the time (ms) to pack, verify-unpack, unpack without hashes, peek the meta, and
store/fetch through CacheStore, so the O(size) load cost and the zero-copy claim can be checked on this machine.
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from ...context_cache.container import ContainerMeta, pack, peek_meta, unpack
from ...context_cache.keys import cache_key
from ...context_cache.store import CacheStore


def _ms(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def run(sizes_mib: list[float]) -> list[dict[str, float]]:
    """One row per size: MiB, pack/unpack/unpack_noverify/peek/put/get in ms, GB/s of verified unpack."""
    rows = []
    with tempfile.TemporaryDirectory() as d:
        store = CacheStore(d)
        for mib in sizes_mib:
            n = int(mib * (1 << 20)) // 16
            arrays = {f"w{i}": np.random.default_rng(i).integers(-128, 127, n, dtype=np.int8) for i in range(16)}
            header = {"ops": [{"op": "MatMul", "i": i} for i in range(200)]}
            key = cache_key("bench", mib)
            meta = ContainerMeta("bench", "npu-ref", "0" * 64, key)  # a cache entry is bound to its key
            buf = pack(header, arrays, meta=meta)
            c = unpack(buf, verify=False)
            assert all(np.shares_memory(a, np.frombuffer(buf, np.uint8)) for a in c.arrays.values())
            row = {"MiB": len(buf) / (1 << 20), "pack": _ms(lambda: pack(header, arrays, meta=meta)),
                   "unpack": _ms(lambda: unpack(buf)), "unpack_noverify": _ms(lambda: unpack(buf, verify=False)),
                   "peek": _ms(lambda: peek_meta(buf)), "put": _ms(lambda: store.put(key, buf)),
                   "get": _ms(lambda: store.get(key))}
            row["unpack_GBps"] = len(buf) / row["unpack"] / 1e6
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    sizes = [float(a) for a in (sys.argv[1:] if argv is None else argv)] or [1, 16, 64]
    cols = ["MiB", "pack", "unpack", "unpack_noverify", "peek", "put", "get", "unpack_GBps"]
    print("  ".join(f"{c:>15}" for c in cols) + "   (times in ms)")
    for r in run(sizes):
        print("  ".join(f"{r[c]:>15.3f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
