"""Errors raised when a compiled context binary cannot be trusted or cannot be used.

Both derive from ``ValueError`` so callers that only want "bad input" can catch that; callers that want to
recompile on any problem catch ``ContextFormatError`` (an incompatibility is a special, well-formed case of it).
"""

from __future__ import annotations


class ContextFormatError(ValueError):
    """The bytes are not a valid context container: wrong magic, bad length/offset, hash mismatch, bad JSON.

    The message names the section or field, the offending value and what was expected.
    """


class ContextIncompatibleError(ContextFormatError):
    """The container is intact but was made for another target, compiler version or format version.

    The message says what differs and how to recompile.
    """


class ContextFileError(ContextFormatError):
    """The path cannot hold a context binary: not a regular file (FIFO, device, folder), a symbolic link, or larger
    than the reader's limit. Nothing past the first 64 bytes was read.
    """


class ContextTooLargeError(ContextFileError):
    """A regular file whose container prefix declares more bytes than the reader's limit (a cache's
    ``cache_max_bytes``). It says nothing about the file's integrity: the rest was not read, so it may be valid.
    """
