"""Faults around the on-disk cache as seen through an NpuEP session: a writer killed mid-entry, torn or tampered
entries, a read-only or full cache_dir. Nothing half-written is ever trusted; the session still runs correctly."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest
from _child import HERE, PYTHON, TESTS, run_child, two_partition_model
from npu_testing import npu_session, save

from npu_ep.context_cache.store import SUFFIX, CacheStore

X = np.linspace(-1, 1, 48, dtype=np.float32).reshape(3, 16)

RUN = """
import json, warnings
import numpy as np
from npu_testing import npu_session
from npu_ep.ep.entry_points import LIVE_SESSIONS
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sess = npu_session({model!r}, {{"cache_dir": {cache!r}}})
    out = sess.run(None, {{"x": np.linspace(-1, 1, 48, dtype=np.float32).reshape(3, 16)}})[0]
np.save({out!r}, out)
print(json.dumps({{"stats": [dict(s.compiled.stats) for s in LIVE_SESSIONS][0],
                  "warnings": [str(w.message) for w in caught]}}))
"""


def _run(model, cache, tmp_path, prefix: str = "", **kw) -> tuple[dict, np.ndarray]:
    out = str(tmp_path / "out.npy")
    child = run_child(prefix + RUN.format(model=model, cache=str(cache), out=out), **kw)
    assert child.returncode == 0, f"rc={child.returncode}\n{child.stderr[-3000:]}"
    return json.loads(child.last_line()), np.load(out)


@pytest.fixture
def setup(tmp_path):
    model = save(two_partition_model(seed=11), tmp_path)
    expected = npu_session(model).run(None, {"x": X})[0]
    return model, tmp_path / "cache", expected


def test_writer_killed_mid_entry_leaves_nothing_trusted(setup, tmp_path):
    model, cache, expected = setup
    # the child SIGKILLs itself after writing half of the first entry's temp file (entries are streamed section by
    # section through PackedContainer.write_to; a bytes entry through os.write)
    kill_mid_write = """
import os, signal
import npu_ep.context_cache.container as container_mod
import npu_ep.context_cache.store as store_mod
_real_write = os.write
def _write(fd, data):
    if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
        _real_write(fd, bytes(data)[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_write(fd, data)
def _write_to(self, f):
    data = b"".join(bytes(p) for p in self.pieces())
    f.write(data[: len(data) // 2])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
store_mod.os.write = _write
container_mod.PackedContainer.write_to = _write_to
"""
    child = run_child(kill_mid_write + RUN.format(model=model, cache=str(cache), out=str(tmp_path / "o.npy")))
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr[-2000:])
    left = os.listdir(cache)
    assert left and all(n.endswith(".tmp") for n in left), left  # only a private temp file, never an entry
    info, out = _run(model, cache, tmp_path)
    assert info["stats"]["hits"] == 0 and info["stats"]["misses"] == 2, info
    np.testing.assert_array_equal(out, expected)
    assert all(e.ok for e in CacheStore(cache).verify_all()) and len(CacheStore(cache).verify_all()) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "zero_length", "garbage"])
def test_torn_or_tampered_entry_is_rebuilt_with_a_warning(setup, tmp_path, damage):
    model, cache, expected = setup
    _run(model, cache, tmp_path)  # populate
    victim = sorted(p for p in cache.iterdir() if p.name.endswith(SUFFIX))[0]
    data = bytearray(victim.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) - 100] ^= 0x10
    elif damage == "zero_length":
        data = bytearray()
    else:
        data = bytearray(os.urandom(len(data)))
    victim.write_bytes(bytes(data))
    info, out = _run(model, cache, tmp_path)
    np.testing.assert_array_equal(out, expected)
    assert info["stats"]["hits"] == 1 and info["stats"]["misses"] == 1, info
    assert any("corrupt" in w or "unusable" in w for w in info["warnings"]), info["warnings"]
    assert all(e.ok for e in CacheStore(cache).verify_all())


def _kill_at_random_times(model, cache, tmp_path, rounds: int, seed: int) -> dict:
    """SIGKILL compiling children at random moments; after each kill every entry on disk must verify."""
    rng = random.Random(seed)
    figures = {"rounds": rounds, "killed": 0, "finished": 0, "bad_entries": 0}
    code = f"import sys; sys.path[:0] = [{TESTS!r}, {HERE!r}]\n" + RUN.format(
        model=model, cache=str(cache), out=str(tmp_path / "k.npy"))
    for _ in range(rounds):
        for p in cache.glob(f"*{SUFFIX}") if cache.exists() else []:
            p.unlink()  # force a compile + write in every round
        p = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 1.5))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            figures["killed"] += 1
        else:
            figures["finished"] += 1
        p.wait()
        if cache.exists():
            figures["bad_entries"] += sum(not e.ok for e in CacheStore(cache).verify_all())
    return figures


def test_children_killed_at_random_moments_never_leave_a_bad_entry(setup, tmp_path):
    model, cache, expected = setup
    f = _kill_at_random_times(model, cache, tmp_path, rounds=4, seed=1)
    assert f["bad_entries"] == 0, f
    _, out = _run(model, cache, tmp_path)
    np.testing.assert_array_equal(out, expected)


DROP_PRIVILEGES = """
import os, json, warnings
import numpy as np
from npu_testing import npu_session
from npu_ep.ep.entry_points import LIVE_SESSIONS
import npu_ep.context_cache.store
npu_session({model!r}).run(None, {{"x": np.zeros((1, 16), np.float32)}})  # import everything lazily loaded, as root
LIVE_SESSIONS.clear()
os.setgid(65534); os.setuid(65534)  # from here on: uid nobody, the cache dir is read-only
"""


def test_read_only_cache_dir_degrades_to_in_memory_with_a_warning(setup, tmp_path):
    model, cache, expected = setup
    cache.mkdir(mode=0o755)  # owned by root: not writable for uid 65534
    os.chmod(tmp_path, 0o755)
    os.chmod(model, 0o644)
    for p in (tmp_path.parent, tmp_path.parent.parent):
        os.chmod(p, os.stat(p).st_mode | 0o055)
    out_dir = tmp_path / "out"
    out_dir.mkdir(mode=0o777)
    os.chmod(out_dir, 0o777)
    info, out = _run(model, cache, out_dir, prefix=DROP_PRIVILEGES.format(model=model))
    np.testing.assert_array_equal(out, expected)
    assert info["stats"]["misses"] == 2, info
    assert any("cannot write" in w for w in info["warnings"]), info["warnings"]
    assert os.listdir(cache) == []


def test_full_cache_dir_degrades_to_in_memory_with_a_warning(setup, tmp_path):
    """'Disk full' emulated with RLIMIT_FSIZE: every write past 256 bytes fails with EFBIG."""
    model, cache, expected = setup
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))\n"
    out_dir = tmp_path  # np.save of the small output (3x8 float32 + header) stays under 256 bytes
    info, out = _run(model, cache, out_dir, prefix=limit)
    np.testing.assert_array_equal(out, expected)
    assert info["stats"]["misses"] == 2, info
    assert any("cannot write" in w for w in info["warnings"]), info["warnings"]
    assert not [p for p in os.listdir(cache) if p.endswith(SUFFIX)]


def _fuzz_cache(n: int, timeout: float) -> dict:
    p = subprocess.run([PYTHON, os.path.join(HERE, "_fuzz_cache.py"), str(n)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode in (0, 1), f"cache fuzzer crashed: rc={p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fuzzed_cache_entries_never_give_a_wrong_result_or_fail_the_session():
    """Mutated, swapped, FIFO, /dev/zero, symlinked, folder and sparse entries in place of a model's entry."""
    f = _fuzz_cache(150, timeout=600)
    assert f["cases"] == 150 and f["wrong_results"] == 0 and f["session_errors"] == 0, f
    assert f["loaded_changed"] == 0 and f["rebuilt"] + f["loaded_valid"] == f["cases"], f


@pytest.mark.slow
def test_fuzzed_cache_entries_3000():
    f = _fuzz_cache(3000, timeout=3600)
    assert f["wrong_results"] == 0 and f["session_errors"] == 0 and f["loaded_changed"] == 0, f
