"""The cache touches only its own temp files (issue 14, item 6): a user's dotfiles survive the sweep with or
without a size cap, and a killed writer's temp file is swept once its pid is gone, as FORMAT.md says."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from npu_ep.context_cache import container as C
from npu_ep.context_cache.keys import cache_key
from npu_ep.context_cache.store import SUFFIX, CacheStore


def _entry(i: int) -> tuple[str, bytes]:
    key = cache_key("temp test", i)
    return key, C.pack({"i": i}, {"w": np.full(64, i, np.int8)}, meta=C.ContainerMeta("0.1.0", "npu-ref", "a1" * 32,
                                                                                      key))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


USER_FILES = [".notes.tmp", ".bashrc.tmp", ".x.tmp", ".abc.1.tmp", ".my-draft.12345.tmp", ".tmp", "notes.tmp"]


@pytest.mark.parametrize("cap", [None, 1 << 20])
def test_users_own_dotfiles_are_never_deleted(tmp_path, cap):
    dead = _dead_pid()
    for name in USER_FILES + [f".something.{dead}.0123456789abcdef.tmp"]:  # ours only if the name is an entry's
        (tmp_path / name).write_text("user data")
    old = time.time() - 7200
    os.utime(tmp_path / ".notes.tmp", (old, old))  # old is not enough either
    s = CacheStore(tmp_path, max_bytes=cap)
    for i in range(3):
        assert s.put(*_entry(i)) is not None
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(SUFFIX))
    assert left == sorted(USER_FILES + [f".something.{dead}.0123456789abcdef.tmp"])


@pytest.mark.parametrize("cap", [None, 1 << 20])
def test_killed_writers_temp_files_are_swept_once_their_pid_is_gone(tmp_path, cap):
    key, blob = _entry(0)
    dead, alive = _dead_pid(), os.getpid()
    dead_tmp = tmp_path / f".{key}{SUFFIX}.{dead}.0123456789abcdef.tmp"  # npu_ep._atomic's name for the entry
    legacy_dead_tmp = tmp_path / f".{key}.{dead}.0badc0de.tmp"  # the name older versions wrote
    live_tmp = tmp_path / f".{key}{SUFFIX}.{alive}.fedcba9876543210.tmp"  # a writer still at work
    stale_live_tmp = tmp_path / f".{key}{SUFFIX}.{alive}.00000000000000ff.tmp"
    for p in (dead_tmp, legacy_dead_tmp, live_tmp, stale_live_tmp):
        p.write_bytes(blob[:100])
    old = time.time() - 7200
    os.utime(stale_live_tmp, (old, old))  # older than an hour: its writer is gone whatever the pid says
    CacheStore(tmp_path, max_bytes=cap).put(*_entry(1))
    assert not dead_tmp.exists() and not legacy_dead_tmp.exists() and not stale_live_tmp.exists()
    assert live_tmp.exists()


def test_clear_removes_only_the_caches_own_files(tmp_path):
    s = CacheStore(tmp_path)
    key, blob = _entry(0)
    s.put(key, blob)
    (tmp_path / f".{key}{SUFFIX}.{os.getpid()}.0123456789abcdef.tmp").write_bytes(b"partial")
    for name in USER_FILES:
        (tmp_path / name).write_text("user data")
    assert s.clear() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(USER_FILES)
