"""The Python side of the plugin: the native shim calls exactly these entry points.

- ``create_ep(ep_name, config) -> EpSession``                 (OrtEpFactory::CreateEp)
- ``EpSession.get_capability(nodes, graph) -> [[index...]]``  (OrtEp::GetCapability)
- ``EpSession.compile(name, nodes, inputs, outputs, graph)``  (OrtEp::Compile) -> (program, epcontext spec | None)
- ``EpSession.compatibility_info(graph) -> str``              (OrtEp::GetCompiledModelCompatibilityInfo)
- ``validate_compatibility(info) -> int``                     (OrtEpFactory::ValidateCompiledModelCompatibilityInfo)
- ``error_text(exc) -> str``                                   (the message of every Python error as ORT reports it)

Nodes arrive as plain dicts (ep/native/graph_view.h); everything else is decided here in Python.
"""

from __future__ import annotations

import logging
import re
import traceback
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ..kernels.node import NodeInfo
from ..kernels.target import Target
from . import options as options_mod
from .capability import EPCONTEXT, Capability, analyze
from .compiled_programs import CompiledPrograms
from .decline_report import DeclineReport
from .compiler import compile_partition
from .epcontext import compatibility_info, validate_compatibility_info
from .graph_convert import node_from_dict, value_from_dict
from .host_memory import retain_freed_memory
from ..kernels.host_blas import allow_split, blas_threads
from ..kernels.runtime import configure as configure_kernels
from ..log import error_level, escape, level_number, logger, session_scoped
from .program import Program

# A generator's declared entry points (session config, ``tools/generation/entries.py``): named in the EPContext
# node's notes as ";entries=name name ..." (names hold commas: "decode[S=1,P=1024]") and read back from them when a
# context model loads.
ENTRIES_CONFIG_KEY = "npu_ep.entries"
ENTRIES_NOTE = ";entries="

# Live sessions, for reports that inspect a running InferenceSession (weak: ORT owns their lifetime).
LIVE_SESSIONS: weakref.WeakSet[EpSession] = weakref.WeakSet()


class EpSession:
    """One OrtEp instance: the options, the target, the capability results and the compiled programs."""

    def __init__(self, ep_name: str, config: Mapping[str, str], device_name: str | None = None):
        self.ep_name = ep_name
        self.config = dict(config)
        # ORT hands provider options over as ep.<the OrtEpDevice's ep_name>.<key>: NpuEP's NPU-memory device has a
        # name of its own (ep/native/factory.cc)
        self.options = options_mod.parse(config, prefix=options_mod.prefix_for(device_name or ep_name))
        self.target = (Target.load(self.options.target).with_kv_cache_dtype(self.options.kv_cache_dtype)
                       .with_conv_layout(self.options.conv_layout))
        # this session's log level (its callbacks run under it, log.session_scoped); None: the application's
        self.log_level = level_number(self.options.log_level if self.options.log_level_given else None)
        self.capabilities: list[tuple[dict, Capability]] = []  # (graph info, result) per GetCapability call
        self._declines = DeclineReport(self.target.name)
        self.programs: dict[str, Program] = {}
        self.declared_entries = self.config.get(ENTRIES_CONFIG_KEY, "").split()
        self.compiled = CompiledPrograms(self.options, self.target, ep_name)
        if self.options.retain_host_memory:
            retain_freed_memory()
        self._blas = blas_threads(self.options.blas_threads) if self.options.blas_threads > 0 else None
        if self._blas is not None:
            self._blas.__enter__()
        self._split = self.options.host_threads >= 2
        if self._split:
            allow_split(True)
        # Set by the shim's CreateEp (ep/native/factory.cc): this session's NPU-memory counters, and whether its
        # OrtEpDevice keeps partition inputs/outputs in NPU memory ("npu") or host memory ("host").
        self.device_stats_key: int | None = None
        self.device_memory = "host"
        LIVE_SESSIONS.add(self)

    # -- GetCapability -------------------------------------------------------------------------------------------
    @session_scoped
    def get_capability(self, nodes: Sequence[dict], graph: Mapping[str, Any]) -> list[list[int]]:
        infos = [node_from_dict(n) for n in nodes]
        assigned = {n["index"]: n.get("ep", "") for n in nodes if n.get("ep")}
        policy = None
        if self.options.partition_policy == "cost_aware":
            from .policy import cost_aware_policy

            policy = cost_aware_policy(self.target, bridge_us=self.options.bridge_cost_us)
        parent = node_from_dict(graph["parent"]) if graph.get("parent") else None  # the If holding a branch
        result = analyze(infos, self.target, ep_name=self.ep_name, assigned=assigned, policy=policy, parent=parent)
        self.capabilities.append(({k: v for k, v in graph.items() if k != "parent"}, result))
        self._declines.add(result, graph)
        if not graph.get("is_subgraph", False):  # ORT partitions subgraphs first: the main graph comes last
            self._declines.flush()
        return result.partitions

    # -- Compile -------------------------------------------------------------------------------------------------
    @session_scoped
    def compile(self, name: str, nodes: Sequence[dict], inputs: Sequence[dict], outputs: Sequence[dict],
                graph: Mapping[str, Any]) -> tuple[Program, dict | None]:
        node_infos = [node_from_dict(n) for n in nodes]
        ins = [value_from_dict(v) for v in inputs]
        outs = [value_from_dict(v) for v in outputs]
        if len(node_infos) == 1 and node_infos[0].key == EPCONTEXT:
            program = self.compiled.load_epcontext(name, node_infos[0], ins, outs, graph)
            self._adopt(name, program, node_infos)
            notes = str(node_infos[0].attr("notes", ""))
            if ENTRIES_NOTE in notes:  # the entries it was compiled for win over a declaration made now
                self.declared_entries = notes.split(ENTRIES_NOTE, 1)[1].split(";")[0].split()
            return program, None
        program, blob = self.compiled.compile_cached(
            name, node_infos, ins, outs,
            lambda: compile_partition(name, node_infos, ins, outs, self.target, record=self.options.record_tensors))
        self._adopt(name, program, node_infos)
        spec = self.compiled.epcontext_spec(name, blob, graph) if self.options.context_enable else None
        if spec is not None and self.declared_entries:
            spec["attrs"]["notes"] += ENTRIES_NOTE + " ".join(self.declared_entries)
        return program, spec

    def _adopt(self, name: str, program: Program, nodes: Sequence[NodeInfo]) -> None:
        program.label = partition_label(self.ep_name, name, nodes)
        configure_kernels((st.prepared for st in program.steps), self.options.kernels, self.options.host_threads)
        program.mark_partition_outputs()
        self.programs[name] = program

    # -- compatibility -------------------------------------------------------------------------------------------
    def compatibility_info(self, graph: Mapping[str, Any]) -> str:
        return compatibility_info(self.target)

    def device_counters(self) -> dict[str, Any]:
        """This session's NPU memory: its allocator's live/peak bytes and allocations, and the copies ORT made
        through NpuEP's data transfer (count, bytes, emulated DMA us per direction); ``memory`` says where its
        partitions keep their inputs and outputs."""
        if self.device_stats_key is None:
            raise LookupError("this EpSession was not created by the plugin (no NPU-memory counters)")
        return counters_with_dma(self.device_stats_key, self.target, self.device_memory)

    def release(self) -> None:  # not session_scoped: ORT's destructor calls it, maybe inside a ContextVar.set
        self._declines.flush(final=True, session_level=self.log_level)  # ORT gave up before its last GetCapability
        self.programs.clear()
        if self._blas is not None:
            self._blas.__exit__(None, None, None)
            self._blas = None
        if self._split:
            allow_split(False)
            self._split = False


def partition_label(ep_name: str, name: str, nodes: Sequence[NodeInfo]) -> str:
    """A readable name for messages, ``'NpuEP_<first op>_<ORT's index>'``, with ORT's fused-node name after it.

    ORT names fused nodes itself (``NpuEP_<model hash>_<index>``) and the plugin ABI gives the EP no say; that
    name stays the key of EPContext's partition_name, the cache and the stats."""
    index = re.search(r"_(\d+)$", name)
    first = escape(nodes[0].op_type) if nodes else "empty"
    return (f"'{ep_name}_{first}_{index.group(1) if index else 0}' ({len(nodes)} node{'s' * (len(nodes) != 1)}, "
            f"ORT node '{name}')")


def counters_with_dma(key: int, target: Target, memory: str) -> dict[str, Any]:
    """The shim's NPU-memory counters under ``key`` with each direction's emulated DMA time: every copy is one
    transfer of the target's DMA engine (``kernels.cost.dma_cycles``, the cost model's one formula)."""
    from ..kernels.cost import dma_cycles
    from ..kernels.runtime import extension

    c: dict[str, Any] = dict(extension().device_stats(key))
    for direction in ("to_npu", "to_host", "on_npu"):
        copies, nbytes = c[f"copies_{direction}"], c[f"bytes_{direction}"]
        cycles = dma_cycles(target, nbytes, transfers=copies) if copies else 0.0
        c[f"dma_us_{direction}"] = cycles / target.clock_hz * 1e6
    c["memory"] = memory
    c["target"] = target.name
    return c


def create_ep(ep_name: str, config: Mapping[str, str], device_name: str | None = None) -> EpSession:
    return EpSession(ep_name, config, device_name)


def validate_compatibility(info: str) -> int:
    return validate_compatibility_info(info)


def error_text(exc: BaseException) -> str:
    """What an ORT status says for a Python exception raised inside NpuEP (ep/native/python_interop.h's WithPython).

    The type and message only: pybind11's own text appends an ``At:`` block of Python frames, NpuEP's internal paths
    followed by the application's own script lines. The traceback (with chained causes) is kept when the ``npu_ep``
    logger is at DEBUG (``log_level=debug``)."""
    level = error_level(exc, [s.log_level for s in list(LIVE_SESSIONS)])  # the raising session's log_level
    if logger.isEnabledFor(logging.DEBUG) or (level is not None and level <= logging.DEBUG):
        return "".join(traceback.format_exception(exc)).rstrip()
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
