"""Section hashes checked while a container file is read (``container.SectionCheck`` on ``fileio.read_container``'s
chunks): it passes exactly when a verifying unpack would, so the EPContext loader may skip the second hashing; any
flipped byte, a bad header or an unfinished read sends the caller to the verifying unpack."""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.context_cache import container as C
from npu_ep.context_cache import fileio
from npu_ep.context_cache.errors import ContextFormatError

from ._helpers import small_container


def big_container() -> bytes:
    """Sections that straddle several read chunks."""
    rng = np.random.default_rng(0)
    arrays = {f"w{i}": rng.integers(-128, 127, size=(97, 131), dtype=np.int8) for i in range(5)}
    arrays["s"] = rng.standard_normal(1000).astype(np.float32)
    return C.pack({"ops": []}, arrays, meta=C.ContainerMeta("0.1.0", "npu-ref", "a1" * 32, "b2" * 32))


@pytest.fixture(params=[4096, 1 << 20], ids=["many_chunks", "one_chunk"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(fileio, "READ_CHUNK", request.param)
    return request.param


@pytest.mark.parametrize("make", [small_container, big_container])
def test_a_valid_file_passes_and_unpacks_to_the_same_arrays(tmp_path, chunk, make):
    raw = make()
    path = tmp_path / "c.npuctx"
    path.write_bytes(raw)
    check = C.SectionCheck()
    buf = fileio.read_container(path, on_chunk=check)
    assert check.passed()
    fast, slow = C.unpack(buf, verify=False), C.unpack(raw)
    assert fast.arrays.keys() == slow.arrays.keys()
    for name, arr in slow.arrays.items():
        np.testing.assert_array_equal(fast.arrays[name], arr)


def test_any_flipped_data_byte_fails_the_check_and_the_verifying_unpack_names_it(tmp_path, chunk):
    raw = bytearray(big_container())
    doc_end = C._align(C.PREFIX_SIZE + C.PREFIX.unpack_from(raw, 0)[3])
    for where in (doc_end, doc_end + 5000, len(raw) - 4100):
        bad = bytearray(raw)
        bad[where] ^= 0x01
        path = tmp_path / f"c{where}.npuctx"
        path.write_bytes(bytes(bad))
        check = C.SectionCheck()
        buf = fileio.read_container(path, on_chunk=check)
        assert not check.passed()
        with pytest.raises(ContextFormatError, match=r"sha256 mismatch|padding"):
            C.unpack(buf, verify=True)


def test_a_bad_header_or_an_unfinished_read_does_not_pass(tmp_path):
    raw = bytearray(small_container())
    raw[C.PREFIX_SIZE + 3] ^= 0x20  # inside the header block: its hash no longer matches
    path = tmp_path / "h.npuctx"
    path.write_bytes(bytes(raw))
    check = C.SectionCheck()
    fileio.read_container(path, on_chunk=check)
    assert not check.passed()
    good = small_container()
    partial = C.SectionCheck()
    partial(memoryview(bytearray(len(good))), 0)  # nothing read yet
    assert not partial.passed()
