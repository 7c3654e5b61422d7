"""A session's compiled contexts: the compile cache and EPContext nodes, sharing one ``stats`` counter.

Built from what it needs (options, target, EP name), not from the session that owns it. The cache lives in
``compile_cache``, ORT's EPContext contract in ``epcontext``, the version stamp in ``compiler_version``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..context_cache.store import CacheStore, default_cache_dir
from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.target import Target
from .compile_cache import CompileCache
from .epcontext import EpContext
from .options import EpOptions
from .program import Program


class CompiledPrograms:
    """A session's compiled programs: from the compile cache or an EPContext node, else built and cached."""

    def __init__(self, options: EpOptions, target: Target, ep_name: str):
        self.options = options
        self.target = target
        self.store: CacheStore | None = None
        if options.cache_dir != "":
            self.store = CacheStore(options.cache_dir or default_cache_dir(), options.cache_max_bytes)
        self.stats = {"hits": 0, "misses": 0, "rebuilt": 0, "epcontext_loads": 0}
        self.cache = CompileCache(self.store, target, record=options.record_tensors, stats=self.stats)
        self.epcontext = EpContext(options, target, ep_name, stats=self.stats)

    def compile_cached(self, name: str, nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo],
                       outputs: Sequence[ValueInfo], build: Callable[[], Program]) -> tuple[Program, bytes | None]:
        """Program for a partition and its packed bytes (None when neither cache nor EPContext needs them)."""
        return self.cache.compile_cached(name, nodes, inputs, outputs, build, need_blob=self.options.context_enable)

    def epcontext_spec(self, name: str, blob: bytes, graph: Mapping[str, Any]) -> dict[str, Any]:
        return self.epcontext.spec(name, blob, graph)

    def load_epcontext(self, name: str, node: NodeInfo, inputs: Sequence[ValueInfo],
                       outputs: Sequence[ValueInfo], graph: Mapping[str, Any]) -> Program:
        return self.epcontext.load(name, node, inputs, outputs, graph)
