"""The cache reader does not trust the file system (issue 14, item 2): a FIFO, a symlink to /dev/zero, a folder or
a huge sparse file in place of an entry is refused quickly, without reading it whole, and rebuilt; ``npu-cache``
lists such entries instead of hanging. Every case runs in a child with a timeout, so a hang fails the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _child import assert_no_crash, run_child, static_model
from npu_testing import cpu_run, save

from npu_ep.context_cache import container as C
from npu_ep.context_cache.keys import cache_key
from npu_ep.context_cache.store import SUFFIX, CacheStore

KEY = cache_key("filesystem test")
GIB2 = 2 << 30


def _valid_entry() -> bytes:
    meta = C.ContainerMeta("0.1.0", "npu-ref", "a1" * 32, KEY)
    return C.pack({"i": 1}, {"w": np.arange(256, dtype=np.int8)}, meta=meta)


def _plant(cache, kind: str, key: str = KEY) -> None:
    """Put something hostile where the entry for ``key`` lives."""
    cache.mkdir(exist_ok=True)
    path = cache / f"{key}{SUFFIX}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "symlink_to_valid":
        (cache / "elsewhere.bin").write_bytes(_valid_entry())
        os.symlink(cache / "elsewhere.bin", path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "sparse_zeros":
        with open(path, "wb") as f:
            f.truncate(GIB2)
    elif kind == "sparse_after_valid_entry":  # a valid entry padded with a 2 GiB hole: the size contradicts it
        with open(path, "wb") as f:
            f.write(_valid_entry())
            f.truncate(GIB2)
    else:
        raise AssertionError(kind)


STORE_CHILD = """
import json, time, warnings
from npu_ep.context_cache.store import CacheStore
from npu_ep.tools.bench.peak_rss import peak_rss_bytes
rss0 = peak_rss_bytes() / 1024
s = CacheStore({cache!r})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t = time.monotonic()
    got = s.get({key!r})
    listed = [(e.ok, e.error) for e in s.entries()]
    verified = [(e.ok, e.error) for e in s.verify_all()]
rss1 = peak_rss_bytes() / 1024
print(json.dumps({{"got": got is not None, "warnings": [str(w.message) for w in caught], "listed": listed,
                  "verified": verified, "rss_growth_mib": (rss1 - rss0) / 1024}}))
"""

REASON = {"fifo": "a FIFO", "dev_zero": "symbolic link", "symlink_to_valid": "symbolic link", "folder": "a folder",
          "sparse_zeros": "magic", "sparse_after_valid_entry": "total_len"}


@pytest.mark.parametrize("kind", list(REASON))
def test_store_refuses_what_is_not_a_regular_entry_file_quickly_and_without_reading_it(tmp_path, kind):
    cache = tmp_path / "cache"
    _plant(cache, kind)
    child = run_child(STORE_CHILD.format(cache=str(cache), key=KEY), timeout=30)
    assert_no_crash(child)
    assert child.returncode == 0, child.stderr[-3000:]
    res = json.loads(child.last_line())
    assert not res["got"], res
    assert any(REASON[kind] in w for w in res["warnings"]), res["warnings"]
    assert res["rss_growth_mib"] < 64, res  # nothing was read whole (a 2 GiB read used 4 GiB before)
    if kind != "folder":  # the refused directory entry is removed (only its link, never a symlink's target)
        assert not os.path.lexists(cache / f"{KEY}{SUFFIX}"), os.listdir(cache)
    if kind == "symlink_to_valid":
        assert (cache / "elsewhere.bin").read_bytes() == _valid_entry()
    assert all(not ok for ok, _ in res["listed"] + res["verified"])


def test_npu_cache_list_and_verify_do_not_hang(tmp_path):
    cache = tmp_path / "cache"
    kinds = ["fifo", "dev_zero", "sparse_zeros"]
    keys = [cache_key("listed", k) for k in kinds]
    for kind, key in zip(kinds, keys):
        _plant(cache, kind, key)
    for cmd in ("list", "verify"):
        p = subprocess.run([sys.executable, "-m", "npu_ep.tools.npu_cache", "--dir", str(cache), cmd],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"})
        assert p.returncode == (0 if cmd == "list" else 1), (cmd, p.returncode, p.stdout, p.stderr[-2000:])
        assert p.stdout.count("CORRUPT") == 3 and "Traceback" not in p.stderr, p.stdout
        assert "3 entries" in p.stdout and all(k[:16] in p.stdout for k in keys), p.stdout
    assert all(os.path.lexists(cache / f"{k}{SUFFIX}") for k in keys)  # listing and verifying never delete


SESSION_CHILD = """
import json, warnings
import numpy as np
from npu_testing import assignment, npu_session
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sess = npu_session({model!r}, {{"cache_dir": {cache!r}}})
    out = sess.run(None, {{"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}})[0]
np.save({out!r}, out)
print(json.dumps({{"eps": sorted(set(assignment(sess).values())), "warnings": [str(w.message) for w in caught]}}))
"""


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse_zeros"])
def test_session_over_a_hostile_entry_gives_correct_outputs_and_rebuilds_it(tmp_path, kind):
    model = save(static_model(seed=3), tmp_path)
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    cache = tmp_path / "cache"
    first = run_child(SESSION_CHILD.format(model=model, cache=str(cache), out=str(tmp_path / "o.npy")), timeout=60)
    assert first.returncode == 0, first.stderr[-3000:]
    [entry] = [p for p in cache.iterdir() if p.name.endswith(SUFFIX)]
    entry.unlink()
    planted = tmp_path / "planted"
    _plant(planted, kind)
    os.rename(planted / f"{KEY}{SUFFIX}", entry)  # the hostile object under the model's real entry name
    child = run_child(SESSION_CHILD.format(model=model, cache=str(cache), out=str(tmp_path / "o.npy")), timeout=60)
    assert child.returncode == 0, child.stderr[-3000:]
    res = json.loads(child.last_line())
    assert res["eps"] == ["NpuEP"], res
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), cpu_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert any("removed corrupt entry" in w for w in res["warnings"]), res["warnings"]
    assert [e.ok for e in CacheStore(cache).verify_all()] == [True]  # rebuilt as a regular, valid entry


def test_store_limit_refuses_an_entry_above_the_cap_before_reading_it(tmp_path):
    blob = _valid_entry()
    s = CacheStore(tmp_path, max_bytes=len(blob) - 1)
    (tmp_path / f"{KEY}{SUFFIX}").write_bytes(blob)
    with pytest.warns(Warning, match="above the limit"):
        assert s.get(KEY) is None
