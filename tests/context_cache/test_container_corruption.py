"""Corrupt, truncated and hostile containers are refused with ContextFormatError naming the field; never a crash."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_ep.context_cache import container as C
from npu_ep.context_cache.errors import ContextFormatError, ContextIncompatibleError

from ._helpers import reseal, reseal_raw, small_container, split

SMALL = small_container(2)


def test_every_single_byte_flip_is_detected() -> None:
    assert len(SMALL) <= 2048
    for i in range(len(SMALL)):
        for x in (0x01, 0x80, 0xFF):
            bad = bytearray(SMALL)
            bad[i] ^= x
            with pytest.raises(ContextFormatError):
                C.verify(bytes(bad))
            with pytest.raises(ContextFormatError):
                C.unpack(bad)


def test_truncation_at_every_length_is_detected() -> None:
    for n in range(len(SMALL)):
        with pytest.raises(ContextFormatError):
            C.unpack(SMALL[:n])


def test_appended_bytes_are_detected() -> None:
    for tail in (b"\0", b"\0" * 64, b"x"):
        with pytest.raises(ContextFormatError, match="total_len"):
            C.unpack(SMALL + tail)


def _doc_data() -> tuple[dict, bytes]:
    doc, data = split(SMALL)
    return copy.deepcopy(doc), data


def _with_array(field: str, value) -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc["arrays"][0][field] = value
    return doc, data


def _overlap() -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc["arrays"][1]["offset"] = doc["arrays"][0]["offset"]
    return doc, data


def _gap() -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc["arrays"][1]["offset"] += 64
    return doc, data


def _past_end() -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc["arrays"][-1]["offset"] = len(data) + 64
    return doc, data


def _dup_name() -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc["arrays"][1]["name"] = doc["arrays"][0]["name"]
    return doc, data


def _meta(field: str, value) -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc["meta"][field] = value
    return doc, data


def _top(key: str, value) -> tuple[dict, bytes]:
    doc, data = _doc_data()
    doc[key] = value
    return doc, data


HOSTILE_DOCS = {
    "huge shape": (lambda: _with_array("shape", [2**40, 2**40, 2**40]), "too large"),
    "shape vs nbytes": (lambda: _with_array("shape", [3, 4]), "does not match nbytes"),
    "negative dim": (lambda: _with_array("shape", [-2, -4]), "non-negative"),
    "float dim": (lambda: _with_array("shape", [2.0, 4]), "non-negative ints"),
    "bool dim": (lambda: _with_array("shape", [True, 8]), "non-negative ints"),
    "too many dims": (lambda: _with_array("shape", [1] * 40 + [8]), "at most 32"),
    "negative offset": (lambda: _with_array("offset", -64), "offset"),
    "unaligned offset": (lambda: _with_array("offset", 3), "aligned"),
    "overlapping sections": (_overlap, "overlaps section"),
    "gap between sections": (_gap, "gap"),
    "offset past end": (_past_end, "past the end"),
    "huge nbytes": (lambda: _with_array("nbytes", 2**70), "nbytes"),
    "negative nbytes": (lambda: _with_array("nbytes", -1), "nbytes"),
    "object dtype": (lambda: _with_array("dtype", "object"), "dtype"),
    "numpy object code": (lambda: _with_array("dtype", "|O"), "dtype"),
    "non-string dtype": (lambda: _with_array("dtype", 17), "dtype"),
    "bad digest format": (lambda: _with_array("blake3", "zz"), "blake3"),
    "wrong section hash": (lambda: _with_array("blake3", "0" * 64), "blake3 mismatch"),
    "duplicate array name": (_dup_name, "duplicate"),
    "extra array field": (lambda: _with_array("exec", "rm -rf /"), "expected keys"),
    "meta not a string": (lambda: _meta("target_name", 5), "header.meta.target_name"),
    "meta missing field": (lambda: _meta("extra", "x"), "header.meta"),
    "header not an object": (lambda: _top("header", [1, 2]), "header.header"),
    "arrays not a list": (lambda: _top("arrays", {"w": 1}), "header.arrays"),
    "unknown top key": (lambda: _top("code", "print(1)"), "top level"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_DOCS))
def test_hostile_header_is_rejected_with_a_named_field(case: str) -> None:
    make, needle = HOSTILE_DOCS[case]
    doc, data = make()
    with pytest.raises(ContextFormatError) as ei:
        C.unpack(reseal(doc, data))
    assert needle in str(ei.value), str(ei.value)


@pytest.mark.parametrize("raw,needle", [
    (b"this is not json", "not valid UTF-8 JSON"),
    (b"\xff\xfe\x00", "not valid UTF-8 JSON"),
    (b"[1, 2, 3]", "top level"),
    (b'{"meta": {}, "meta": {}, "header": {}, "arrays": []}', "duplicate key"),
    (b'{"meta": NaN, "header": {}, "arrays": []}', "non-finite"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON"),
    (b'{"meta": ' + b"9" * 5000 + b"}", "JSON"),
])
def test_non_json_header_is_rejected(raw: bytes, needle: str) -> None:
    with pytest.raises(ContextFormatError, match=needle):
        C.unpack(reseal_raw(raw, b""))


def test_wrong_magic_is_a_format_error() -> None:
    doc, data = _doc_data()
    with pytest.raises(ContextFormatError, match="magic"):
        C.unpack(reseal(doc, data, magic=b"PK\3\4\0\0\0\0"))


def test_unknown_format_version_is_incompatible_and_says_how_to_recompile() -> None:
    doc, data = _doc_data()
    with pytest.raises(ContextIncompatibleError, match=r"format_version at offset 8 is 3 \(written by a newer.*"
                                                       r"recompile"):
        C.unpack(reseal(doc, data, version=3))


def test_nonzero_flags_and_nonzero_padding_are_rejected() -> None:
    doc, data = _doc_data()
    with pytest.raises(ContextFormatError, match="flags"):
        C.unpack(reseal(doc, data, flags=1))
    bad = bytearray(reseal(doc, data))
    bad[-1] = 1  # trailing padding after the last section
    with pytest.raises(ContextFormatError, match="padding"):
        C.unpack(bytes(bad))


def test_header_len_past_end_is_rejected() -> None:
    bad = bytearray(SMALL)
    C.PREFIX.pack_into(bad, 0, C.MAGIC, C.FORMAT_VERSION, 0, 10**9, len(SMALL), b"\0" * 32)
    with pytest.raises(ContextFormatError, match="header_len"):
        C.unpack(bytes(bad))


# ------------------------------------------------------------------------------------------------------ fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=6) | st.sampled_from(["int8", "float32", "object", "O", "<f4"]),
    lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=6), ch, max_size=4), max_leaves=8)


def _check_outcome(buf: bytes) -> None:
    """Either a consistent container or ContextFormatError; anything else (crash, other exception) fails."""
    try:
        c = C.unpack(buf)
    except ContextFormatError:
        return
    for e in c.table:
        a = c.arrays[e.name]
        assert a.nbytes == e.nbytes and not a.flags.writeable


@settings(max_examples=1200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_resealed_json_mutations(data: st.DataObject) -> None:
    doc, raw = _doc_data()
    where = data.draw(st.sampled_from(["array", "meta", "top", "doc", "data"]))
    if where == "array":
        i = data.draw(st.integers(0, len(doc["arrays"]) - 1))
        field = data.draw(st.sampled_from(sorted(C._ARRAY_FIELDS) + ["extra"]))
        doc["arrays"][i][field] = data.draw(json_values)
    elif where == "meta":
        doc["meta"][data.draw(st.sampled_from(list(C._META_FIELDS)))] = data.draw(json_values)
    elif where == "top":
        doc[data.draw(st.sampled_from(["meta", "header", "arrays", "x"]))] = data.draw(json_values)
    elif where == "doc":
        doc = data.draw(json_values)
    else:
        raw = data.draw(st.binary(max_size=len(raw) + 128))
    _check_outcome(reseal(doc, raw))


@settings(max_examples=1000, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_raw_byte_mutations(data: st.DataObject) -> None:
    buf = bytearray(SMALL)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["set", "insert", "delete", "truncate", "splice"]))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "set" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=70))
        elif op == "delete":
            del buf[pos:pos + data.draw(st.integers(1, 70))]
        elif op == "truncate":
            del buf[pos:]
        else:
            chunk = data.draw(st.binary(min_size=1, max_size=16))
            buf[pos:pos + len(chunk)] = chunk
    if bytes(buf) == SMALL:
        C.unpack(bytes(buf))
        return
    with pytest.raises(ContextFormatError):
        C.unpack(bytes(buf))


def test_fuzz_valid_packs_of_random_headers_survive() -> None:
    """Sanity for the fuzzers: a well-formed resealed doc is accepted, so the fuzzers do reach the parser."""
    doc, data = _doc_data()
    c = C.unpack(reseal(doc, data))
    np.testing.assert_array_equal(c.arrays["z"], [7, -1])
    assert json.loads(json.dumps(c.header)) == c.header
