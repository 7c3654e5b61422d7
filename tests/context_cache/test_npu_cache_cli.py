"""npu-cache list/verify/clear: exit codes 0/1/2 and a table that shows what is in the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npu_ep.context_cache import container as C
from npu_ep.context_cache.keys import cache_key
from npu_ep.context_cache.store import CacheStore
from npu_ep.tools.npu_cache import main

from ._helpers import meta_for


def _fill(root: Path, n: int = 2) -> list[str]:
    s, keys = CacheStore(root), []
    for i in range(n):
        k = cache_key(i)
        s.put(k, C.pack({"i": i}, {"w": np.full(64, i, np.int8)}, meta=meta_for(k)))
        keys.append(k)
    return keys


def test_list_shows_key_size_target_compiler_and_status(tmp_path: Path, capsys) -> None:
    keys = _fill(tmp_path)
    assert main(["--dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "npu-ref" in out and "0.1.0" in out and "ok" in out
    assert all(k[:16] in out for k in keys)


def test_verify_exit_1_on_corruption_and_remove_corrupt(tmp_path: Path, capsys) -> None:
    keys = _fill(tmp_path)
    p = CacheStore(tmp_path).path_for(keys[1])
    raw = bytearray(p.read_bytes())
    raw[-10] ^= 0xFF
    p.write_bytes(bytes(raw))
    assert main(["--dir", str(tmp_path), "verify"]) == 1
    assert "CORRUPT" in capsys.readouterr().out
    assert main(["--dir", str(tmp_path), "verify", "--remove-corrupt"]) == 1
    assert main(["--dir", str(tmp_path), "verify"]) == 0
    assert "all entries verified" in capsys.readouterr().out


def test_clear_empties_the_cache(tmp_path: Path, capsys) -> None:
    _fill(tmp_path, 3)
    assert main(["--dir", str(tmp_path), "clear"]) == 0
    assert "removed 3" in capsys.readouterr().out
    assert CacheStore(tmp_path).entries() == []


def test_bad_input_exits_2(tmp_path: Path, capsys) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["--dir", str(f), "list"]) == 2
    assert main(["--dir", str(tmp_path / "missing"), "list"]) == 2
    assert main(["frobnicate"]) == 2
    assert main([]) == 2


def test_default_dir_from_env(tmp_path: Path, monkeypatch, capsys) -> None:
    _fill(tmp_path, 1)
    monkeypatch.setenv("NPU_EP_CACHE_DIR", str(tmp_path))
    assert main(["list"]) == 0
    assert "1 entry," in capsys.readouterr().out
