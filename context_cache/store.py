"""The on-disk cache of compiled context binaries: one file per key, atomic writes, verified reads, LRU cap.

Why this shape: several processes may compile the same model at once, a process may die mid-write, disks fill
up and directories can be read-only. So every write goes to a private temp file in the same directory, is
fsync'ed and then ``os.replace``d over the entry (readers see the old file or the new one, never a mix); every
read checks all hashes, and a corrupt entry is removed with a warning so the caller rebuilds it. I/O problems
degrade to "no cache" with a warning; they never fail the session.

Layout: ``<root>/<key>.npuctx``; temp files are ``<root>/.<key>.<pid>.<random>.tmp`` and are never read.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from .container import ContainerMeta, peek_meta, verify
from .errors import ContextFormatError

ENV_CACHE_DIR = "NPU_EP_CACHE_DIR"
SUFFIX = ".npuctx"
TMP_SUFFIX = ".tmp"
TMP_MAX_AGE_S = 3600.0  # a temp file older than this (seconds) belongs to a dead writer
_KEY_RE = re.compile(r"[0-9a-f]{16,128}")


class CacheWarning(UserWarning):
    """The cache could not be used (corrupt entry, unwritable directory, ...); the caller carries on without it."""


def _warn(msg: str) -> None:
    warnings.warn(f"NpuEP cache: {msg}", CacheWarning, stacklevel=3)


def default_cache_dir() -> Path:
    """``$NPU_EP_CACHE_DIR`` if set and non-empty, else the user cache dir (e.g. ``~/.cache/npu_ep``)."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("npu_ep", appauthor=False))


def check_key(key: str) -> str:
    """A key is 16-128 lowercase hex digits (``cache_key`` gives 64): nothing else can reach the file system."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"cache key {key!r} is not 16-128 lowercase hex digits")
    return key


@dataclass(frozen=True)
class CacheEntry:
    """One cache file as listed by ``entries``/``verify_all``; sizes in bytes, ages in seconds."""

    key: str
    path: Path
    size: int
    target: str | None
    compiler_version: str | None
    age_s: float  # since written
    idle_s: float  # since last read or write (the LRU clock)
    ok: bool
    error: str | None = None


def _read_fd(fd: int, size: int) -> bytes:
    chunks, got = [], 0
    while True:
        b = os.read(fd, max(size - got, 1 << 20))
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        got += len(b)


def _peek_file(path: Path) -> tuple[ContainerMeta | None, str | None]:
    """Meta of a cache file via mmap (only the header pages are read) or the reason it is unreadable."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None, "empty file"
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            err = None
            try:
                meta = peek_meta(mm)
            except ContextFormatError as e:
                meta, err = None, str(e)
            try:
                mm.close()
            except BufferError:  # a view is still alive somewhere: let the GC unmap it
                pass
            return meta, err
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"


class CacheStore:
    """A directory of context binaries keyed by ``cache_key``; ``max_bytes`` caps the total size (LRU)."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}")
        self.root = Path(root)
        self.max_bytes = max_bytes

    def path_for(self, key: str) -> Path:
        """Where the entry for ``key`` lives (whether or not it exists)."""
        return self.root / f"{check_key(key)}{SUFFIX}"

    # ------------------------------------------------------------------------------------------------ reading

    def get(self, key: str) -> bytes | None:
        """The verified bytes of ``key``, or None (missing, unreadable, or corrupt: then removed + warning)."""
        path = self.path_for(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            _warn(f"cannot read {path}: {e.strerror or e}; compiling without the cache")
            return None
        try:
            st = os.fstat(fd)
            data = _read_fd(fd, st.st_size)
        except OSError as e:
            _warn(f"cannot read {path}: {e.strerror or e}; compiling without the cache")
            return None
        finally:
            os.close(fd)
        try:
            verify(data)
        except ContextFormatError as e:
            self._remove_if_same(path, st)
            _warn(f"removed corrupt entry {path} ({e}); it will be rebuilt")
            return None
        try:  # LRU clock: reads refresh the access time explicitly (relatime/noatime mounts would not)
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
        except OSError:
            pass
        return data

    @staticmethod
    def _remove_if_same(path: Path, st: os.stat_result) -> None:
        """Unlink ``path`` only if it is still the file we read (a concurrent writer may have replaced it)."""
        try:
            now = os.stat(path)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(path)
        except OSError:
            pass

    # ------------------------------------------------------------------------------------------------ writing

    def put(self, key: str, data: bytes) -> Path | None:
        """Store ``data`` (a packed container) atomically; None + warning if the directory is unusable.

        Raises only for caller bugs: a bad key (ValueError) or bytes that are not a container (ContextFormatError).
        """
        path = self.path_for(key)
        peek_meta(data)
        if self.max_bytes is not None and len(data) > self.max_bytes:
            _warn(f"entry {key[:16]} is {len(data)} bytes, above the cache cap of {self.max_bytes}; not cached")
            return None
        tmp = self.root / f".{key}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        fd = -1
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except OSError as e:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            reason = "disk full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
            _warn(f"cannot write {path}: {reason}; continuing without caching")
            return None
        self._fsync_dir()
        if self.max_bytes is not None:
            self._evict(keep=path)
        return path

    def _fsync_dir(self) -> None:
        try:  # make the rename durable; best effort (not all file systems allow it)
            dfd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    # ---------------------------------------------------------------------------------------------- housekeeping

    def _scan(self) -> list[tuple[str, Path, os.stat_result]]:
        """(key, path, stat) of every entry file; silently skips files that vanish while scanning."""
        out = []
        try:
            it = list(os.scandir(self.root))
        except OSError:
            return []
        for de in it:
            name = de.name
            if not name.endswith(SUFFIX) or not _KEY_RE.fullmatch(name[: -len(SUFFIX)]):
                continue
            try:
                out.append((name[: -len(SUFFIX)], Path(de.path), de.stat()))
            except OSError:
                continue
        return sorted(out, key=lambda t: t[0])

    def _sweep_tmp(self, force: bool = False) -> int:
        """Remove temp files of dead or long-gone writers (all of them if ``force``); returns the count."""
        n = 0
        try:
            it = list(os.scandir(self.root))
        except OSError:
            return 0
        now = time.time()
        for de in it:
            if not (de.name.startswith(".") and de.name.endswith(TMP_SUFFIX)):
                continue
            try:
                if force or now - de.stat().st_mtime > TMP_MAX_AGE_S or not _pid_alive(de.name):
                    os.unlink(de.path)
                    n += 1
            except OSError:
                continue
        return n

    def _evict(self, keep: Path | None = None) -> list[str]:
        """Remove least-recently-used entries until the total is within ``max_bytes``; returns removed keys."""
        if self.max_bytes is None:
            return []
        self._sweep_tmp()
        files = self._scan()
        total = sum(st.st_size for _, _, st in files)
        removed = []
        for key, path, st in sorted(files, key=lambda t: (t[2].st_atime_ns, t[0])):
            if total <= self.max_bytes:
                break
            if keep is not None and path == keep:
                continue
            try:
                os.unlink(path)
                removed.append(key)
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total -= st.st_size
        return removed

    def total_bytes(self) -> int:
        """Sum of entry sizes in bytes."""
        return sum(st.st_size for _, _, st in self._scan())

    def entries(self) -> list[CacheEntry]:
        """All entries with size, target, compiler version and ages; ``ok`` checks only the header hash (cheap)."""
        now = time.time()
        out = []
        for key, path, st in self._scan():
            meta, err = _peek_file(path)
            out.append(CacheEntry(key, path, st.st_size, meta.target_name if meta else None,
                                  meta.compiler_version if meta else None, max(0.0, now - st.st_mtime),
                                  max(0.0, now - st.st_atime), meta is not None, err))
        return out

    def verify_all(self, remove_corrupt: bool = False) -> list[CacheEntry]:
        """Like ``entries`` but checks every hash of every entry; optionally removes the corrupt ones."""
        out = []
        for e in self.entries():
            if e.ok:
                try:
                    verify(e.path.read_bytes())
                except ContextFormatError as exc:
                    e = replace(e, ok=False, error=str(exc))
                except OSError as exc:
                    e = replace(e, ok=False, error=f"unreadable: {exc.strerror or exc}")
            if not e.ok and remove_corrupt:
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
            out.append(e)
        return out

    def clear(self) -> int:
        """Remove every entry and temp file (only files this store names); returns how many were removed."""
        n = self._sweep_tmp(force=True)
        for _, path, _ in self._scan():
            try:
                os.unlink(path)
                n += 1
            except OSError:
                pass
        return n


def _pid_alive(tmp_name: str) -> bool:
    """Whether the writer pid encoded in a temp file name (``.<key>.<pid>.<rand>.tmp``) still runs here."""
    parts = tmp_name.split(".")
    try:
        pid = int(parts[2])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
