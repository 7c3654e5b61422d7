"""Atomic file writes for every file NpuEP produces (cache entries, EPContext payloads, tool outputs).

Why: writing a file in place truncates it first, so a crash or a full disk leaves a broken file where a good one
was, and a fixed temp name (``out.tmp``) follows a symlink planted there and overwrites the link's target. Here the
bytes go to a fresh temp file in the destination's folder, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a
unique name, then fsync'ed and ``os.replace``d over the destination (a rename replaces a symlink at the
destination itself, never its target); the folder is fsync'ed so the rename survives a power loss. Readers see the
old file or the new one, never a mix. On any error the temp file is removed and the exception propagates (an
OSError that named no file, e.g. ENOSPC from a write, is raised again naming the destination); the destination is
untouched.

Temp names are ``.<destination name>.<pid>.<16 hex digits>.tmp`` in the destination's folder (see
``temp_name_pattern``), so a sweeper can recognise exactly these files and tell, from the pid, whether the writer
is still alive. Nothing else is ever created or deleted.

Usage::

    from npu_ep._atomic import atomic_write_bytes, atomic_writer
    atomic_write_bytes("out.onnx", data)            # bytes-like, written in full
    with atomic_writer("out.onnx") as f:            # streaming: f is a binary file object
        for chunk in chunks:
            f.write(chunk)
    # the destination appears only when the with-block ends without an exception

What this does not do: refuse a destination that is also an input. Callers that read and write files (the CLIs)
check that first (``os.path.samefile`` on every input, data files included).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write_bytes", "atomic_writer", "temp_name_pattern"]

TMP_SUFFIX = ".tmp"


def temp_name_pattern(dest_name: str = r"[^/]+") -> re.Pattern[str]:
    """Regex matching this module's temp names for ``dest_name`` (a regex); group ``pid`` is the writer's pid."""
    return re.compile(rf"\.(?P<dest>{dest_name})\.(?P<pid>[0-9]+)\.[0-9a-f]{{16}}{re.escape(TMP_SUFFIX)}")


def _temp_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(8)}{TMP_SUFFIX}")


def _fsync_dir(folder: Path) -> None:
    try:  # make the rename durable; best effort (not every file system lets a folder be fsync'ed)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


@contextmanager
def _replacing_fd(path: str | os.PathLike[str], mode: int) -> Iterator[int]:
    """A fresh temp fd beside ``path``; on a clean exit it is fsync'ed, closed and renamed over ``path``."""
    dest = Path(path)
    tmp = _temp_path(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            yield fd
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:  # os.write/fsync name no file: say which one failed
            raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(dest)) from exc
        raise
    _fsync_dir(dest.parent)


@contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a binary file whose content replaces ``path`` atomically when the block ends without an exception.

    ``mode`` is the new file's permission bits (the process umask applies). The parent folder must exist.
    Raises OSError (e.g. ENOSPC, EACCES) with the temp file already removed and ``path`` untouched.
    """
    with _replacing_fd(path, mode) as fd, os.fdopen(os.dup(fd), "wb") as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | bytearray | memoryview,
                       mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (unique O_EXCL|O_NOFOLLOW temp, fsync, rename, folder fsync)."""
    with _replacing_fd(path, mode) as fd:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]
