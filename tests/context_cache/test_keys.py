"""cache_key: any changed part changes the key; different splits, types or layouts of the same bytes never collide."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_ep.context_cache.keys import cache_key, canonical_json

BASE = (b"\x08\x01graph-bytes", np.arange(12, dtype=np.float32).reshape(3, 4), {"name": "npu-ref", "sram": 262144},
        "0.1.0", {"opt_level": 2, "tile": [32, 64]}, "bucket:seq<=128")


def test_key_is_64_lowercase_hex_and_deterministic() -> None:
    k = cache_key(*BASE)
    assert len(k) == 64 and all(c in "0123456789abcdef" for c in k)
    assert k == cache_key(*BASE)


def _variants() -> list[tuple[int, object]]:
    w = BASE[1].copy()
    w[2, 3] = np.nextafter(w[2, 3], np.float32(100))  # one weight value, one ulp
    return [(0, b"\x08\x01graph-bytez"), (1, w), (1, BASE[1].astype(np.float16)), (1, BASE[1].reshape(4, 3)),
            (2, {"name": "npu-edge", "sram": 262144}), (2, {"name": "npu-ref", "sram": 262145}),
            (3, "0.1.1"), (4, {"opt_level": 1, "tile": [32, 64]}), (4, {"opt_level": 2, "tile": [64, 32]}),
            (5, "bucket:seq<=256")]


@pytest.mark.parametrize("i,new", _variants())
def test_changing_any_single_part_changes_the_key(i: int, new: object) -> None:
    parts = list(BASE)
    parts[i] = new
    assert cache_key(*parts) != cache_key(*BASE)


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=24))
def test_different_splits_of_the_same_bytes_do_not_collide(data: bytes) -> None:
    splits = {(data,)}
    for i in range(len(data) + 1):
        splits.add((data[:i], data[i:]))
        for j in range(i, len(data) + 1, 3):
            splits.add((data[:i], data[i:j], data[j:]))
    keys = {cache_key(*s) for s in splits}
    assert len(keys) == len(splits)
    text = data.decode("latin-1")
    assert cache_key(data) != cache_key(text)  # bytes vs str of the same characters


def test_type_tags_and_array_metadata_disambiguate() -> None:
    raw = np.arange(6, dtype=np.int8)
    keys = {cache_key(raw), cache_key(raw.view(np.uint8)), cache_key(raw.reshape(2, 3)), cache_key(raw.reshape(3, 2)),
            cache_key(raw.tobytes()), cache_key(list(raw.tolist())), cache_key(raw.reshape(1, 6)),
            cache_key(np.zeros((0, 6), np.int8)), cache_key(np.zeros((6, 0), np.int8)), cache_key(), cache_key(b""),
            cache_key(""), cache_key(None), cache_key({}), cache_key([])}
    assert len(keys) == 15


def test_same_values_in_any_memory_layout_or_byte_order_give_the_same_key() -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert cache_key(a) == cache_key(np.asfortranarray(a)) == cache_key(a.astype(">i4"))
    assert cache_key(a.T) == cache_key(np.ascontiguousarray(a.T))
    assert cache_key(memoryview(b"abc")) == cache_key(b"abc") == cache_key(bytearray(b"abc"))


def test_dicts_are_canonical_regardless_of_insertion_order() -> None:
    assert cache_key({"a": 1, "b": {"y": 2, "x": 1}}) == cache_key({"b": {"x": 1, "y": 2}, "a": 1})
    assert canonical_json({"b": 1, "a": [1.5, None]}) == b'{"a":[1.5,null],"b":1}'


@pytest.mark.parametrize("bad,exc", [({1: "a"}, TypeError), ({"x": float("nan")}, ValueError),
                                     ({"x": b"raw"}, TypeError), (np.array([object()], dtype=object), TypeError),
                                     ({"x": {2: 3}}, TypeError)])
def test_ambiguous_parts_are_refused(bad, exc) -> None:
    with pytest.raises(exc):
        cache_key("ok", bad)


def test_large_arrays_are_bound_by_their_own_digest():
    """Arrays from LARGE_PAYLOAD bytes on are hashed on the pool (their BLAKE3 in the SHA-256): any byte still
    changes the key, layout still does not, and the encoding differs from a small array's only in how, never in what,
    it binds."""
    from npu_ep.context_cache.keys import LARGE_PAYLOAD

    big = np.random.default_rng(1).integers(0, 255, LARGE_PAYLOAD + 7, dtype=np.uint8)
    k = cache_key("w", big, big[:100])
    assert k == cache_key("w", big.copy(), big[:100].copy())
    for pos in (0, LARGE_PAYLOAD // 2, big.size - 1):
        changed = big.copy()
        changed[pos] ^= 1
        assert cache_key("w", changed, big[:100]) != k
    assert cache_key("w", big.reshape(-1, 1), big[:100]) != k  # the shape is bound
    wide = big[:LARGE_PAYLOAD].view(np.int32).reshape(-1, 2)
    assert cache_key(wide) == cache_key(np.asfortranarray(wide)) == cache_key(wide.astype(">i4"))
    assert cache_key(big[:LARGE_PAYLOAD]) != cache_key(big[:LARGE_PAYLOAD - 1])  # either side of the threshold


def test_a_large_array_is_written_as_its_blake3_digest():
    """The encoding FORMAT.md gives, computed by hand: tag, length, b"#" and the payload's BLAKE3."""
    import hashlib
    import struct

    from blake3 import blake3

    from npu_ep.context_cache.keys import KEY_DOMAIN, LARGE_PAYLOAD

    big = np.arange(LARGE_PAYLOAD, dtype=np.uint8)
    u64 = struct.Struct("<Q").pack
    h = hashlib.sha256(KEY_DOMAIN + u64(1) + b"A" + b"d" + u64(9) + b"|u1/uint8" + u64(1) + u64(big.size))
    h.update(b"b" + u64(big.size) + b"#" + blake3(big.tobytes()).digest())
    assert cache_key(big) == h.hexdigest()


def test_keys_with_large_arrays_from_many_threads_agree():
    from concurrent.futures import ThreadPoolExecutor

    from npu_ep.context_cache.keys import LARGE_PAYLOAD

    arrays = [np.full(LARGE_PAYLOAD // 4 + i, i, np.float32) for i in range(4)]
    want = cache_key(*arrays)
    with ThreadPoolExecutor(4) as ex:
        assert set(ex.map(lambda _: cache_key(*arrays), range(8))) == {want}
