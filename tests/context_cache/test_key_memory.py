"""cache_key reads every byte of a weight ORT mapped from an external data file, but does not keep the file's pages
resident: the peak RSS of hashing stays a few chunks, not the file (issue 40 item 6). The key is the same as for
the bytes in ordinary memory, and memory no file backs (anonymous, or a private mapping's written page) is never
given back."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from npu_ep.context_cache.file_pages import PAGE, release_file_pages
from npu_ep.context_cache.keys import cache_key

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and pagemap are Linux's")

SIZE = 64 << 20


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _mapping_rss(mm: mmap.mmap) -> int:
    """Resident bytes of the mapping holding ``mm`` (its line in /proc/self/smaps)."""
    start = np.frombuffer(mm, np.uint8).ctypes.data
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        lo, _, rest = line.partition("-")
        if rest and int(lo, 16) == start:
            return next(int(x.split()[1]) * 1024 for x in lines[i + 1:] if x.startswith("Rss:"))
    raise AssertionError("mapping not found in /proc/self/smaps")


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx.data"
    np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tofile(path)
    return path


def _map_like_ort(path: Path) -> mmap.mmap:
    """A private, writable mapping of the whole file: how ORT maps an initializer's external data."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, SIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def test_hashing_a_mapped_weight_file_keeps_its_pages_out_of_the_peak_rss(weights: Path) -> None:
    mm = _map_like_ort(weights)
    weight = np.frombuffer(mm, np.float32).reshape(4096, -1)
    _reset_peak_rss()
    before = _status_bytes("VmRSS")
    key = cache_key("graph", weight)
    grew = _status_bytes("VmHWM") - before
    assert grew < SIZE // 4, f"hashing a {SIZE >> 20} MiB mapped weight raised the peak RSS by {grew >> 20} MiB"
    assert _mapping_rss(mm) < SIZE // 4
    in_memory = np.fromfile(weights, np.float32).reshape(4096, -1)
    assert cache_key("graph", in_memory) == key
    assert np.array_equal(weight.view(np.uint8), in_memory.view(np.uint8))  # read again from the file
    del weight


def test_written_pages_of_a_private_mapping_and_anonymous_memory_are_kept(weights: Path) -> None:
    mm = _map_like_ort(weights)
    mm[SIZE // 2] = (mm[SIZE // 2] + 1) % 256  # copy-on-write: that page is now only in this process's memory
    expected = np.fromfile(weights, np.uint8)
    expected[SIZE // 2] = mm[SIZE // 2]
    key = cache_key(np.frombuffer(mm, np.uint8))
    assert np.array_equal(np.frombuffer(mm, np.uint8), expected)
    assert cache_key(expected) == key
    anonymous = expected.copy()
    assert release_file_pages(memoryview(anonymous)) == 0
    assert np.array_equal(anonymous, expected)


def test_release_file_pages_gives_back_whole_pages_inside_the_view(weights: Path) -> None:
    mm = _map_like_ort(weights)
    data = np.frombuffer(mm, np.uint8)
    assert int(data[::PAGE].sum()) >= 0  # fault every page in
    assert release_file_pages(memoryview(data[100:100 + 3 * PAGE])) == 2 * PAGE  # pages 1 and 2 only
    assert release_file_pages(memoryview(data[:PAGE - 1])) == 0
    assert release_file_pages(memoryview(data)) == SIZE
    assert _mapping_rss(mm) == 0
