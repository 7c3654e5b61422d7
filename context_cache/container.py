"""The compiled "context binary" container: one partition's program header + its packed weight arrays.

Why a custom container: loading must be a single read (or mmap) plus zero-copy numpy views, and nothing read from
disk may execute code (no pickle). Every length, offset, dtype and shape is checked before it is used, and
SHA-256 covers the header block and BLAKE3 every section, so a stale or corrupt file is refused instead of trusted.

Byte layout (all integers little-endian; see FORMAT.md for the full description):

    [0, 64)                  prefix: magic, format version, flags, header_len, total_len, header sha256
    [64, 64 + header_len)    UTF-8 JSON: {"meta": {...}, "header": {...}, "arrays": [...]}
    zero padding to a multiple of 64  -> data_start
    sections, each at data_start + offset (offset a multiple of 64), zero padding between and after them
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass, field
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
from blake3 import blake3

from .errors import ContextFormatError, ContextIncompatibleError
from .file_pages import release_file_pages
from .hash_pool import hash_pool
from .fileio import map_container
from .prefix import ALIGN, FORMAT_VERSION, HASHED_PREFIX, MAGIC, PREFIX, PREFIX_SIZE
from .prefix import align as _align, as_readonly_view as _as_readonly_view, fail as _fail
from .prefix import unpack_prefix as _unpack_prefix

MAX_NDIM = 32
MAX_SPAN = 2**62  # numpy refuses arrays whose non-zero dims span more than intp can address

_META_FIELDS = ("compiler_version", "target_name", "target_hash", "source_key")
_ARRAY_FIELDS = frozenset({"name", "dtype", "shape", "offset", "nbytes", "blake3"})
_TOP_FIELDS = frozenset({"meta", "header", "arrays"})


class _DtypeWhitelist(Mapping[str, np.dtype]):
    """The dtypes a container may hold, by name. bfloat16 (common for NPU weights) comes from ml_dtypes, imported
    on first use: its import is most of an EP session's start-up otherwise."""

    _BASE = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64")

    def __init__(self) -> None:
        self._table = {n: np.dtype(n).newbyteorder("<") for n in self._BASE}
        self._names = (*self._BASE, "bfloat16")

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bfloat16" and name not in self._table:
            try:
                import ml_dtypes
            except ImportError:  # pragma: no cover  (a declared dependency)
                raise KeyError(name) from None
            self._table[name] = np.dtype(ml_dtypes.bfloat16)
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


DTYPES: Mapping[str, np.dtype] = _DtypeWhitelist()


@dataclass(frozen=True)
class ContainerMeta:
    """Who made a container and for what: checked against the session before the program is used."""

    compiler_version: str
    target_name: str
    target_hash: str
    source_key: str  # key of the source subgraph (or the full cache key) this program was compiled from
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class ContainerExpect:
    """What the loading session demands; None means "don't care"."""

    target_name: str | None = None
    target_hash: str | None = None
    compiler_version: str | None = None
    format_version: int | None = None
    source_key: str | None = None  # binds a cache entry to the key it is looked up under (a copied file fails)


@dataclass(frozen=True)
class ArrayEntry:
    """One row of the array table; offset is relative to data_start, sizes in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    blake3: str  # hex digest of the section's bytes


@dataclass(frozen=True)
class Container:
    """An unpacked container; ``arrays`` are read-only zero-copy views into the buffer given to ``unpack``."""

    meta: ContainerMeta
    header: dict[str, Any]
    arrays: dict[str, np.ndarray]
    table: tuple[ArrayEntry, ...] = field(repr=False)
    nbytes: int = 0


def _dtype_name(dt: np.dtype) -> str:
    for name, wl in DTYPES.items():
        if dt == wl or (dt.kind != "V" and dt.newbyteorder("<") == wl):
            return name
    raise TypeError(f"dtype {dt} is not allowed in a context container (allowed: {', '.join(DTYPES)})")


# ----------------------------------------------------------------------------------------------------- packing


@dataclass(frozen=True)
class PackedContainer:
    """A container laid out and hashed, its sections still the caller's arrays: ``write_to`` streams it to a file
    section by section, so storing an entry never holds a second whole copy of its weights."""

    meta: ContainerMeta
    head: bytes  # prefix, JSON block and zero padding up to data_start
    sections: tuple[tuple[int, memoryview], ...]  # (offset from data_start, the section's bytes), in file order
    nbytes: int  # total_len

    def pieces(self) -> Iterator[bytes | memoryview]:
        """The file's bytes in order: head, then each section and the zero padding after it."""
        yield self.head
        cursor = len(self.head)
        for off, raw in self.sections:
            start = len(self.head) + off
            if start > cursor:
                yield bytes(start - cursor)
            yield raw
            cursor = start + raw.nbytes
        if self.nbytes > cursor:
            yield bytes(self.nbytes - cursor)

    def write_to(self, f: BinaryIO) -> None:
        """Write the whole container to the binary file ``f`` (buffered writes of each section in place)."""
        for piece in self.pieces():
            f.write(piece)

    def to_bytes(self) -> bytes:
        """The container as one bytes object (the only copy made)."""
        return b"".join(self.pieces())


def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray], *, meta: ContainerMeta) -> bytes:
    """Serialize a program header (JSON-serializable dict) and named arrays into one container (``packed``'s
    bytes)."""
    return packed(header, arrays, meta=meta).to_bytes()


def packed(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray], *, meta: ContainerMeta) -> PackedContainer:
    """Lay out and hash a container without copying its arrays (only one that is not little-endian C order is
    converted).

    Arrays are stored little-endian, C order, in the given order, each 64-byte aligned. Header keys are sorted so
    the same input always gives the same bytes.
    """
    if meta.format_version != FORMAT_VERSION:
        raise ValueError(f"this writer produces format version {FORMAT_VERSION}, meta asks for {meta.format_version}")
    for f in _META_FIELDS:
        if not isinstance(getattr(meta, f), str):
            raise TypeError(f"ContainerMeta.{f} must be str, got {type(getattr(meta, f)).__name__}")
    if not isinstance(header, Mapping):
        raise TypeError(f"header must be a mapping, got {type(header).__name__}")
    table: list[dict[str, Any]] = []
    sections: list[tuple[int, memoryview]] = []
    cursor = 0
    for name, arr in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"array name {name!r} must be str")
        arr = np.asarray(arr)
        dname = _dtype_name(arr.dtype)
        data = np.asarray(arr, dtype=DTYPES[dname], order="C")  # keeps 0-d (ascontiguousarray would not)
        raw = memoryview(data.reshape(-1).view(np.uint8))
        table.append({"name": name, "dtype": dname, "shape": [int(d) for d in data.shape], "offset": cursor,
                      "nbytes": int(data.nbytes), "blake3": _digest(raw)})
        sections.append((cursor, raw))
        cursor = _align(cursor + data.nbytes)
    doc = {"meta": {f: getattr(meta, f) for f in _META_FIELDS}, "header": dict(header), "arrays": table}
    try:
        js = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"container header is not JSON-serializable: {e}") from e
    jb = js.encode("utf-8")
    data_start = _align(PREFIX_SIZE + len(jb))
    total = data_start + cursor
    head = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(jb), total, b"\0" * 32)
    digest = hashlib.sha256(head[:HASHED_PREFIX] + jb).digest()
    prefix = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(jb), total, digest)
    return PackedContainer(meta=meta, head=prefix + jb + bytes(data_start - PREFIX_SIZE - len(jb)),
                           sections=tuple(sections), nbytes=total)


# --------------------------------------------------------------------------------------------------- unpacking


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _read_prefix(mv: memoryview) -> tuple[int, int, int, bytes]:
    """Check magic, version, flags and lengths; return (format_version, header_len, total_len, header_sha)."""
    version, hlen, total, digest = _unpack_prefix(mv)
    if total != len(mv):
        raise _fail(f"prefix.total_len at offset 24: says {total} bytes, buffer has {len(mv)} (truncated or padded)")
    return version, hlen, total, digest


def _parse_header_block(mv: memoryview) -> tuple[int, dict[str, Any], int]:
    """Verify the header hash and parse the JSON block; return (format_version, doc, data_start)."""
    version, hlen, _total, digest = _read_prefix(mv)
    jb = mv[PREFIX_SIZE:PREFIX_SIZE + hlen]
    h = hashlib.sha256(mv[:HASHED_PREFIX])
    h.update(jb)
    if h.digest() != digest:
        raise _fail(f"header block [{PREFIX_SIZE}, {PREFIX_SIZE + hlen}): sha256 mismatch "
                    f"(stored {digest.hex()[:16]}..., computed {h.hexdigest()[:16]}...): corrupt or tampered")
    try:
        doc = json.loads(bytes(jb).decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(f"header block at offset {PREFIX_SIZE}: not valid UTF-8 JSON ({e})") from None
    if not isinstance(doc, dict) or set(doc) != _TOP_FIELDS:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise _fail(f"header block: top level must be an object with keys {sorted(_TOP_FIELDS)}, got {got}")
    return version, doc, _align(PREFIX_SIZE + hlen)


def _parse_meta(doc: dict[str, Any], version: int) -> ContainerMeta:
    m = doc["meta"]
    if not isinstance(m, dict) or set(m) != set(_META_FIELDS):
        got = sorted(m) if isinstance(m, dict) else type(m).__name__
        raise _fail(f"header.meta: expected keys {sorted(_META_FIELDS)}, got {got}")
    for f in _META_FIELDS:
        if not isinstance(m[f], str):
            raise _fail(f"header.meta.{f}: expected a string, got {type(m[f]).__name__}")
    return ContainerMeta(**{f: m[f] for f in _META_FIELDS}, format_version=version)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_table(doc: dict[str, Any], data_size: int) -> tuple[ArrayEntry, ...]:
    """Validate the array table against the data region: canonical 64-byte-aligned layout, no overlap, no gap."""
    rows = doc["arrays"]
    if not isinstance(rows, list):
        raise _fail(f"header.arrays: expected a list, got {type(rows).__name__}")
    out: list[ArrayEntry] = []
    seen: set[str] = set()
    cursor = 0
    prev = "<start of data>"
    for i, r in enumerate(rows):
        where = f"header.arrays[{i}]"
        if not isinstance(r, dict) or set(r) != _ARRAY_FIELDS:
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise _fail(f"{where}: expected keys {sorted(_ARRAY_FIELDS)}, got {got}")
        name = r["name"]
        if not isinstance(name, str) or name in seen:
            raise _fail(f"{where}.name: {name!r} is not a string or is a duplicate")
        seen.add(name)
        where = f"section {name!r} ({where})"
        dname = r["dtype"]
        if not isinstance(dname, str) or dname not in DTYPES:
            raise _fail(f"{where}.dtype: {dname!r} is not allowed (allowed: {', '.join(DTYPES)})")
        shape, off, nb, sha = r["shape"], r["offset"], r["nbytes"], r["blake3"]
        if (not isinstance(shape, list) or len(shape) > MAX_NDIM
                or not all(_is_int(d) and d >= 0 for d in shape)):
            raise _fail(f"{where}.shape: {str(shape)[:80]} must be a list of at most {MAX_NDIM} non-negative ints")
        if not _is_int(nb) or nb < 0 or nb > data_size:
            raise _fail(f"{where}.nbytes: {str(nb)[:40]} must be an int in [0, {data_size}] (data region size)")
        itemsize = DTYPES[dname].itemsize
        count, span = 1, itemsize  # element count; byte span of the non-zero dims (numpy's own size limit)
        for d in shape:  # Python ints cannot overflow; stop once the span is absurd
            count *= d
            span *= max(d, 1)
            if span > MAX_SPAN:
                raise _fail(f"{where}.shape: {str(shape)[:80]} is too large (more than 2**62 bytes)")
        if count * itemsize != nb:
            raise _fail(f"{where}: shape {str(shape)[:80]} x {dname} ({itemsize} B) does not match nbytes {nb}")
        if not _is_int(off) or off < 0:
            raise _fail(f"{where}.offset: {str(off)[:40]} must be a non-negative int")
        if off % ALIGN:
            raise _fail(f"{where}.offset: {off} is not {ALIGN}-byte aligned")
        if off < cursor:
            raise _fail(f"{where}.offset: {off} overlaps section {prev} which ends at {cursor}")
        if off + nb > data_size:
            raise _fail(f"{where}: [{off}, {off + nb}) extends past the end of the data region ({data_size} bytes)")
        if off != cursor:
            raise _fail(f"{where}.offset: {off} leaves a gap, expected {cursor}")
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise _fail(f"{where}.blake3: {str(sha)[:80]!r} is not 64 lowercase hex digits")
        out.append(ArrayEntry(name, dname, tuple(shape), off, nb, sha))
        cursor = _align(off + nb) if nb else off
        prev = repr(name)
    if _align(cursor) != data_size:
        raise _fail(f"data region: sections end at {cursor}, but the data region is {data_size} bytes "
                    f"(expected {_align(cursor)})")
    return tuple(out)


def _check_padding(mv: memoryview, start: int, end: int, what: str) -> None:
    if end > start and any(mv[start:end]):
        raise _fail(f"padding {what} [{start}, {end}) is not zero")


def _check_expect(meta: ContainerMeta, expect: ContainerExpect) -> None:
    diffs = []
    if expect.target_name is not None and meta.target_name != expect.target_name:
        diffs.append(f"target {meta.target_name!r} (session uses {expect.target_name!r})")
    if expect.target_hash is not None and meta.target_hash != expect.target_hash:
        diffs.append(f"target hash {meta.target_hash[:16]} (session target hash {expect.target_hash[:16]})")
    if expect.compiler_version is not None and meta.compiler_version != expect.compiler_version:
        diffs.append(f"compiler version {meta.compiler_version!r} (session uses {expect.compiler_version!r})")
    if expect.format_version is not None and meta.format_version != expect.format_version:
        diffs.append(f"format version {meta.format_version} (session expects {expect.format_version})")
    if expect.source_key is not None and meta.source_key != expect.source_key:
        diffs.append(f"source key {meta.source_key[:16]}... (looked up as {expect.source_key[:16]}...: a copied or "
                     f"swapped file)")
    if diffs:
        raise ContextIncompatibleError(
            "context binary was compiled for " + "; ".join(diffs)
            + ": delete the cache entry or re-run with ep.context_enable=1 to recompile")


def unpack(buf: bytes | bytearray | memoryview | mmap.mmap, *, expect: ContainerExpect | None = None,
           verify: bool = True) -> Container:
    """Parse and check a container; arrays are read-only views into ``buf`` (keep ``buf`` alive).

    Cost: O(header) parsing + O(size) hashing when ``verify`` (default), sections hashed on the hashing threads;
    with ``verify=False`` the section hashes are skipped (only for bytes the caller already verified). From an
    mmap (``load_file``), each hashed piece's file pages leave the resident set again: verifying a payload does
    not make the whole file resident (a kernel reading a section faults its pages back in from the page cache).
    Raises ContextFormatError (corrupt/hostile) or ContextIncompatibleError (``expect`` not met).
    """
    mapped = isinstance(buf, mmap.mmap)
    mv = _as_readonly_view(buf)
    version, doc, data_start = _parse_header_block(mv)
    meta = _parse_meta(doc, version)
    if expect is not None:
        _check_expect(meta, expect)
    if not isinstance(doc["header"], dict):
        raise _fail(f"header.header: expected an object, got {type(doc['header']).__name__}")
    table = _parse_table(doc, len(mv) - data_start)
    hlen = PREFIX.unpack_from(mv, 0)[3]
    _check_padding(mv, PREFIX_SIZE + hlen, data_start, "after header block")
    arrays: dict[str, np.ndarray] = {}
    cursor = data_start
    for e in table:
        start = data_start + e.offset
        _check_padding(mv, cursor, start, f"before section {e.name!r}")
        sec = mv[start:start + e.nbytes]
        arrays[e.name] = np.frombuffer(sec, dtype=DTYPES[e.dtype]).reshape(e.shape)
        cursor = start + e.nbytes
    _check_padding(mv, cursor, len(mv), "at end of file")
    if verify:
        _verify_sections(mv, table, data_start, mapped)
    return Container(meta=meta, header=doc["header"], arrays=arrays, table=table, nbytes=len(mv))


HASH_CHUNK = 4 << 20  # bytes of a mapped section hashed before its pages are released
_INLINE_BYTES = 4 << 20  # data regions below this are hashed on the calling thread


def _verify_sections(mv: memoryview, table: tuple[ArrayEntry, ...], data_start: int, mapped: bool) -> None:
    """Every section's BLAKE3 digest, largest first on the hashing threads (blake3 releases the GIL); the first
    mismatch in file order is reported."""
    spans = [(e, mv[data_start + e.offset:data_start + e.offset + e.nbytes]) for e in table]
    if len(mv) - data_start < _INLINE_BYTES:
        digests = {e.name: _digest(sec, mapped) for e, sec in spans}
    else:
        pool = hash_pool()
        jobs = {e.name: pool.submit(_digest, sec, mapped) for e, sec in sorted(spans, key=lambda t: -t[0].nbytes)}
        digests = {name: job.result() for name, job in jobs.items()}
    for e, _ in spans:
        if digests[e.name] != e.blake3:
            start = data_start + e.offset
            raise _fail(f"section {e.name!r} [{start}, {start + e.nbytes}): blake3 mismatch "
                        f"(stored {e.blake3[:16]}...): corrupt or tampered")


def _digest(section: memoryview, release: bool = False) -> str:
    """A section's BLAKE3 hex digest (about three times SHA-256's speed here); ``release``: drop each hashed
    piece's file pages (``section`` views a mapping)."""
    if not release:
        return blake3(section).hexdigest()
    h = blake3()
    for lo in range(0, len(section), HASH_CHUNK):
        piece = section[lo:lo + HASH_CHUNK]
        h.update(piece)
        release_file_pages(piece)
    return h.hexdigest()


def verify(buf: bytes | bytearray | memoryview) -> None:
    """Check every hash, length, offset and padding byte; raise ContextFormatError on the first problem."""
    unpack(buf, verify=True)


def peek_meta(buf: bytes | bytearray | memoryview) -> ContainerMeta:
    """Read only the prefix and the (hash-checked) header block: cheap, for listings and compatibility checks.

    Pass the whole file (total_len is checked against it); with mmap only the header pages are touched.
    """
    mv = _as_readonly_view(buf)
    version, doc, _ = _parse_header_block(mv)
    return _parse_meta(doc, version)


def load_file(path: str | os.PathLike[str], *, expect: ContainerExpect | None = None,
              verify: bool = True) -> Container:
    """mmap a container file and unpack it: arrays are views into the mapping (kept alive by the arrays).

    The file is opened by ``fileio.map_container`` (regular files only, size checked against the header first).
    Errors name the file, e.g. for an external EPContext payload (embed_mode=0).
    """
    try:
        mm = map_container(path)
    except OSError as e:
        raise ContextFormatError(f"{os.fspath(path)}: cannot read context binary: {e.strerror or e}") from None
    try:
        return unpack(mm, expect=expect, verify=verify)
    except ContextFormatError as e:
        raise type(e)(f"{os.fspath(path)}: {e}") from None
