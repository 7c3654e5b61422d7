"""The context cache's hashing threads: two workers shared by cache keys and container checks (hashlib releases
the GIL on large buffers, so two digests run at once)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_pool: list[ThreadPoolExecutor] = []
_pool_lock = threading.Lock()


def hash_pool() -> ThreadPoolExecutor:
    """The shared pool, created on first use."""
    with _pool_lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="npu_ep-hash"))
        return _pool[0]
