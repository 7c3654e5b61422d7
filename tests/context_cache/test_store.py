"""CacheStore: verified reads, corrupt entries removed, unusable directories degrade to None, LRU cap."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from npu_ep.context_cache import container as C
from npu_ep.context_cache.keys import cache_key
from npu_ep.context_cache.store import CacheStore, CacheWarning, check_key, default_cache_dir

from ._helpers import meta_for


def entry(i: int, n: int = 100) -> tuple[str, bytes]:
    key = cache_key("entry", i)
    return key, C.pack({"i": i}, {"w": np.full(n, i % 128, np.int8)}, meta=meta_for(key))


def test_put_then_get_returns_the_same_verified_bytes(tmp_path: Path) -> None:
    s = CacheStore(tmp_path / "c")
    k, b = entry(1)
    assert s.get(k) is None
    p = s.put(k, b)
    assert p == s.path_for(k) and p.exists()
    assert s.get(k) == b
    [e] = s.entries()
    assert (e.key, e.size, e.target, e.compiler_version, e.ok) == (k, len(b), "npu-ref", "0.1.0", True)
    assert [x.name for x in tmp_path.joinpath("c").iterdir()] == [p.name]  # no temp files left behind


@pytest.mark.parametrize("bad", ["../etc/passwd", "ABCDEF0123456789", "abc", "g" * 64, "a" * 200, "", "a" * 63 + "/"])
def test_keys_are_validated_so_nothing_escapes_the_directory(tmp_path: Path, bad: str) -> None:
    s = CacheStore(tmp_path)
    with pytest.raises(ValueError, match="hex"):
        s.get(bad)
    with pytest.raises(ValueError, match="hex"):
        s.put(bad, entry(0)[1])
    with pytest.raises(ValueError):
        check_key(bad)


def test_put_refuses_bytes_that_are_not_a_container(tmp_path: Path) -> None:
    with pytest.raises(C.ContextFormatError):
        CacheStore(tmp_path).put(cache_key(1), b"garbage" * 20)


@pytest.mark.parametrize("where", ["header", "section", "truncate"])
def test_corrupt_entry_is_removed_with_a_warning_and_reported_missing(tmp_path: Path, where: str) -> None:
    s = CacheStore(tmp_path)
    k, b = entry(3)
    p = s.put(k, b)
    raw = bytearray(p.read_bytes())
    if where == "header":
        raw[80] ^= 0x20
    elif where == "section":
        raw[-40] ^= 0x01
    else:
        del raw[len(raw) // 2:]
    p.write_bytes(bytes(raw))
    with pytest.warns(CacheWarning, match="removed corrupt entry"):
        assert s.get(k) is None
    assert not p.exists()
    assert s.put(k, b) is not None and s.get(k) == b  # the caller rebuilds


def test_verify_all_and_entries_flag_corrupt_entries(tmp_path: Path) -> None:
    s = CacheStore(tmp_path)
    (k1, b1), (k2, b2) = entry(1), entry(2)
    s.put(k1, b1)
    p2 = s.put(k2, b2)
    raw = bytearray(p2.read_bytes())
    raw[-40] ^= 1  # section damage: header still fine, so the cheap listing says ok, verify_all says corrupt
    p2.write_bytes(bytes(raw))
    assert all(e.ok for e in s.entries())
    res = {e.key: e for e in s.verify_all()}
    assert res[k1].ok and not res[k2].ok and "blake3 mismatch" in res[k2].error
    s.verify_all(remove_corrupt=True)
    assert [e.key for e in s.entries()] == [k1]


def test_unwritable_directory_degrades_to_none_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    s = CacheStore(tmp_path / "ro")
    real_open = os.open

    def deny(path, flags, *a, **kw):
        if str(path).startswith(str(tmp_path / "ro")) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", deny)
    k, b = entry(1)
    with pytest.warns(CacheWarning, match="Permission denied"):
        assert s.put(k, b) is None
    assert s.get(k) is None


def test_full_disk_degrades_to_none_and_leaves_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    s = CacheStore(tmp_path)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    k, b = entry(1)
    with pytest.warns(CacheWarning, match="disk full"):
        assert s.put(k, b) is None
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def _put_as_nobody(root: Path, key: str, data: bytes) -> tuple[bool, list[str]]:
    """Fork, drop root to uid 65534 and try to write into ``root`` (root bypasses permission bits)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                res = CacheStore(root).put(key, data)
            os.write(w, f"{res is None}|{'|'.join(str(x.message) for x in rec)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    msg = b""
    while chunk := os.read(r, 65536):
        msg += chunk
    os.close(r)
    os.waitpid(pid, 0)
    none, *warns = msg.decode().split("|")
    return none == "True", warns


def test_real_read_only_directory_degrades_to_none(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    k, b = entry(1)
    if os.geteuid() == 0:
        tmp_path.chmod(0o755)
        root.chmod(0o555)
        none, warns = _put_as_nobody(root, k, b)
    else:
        root.chmod(0o555)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            none = CacheStore(root).put(k, b) is None
        warns = [str(x.message) for x in rec]
    root.chmod(0o755)
    assert none and any("cannot write" in m for m in warns), warns
    assert list(root.iterdir()) == []


def test_lru_eviction_keeps_total_under_cap_and_drops_least_recently_used(tmp_path: Path) -> None:
    keys_data = [entry(i) for i in range(4)]
    size = len(keys_data[0][1])
    s = CacheStore(tmp_path, max_bytes=3 * size)
    for i, (k, b) in enumerate(keys_data[:3]):
        p = s.put(k, b)
        t = 10**18 + i * 10**9  # 2001-09-09 + i seconds: deterministic past access order, 0 oldest
        os.utime(p, ns=(t, t))
    assert s.get(keys_data[0][0]) is not None  # touching entry 0 makes entry 1 the least recently used
    s.put(*keys_data[3])
    left = {e.key for e in s.entries()}
    assert left == {keys_data[i][0] for i in (0, 2, 3)}
    assert s.total_bytes() <= 3 * size


def test_entry_larger_than_the_cap_is_not_cached(tmp_path: Path) -> None:
    k, b = entry(1, n=5000)
    s = CacheStore(tmp_path, max_bytes=1000)
    with pytest.warns(CacheWarning, match="above the cache cap"):
        assert s.put(k, b) is None


def test_clear_removes_entries_and_temp_files_but_nothing_else(tmp_path: Path) -> None:
    s = CacheStore(tmp_path)
    for i in range(3):
        s.put(*entry(i))
    (tmp_path / f".{'a' * 64}.1.dead.tmp").write_bytes(b"partial")
    (tmp_path / "README").write_text("user file")
    assert s.clear() == 4
    assert [p.name for p in tmp_path.iterdir()] == ["README"]


def test_default_cache_dir_honours_env_override(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NPU_EP_CACHE_DIR", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x"
    monkeypatch.delenv("NPU_EP_CACHE_DIR")
    assert default_cache_dir().name == "npu_ep"


def test_a_valid_entry_above_the_readers_cap_is_left_in_place_and_said_not_to_fit(tmp_path: Path) -> None:
    """A store with a smaller cap than an existing valid entry does not read it, and must not call it corrupt nor
    delete it from the shared folder (another store with a larger cap still uses it)."""
    k, b = entry(1, n=5000)
    path = CacheStore(tmp_path).put(k, b)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert CacheStore(tmp_path, max_bytes=len(b) - 1).get(k) is None
    [msg] = [str(w.message) for w in rec]
    assert "does not fit" in msg and str(path) in msg and "corrupt" not in msg, msg
    assert path.exists() and CacheStore(tmp_path).get(k) == b
