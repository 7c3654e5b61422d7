"""Create and destroy N NpuEP sessions (each runs once) and print RSS growth as JSON; run as a script.

    python _leak.py N [model]   # model: two_partition (default) or static
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(__file__))]

import numpy as np
import psutil

from _child import static_model, two_partition_model
from npu_testing import npu_session


def measure(n: int, kind: str = "two_partition", warmup: int = 20) -> dict:
    model = (two_partition_model() if kind == "two_partition" else static_model()).SerializeToString()
    x = np.ones((2, 16) if kind == "two_partition" else (2, 8), np.float32)
    proc = psutil.Process()

    def cycle():
        sess = npu_session(model)
        sess.run(None, {"x": x})
        del sess

    for _ in range(warmup):
        cycle()
    gc.collect()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    for _ in range(n):
        cycle()
    gc.collect()
    rss1 = proc.memory_info().rss
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    return {"sessions": n, "model": kind, "rss_before_mb": round(rss0 / 2**20, 1),
            "rss_after_mb": round(rss1 / 2**20, 1),
            "growth_mb": round((rss1 - rss0) / 2**20, 2), "per_session_kb": round((rss1 - rss0) / 1024 / max(n, 1), 2),
            "live_ep_sessions": len(LIVE_SESSIONS), "seconds": round(time.perf_counter() - t0, 1)}


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "two_partition")))
