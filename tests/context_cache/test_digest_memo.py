"""Cache keys with remembered digests of file-backed weights (``digest_memo``): the same key as hashing the bytes,
taken from the memo only for bytes an unwritten mapping of an unchanged, settled file holds; anything else is
hashed again."""

from __future__ import annotations

import json
import mmap
import os
import sys
import time

import numpy as np
import pytest

from npu_ep.context_cache import digest_memo, keys
from npu_ep.context_cache.digest_memo import DigestMemo
from npu_ep.context_cache.store import CacheStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps and pagemap")

N = 3 << 20  # above keys.LARGE_PAYLOAD


@pytest.fixture
def settled(monkeypatch):
    """Files written by the test count as settled (the default waits SETTLE_NS after their last change)."""
    monkeypatch.setattr(digest_memo, "SETTLE_NS", 0)


def _weights(tmp_path, name: str = "w.data") -> tuple[str, np.ndarray]:
    path = tmp_path / name
    values = np.random.default_rng(0).integers(0, 255, N + 4096, dtype=np.uint8)
    path.write_bytes(values.tobytes())
    time.sleep(0.02)  # a later change gets a later status-change time
    return str(path), values


def _mapped(path: str, access: int = mmap.ACCESS_COPY) -> np.ndarray:
    """What ORT does with external data: a private mapping; the weight starts one page into the file."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=access)
    return np.frombuffer(mm, np.uint8, N, offset=4096)


def _hashed(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = keys._large_digest

    def counting(payload):
        calls.append(payload.nbytes)
        return real(payload)

    monkeypatch.setattr(keys, "_large_digest", counting)
    return calls


def test_a_settled_file_is_hashed_once_and_gives_the_same_key(tmp_path, monkeypatch, settled) -> None:
    path, values = _weights(tmp_path)
    plain = keys.cache_key("k", values[4096:4096 + N].copy())
    calls = _hashed(monkeypatch)
    memo_dir = tmp_path / "cache"
    assert keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir)) == plain
    assert calls == [N] and len(list((memo_dir / "digests").iterdir())) == 1
    assert keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir)) == plain  # a new session: not hashed
    assert calls == [N]


def test_a_file_changed_in_place_is_hashed_again(tmp_path, monkeypatch, settled) -> None:
    path, values = _weights(tmp_path)
    memo_dir = tmp_path / "cache"
    keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir))
    with open(path, "r+b") as f:  # same size, same mtime forced back: only the status-change time tells
        st = os.fstat(f.fileno())
        f.seek(4096 + N // 2)
        f.write(b"\x00" if values[4096 + N // 2] else b"\x01")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    expected = keys.cache_key("k", np.fromfile(path, np.uint8)[4096:4096 + N].copy())
    calls = _hashed(monkeypatch)
    assert keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir)) == expected
    assert calls == [N]


def test_a_written_page_of_the_mapping_is_hashed_not_looked_up(tmp_path, monkeypatch, settled) -> None:
    path, _ = _weights(tmp_path)
    memo_dir = tmp_path / "cache"
    keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir))
    arr = _mapped(path)
    base = arr.base
    base[4096 + 10] ^= 0xFF  # copy-on-write: that page is no longer the file's
    expected = keys.cache_key("k", arr.copy())
    calls = _hashed(monkeypatch)
    assert keys.cache_key("k", arr, memo=DigestMemo(memo_dir)) == expected
    assert calls == [N]


def test_copies_and_unsettled_files_are_not_remembered(tmp_path, monkeypatch) -> None:
    path, values = _weights(tmp_path)
    memo_dir = tmp_path / "cache"
    keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir))  # written just now: not settled
    keys.cache_key("k", values[4096:4096 + N].copy(), memo=DigestMemo(memo_dir))  # no file behind it
    assert not (memo_dir / "digests").exists()


def test_a_memo_file_for_another_identity_or_malformed_is_ignored(tmp_path, monkeypatch, settled) -> None:
    path, values = _weights(tmp_path)
    memo_dir = tmp_path / "cache"
    keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir))
    (memo_file,) = (memo_dir / "digests").iterdir()
    doc = json.loads(memo_file.read_text())
    plain = keys.cache_key("k", values[4096:4096 + N].copy())
    for bad in ({**doc, "file": [0, 0, 0, 0, 0]}, {**doc, "ranges": {k: "zz" for k in doc["ranges"]}}, [1, 2], "{"):
        memo_file.write_text(json.dumps(bad) if not isinstance(bad, str) else bad)
        calls = _hashed(monkeypatch)
        assert keys.cache_key("k", _mapped(path), memo=DigestMemo(memo_dir)) == plain
        assert calls == [N]


def test_clear_removes_the_memo(tmp_path, settled) -> None:
    path, _ = _weights(tmp_path)
    store = CacheStore(tmp_path / "cache")
    keys.cache_key("k", _mapped(path), memo=store.digest_memo())
    assert store.clear() == 1 and not list((tmp_path / "cache" / "digests").iterdir())
