"""Builders shared by the context_cache tests: small valid containers and re-sealed (hash-fixed) hostile ones."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from npu_ep.context_cache import container as C

META = C.ContainerMeta(compiler_version="0.1.0", target_name="npu-ref", target_hash="a1" * 32,
                       source_key="b2" * 32)


def meta_for(key: str) -> C.ContainerMeta:
    """META bound to a cache key: a CacheStore entry's source_key must be the key it is stored under."""
    return dataclasses.replace(META, source_key=key)


def small_container(n: int = 3) -> bytes:
    """A small but complete container: a header, several sections of different dtypes, incl. 0-d and empty."""
    arrays = {"w": np.arange(n * 4, dtype=np.int8).reshape(n, 4), "s": np.float32(0.5) * np.ones((), np.float32),
              "e": np.zeros((0, 3), np.float16), "z": np.array([7, -1], np.int64)}
    return C.pack({"ops": [{"op": "MatMul", "tile": [32, 64]}], "io": {"x": [1, n]}}, arrays, meta=META)


def split(buf: bytes) -> tuple[dict[str, Any], bytes]:
    """(JSON document, data region) of a valid container."""
    _, hlen, _, _ = C._read_prefix(memoryview(buf))
    doc = json.loads(buf[C.PREFIX_SIZE:C.PREFIX_SIZE + hlen])
    return doc, buf[C._align(C.PREFIX_SIZE + hlen):]


def reseal_raw(header_bytes: bytes, data: bytes, *, version: int = C.FORMAT_VERSION, flags: int = 0,
               magic: bytes = C.MAGIC) -> bytes:
    """Assemble a container around arbitrary header bytes with a CORRECT header hash (so parsing is reached)."""
    data_start = C._align(C.PREFIX_SIZE + len(header_bytes))
    total = data_start + len(data)
    head = C.PREFIX.pack(magic, version, flags, len(header_bytes), total, b"\0" * 32)
    digest = hashlib.sha256(head[:C.HASHED_PREFIX] + header_bytes).digest()
    out = bytearray(C.PREFIX.pack(magic, version, flags, len(header_bytes), total, digest))
    out += header_bytes
    out += b"\0" * (data_start - len(out))
    out += data
    return bytes(out)


def reseal(doc: Any, data: bytes, **kw: Any) -> bytes:
    return reseal_raw(json.dumps(doc, separators=(",", ":")).encode(), data, **kw)


def as_format_1(buf: bytes) -> bytes:
    """The same container as format version 1 wrote it (sections hashed with SHA-256 under ``sha256``): what an
    older NpuEP left in a cache folder or beside an EPContext model."""
    doc, data = split(buf)
    start = C._align(C.PREFIX_SIZE + C.PREFIX.unpack_from(buf, 0)[3])
    for row in doc["arrays"]:
        del row["blake3"]
        row["sha256"] = hashlib.sha256(buf[start + row["offset"]:start + row["offset"] + row["nbytes"]]).hexdigest()
    return reseal_raw(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), data, version=1)
