"""ORT's EPContext contract: the node dumped with ``ep.context_enable=1`` and the loading of a ``_ctx.onnx``.

- ``EpContext.spec``: the attributes of the EPContext node (payload embedded, or written to a ``.npuctx`` file next
  to the context model and referenced by a relative path).
- ``EpContext.load``: run an EPContext node without recompiling; refuses payload paths outside the model's folder
  and contexts compiled for another target or compiler version, saying what differs and how to recompile.
- ``compatibility_info`` / ``validate_compatibility_info``: ORT's compiled-model compatibility strings.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_bytes
from ..context_cache.container import FORMAT_VERSION, unpack
from ..context_cache.errors import ContextFileError, ContextFormatError, ContextIncompatibleError
from ..context_cache.fileio import map_container
from ..kernels.node import NodeInfo, ValueInfo
from ..kernels.target import Target
from . import compiler_version
from .options import EpOptions
from .program import Program
from .program_io import program_from_parts

COMPAT_PREFIX = "npu_ep"


class EpContextError(RuntimeError):
    pass


def compatibility_info(target: Target) -> str:
    return f"{COMPAT_PREFIX};compiler={compiler_version.COMPILER_VERSION};format={FORMAT_VERSION};" \
           f"target={target.name};target_hash={target.digest}"


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
    if fields.get("compiler") != compiler_version.COMPILER_VERSION or fields.get("format") != str(FORMAT_VERSION):
        return 3
    return 1


class EpContext:
    """EPContext nodes of one session: its options (embed mode, file path, name prefix), target and EP name."""

    def __init__(self, options: EpOptions, target: Target, ep_name: str, *, stats: dict[str, int]):
        self.options = options
        self.target = target
        self.ep_name = ep_name
        self.stats = stats

    # -- dump ----------------------------------------------------------------------------------------------------
    def spec(self, name: str, blob: bytes, graph: Mapping[str, Any]) -> dict[str, Any]:
        opts = self.options
        model_path = graph.get("model_path", "")
        attrs: dict[str, Any] = {
            "main_context": 1,
            "embed_mode": opts.context_embed_mode,
            "ep_sdk_version": compiler_version.COMPILER_VERSION,
            # ORT matches an EPContext node to its fused node by exact name and the 1.23 plugin ABI lets the EP
            # not choose fused-node names, so ep.context_node_name_prefix can only prefix the partition name.
            "partition_name": f"{opts.context_node_name_prefix}{name}",
            "source": self.ep_name,
            "hardware_architecture": self.target.name,
            "notes": compatibility_info(self.target),
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
            _write_payload(folder / payload_name, blob, name)
            attrs["ep_cache_context"] = payload_name
        return {"node_name": name, "attrs": attrs}

    # -- load ----------------------------------------------------------------------------------------------------
    def load(self, name: str, node: NodeInfo, inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo],
             graph: Mapping[str, Any]) -> Program:
        embed = int(node.attr("embed_mode", 1))
        payload = node.attr("ep_cache_context")
        if payload is None:
            raise EpContextError(f"{node.describe()}: no ep_cache_context attribute")
        where = f"{node.describe()}"
        if embed == 1:
            blob = payload if isinstance(payload, (bytes, bytearray)) else str(payload).encode("latin-1")
        elif embed == 0:
            path = _payload_path(payload, where)
            blob = _map_payload_file(path, graph, where)
            where += f" payload {path}"
        else:
            raise EpContextError(f"{where}: embed_mode={embed} (expected 0 or 1)")
        try:
            container = unpack(blob, expect=compiler_version.expected(self.target))
        except ContextIncompatibleError as exc:
            raise EpContextError(f"{where}: {exc}") from exc
        except ContextFormatError as exc:
            raise EpContextError(f"{where}: corrupt context binary: {exc}") from exc
        program = program_from_parts(container.header, container.arrays, self.target, name=name,
                                     record=self.options.record_tensors)
        try:
            program.rebind([v.name for v in inputs], [v.name for v in outputs])
        except ValueError as exc:
            raise EpContextError(f"{where}: {exc}") from exc
        self.stats["epcontext_loads"] += 1
        return program


def _write_payload(path: Path, blob: bytes, name: str) -> None:
    """The embed_mode=0 payload file (a unique O_EXCL|O_NOFOLLOW temp renamed over it, never a planted link); a
    failure names the file and what it was for."""
    try:
        atomic_write_bytes(path, blob)
    except OSError as exc:
        raise EpContextError(f"partition {name}: cannot write its EPContext payload ({len(blob)} bytes, "
                             f"ep.context_embed_mode=0) to {path}: {exc.strerror or exc}") from exc


def _map_payload_file(rel: str, graph: Mapping[str, Any], where: str) -> mmap.mmap:
    """The embed_mode=0 payload, mapped read-only: its sections are used in place (no copy; pages the kernels never
    touch, such as most rows of an embedding table, are never read). ``unpack`` then checks every hash before
    anything is used, so a corrupt or truncated file is refused naming the file and section. Like ORT's mapping of
    external data, the file must not be changed in place while a session uses it (writers replace it by rename,
    which leaves the mapped file as it was)."""
    model_path = graph.get("model_path", "")
    if not model_path:
        raise EpContextError(f"{where}: embed_mode=0 context needs the model to be loaded from a file")
    if os.path.isabs(rel):
        raise EpContextError(f"{where}: refusing absolute payload path {rel!r} (must be relative to the model)")
    base = Path(model_path).resolve().parent
    path = (base / rel).resolve()
    if base not in path.parents:
        raise EpContextError(f"{where}: refusing payload path {rel!r}: it escapes the model directory {base}")
    try:  # regular files only, size checked against the container's header before it is mapped
        return map_container(path)
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
