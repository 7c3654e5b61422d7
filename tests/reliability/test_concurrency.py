"""Concurrency: many threads on one session, several sessions at once, several processes compiling into one
cache_dir — results identical to single-threaded runs."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import numpy as np
import pytest
from _child import HERE, PYTHON, TESTS, two_partition_model
from npu_testing import assignment, npu_partitions, npu_session, save

from npu_ep.context_cache.store import CacheStore

RNG = np.random.default_rng(3)


def _hammer(sessions, threads: int, runs: int) -> list[str]:
    inputs = [RNG.standard_normal((1 + i % 4, 16)).astype(np.float32) for i in range(threads)]
    expected = [sessions[i % len(sessions)].run(None, {"x": x})[0] for i, x in enumerate(inputs)]
    failures: list[str] = []
    barrier = threading.Barrier(threads)

    def worker(i: int) -> None:
        sess = sessions[i % len(sessions)]
        barrier.wait()
        try:
            for r in range(runs):
                got = sess.run(None, {"x": inputs[i]})[0]
                if not np.array_equal(got, expected[i]):
                    failures.append(f"thread {i} run {r}: result differs")
                    return
        except Exception as exc:  # noqa: BLE001 - a thread's error is the failure reported
            failures.append(f"thread {i}: {type(exc).__name__}: {exc}")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in ts), "a worker thread hung"
    return failures


def _session():
    sess = npu_session(two_partition_model())
    assert len(npu_partitions(sess)) == 2 and assignment(sess)["cpu_atan"] == "CPUExecutionProvider"
    return sess


def test_8_threads_x_200_runs_on_one_two_partition_session():
    assert not _hammer([_session()], 8, 200)


@pytest.mark.slow
def test_8_threads_x_1000_runs_on_one_session():
    assert not _hammer([_session()], 8, 1000)


def test_4_sessions_in_parallel_x_200_runs():
    sessions = [_session() for _ in range(4)]
    assert not _hammer(sessions, 8, 200)  # 2 threads per session


@pytest.mark.slow
def test_4_sessions_in_parallel_x_1000_runs():
    assert not _hammer([_session() for _ in range(4)], 8, 1000)


def test_sessions_created_concurrently_from_threads_agree():
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    out: list = [None] * 6
    errors: list[str] = []

    def make(i):
        try:
            out[i] = npu_session(two_partition_model()).run(None, {"x": x})[0]
        except Exception as exc:  # noqa: BLE001 - a thread's error is the failure reported
            errors.append(str(exc))

    ts = [threading.Thread(target=make, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not errors
    for o in out[1:]:
        np.testing.assert_array_equal(o, out[0])


CHILD = """
import sys, json; sys.path[:0] = [{tests!r}, {here!r}]
import numpy as np
from npu_testing import npu_session, assignment
from npu_ep.ep.entry_points import LIVE_SESSIONS
sess = npu_session({model!r}, {{"cache_dir": {cache!r}}})
x = np.load({x!r})
np.save({out!r}, sess.run(None, {{"x": x}})[0])
stats = [dict(s.compiled.stats) for s in LIVE_SESSIONS]
print(json.dumps({{"stats": stats, "npu": sorted(k for k, v in assignment(sess).items() if v == "NpuEP")}}))
"""


def run_cache_children(n: int, model: str, cache: str, x_path: str, folder) -> list[tuple[dict, np.ndarray]]:
    procs = []
    for i in range(n):
        out = os.path.join(str(folder), f"out{i}.npy")
        code = CHILD.format(tests=TESTS, here=HERE, model=model, cache=cache, x=x_path, out=out)
        procs.append((subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True), out))
    results = []
    for p, out in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"rc={p.returncode}\n{stderr[-3000:]}"
        results.append((json.loads(stdout.strip().splitlines()[-1]), np.load(out)))
    return results


def test_processes_compiling_the_same_model_into_one_cache_dir(tmp_path):
    model = save(two_partition_model(seed=5), tmp_path)
    cache = tmp_path / "cache"
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = npu_session(model).run(None, {"x": x})[0]  # single process, no cache
    results = run_cache_children(4, model, str(cache), str(tmp_path / "x.npy"), tmp_path)
    for info, out in results:
        assert info["npu"] == ["add", "mm", "relu", "tanh"], info
        np.testing.assert_array_equal(out, expected)
    entries = CacheStore(cache).verify_all()
    assert len(entries) == 2 and all(e.ok for e in entries), entries  # one valid entry per partition
    assert not [p for p in os.listdir(cache) if p.endswith(".tmp")]
    # a later process loads both partitions from the cache, same results
    (info, out), = run_cache_children(1, model, str(cache), str(tmp_path / "x.npy"), tmp_path)
    assert info["stats"][0]["hits"] == 2 and info["stats"][0]["misses"] == 0, info
    np.testing.assert_array_equal(out, expected)
