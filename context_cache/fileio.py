"""Reading context binaries from a file system we do not trust: the one reader of the cache and of EPContext payloads.

Why: a cache folder or a model folder can hold anything another user or a careless script put there. Opening a
FIFO for reading blocks forever, a symlink can point at /dev/zero, and a huge sparse file read whole costs its
size in RAM. So a path is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink fails at once, a FIFO does not wait
for a writer), ``fstat`` on the open descriptor must say "regular file" (no check-then-open race), the first 64
bytes must be a container prefix whose declared ``total_len`` equals the file's size (and stays within the
caller's ``limit``), and only then are exactly that many bytes read or mapped.

Errors: ``ContextFileError`` (not a regular file, a symlink; its subclass ``ContextTooLargeError``: above the
caller's limit), ``ContextFormatError`` (the prefix is not a container's, or the file's size contradicts it),
``OSError`` (missing, permission denied, I/O). Every message names the path.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from .prefix import PREFIX_SIZE, declared_size
from .errors import ContextFileError, ContextFormatError, ContextTooLargeError

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


@contextmanager
def open_container(path: str | os.PathLike[str], limit: int | None = None) -> Iterator[tuple[int, int]]:
    """Yield ``(fd, size)`` of a regular, non-symlink file whose prefix declares exactly its size (<= ``limit``)."""
    name = os.fspath(path)
    try:
        fd = os.open(name, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ContextFileError(f"{name}: is a symbolic link; context binaries are read only from regular "
                                   f"files") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ContextFileError(f"{name}: is {_kind(st.st_mode)}, not a regular file")
        if st.st_size == 0:
            raise ContextFormatError(f"{name}: empty file, not a context binary")
        if st.st_size < PREFIX_SIZE:
            raise ContextFormatError(f"{name}: {st.st_size} bytes, shorter than a context binary's "
                                   f"{PREFIX_SIZE}-byte prefix")
        try:
            size = declared_size(os.pread(fd, PREFIX_SIZE, 0))
        except ContextFormatError as e:
            raise type(e)(f"{name}: {e}") from None
        if size != st.st_size:
            raise ContextFormatError(f"{name}: the file is {st.st_size} bytes but its prefix.total_len says {size} "
                                   f"(truncated or padded)")
        if limit is not None and size > limit:
            raise ContextTooLargeError(f"{name}: {size} bytes is above the limit of {limit} bytes")
        yield fd, size
    finally:
        os.close(fd)


READ_CHUNK = 64 << 20  # bytes per read
READ_THREADS = 2  # chunks in flight at once (a large file reads ~1.5-2x faster here than with one)


def read_container(path: str | os.PathLike[str], limit: int | None = None) -> memoryview:
    """The bytes of a container file (a view of one uint8 array), read only after ``open_container``'s checks; at most
    the declared size. One numpy buffer: large ones sit on huge pages, so the arrays unpacked from it are read in place
    (``ep.weight_arena`` leaves them there) instead of being copied again. A large file is read in chunks on
    READ_THREADS threads."""
    with open_container(path, limit) as (fd, size):
        buf = np.empty(size, np.uint8)
        view = memoryview(buf)
        chunks = [(lo, min(size, lo + READ_CHUNK)) for lo in range(0, size, READ_CHUNK)]
        if len(chunks) == 1:
            _read_range(fd, view, 0, size, path)
            return view
        with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="npu_ep-read") as pool:
            for read in [pool.submit(_read_range, fd, view, lo, hi, path) for lo, hi in chunks]:
                read.result()
        return view


def _read_range(fd: int, view: memoryview, lo: int, hi: int, path: str | os.PathLike[str]) -> None:
    got = lo
    while got < hi:
        n = os.preadv(fd, [view[got:hi]], got)
        if not n:
            raise ContextFormatError(f"{os.fspath(path)}: shrank to {got} bytes while being read "
                                     f"(expected {len(view)})")
        got += n


def map_container(path: str | os.PathLike[str], limit: int | None = None) -> mmap.mmap:
    """A read-only mapping of a container file after ``open_container``'s checks (pages are read on demand)."""
    with open_container(path, limit) as (fd, size):
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
