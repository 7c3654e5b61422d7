"""The on-disk cache of compiled context binaries: one file per key, atomic writes, verified reads, LRU cap.

Why this shape: several processes may compile the same model at once, a process may die mid-write, disks fill
up and directories can be read-only. So every write goes to a private temp file in the same directory, is
fsync'ed and then ``os.replace``d over the entry (readers see the old file or the new one, never a mix); every
read checks all hashes, and a corrupt entry is removed with a warning so the caller rebuilds it. I/O problems
degrade to "no cache" with a warning; they never fail the session.

Layout: ``<root>/<key>.npuctx``; an entry's ``meta.source_key`` must equal its key (a file copied over another
key's name is refused like a corrupt one). Entries are read through ``fileio`` (regular files only, size checked
against the header first). Temp files are ``npu_ep._atomic``'s ``<root>/.<key>.npuctx.<pid>.<random>.tmp``, never
read, and swept once their writer is gone; no other file in the folder is ever touched.
"""

from __future__ import annotations

import errno
import os
import re
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from .._atomic import atomic_write_bytes, atomic_writer, temp_name_pattern
from .container import ContainerExpect, ContainerMeta, PackedContainer, peek_meta, unpack
from .digest_memo import DigestMemo
from .errors import ContextFormatError, ContextTooLargeError
from .fileio import map_container, read_container

ENV_CACHE_DIR = "NPU_EP_CACHE_DIR"
SUFFIX = ".npuctx"
TMP_MAX_AGE_S = 3600.0  # a temp file older than this (seconds) belongs to a dead writer
_KEY_RE = re.compile(r"[0-9a-f]{16,128}")
# the cache's own temp names: npu_ep._atomic's for an entry, and the older ``.<key>.<pid>.<random>.tmp``
_TMP_RES = (temp_name_pattern(_KEY_RE.pattern + re.escape(SUFFIX)),
            re.compile(r"\.[0-9a-f]{16,128}\.(?P<pid>[0-9]+)\.[0-9a-f]{1,32}\.tmp"))


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


def _check_entry(key: str, data: bytes | memoryview) -> None:
    """Every hash, and the binding: the entry must have been written for ``key`` (not copied from another key)."""
    unpack(data, expect=ContainerExpect(source_key=key))


def _peek_file(key: str, path: Path) -> tuple[ContainerMeta | None, str | None]:
    """Meta of a cache file via mmap (only the header pages are read) or the reason it cannot be used."""
    try:
        mm = map_container(path)
    except ContextFormatError as e:
        return None, str(e)
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    try:
        meta = peek_meta(mm)
    except ContextFormatError as e:
        return None, str(e)
    finally:
        try:
            mm.close()
        except BufferError:  # a view is still alive somewhere: let the GC unmap it
            pass
    if meta.source_key != key:
        return meta, (f"written for key {meta.source_key[:16]}..., not {key[:16]}... (a copied or swapped file)")
    return meta, None


class CacheStore:
    """A directory of context binaries keyed by ``cache_key``; ``max_bytes`` caps the total size (LRU)."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}")
        self.root = Path(root)
        self.max_bytes = max_bytes

    def digest_memo(self) -> DigestMemo:
        """The digests of file-backed weights remembered in this cache folder (``digest_memo``)."""
        return DigestMemo(self.root)

    def path_for(self, key: str) -> Path:
        """Where the entry for ``key`` lives (whether or not it exists)."""
        return self.root / f"{check_key(key)}{SUFFIX}"

    # ------------------------------------------------------------------------------------------------ reading

    def get(self, key: str) -> memoryview | None:
        """The verified bytes of ``key`` (``fileio.read_container``), or None: missing, unreadable, larger than
        ``max_bytes`` (left in place with a warning: it may be valid, it just does not fit this store's cap), or
        refused (corrupt, written for another key, not a regular file, size contradicting its header): then removed
        with a warning, so it is rebuilt."""
        path = self.path_for(key)
        try:
            st = os.lstat(path)  # what a refused entry is compared with before it is unlinked
            data = read_container(path, self.max_bytes)
            _check_entry(key, data)
        except FileNotFoundError:
            return None
        except ContextTooLargeError as e:  # not read, so not judged: another session with a larger cap may use it
            _warn(f"{e}: the entry does not fit this cache's cap (cache_max_bytes), so it is left in place and "
                  f"not used; compiling without it")
            return None
        except ContextFormatError as e:
            self._remove_if_same(path, st)
            _warn(f"removed corrupt entry {path} ({e}); it will be rebuilt")
            return None
        except (OSError, MemoryError) as e:
            reason = "not enough memory" if isinstance(e, MemoryError) else (e.strerror or str(e))
            _warn(f"cannot read {path}: {reason}; compiling without the cache")
            return None
        try:  # LRU clock: reads refresh the access time explicitly (relatime/noatime mounts would not)
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)
        except OSError:
            pass
        return data

    @staticmethod
    def _remove_if_same(path: Path, st: os.stat_result) -> None:
        """Unlink ``path`` only if it is still the file we read (a concurrent writer may have replaced it)."""
        try:
            now = os.lstat(path)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(path)
        except OSError:
            pass

    # ------------------------------------------------------------------------------------------------ writing

    def put(self, key: str, data: bytes | PackedContainer) -> Path | None:
        """Store ``data`` (a packed container, or a ``PackedContainer`` streamed to the file section by section)
        atomically; None + warning if the directory is unusable.

        Raises only for caller bugs: a bad key (ValueError) or bytes that are not a container (ContextFormatError).
        """
        path = self.path_for(key)
        streamed = isinstance(data, PackedContainer)
        bound = data.meta.source_key if streamed else peek_meta(data).source_key
        if bound != key:
            raise ValueError(f"cache entry for key {key[:16]}... holds a container written for {bound[:16]}...: "
                             f"meta.source_key must be the key")
        size = data.nbytes if streamed else len(data)
        if self.max_bytes is not None and size > self.max_bytes:
            _warn(f"entry {key[:16]} is {size} bytes, above the cache cap of {self.max_bytes}; not cached")
            return None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if streamed:
                with atomic_writer(path) as f:
                    data.write_to(f)
            else:
                atomic_write_bytes(path, data)
        except OSError as e:
            reason = "disk full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
            _warn(f"cannot write {path}: {reason}; continuing without caching")
            return None
        self._sweep_tmp()
        if self.max_bytes is not None:
            self._evict(keep=path)
        return path

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
                out.append((name[: -len(SUFFIX)], Path(de.path), de.stat(follow_symlinks=False)))
            except OSError:
                continue
        return sorted(out, key=lambda t: t[0])

    def _sweep_tmp(self, force: bool = False) -> int:
        """Remove the cache's own temp files whose writer is gone (pid not running, or older than an hour), all of
        them if ``force``; any other file, dotfile or not, is left alone. Returns the count."""
        n = 0
        try:
            it = list(os.scandir(self.root))
        except OSError:
            return 0
        now = time.time()
        for de in it:
            m = next((m for r in _TMP_RES if (m := r.fullmatch(de.name))), None)
            if m is None:
                continue
            try:
                if (force or now - de.stat(follow_symlinks=False).st_mtime > TMP_MAX_AGE_S
                        or not _pid_alive(int(m["pid"]))):
                    os.unlink(de.path)
                    n += 1
            except OSError:
                continue
        return n

    def _evict(self, keep: Path | None = None) -> list[str]:
        """Remove least-recently-used entries until the total is within ``max_bytes``; returns removed keys."""
        if self.max_bytes is None:
            return []
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
            meta, err = _peek_file(key, path)
            out.append(CacheEntry(key, path, st.st_size, meta.target_name if meta else None,
                                  meta.compiler_version if meta else None, max(0.0, now - st.st_mtime),
                                  max(0.0, now - st.st_atime), err is None, err))
        return out

    def verify_all(self, remove_corrupt: bool = False) -> list[CacheEntry]:
        """Like ``entries`` but checks every hash of every entry; optionally removes the corrupt ones."""
        out = []
        for e in self.entries():
            if e.ok:
                try:
                    _check_entry(e.key, read_container(e.path))
                except ContextFormatError as exc:
                    e = replace(e, ok=False, error=str(exc))
                except (OSError, MemoryError) as exc:
                    reason = "not enough memory" if isinstance(exc, MemoryError) else (exc.strerror or exc)
                    e = replace(e, ok=False, error=f"unreadable: {reason}")
            if not e.ok and remove_corrupt:
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
            out.append(e)
        return out

    def clear(self) -> int:
        """Remove every entry and temp file (only files this store names); returns how many were removed."""
        n = self._sweep_tmp(force=True) + self.digest_memo().clear()
        for _, path, _ in self._scan():
            try:
                os.unlink(path)
                n += 1
            except OSError:
                pass
        return n


def _pid_alive(pid: int) -> bool:
    """Whether the writer pid of a temp file still runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:  # no such pid can exist
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True
