"""Content-addressed cache keys: one SHA-256 over everything that changes a compiled program.

Why an explicit encoding: a key built by concatenating strings lets ("ab", "c") and ("a", "bc") collide, and a
dict hashed via ``str()`` depends on insertion order. Here every part is written as ``tag + u64 length + payload``
(arrays also carry dtype and shape), dicts/lists become sorted, compact JSON, and the part count is hashed first,
so different inputs give different byte streams and the same input always gives the same key.

Typical parts: canonical subgraph bytes, each initializer array, the target description (dict), compiler version,
compile options (dict), shape bucket.

A payload of LARGE_PAYLOAD bytes or more is written as its length and its own BLAKE3 digest (a two-level hash,
still collision resistant), and those digests are computed on two threads at once (blake3 releases the GIL): a warm
session start hashes every weight its partition binds, 0.5 GB for a 1B int4 decoder, and BLAKE3 reads it about three
times as fast as SHA-256 here. Pages of ORT's mapping of an external data file are released as they are hashed
(``file_pages``): the key reads every weight, but must not keep them all resident.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from concurrent.futures import Future
from typing import Any
from collections.abc import Mapping

import numpy as np
from blake3 import blake3

from .digest_memo import DigestMemo, FileRanges
from .file_pages import release_file_pages
from .hash_pool import hash_pool

KEY_DOMAIN = b"npu_ep.cache_key.v3\0"
LARGE_PAYLOAD = 1 << 20
HASH_CHUNK = 4 << 20  # bytes of a large payload hashed before its file pages are released
_U64 = struct.Struct("<Q")

KeyPart = bytes | bytearray | memoryview | str | Mapping | list | tuple | int | float | bool | None | np.ndarray


def _check_json_value(v: Any, path: str) -> None:
    """Reject what sorted JSON would encode ambiguously: non-str keys ({1: x} vs {"1": x}), NaN, unknown types."""
    if isinstance(v, Mapping):
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"cache_key: mapping key {k!r} at {path} must be str")
            _check_json_value(x, f"{path}.{k}")
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _check_json_value(x, f"{path}[{i}]")
    elif isinstance(v, float) and v != v:
        raise ValueError(f"cache_key: NaN at {path} has no canonical encoding")
    elif not isinstance(v, (str, int, float, bool, type(None))):
        raise TypeError(f"cache_key: value of type {type(v).__name__} at {path} is not JSON; "
                        f"pass arrays/bytes as separate parts")


def canonical_json(value: Any) -> bytes:
    """Sorted, compact, UTF-8 JSON: the canonical bytes of a dict/list of plain values."""
    _check_json_value(value, "$")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _large_digest(payload: memoryview) -> bytes:
    """BLAKE3 of ``payload`` read HASH_CHUNK bytes at a time; the pages of a chunk a file backs (ORT's mapping of
    external data) are given back once hashed (``file_pages``), so hashing a model's weights does not hold them."""
    h = blake3()
    for lo in range(0, payload.nbytes, HASH_CHUNK):
        chunk = payload[lo:lo + HASH_CHUNK]
        h.update(chunk)
        release_file_pages(chunk)
    return h.digest()


def _put(h: hashlib._Hash, tag: bytes, payload: bytes | memoryview, digest: Future | None = None) -> None:
    """tag + u64 length + the payload, or for a large payload (``digest`` computing its BLAKE3) + b"#" + digest."""
    h.update(tag)
    h.update(_U64.pack(len(payload) if not isinstance(payload, memoryview) else payload.nbytes))
    if digest is None:
        h.update(payload)
    else:
        h.update(b"#")
        h.update(digest.result())


def _array_bytes(arr: np.ndarray) -> tuple[np.dtype, np.ndarray]:
    if arr.dtype.hasobject or (arr.dtype.kind == "V" and arr.dtype.fields):
        raise TypeError(f"cache_key: array dtype {arr.dtype} has no canonical byte encoding")
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder in (">", "=") else arr.dtype
    return dt, np.asarray(arr, dtype=dt, order="C")  # little-endian, C order: layout-independent bytes


def _put_array(h: hashlib._Hash, arr: np.ndarray, digest: Future | None = None) -> None:
    dt, data = _array_bytes(arr)
    h.update(b"A")
    _put(h, b"d", dt.str.encode("ascii") + b"/" + str(dt).encode("ascii"))
    h.update(_U64.pack(data.ndim))
    for d in data.shape:
        h.update(_U64.pack(d))
    _put(h, b"b", _raw(data), digest)


def _raw(data: np.ndarray) -> memoryview:
    return memoryview(data.reshape(-1).view(np.uint8))


def _large_digests(parts: tuple, memo: DigestMemo | None) -> tuple[dict[int, Future], list[tuple]]:
    """BLAKE3 of every large array part's bytes, started on the pool (part index -> future); with ``memo``, the
    stored digest of bytes a file backs (``digest_memo``) instead, and the file-backed ones hashed here (for
    ``DigestMemo.put``)."""
    out: dict[int, Future] = {}
    fresh: list[tuple] = []
    ranges = FileRanges() if memo is not None else None
    started = time.time_ns()
    for i, p in enumerate(parts):
        if isinstance(p, np.ndarray) and p.nbytes >= LARGE_PAYLOAD and not p.dtype.hasobject:
            raw = _raw(_array_bytes(p)[1])
            where = ranges.locate(raw) if ranges is not None else None
            known = memo.get(where, raw.nbytes) if where is not None else None
            if known is not None:
                out[i] = Future()
                out[i].set_result(known)
                continue
            out[i] = hash_pool().submit(_large_digest, raw)
            if where is not None:
                fresh.append((where, raw.nbytes, out[i], started))
    return out, fresh


def cache_key(*parts: KeyPart, memo: DigestMemo | None = None) -> str:
    """SHA-256 hex (64 lowercase chars) of an unambiguous encoding of ``parts``.

    bytes-like -> raw bytes; str -> UTF-8; ndarray -> dtype + shape + little-endian C-order bytes;
    Mapping/list/tuple/int/float/bool/None -> canonical JSON (str keys only, no NaN). ``memo``: digests of
    file-backed weights remembered across sessions (the same key, without reading the bytes again).
    """
    digests, fresh = _large_digests(parts, memo)
    h = hashlib.sha256(KEY_DOMAIN)
    h.update(_U64.pack(len(parts)))
    for i, p in enumerate(parts):
        if isinstance(p, (bytes, bytearray, memoryview)):
            _put(h, b"B", memoryview(p).cast("B") if isinstance(p, memoryview) else bytes(p))
        elif isinstance(p, str):
            _put(h, b"S", p.encode("utf-8"))
        elif isinstance(p, np.ndarray):
            _put_array(h, p, digests.get(i))
        elif isinstance(p, np.generic):
            _put_array(h, np.asarray(p))
        else:
            try:
                _put(h, b"J", canonical_json(p))
            except (TypeError, ValueError) as e:
                raise type(e)(f"cache_key part {i}: {e}") from None
    if memo is not None:
        for where, nbytes, job, started in fresh:
            memo.put(where, nbytes, job.result(), started)
        memo.flush()
    return h.hexdigest()
