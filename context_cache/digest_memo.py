"""Remembered BLAKE3 digests of weights a file backs, so a warm start from the cache need not read every weight byte
to make its key.

Why: the cache key hashes every initializer (``keys.cache_key``), 0.5 GB for a 1B int4 decoder, at every session
start. ORT maps an external data file's initializers; an array whose bytes are a private mapping of a regular file
(``/proc/self/maps``), none of whose pages were written (``/proc/self/pagemap``: file pages or not in memory, so no
copy-on-write page differs from the file), holds exactly the file's bytes at that offset. Their digest is stored in
the cache folder under the file's identity: device, inode, size, modification and status-change times in ns. Any
change to the file's bytes changes its status-change time, which no user can set, so a later start with an equal
identity reads the same bytes and may take the stored digest. A digest is stored only for a file whose times are
SETTLE_NS older than the hashing's start and that has the same identity after it (no change while hashed can share
a timestamp with the stored one). Anything else (no /proc, an anonymous or written page, a copy, a renamed or
changed file) is hashed as before.

Trust: the memo lives in the cache folder and is as trusted as its entries (whoever can write one can write the
other); a memo file is parsed as strict JSON with a size cap and must name the identity it is stored under.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from .._atomic import atomic_write_bytes, temp_name_pattern
from .file_pages import PAGE, _all_file_backed

MEMO_DIR = "digests"
SUFFIX = ".json"
SETTLE_NS = 2_000_000_000  # a file changed this recently (before hashing began) is not remembered
MAX_MEMO_BYTES = 1 << 20
_NAME_RE = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX))
TMP_RE = temp_name_pattern(_NAME_RE.pattern)
_HEX64 = re.compile(r"[0-9a-f]{64}")

Identity = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class FileRanges:
    """Which file range each array's bytes are, from one read of ``/proc/self/maps`` (empty where there is none)."""

    def __init__(self) -> None:
        self._maps: list[tuple[int, int, int, int, int, str]] = []  # start, end, file offset, dev, inode, path
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/") or fields[5].endswith(" (deleted)"):
                continue
            try:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                self._maps.append((lo, hi, int(fields[2], 16), os.makedev(major, minor), int(fields[4]), fields[5]))
            except ValueError:
                continue
        self._maps.sort()
        self._starts = [m[0] for m in self._maps]

    def locate(self, raw: memoryview) -> tuple[str, Identity, int] | None:
        """(path, identity, file offset) of the bytes ``raw`` views, or None: not one private file mapping, the file
        is not that inode any more, or a page is not the file's."""
        if not self._maps or raw.nbytes == 0:
            return None
        address = np.frombuffer(raw, np.uint8).ctypes.data
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        lo, hi, offset, dev, inode, path = self._maps[i]
        if address + raw.nbytes > hi:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != (dev, inode):
            return None
        first = address // PAGE
        if not _all_file_backed(first, (address + raw.nbytes - 1) // PAGE - first + 1):
            return None
        return path, _identity(st), offset + address - lo


class DigestMemo:
    """The digests stored under ``<cache root>/digests``: one JSON file per file identity."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.folder = Path(root) / MEMO_DIR
        self._tables: dict[Identity, dict[str, str]] = {}
        self._new: dict[Identity, tuple[str, int, dict[str, str]]] = {}  # identity -> path, started ns, ranges

    @staticmethod
    def _name(ident: Identity) -> str:
        return hashlib.sha256(":".join(map(str, ident)).encode()).hexdigest()[:32] + SUFFIX

    def _table(self, ident: Identity) -> dict[str, str]:
        if ident not in self._tables:
            self._tables[ident] = self._read(ident)
        return self._tables[ident]

    def _read(self, ident: Identity) -> dict[str, str]:
        try:
            fd = os.open(self.folder / self._name(ident), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            raw = os.read(fd, MAX_MEMO_BYTES + 1)
        except OSError:
            return {}
        finally:
            os.close(fd)
        try:
            doc = json.loads(raw) if len(raw) <= MAX_MEMO_BYTES else None
        except (ValueError, RecursionError):
            return {}
        if (not isinstance(doc, dict) or doc.get("file") != list(ident) or not isinstance(doc.get("ranges"), dict)
                or not all(isinstance(v, str) and _HEX64.fullmatch(v) for v in doc["ranges"].values())):
            return {}
        return dict(doc["ranges"])

    def get(self, where: tuple[str, Identity, int], nbytes: int) -> bytes | None:
        """The stored digest of ``nbytes`` at the located range, or None."""
        hexdigest = self._table(where[1]).get(f"{where[2]}+{nbytes}")
        return bytes.fromhex(hexdigest) if hexdigest else None

    def put(self, where: tuple[str, Identity, int], nbytes: int, digest: bytes, started_ns: int) -> None:
        """Remember a digest computed from ``started_ns`` on (kept for ``flush``) if the file had settled by then."""
        path, ident, offset = where
        if max(ident[3], ident[4]) > started_ns - SETTLE_NS:
            return
        entry = self._new.setdefault(ident, (path, started_ns, {}))
        entry[2][f"{offset}+{nbytes}"] = digest.hex()

    def flush(self) -> None:
        """Write the new digests of each file that still has the identity it was hashed with; I/O errors are
        ignored (the next start hashes again)."""
        for ident, (path, _, ranges) in self._new.items():
            try:
                if _identity(os.stat(path)) != ident:
                    continue
                table = {**self._table(ident), **ranges}
                doc = {"file": list(ident), "ranges": table}
                self.folder.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(self.folder / self._name(ident), json.dumps(doc, sort_keys=True).encode())
                self._tables[ident] = table
            except OSError:
                continue
        self._new.clear()

    def clear(self) -> int:
        """Remove every memo file and memo temp file; returns how many."""
        n = 0
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        for name in names:
            if _NAME_RE.fullmatch(name) or TMP_RE.fullmatch(name):
                try:
                    os.unlink(self.folder / name)
                    n += 1
                except OSError:
                    pass
        return n
