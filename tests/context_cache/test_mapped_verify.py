"""A container verified from a file mapping (``load_file``, the EPContext payload): arrays stay views of the mapping
(no copy), every section is hashed (on the hashing threads above a few MB), a flipped byte or a truncated file is
refused naming the file and the section, and hashing does not leave the file's pages resident."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from npu_ep.context_cache import container as C
from npu_ep.context_cache.errors import ContextFormatError

from ._helpers import META


def large_container() -> tuple[bytes, dict[str, np.ndarray]]:
    """Above the inline-hashing size: one section larger than a hash chunk, several small ones."""
    rng = np.random.default_rng(1)
    arrays = {"table": rng.standard_normal((1300, 1024)).astype(np.float32)}  # 5.3 MB: two hash chunks
    arrays.update({f"w{i}": rng.integers(-8, 8, size=(256 + i, 257), dtype=np.int8) for i in range(6)})
    arrays["e"] = np.zeros((0, 4), np.float16)
    return C.pack({"ops": []}, arrays, meta=META), arrays


def _base(arr: np.ndarray) -> object:
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_arrays_are_views_of_the_mapping_with_the_written_values(tmp_path) -> None:
    raw, arrays = large_container()
    path = tmp_path / "c.npuctx"
    path.write_bytes(raw)
    c = C.load_file(path)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(c.arrays[name], arr)
        assert not c.arrays[name].flags.writeable
    assert isinstance(_base(c.arrays["table"]), mmap.mmap)


def _section_span(raw: bytes, name: str) -> tuple[int, int]:
    doc_end = C._align(C.PREFIX_SIZE + C.PREFIX.unpack_from(raw, 0)[3])
    entry = next(e for e in C.unpack(raw).table if e.name == name)
    return doc_end + entry.offset, entry.nbytes


@pytest.mark.parametrize("name,at", [("table", 0), ("table", -1), ("w3", 100), ("w5", -1)])
def test_a_flipped_byte_in_any_section_names_the_file_and_the_section(tmp_path, name, at) -> None:
    raw, _ = large_container()
    start, nbytes = _section_span(raw, name)
    bad = bytearray(raw)
    bad[start + at % nbytes] ^= 0x10
    path = tmp_path / "bad.npuctx"
    path.write_bytes(bytes(bad))
    with pytest.raises(ContextFormatError, match=rf"bad\.npuctx.*section '{name}'.*mismatch"):
        C.load_file(path)
    with pytest.raises(ContextFormatError, match=rf"section '{name}'.*mismatch"):
        C.unpack(bytes(bad))  # the same check from memory


def test_a_truncated_file_is_refused_before_it_is_mapped(tmp_path) -> None:
    raw, _ = large_container()
    path = tmp_path / "short.npuctx"
    path.write_bytes(raw[:len(raw) - 4096])
    with pytest.raises(ContextFormatError, match=r"short\.npuctx.*truncated"):
        C.load_file(path)


def _resident_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="/proc/self/status")
def test_verifying_a_mapped_file_does_not_keep_its_pages_resident(tmp_path) -> None:
    rng = np.random.default_rng(2)
    arrays = {f"w{i}": rng.integers(0, 255, size=(8 << 20,), dtype=np.uint8) for i in range(4)}  # 32 MB
    path = tmp_path / "big.npuctx"
    path.write_bytes(C.pack({}, arrays, meta=META))
    before = _resident_file_kb()
    c = C.load_file(path)
    assert _resident_file_kb() - before < 8 << 10, "the verified sections stayed mapped in"
    np.testing.assert_array_equal(c.arrays["w2"], arrays["w2"])  # read again from the page cache
