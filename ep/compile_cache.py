"""The compiled-program cache: a partition's program is stored under a key of everything that changes it and
loaded instead of compiled on the next session start.

The key hashes the canonical subgraph (with initializer bytes), the target description, the compiler version and
the I/O signature. A hit loads the stored program (no prepare, no re-packing); a corrupt, stale or incompatible
entry is rebuilt with a warning, never trusted. Entries refer to the weights the program reads in place from ORT's
initializers instead of holding a copy (``borrowed_refs``); the EPContext payload stays self-contained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..context_cache.container import PackedContainer, packed, unpack
from ..context_cache.digest_memo import DigestMemo
from ..context_cache.errors import ContextFormatError
from ..context_cache.keys import cache_key
from ..context_cache.store import CacheStore
from ..kernels.layout import host_mode
from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.target import Target
from . import compiler_version
from .borrowed_refs import BorrowedRefs
from ..log import logger
from .program import Program
from .program_io import ProgramFormatError, program_from_parts, program_to_parts


def subgraph_key(nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo],
                 target: Target, memo: DigestMemo | None = None) -> str:
    """Everything that changes the compiled result, and nothing else (not ORT's partition names; the layout this
    host compiles ``auto`` in, ``kernels.layout.host_mode``); ``memo``: the
    cache's remembered digests of weights a file backs (``context_cache.digest_memo``)."""
    parts: list[Any] = [compiler_version.COMPILER_VERSION, target.digest, host_mode(target),
                        [[v.name, str(v.dtype), _shape(v.shape)] for v in inputs],
                        [[v.name, str(v.dtype), _shape(v.shape)] for v in outputs]]
    for n in nodes:
        parts.append({"op": [n.domain, n.op_type], "attrs": {k: _plain(v) for k, v in sorted(n.attrs.items())},
                      "in": [[v.name, str(v.dtype), _shape(v.shape), v.is_constant] for v in n.inputs],
                      "out": [[v.name, str(v.dtype), _shape(v.shape)] for v in n.outputs]})
        for v in n.inputs:
            if v.value is not None:
                parts.append(v.value)
    return cache_key(*parts, memo=memo)


def _shape(shape) -> list | None:
    return None if shape is None else [d if d is not None else "?" for d in shape]


def _plain(v: Any) -> Any:
    if hasattr(v, "cache_digest"):  # an If's branch graph (kernels.ops.control_flow.BranchGraph)
        return v.cache_digest()
    if hasattr(v, "tolist"):
        return {"tensor": v.tolist(), "dtype": str(v.dtype)}
    if isinstance(v, bytes):
        return v.hex()
    return v


class CompileCache:
    """Compiles through the store (``store=None``: no cache). ``stats`` counts hits, misses and rebuilt entries."""

    def __init__(self, store: CacheStore | None, target: Target, *, record: bool, stats: dict[str, int]):
        self.store = store
        self.target = target
        self.record = record
        self.stats = stats

    def compile_cached(self, name: str, nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo],
                       outputs: Sequence[ValueInfo], build: Callable[[], Program], *,
                       need_blob: bool = False) -> tuple[Program, bytes | None]:
        """Program for a partition and its self-contained packed bytes (for an EPContext node; None unless
        ``need_blob``)."""
        if self.store is None and not need_blob:
            self.stats["misses"] += 1
            return build(), None
        key = subgraph_key(nodes, inputs, outputs, self.target,
                           self.store.digest_memo() if self.store is not None else None)
        refs = BorrowedRefs(nodes)
        program = None
        if self.store is not None:
            entry = self.store.get(key)
            if entry is not None:
                try:
                    program = self._program_from_blob(entry, name, refs)
                    self.stats["hits"] += 1
                    logger.info("partition %s: loaded from cache %s", name, key[:12])
                except (ContextFormatError, ProgramFormatError) as exc:
                    logger.warning("cache entry %s for partition %s is unusable (%s); recompiling", key[:12], name,
                                   exc)
                    self.stats["rebuilt"] += 1  # put() below replaces the entry atomically
        if program is None:
            self.stats["misses"] += 1
            program = build()
            if self.store is not None:
                self.store.put(key, self._packed(program, key, refs))  # streamed: no copy of its arrays
        return program, self._packed(program, key, None).to_bytes() if need_blob else None

    def _packed(self, program: Program, key: str, refs: BorrowedRefs | None) -> PackedContainer:
        header, arrays = program_to_parts(program, refs)
        return packed(header, arrays, meta=compiler_version.stamp(self.target, key))

    def _program_from_blob(self, blob: bytes | memoryview, name: str, refs: BorrowedRefs) -> Program:
        container = unpack(blob, expect=compiler_version.expected(self.target), verify=False)  # get() hashed it
        return program_from_parts(container.header, container.arrays, self.target, name=name, record=self.record,
                                  refs=refs)
