"""npu_ep.context_cache: the compiled context binary format, cache keys and the on-disk cache (see FORMAT.md).

May import: of npu_ep, ``_atomic`` only (a bottom layer beside ``models`` and ``quantization``, importing neither);
numpy, blake3 and platformdirs.
"""

from __future__ import annotations

from .container import (FORMAT_VERSION, Container, ContainerExpect, ContainerMeta, load_file, pack, peek_meta,
                        unpack, verify)
from .errors import ContextFileError, ContextFormatError, ContextIncompatibleError, ContextTooLargeError
from .keys import cache_key, canonical_json
from .store import CacheEntry, CacheStore, CacheWarning, default_cache_dir

__all__ = ["FORMAT_VERSION", "CacheEntry", "CacheStore", "CacheWarning", "Container", "ContainerExpect",
           "ContainerMeta", "ContextFileError", "ContextFormatError", "ContextIncompatibleError",
           "ContextTooLargeError", "cache_key", "canonical_json", "default_cache_dir", "load_file", "pack", "peek_meta",
           "unpack", "verify"]
