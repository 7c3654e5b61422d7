"""npu_ep._atomic: every file NpuEP writes appears whole or not at all, and a planted symlink is never followed."""

from __future__ import annotations

import errno
import os

import pytest

from npu_ep._atomic import atomic_write_bytes, atomic_writer, temp_name_pattern


def test_write_replaces_the_destination_and_leaves_no_temp_file(tmp_path):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    atomic_write_bytes(dest, b"new content")
    assert dest.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_streaming_writer_appears_only_when_the_block_ends(tmp_path):
    dest = tmp_path / "out.bin"
    with atomic_writer(dest) as f:
        f.write(b"part 1, ")
        assert not dest.exists()
        f.write(b"part 2")
    assert dest.read_bytes() == b"part 1, part 2"


def test_an_error_in_the_block_keeps_the_old_file_and_removes_the_temp(tmp_path):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(dest) as f:
        f.write(b"half")
        raise RuntimeError("writer failed")
    assert dest.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_disk_full_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(dest, b"new" * 1000)
    monkeypatch.undo()
    assert dest.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_a_symlink_at_the_destination_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    (tmp_path / "out.bin").symlink_to(victim)
    atomic_write_bytes(tmp_path / "out.bin", b"payload")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "out.bin").is_symlink() and (tmp_path / "out.bin").read_bytes() == b"payload"


def test_symlinks_planted_at_fixed_temp_names_are_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    for name in ("out.bin.tmp", ".out.bin.tmp", f".out.bin.{os.getpid()}.tmp"):
        (tmp_path / name).symlink_to(victim)
    atomic_write_bytes(tmp_path / "out.bin", b"payload")
    assert victim.read_bytes() == b"precious"


def test_temp_names_match_the_published_pattern(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write_bytes(tmp_path / "abc.npuctx", b"x")
    m = temp_name_pattern(r"abc\.npuctx").fullmatch(seen[0])
    assert m and int(m["pid"]) == os.getpid(), seen
