"""Compiled contexts: the on-disk cache and ORT's EPContext contract, on top of ``npu_ep.context_cache``.

- ``compile_cached``: key = hash(canonical subgraph incl. initializer bytes, target description, compiler
  version, I/O signature); a hit loads the stored program (no prepare, no re-packing); a corrupt, stale or
  incompatible entry is rebuilt with a warning, never trusted.
- ``epcontext_spec``: the attributes of the EPContext node emitted with ``ep.context_enable=1``.
- ``load_epcontext``: run a ``_ctx.onnx`` without recompiling; refuses payload paths outside the model's folder and
  contexts compiled for another target or compiler version, saying what differs and how to recompile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from .._atomic import atomic_write_bytes
from ..context_cache.container import FORMAT_VERSION, ContainerExpect, ContainerMeta, pack, unpack
from ..context_cache.errors import ContextFileError, ContextFormatError, ContextIncompatibleError
from ..context_cache.fileio import read_container
from ..context_cache.keys import cache_key
from ..context_cache.store import CacheStore, default_cache_dir
from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.target import Target
from .log import logger
from .program import Program
from .program_io import ProgramFormatError, program_from_parts, program_to_parts

if TYPE_CHECKING:
    from .bridge import EpSession

# Bump the suffix whenever a change to the compiler or a kernel's prepared layout changes compiled programs.
COMPILER_VERSION = f"{__version__}+c4"  # c4: pool attrs (auto_pad, 1-D); c3: packed MatMulNBits; c2: fusions
COMPAT_PREFIX = "npu_ep"


class EpContextError(RuntimeError):
    pass


def compatibility_info(target: Target) -> str:
    return f"{COMPAT_PREFIX};compiler={COMPILER_VERSION};format={FORMAT_VERSION};target={target.name};" \
           f"target_hash={target.digest}"


def _parse_info(info: str) -> dict[str, str]:
    fields = info.split(";")
    if not fields or fields[0] != COMPAT_PREFIX:
        return {}
    return dict(f.split("=", 1) for f in fields[1:] if "=" in f)


def validate_compatibility_info(info: str) -> int:
    """OrtCompiledModelCompatibility for a compiled model's info string (0 n/a, 1 optimal, 3 unsupported)."""
    fields = _parse_info(info)
    if not fields:
        return 0
    if fields.get("compiler") != COMPILER_VERSION or fields.get("format") != str(FORMAT_VERSION):
        return 3
    return 1


def subgraph_key(nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo],
                 target: Target) -> str:
    """Everything that changes the compiled result, and nothing else (not ORT's partition names)."""
    parts: list[Any] = [COMPILER_VERSION, target.digest,
                        [[v.name, str(v.dtype), _shape(v.shape)] for v in inputs],
                        [[v.name, str(v.dtype), _shape(v.shape)] for v in outputs]]
    for n in nodes:
        parts.append({"op": [n.domain, n.op_type], "attrs": {k: _plain(v) for k, v in sorted(n.attrs.items())},
                      "in": [[v.name, str(v.dtype), _shape(v.shape), v.is_constant] for v in n.inputs],
                      "out": [[v.name, str(v.dtype), _shape(v.shape)] for v in n.outputs]})
        for v in n.inputs:
            if v.value is not None:
                parts.append(v.value)
    return cache_key(*parts)


def _shape(shape) -> list | None:
    return None if shape is None else [d if d is not None else "?" for d in shape]


def _plain(v: Any) -> Any:
    if hasattr(v, "tolist"):
        return {"tensor": v.tolist(), "dtype": str(v.dtype)}
    if isinstance(v, bytes):
        return v.hex()
    return v


class ContextManager:
    def __init__(self, session: "EpSession"):
        self.session = session
        opts = session.options
        self.store: CacheStore | None = None
        if opts.cache_dir != "":
            root = opts.cache_dir or default_cache_dir()
            self.store = CacheStore(root, opts.cache_max_bytes)
        self.stats = {"hits": 0, "misses": 0, "rebuilt": 0, "epcontext_loads": 0}

    def _expect(self) -> ContainerExpect:
        t = self.session.target
        return ContainerExpect(target_name=t.name, target_hash=t.digest, compiler_version=COMPILER_VERSION)

    def _meta(self, key: str) -> ContainerMeta:
        t = self.session.target
        return ContainerMeta(COMPILER_VERSION, t.name, t.digest, key)

    def compile_cached(self, name: str, nodes: Sequence[NodeInfo], inputs: Sequence[ValueInfo],
                       outputs: Sequence[ValueInfo], build: Callable[[], Program]) -> tuple[Program, bytes | None]:
        """Program for a partition and its packed bytes (None when neither cache nor EPContext needs them)."""
        need_blob = self.store is not None or self.session.options.context_enable
        key = subgraph_key(nodes, inputs, outputs, self.session.target) if need_blob else ""
        if self.store is not None:
            blob = self.store.get(key)
            if blob is not None:
                try:
                    program = self._program_from_blob(blob, name, verified=True)
                    self.stats["hits"] += 1
                    logger.info("partition %s: loaded from cache %s", name, key[:12])
                    return program, blob
                except (ContextFormatError, ProgramFormatError) as exc:
                    logger.warning("cache entry %s for partition %s is unusable (%s); recompiling", key[:12], name,
                                   exc)
                    self.stats["rebuilt"] += 1  # put() below replaces the entry atomically
        self.stats["misses"] += 1
        program = build()
        if not need_blob:
            return program, None
        header, arrays = program_to_parts(program)
        blob = pack(header, arrays, meta=self._meta(key))
        if self.store is not None:
            self.store.put(key, blob)
        return program, blob

    def _program_from_blob(self, blob: bytes | memoryview, name: str, *, verified: bool = False) -> Program:
        container = unpack(blob, expect=self._expect(), verify=not verified)  # store.get already hashed it
        return program_from_parts(container.header, container.arrays, self.session.target, name=name,
                                  record=self.session.options.record_tensors)

    # -- EPContext dump ------------------------------------------------------------------------------------------
    def epcontext_spec(self, name: str, blob: bytes, graph: Mapping[str, Any]) -> dict[str, Any]:
        opts = self.session.options
        model_path = graph.get("model_path", "")
        attrs: dict[str, Any] = {
            "main_context": 1,
            "embed_mode": opts.context_embed_mode,
            "ep_sdk_version": COMPILER_VERSION,
            # ORT matches an EPContext node to its fused node by exact name and the 1.23 plugin ABI lets the EP
            # not choose fused-node names, so ep.context_node_name_prefix can only prefix the partition name.
            "partition_name": f"{opts.context_node_name_prefix}{name}",
            "source": self.session.ep_name,
            "hardware_architecture": self.session.target.name,
            "notes": compatibility_info(self.session.target),
        }
        if model_path:
            attrs["onnx_model_filename"] = os.path.basename(model_path)
        if opts.context_embed_mode == 1:
            attrs["ep_cache_context"] = bytes(blob)
        else:
            ctx_model = opts.context_file_path or (
                str(Path(model_path).with_suffix("")) + "_ctx.onnx" if model_path else "")
            if not ctx_model:
                raise EpContextError("ep.context_embed_mode=0 needs ep.context_file_path when the model was not "
                                     "loaded from a file")
            folder = Path(ctx_model).resolve().parent
            payload_name = f"{Path(ctx_model).stem}_{_safe(name)}.npuctx"
            atomic_write_bytes(folder / payload_name, blob)  # unique O_EXCL|O_NOFOLLOW temp, never a planted link
            attrs["ep_cache_context"] = payload_name
        return {"node_name": name, "attrs": attrs}

    # -- EPContext load ------------------------------------------------------------------------------------------
    def load_epcontext(self, name: str, node: NodeInfo, inputs: Sequence[ValueInfo],
                       outputs: Sequence[ValueInfo], graph: Mapping[str, Any]) -> Program:
        embed = int(node.attr("embed_mode", 1))
        payload = node.attr("ep_cache_context")
        if payload is None:
            raise EpContextError(f"{node.describe()}: no ep_cache_context attribute")
        where = f"{node.describe()}"
        if embed == 1:
            blob = payload if isinstance(payload, (bytes, bytearray)) else str(payload).encode("latin-1")
        elif embed == 0:
            path = _payload_path(payload, where)
            blob = self._read_payload_file(path, graph, where)
            where += f" payload {path}"
        else:
            raise EpContextError(f"{where}: embed_mode={embed} (expected 0 or 1)")
        try:
            container = unpack(blob, expect=self._expect())
        except ContextIncompatibleError as exc:
            raise EpContextError(f"{where}: {exc}") from exc
        except ContextFormatError as exc:
            raise EpContextError(f"{where}: corrupt context binary: {exc}") from exc
        program = program_from_parts(container.header, container.arrays, self.session.target, name=name,
                                     record=self.session.options.record_tensors)
        try:
            program.rebind([v.name for v in inputs], [v.name for v in outputs])
        except ValueError as exc:
            raise EpContextError(f"{where}: {exc}") from exc
        self.stats["epcontext_loads"] += 1
        return program

    def _read_payload_file(self, rel: str, graph: Mapping[str, Any], where: str) -> bytes:
        model_path = graph.get("model_path", "")
        if not model_path:
            raise EpContextError(f"{where}: embed_mode=0 context needs the model to be loaded from a file")
        if os.path.isabs(rel):
            raise EpContextError(f"{where}: refusing absolute payload path {rel!r} (must be relative to the model)")
        base = Path(model_path).resolve().parent
        path = (base / rel).resolve()
        if base not in path.parents:
            raise EpContextError(f"{where}: refusing payload path {rel!r}: it escapes the model directory {base}")
        try:  # regular files only, size checked against the container's header before the rest is read
            return read_container(path)
        except ContextFileError as exc:
            raise EpContextError(f"{where}: refusing payload {path}: {_after_path(exc, path)}") from exc
        except ContextFormatError as exc:
            raise EpContextError(f"{where}: corrupt context binary: {exc}") from exc
        except OSError as exc:
            raise EpContextError(f"{where}: cannot read payload {path}: {exc.strerror or exc}") from exc


def _after_path(exc: Exception, path: Path) -> str:
    msg = str(exc)
    return msg[len(f"{path}: "):] if msg.startswith(f"{path}: ") else msg


def _payload_path(payload: Any, where: str) -> str:
    """The embed_mode=0 payload location as text; a NUL byte or undecodable bytes cannot name a file."""
    try:
        path = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else str(payload)
    except UnicodeDecodeError:
        raise EpContextError(f"{where}: refusing payload path {bytes(payload)[:80]!r}: not UTF-8") from None
    if "\0" in path:
        raise EpContextError(f"{where}: refusing payload path {path[:80]!r}: it contains a NUL byte")
    return path


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
