"""Fuzz the on-disk cache as a session sees it (run as a script in a child so a crash is a return code).

    python _fuzz_cache.py N

Each case puts something in place of model B's cache entry: the valid entry with byte mutations (flip, overwrite,
truncate, insert, splice), model A's valid entry (swapped), A's entry mutated, a FIFO, a symlink to /dev/zero or to
a valid entry, a folder, a 1 GiB sparse file. Then a session for B must give B's no-cache outputs bit for bit and
must never load a changed entry. Prints one JSON line; exit 1 if any case was wrong, failed or loaded a changed
entry.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import warnings

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(__file__))]

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _child import static_model
from _fuzz_epcontext import apply, mutations
from npu_testing import npu_session, save

from npu_ep.context_cache.store import SUFFIX
from npu_ep.ep.entry_points import LIVE_SESSIONS

X = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
OBJECTS = ["swapped", "swapped_mutated", "fifo", "dev_zero", "symlink_to_valid", "folder", "sparse"]


def _entry_of(model: str, cache: str) -> tuple[str, bytes]:
    npu_session(model, {"cache_dir": cache})
    [name] = [n for n in os.listdir(cache) if n.endswith(SUFFIX)]
    return name, open(os.path.join(cache, name), "rb").read()


def run(n: int) -> dict:
    figures = {"cases": 0, "wrong_results": 0, "session_errors": 0, "loaded_changed": 0, "loaded_valid": 0,
               "rebuilt": 0, "examples": []}
    with tempfile.TemporaryDirectory() as folder:
        a = save(static_model(seed=1), folder, "a.onnx")
        b = save(static_model(seed=2), folder, "b.onnx")
        _, entry_a = _entry_of(a, os.path.join(folder, "ca"))
        name_b, entry_b = _entry_of(b, os.path.join(folder, "cb"))
        expected = npu_session(b).run(None, {"x": X})[0]
        cache = os.path.join(folder, "cache")

        def plant(case) -> bytes | None:
            """Put the case's object at B's entry name; returns the bytes planted (None: not a regular file)."""
            shutil.rmtree(cache, ignore_errors=True)
            os.makedirs(cache)
            path = os.path.join(cache, name_b)
            kind, ops = case
            data = None
            if kind == "mutated":
                data = apply(entry_b, ops)
            elif kind == "swapped":
                data = entry_a
            elif kind == "swapped_mutated":
                data = apply(entry_a, ops)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "dev_zero":
                os.symlink("/dev/zero", path)
            elif kind == "symlink_to_valid":
                with open(os.path.join(cache, "valid.bin"), "wb") as f:
                    f.write(entry_b)
                os.symlink(os.path.join(cache, "valid.bin"), path)
            elif kind == "folder":
                os.mkdir(path)
            else:
                with open(path, "wb") as f:
                    f.write(entry_b)
                    f.truncate(1 << 30)
            if data is not None:
                with open(path, "wb") as f:
                    f.write(data)
            return data

        def check(case) -> None:
            figures["cases"] += 1
            data = plant(case)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sess = npu_session(b, {"cache_dir": cache})
                    got = sess.run(None, {"x": X})[0]
                hits = next(s.compiled.stats["hits"] for s in LIVE_SESSIONS if s.compiled.store is not None)
            except Exception as exc:  # noqa: BLE001 - the cache must never fail a session
                figures["session_errors"] += 1
                figures["examples"].append(f"{case[0]}: {str(exc)[:300]}")
                return
            finally:
                LIVE_SESSIONS.clear()
            if not np.array_equal(got, expected):
                figures["wrong_results"] += 1
                figures["examples"].append(f"{case[0]}: wrong outputs")
            if hits and data != entry_b:
                figures["loaded_changed"] += 1
                figures["examples"].append(f"{case[0]}: a changed entry was loaded")
            figures["loaded_valid" if hits else "rebuilt"] += 1

        cases = st.one_of(st.tuples(st.just("mutated"), mutations(len(entry_b))),
                          st.tuples(st.sampled_from(OBJECTS), mutations(len(entry_a))))
        for kind in OBJECTS:  # every object kind at least once, whatever n
            check((kind, [("flip", 100, 1)]))

        @settings(max_examples=max(1, n - len(OBJECTS)), deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(cases)
        def fuzz(case):
            check(case)

        fuzz()
    figures["examples"] = figures["examples"][:5]
    return figures


if __name__ == "__main__":
    t0 = time.perf_counter()
    f = run(int(sys.argv[1]))
    f["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(f))
    sys.exit(1 if f["wrong_results"] or f["session_errors"] or f["loaded_changed"] else 0)
