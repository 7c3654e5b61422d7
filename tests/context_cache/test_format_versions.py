"""Format version 2 hashes sections with BLAKE3; a version 1 container (SHA-256 sections, an older NpuEP's) is
refused as incompatible with how to recompile, never parsed, and the cache removes such an entry and rebuilds it."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from blake3 import blake3

from npu_ep.context_cache import container as C
from npu_ep.context_cache.errors import ContextIncompatibleError
from npu_ep.context_cache.store import CacheStore, CacheWarning

from ._helpers import as_format_1, meta_for, small_container, split

KEY = "c3" * 32
W = np.arange(24, dtype=np.int16).reshape(4, 6)


def test_sections_carry_their_blake3_digest() -> None:
    raw = small_container()
    doc, data = split(raw)
    assert C.FORMAT_VERSION == 2 and C.PREFIX.unpack_from(raw, 0)[1] == 2
    for row in doc["arrays"]:
        assert set(row) == {"name", "dtype", "shape", "offset", "nbytes", "blake3"}
        assert row["blake3"] == blake3(data[row["offset"]:row["offset"] + row["nbytes"]]).hexdigest()
        assert row["blake3"] != hashlib.sha256(data[row["offset"]:row["offset"] + row["nbytes"]]).hexdigest()


def test_a_version_1_container_is_incompatible_and_says_how_to_recompile(tmp_path) -> None:
    old = as_format_1(small_container())
    for read in (C.unpack, C.peek_meta, lambda b: C.unpack(b, verify=False)):
        with pytest.raises(ContextIncompatibleError, match=r"format_version at offset 8 is 1 \(written by an older "
                                                           r"NpuEP\).*ep\.context_enable=1 to recompile"):
            read(old)
    path = tmp_path / "old.npuctx"
    path.write_bytes(old)
    with pytest.raises(ContextIncompatibleError, match=r"old\.npuctx: .*is 1 \(written by an older"):
        C.load_file(path)


def test_a_version_1_cache_entry_is_removed_with_a_warning_and_rebuilt(tmp_path) -> None:
    store = CacheStore(tmp_path)
    old = as_format_1(C.pack({"ops": []}, {"w": W}, meta=meta_for(KEY)))
    store.path_for(KEY).write_bytes(old)
    with pytest.warns(CacheWarning, match="written by an older NpuEP"):
        assert store.get(KEY) is None
    assert not store.path_for(KEY).exists()
    fresh = C.pack({"ops": []}, {"w": W}, meta=meta_for(KEY))
    assert store.put(KEY, fresh) is not None and bytes(store.get(KEY)) == fresh

