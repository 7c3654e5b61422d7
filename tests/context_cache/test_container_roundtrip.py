"""Round trips: every whitelisted dtype and rank comes back bit-identical as a read-only zero-copy view."""

from __future__ import annotations

import mmap

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npu_ep.context_cache import container as C
from npu_ep.context_cache.errors import ContextFormatError, ContextIncompatibleError

from ._helpers import META, small_container

NATIVE = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64"]

arrays_st = st.sampled_from(NATIVE).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=4)))
names_st = st.text(min_size=0, max_size=12)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == np.ascontiguousarray(b).tobytes()


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(names_st, arrays_st, max_size=6),
       st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8) | st.lists(st.integers(), max_size=4),
                       max_size=4))
def test_round_trip_is_bit_identical_and_read_only(arrays: dict[str, np.ndarray], header: dict) -> None:
    buf = C.pack(header, arrays, meta=META)
    assert len(buf) % C.ALIGN == 0
    c = C.unpack(buf)
    assert c.meta == META and c.header == header
    assert list(c.arrays) == list(arrays)
    base = np.frombuffer(buf, np.uint8)
    for name, a in arrays.items():
        got = c.arrays[name]
        assert _same_bits(got, a.astype(a.dtype.newbyteorder("<")))
        assert not got.flags.writeable
        if got.nbytes:
            assert np.shares_memory(got, base), "arrays must be views into the buffer, not copies"
            off = got.__array_interface__["data"][0] - base.__array_interface__["data"][0]
            assert off % C.ALIGN == 0


def test_bfloat16_big_endian_and_non_contiguous_inputs_round_trip() -> None:
    src = {"bf": np.linspace(-2, 2, 7).astype(ml_dtypes.bfloat16), "be": np.arange(5, dtype=">i4"),
           "t": np.arange(12, dtype=np.float32).reshape(3, 4).T, "scalar": np.int8(-3)}
    c = C.unpack(C.pack({}, src, meta=META))
    assert c.arrays["bf"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(c.arrays["bf"].astype(np.float32), src["bf"].astype(np.float32))
    np.testing.assert_array_equal(c.arrays["be"], src["be"])
    np.testing.assert_array_equal(c.arrays["t"], src["t"])
    assert c.arrays["scalar"].shape == () and int(c.arrays["scalar"]) == -3


def test_views_cannot_be_made_writable_even_over_a_writable_buffer() -> None:
    c = C.unpack(bytearray(small_container()))
    with pytest.raises(ValueError):
        c.arrays["w"].setflags(write=True)


def test_pack_is_deterministic() -> None:
    assert small_container() == small_container()


def test_unpack_from_mmap(tmp_path) -> None:
    p = tmp_path / "c.npuctx"
    p.write_bytes(small_container(5))
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        c = C.unpack(mm)
        np.testing.assert_array_equal(c.arrays["w"], np.arange(20, dtype=np.int8).reshape(5, 4))
        del c  # release the views before the mmap closes


def test_peek_meta_reads_meta_without_sections() -> None:
    buf = small_container()
    assert C.peek_meta(buf) == META
    C.verify(buf)


@pytest.mark.parametrize("field,value,needle", [
    ("target_name", "npu-edge", "target 'npu-ref' (session uses 'npu-edge')"),
    ("target_hash", "ff" * 32, "target hash"),
    ("compiler_version", "0.2.0", "compiler version '0.1.0' (session uses '0.2.0')"),
    ("format_version", 3, "format version 2 (session expects 3)"),
])
def test_expect_mismatch_says_what_differs_and_how_to_recompile(field: str, value, needle: str) -> None:
    with pytest.raises(ContextIncompatibleError) as ei:
        C.unpack(small_container(), expect=C.ContainerExpect(**{field: value}))
    assert needle in str(ei.value) and "ep.context_enable=1" in str(ei.value)


def test_expect_match_passes() -> None:
    e = C.ContainerExpect(target_name="npu-ref", target_hash="a1" * 32, compiler_version="0.1.0", format_version=2)
    assert C.unpack(small_container(), expect=e).meta == META


@pytest.mark.parametrize("arrays,header,exc", [
    ({"o": np.array([object()], dtype=object)}, {}, TypeError),
    ({"c": np.ones(2, np.complex64)}, {}, TypeError),
    ({"s": np.array(["ab"])}, {}, TypeError),
    ({}, {"x": float("nan")}, TypeError),
    ({}, {"x": object()}, TypeError),
    ({1: np.ones(1)}, {}, TypeError),
])
def test_pack_refuses_what_cannot_be_stored_safely(arrays, header, exc) -> None:
    with pytest.raises(exc):
        C.pack(header, arrays, meta=META)


def test_incompatible_is_a_format_error_so_one_except_rebuilds() -> None:
    assert issubclass(ContextIncompatibleError, ContextFormatError)


def test_load_file_maps_the_file_and_names_it_in_errors(tmp_path) -> None:
    good, bad, empty = tmp_path / "good.npuctx", tmp_path / "bad.npuctx", tmp_path / "empty.npuctx"
    good.write_bytes(small_container(4))
    bad.write_bytes(small_container(4)[:-1])
    empty.write_bytes(b"")
    c = C.load_file(good, expect=C.ContainerExpect(target_name="npu-ref"))
    np.testing.assert_array_equal(c.arrays["w"], np.arange(16, dtype=np.int8).reshape(4, 4))
    for p, needle in ((bad, "total_len"), (empty, "empty file"), (tmp_path / "missing", "cannot read")):
        with pytest.raises(ContextFormatError, match=needle) as ei:
            C.load_file(p)
        assert str(p) in str(ei.value)
    with pytest.raises(ContextIncompatibleError, match=r"good.npuctx.*npu-edge"):
        C.load_file(good, expect=C.ContainerExpect(target_name="npu-edge"))
