"""The container's fixed 64-byte prefix: layout constants and the checks that run before anything else is read.

Its own module because both the container parser and the file reader (``fileio``, which must know a file's
declared size before reading it) need it, and neither should import the other for it.
"""

from __future__ import annotations

import struct

from .errors import ContextFormatError, ContextIncompatibleError

MAGIC = b"NPUCTX\0\1"
FORMAT_VERSION = 2  # 2: sections hashed with BLAKE3 (1: SHA-256, no longer read)
SUPPORTED_FORMAT_VERSIONS = frozenset({2})
ALIGN = 64
PREFIX = struct.Struct("<8sIIQQ32s")  # magic, format_version, flags, header_len, total_len, header_sha256
PREFIX_SIZE = PREFIX.size  # 64 bytes
HASHED_PREFIX = 32  # bytes [0, 32) of the prefix are covered by the header hash, with the JSON block


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def fail(msg: str) -> ContextFormatError:
    return ContextFormatError(f"context container: {msg}")


def as_readonly_view(buf: bytes | bytearray | memoryview) -> memoryview:
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
        mv = mv.cast("B")
    return mv.toreadonly()


def declared_size(prefix: bytes | bytearray | memoryview) -> int:
    """The file size (``total_len``) a container's first 64 bytes declare, after the magic, version, flags and
    header_len checks: a file reader compares it with the file's real size before reading the rest."""
    return unpack_prefix(as_readonly_view(prefix))[2]


def unpack_prefix(mv: memoryview) -> tuple[int, int, int, bytes]:
    """Check magic, version, flags and lengths; return (format_version, header_len, total_len, header_sha)."""
    if len(mv) < PREFIX_SIZE:
        raise fail(f"prefix: buffer is {len(mv)} bytes, need at least {PREFIX_SIZE}")
    magic, version, flags, hlen, total, digest = PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise fail(f"prefix.magic at offset 0: got {magic!r}, expected {MAGIC!r} (not an NpuEP context binary)")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        maker = "an older" if version < min(SUPPORTED_FORMAT_VERSIONS) else "a newer"
        raise ContextIncompatibleError(
            f"context container: prefix.format_version at offset 8 is {version} (written by {maker} NpuEP), this "
            f"NpuEP reads {sorted(SUPPORTED_FORMAT_VERSIONS)}: delete the cache entry or re-run with "
            f"ep.context_enable=1 to recompile")
    if flags != 0:
        raise fail(f"prefix.flags at offset 12: got {flags:#x}, expected 0")
    if total < PREFIX_SIZE:
        raise fail(f"prefix.total_len at offset 24: {total} bytes is shorter than the {PREFIX_SIZE}-byte prefix")
    if hlen > total - PREFIX_SIZE:
        raise fail(f"prefix.header_len at offset 16: {hlen} bytes does not fit in {total - PREFIX_SIZE} bytes "
                   f"after the prefix")
    if align(PREFIX_SIZE + hlen) > total:
        raise fail(f"prefix.header_len at offset 16: header padding to {align(PREFIX_SIZE + hlen)} passes the "
                   f"end ({total})")
    return version, hlen, total, digest
