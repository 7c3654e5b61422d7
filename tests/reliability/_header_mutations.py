"""Hostile-but-well-formed containers: valid hashes around a mutated program header or mutated const arrays.

Hashes prove integrity, not authorship, so these reach ``program_from_parts`` and the kernels: they must fail with
an exception (or run), never crash, hang or allocate without bound."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_ep.context_cache.container import pack, unpack

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**63), st.sampled_from([0, -1, 1, 2, 3, 10**12, 2**31, -2**31]),
    st.floats(allow_nan=True), st.text(max_size=12), st.lists(st.integers(-3, 10**9), max_size=5),
    st.sampled_from([["", "Relu"], ["", "MatMul"], ["com.microsoft", "GroupQueryAttention"], ["", "NoSuchOp"],
                     [1, 2], [], {"a": 1}, "../../etc/passwd", "__import__('os')"]),
    st.dictionaries(st.text(max_size=6), st.integers(-5, 5), max_size=3),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _set(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def fuzz_headers(payload: bytes, check: Callable[[bytes], None], n: int) -> None:
    c = unpack(payload)
    header, arrays, meta = c.header, {k: np.array(v) for k, v in c.arrays.items()}, c.meta
    paths = _paths(header)
    names = sorted(arrays)

    array_mut = st.tuples(st.sampled_from(names), st.sampled_from(["shape", "dtype", "empty", "nan", "big"]))

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, len(paths) - 1), HOSTILE, st.booleans()), min_size=0, max_size=3),
           st.lists(array_mut, max_size=2))
    def fuzz(edits, array_edits):
        h = copy.deepcopy(header)
        for idx, value, delete in edits:
            live = _paths(h)
            path = live[idx % len(live)]
            try:
                h = _set(h, path, value, delete and bool(path))
            except (KeyError, IndexError, TypeError):
                pass
        if not isinstance(h, dict):
            h = {"junk": h}
        arrs = dict(arrays)
        for name, how in array_edits:
            a = arrs[name]
            arrs[name] = {"shape": a.reshape(-1)[: max(a.size - 1, 0)], "dtype": a.astype(np.float64),
                          "empty": np.zeros((0,), a.dtype),
                          "nan": np.full_like(a, np.nan) if a.dtype.kind == "f" else a,
                          "big": np.zeros((4096, 16), a.dtype)}[how]
        try:
            blob = pack(h, arrs, meta=meta)
        except (TypeError, ValueError):
            return
        check(blob)

    fuzz()
