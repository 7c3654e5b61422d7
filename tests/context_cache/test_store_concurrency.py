"""Several processes writing and reading one key, and writers killed mid-write: nothing torn is ever trusted."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from npu_ep.context_cache import container as C
from npu_ep.context_cache.keys import cache_key
from npu_ep.context_cache.store import SUFFIX, CacheStore, CacheWarning

from ._helpers import meta_for

KEY = cache_key("shared model", "npu-ref", "0.1.0")
CTX = mp.get_context("fork")


def payload(writer: int, n: int = 1 << 20) -> bytes:
    """~1 MiB container whose every byte identifies its writer (so a mix of two writers cannot verify)."""
    return C.pack({"writer": writer}, {"w": np.full(n, writer, np.uint8)}, meta=meta_for(KEY))


def _writer(root: str, writer: int, rounds: int) -> None:
    s, b = CacheStore(root), payload(writer)
    for _ in range(rounds):
        assert s.put(KEY, b) is not None


def _reader(root: str, stop_at: float, q) -> None:
    s, seen, bad = CacheStore(root), set(), []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        while time.monotonic() < stop_at:
            data = s.get(KEY)
            if data is not None:
                c = C.unpack(data)
                w = c.header["writer"]
                if not (c.arrays["w"] == w).all():
                    bad.append(f"mixed content for writer {w}")
                seen.add(w)
    bad += [str(r.message) for r in rec if issubclass(r.category, CacheWarning)]
    q.put((sorted(seen), bad))


@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_writers_leave_one_valid_entry_and_readers_never_see_a_torn_one(tmp_path: Path,
                                                                                  writers: int) -> None:
    root = str(tmp_path)
    q = CTX.Queue()
    readers = [CTX.Process(target=_reader, args=(root, time.monotonic() + 2.0, q)) for _ in range(2)]
    procs = [CTX.Process(target=_writer, args=(root, w + 1, 8)) for w in range(writers)]
    for p in readers + procs:
        p.start()
    for p in procs + readers:
        p.join(60)
        assert p.exitcode == 0
    results = [q.get(timeout=10) for _ in readers]
    assert all(not bad for _, bad in results), results
    assert any(seen for seen, _ in results), "readers should have observed entries"
    files = sorted(os.listdir(root))
    assert files == [KEY + SUFFIX], files  # one entry, no leftover temp files
    data = CacheStore(root).get(KEY)
    assert bytes(data) in {payload(w + 1) for w in range(writers)}


def _slow_writer(root: str, ready, old: bool) -> None:
    """Write half of the entry, tell the parent, then hang: the parent SIGKILLs us mid-write."""
    real_write = os.write

    def half_then_hang(fd: int, data) -> int:
        n = real_write(fd, bytes(data[: len(data) // 2]))
        ready.set()
        time.sleep(60)
        return n

    os.write = half_then_hang
    CacheStore(root).put(KEY, payload(9))


@pytest.mark.parametrize("old_entry", [False, True])
def test_writer_killed_mid_write_leaves_nothing_that_is_trusted(tmp_path: Path, old_entry: bool) -> None:
    root = str(tmp_path)
    s = CacheStore(root)
    if old_entry:
        s.put(KEY, payload(1, n=4096))
    ready = CTX.Event()
    p = CTX.Process(target=_slow_writer, args=(root, ready, old_entry))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL
    assert any(n.endswith(".tmp") for n in os.listdir(root)), "the partial temp file is on disk"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        got = s.get(KEY)
    assert got == (payload(1, n=4096) if old_entry else None)
    assert [e.key for e in s.entries()] == ([KEY] if old_entry else [])
    assert s._sweep_tmp() == 1  # dead writer's temp file is swept
    assert not any(n.endswith(".tmp") for n in os.listdir(root))


def _plain_writer(root: str, n: int) -> None:
    CacheStore(root).put(KEY, payload(5, n=n))


def test_sigkill_at_random_moments_never_yields_a_corrupt_entry(tmp_path: Path) -> None:
    root = str(tmp_path)
    rng = random.Random(1234)
    good = payload(5, n=8 << 20)
    for _ in range(4):
        p = CTX.Process(target=_plain_writer, args=(root, 8 << 20))
        p.start()
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            got = CacheStore(root).get(KEY)
        assert got is None or got == good
