"""``npu_ep.report(...)`` / ``npu-report``: which nodes NpuEP takes, which fall back and why, what it costs.

``build_report`` returns one JSON-ready dict (schema: ``tools/report/schema.json``, ``schema_version`` below):
coverage, partitions, crossings, layers, emulated timeline, and with ``run=True`` measurements from a real NpuEP
session (what the session ran after ORT's own fusions, not what the file says): latency, bridge counters, ORT's
profile per node (``profile``), prefill vs decode for a KV-cache model (``phases``); with
``compare=True`` per-node numerics, three-way for a quantized model given its float original (``quant``).

The model is validated first (``validate``): bad input raises ``ReportInputError`` (CLI: exit 2, one
line); an ORT failure on NpuEP for a model the CPU EP runs raises ``NpuEPFailure`` (CLI: exit 1, one line).
Rendering lives in ``render`` (terminal) and ``html`` (HTML).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnx

from ..._atomic import atomic_write_bytes
from ...ep.capability import Capability, analyze
from ...ep.onnx_graph import nodes_from_model
from ...ep.policy import bridge_cost_us, cost_aware_policy
from ...ep.sessions import session_of
from ...kernels.node import NodeInfo
from ...kernels.target import Target, TargetError
from . import layers as rl
from . import model as rm
from . import profile as report_profile
from . import timeline as rt
from .latency import latency
from .phases import DEFAULT_PREFILL_TOKENS, entries_report, label_entries, label_timeline, measure_phases
from .dim_hints import inputs_that_run
from .run import DEFAULT_MAX_INPUT_MIB, NpuEPFailure, attribute_bridge, dim_key, measure, npu_session, resolve_dims
from .validate import ReportInputError, load_checked, ort_exceptions, ort_message

SCHEMA_VERSION = "1.6"
SCHEMA_PATH = Path(__file__).with_name("schema.json")

__all__ = ["SCHEMA_PATH", "SCHEMA_VERSION", "NpuEPFailure", "ReportInputError", "build_report", "validate",
           "write_json"]


def _program_names(programs: Mapping[str, Any], cap: Capability, nodes: list[NodeInfo]) -> list[str]:
    """EP partition name per capability partition, matched by the node names the program's steps carry."""
    by_index = {n.index: n for n in nodes}
    owner = {}
    for pname, prog in programs.items():
        for step in prog.steps:
            for node in step.node_name.split("+"):
                owner[node] = pname
    names = []
    for p, group in enumerate(cap.partitions):
        hits = Counter(owner[by_index[i].name] for i in group if by_index[i].name in owner)
        names.append(hits.most_common(1)[0][0] if hits else f"partition_{p}")
    return names


def build_report(model_or_session, *, target: str = "npu-ref", dims: Mapping[str, int] | None = None,
                 run: bool = False, runs: int = 20, layers: int | None = None, compare: bool = False,
                 provider_options: Mapping[str, str] | None = None, model=None, float_model=None,
                 check: bool = True, prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
                 max_input_mib: float = DEFAULT_MAX_INPUT_MIB,
                 dump_partitions: str | os.PathLike | None = None, explain_fusions: bool = False,
                 device_memory: str = "host") -> dict[str, Any]:
    """The report document. ``model_or_session``: path, ``onnx.ModelProto`` or an ``InferenceSession`` created
    with NpuEP and options passed through ``npu_ep.ep.sessions.tag_session_options`` (then ``model=`` gives the
    file view and enables the CPU-EP comparison). ``dims``: symbolic dim -> size for inputs.
    ``float_model``: the float original of a quantized model (path or ModelProto) for the three-way numerics
    (implies ``compare``). ``check=False`` skips ``onnx.checker`` (the structural checks always run).
    ``prefill_tokens``: new tokens of the prefill-shaped run of a KV-cache model (``run=True``).
    ``max_input_mib``: generated inputs (``run``/``compare``) above this are refused before allocation.
    ``dump_partitions``: a folder to write every NPU partition of the file into as a standalone model
    (``partition_dump``); the written files are listed under ``partition_dumps``. ``explain_fusions``: under
    ``fusions``, per partition of the file the fusions applied and why each candidate was not fused (``fusions``).
    ``device_memory``: with ``run``, NpuEP's OrtEpDevice for the measured session, "host" (as providers=["NpuEP"])
    or "npu" (partition inputs/outputs in NPU memory, copies counted: ``measurement.boundaries``)."""
    if device_memory not in ("host", "npu"):
        raise ValueError(f"device_memory={device_memory!r}: expected 'host' or 'npu'")
    import onnxruntime as ort

    if runs < 1 or prefill_tokens < 1:
        raise ReportInputError(f"runs ({runs}) and prefill_tokens ({prefill_tokens}) must be >= 1")
    if dump_partitions is not None:  # a folder that cannot be one is refused before any work
        from .partition_dump import check_folder

        check_folder(dump_partitions)
    opts = {"target": target, **(provider_options or {})}
    try:
        tgt = Target.load(opts["target"]).with_kv_cache_dtype(opts.get("kv_cache_dtype"))  # as the EP loads it
    except TargetError as exc:
        raise ReportInputError(str(exc)) from None
    session = model_or_session if isinstance(model_or_session, ort.InferenceSession) else None
    if session is not None and model is None:
        raise ReportInputError("report on an InferenceSession needs model= (path or ModelProto) for the file view")
    proto, where, validation = load_checked(model if session is not None else model_or_session, checker=check)
    fproto = None
    if float_model is not None:
        fproto, fwhere, _ = load_checked(float_model, checker=check)
        _same_inputs(proto, where, fproto, fwhere)
        compare = True
    given_dims = dict(dims or {})
    dims = resolve_dims(proto, given_dims)
    # ORT turns Constant nodes into initializers before any EP sees the graph: they are not nodes to place
    file_nodes = [n for n in nodes_from_model(proto) if n.key != ("", "Constant")]
    policy = cost_aware_policy(tgt) if opts.get("partition_policy") == "cost_aware" else None
    file_cap = analyze(file_nodes, tgt, policy=policy)
    doc: dict[str, Any] = {"schema": "npu-report", "schema_version": SCHEMA_VERSION, "model": where,
                           "target": tgt.name, "policy": opts.get("partition_policy", "max_coverage"),
                           "source": "file", "dims": dims, "bridge_cost_us_default": bridge_cost_us(),
                           "validation": validation,
                           "file_coverage": {"total": len(file_cap.decisions),
                                             "claimed": sum(d.claimed for d in file_cap.decisions)},
                           "measurement": None, "projection": None, "compare": None, "phases": None,
                           "entries": None, "kv_cache_dtype": tgt.kv_cache_dtype}
    nodes, cap, measurement, names, timeline = file_nodes, file_cap, None, None, None
    ep = None
    feeds = cpu = None
    if run or compare:  # sizes the CPU EP runs: a dim sized 1 by default may get the model's own hint instead
        dims, feeds, cpu = inputs_that_run(proto, dims, given_dims, where, max_input_mib)
        doc["dims"] = dims
    if session is not None:
        ep = _ep_of(session)
    elif run:
        session, ep, measurement, doc["phases"] = _run(proto, where, opts, cpu, feeds, dims, tgt, runs,
                                                       prefill_tokens, device_memory)
    if ep is not None:
        doc["source"] = "session"
        nodes = [d.node for d in ep.capabilities[-1][1].decisions]
        cap = ep.capabilities[-1][1]
        names = _program_names(ep.programs, cap, nodes)
    names = names or [f"partition_{i}" for i in range(len(cap.partitions))]
    with rm.layer_scope(nodes):
        if ep is not None:
            timeline = rt.from_programs(ep.programs, tgt)
        parts, crossings = rm.partitions_and_crossings(nodes, cap, dims, names)
        if measurement:
            attribute_bridge(crossings, measurement["partitions"])
        if timeline is None or not timeline:  # cost model on the file with the input dims made concrete
            timeline = rt.from_static(nodes_from_model(_with_dims(proto, dims), symbolic=True) if nodes is file_nodes
                                      else nodes,
                                      cap, names, tgt, dims)
        label_timeline(timeline, doc["phases"])
        doc["entries"] = entries_report(ep)
        doc["kv_cache_dtype"] = (ep.target if ep is not None else tgt).kv_cache_dtype
        label_entries(timeline, doc["entries"])
        doc.update(latency(timeline, tgt))
        doc.update(coverage=rm.coverage(cap), partitions=parts, crossings=crossings,
                   layers=rm.layer_summary(nodes, crossings, layers), timeline=timeline, measurement=measurement)
        doc["per_layer"] = rl.per_layer(nodes, cap, parts, timeline, crossings,
                                        measurement["profile"] if measurement else None, tgt)
    if measurement:
        doc["projection"] = rl.projection(doc["layers"], crossings)
    if dump_partitions is not None:
        from .partition_dump import dump_partitions as dump_to  # onnx-graphsurgeon is imported only for this

        # the file's partitions (a session's view is after ORT's fusions: its tensors need not exist in the file)
        file_names = names if nodes is file_nodes else _program_names(ep.programs, file_cap, file_nodes)
        doc["partition_dumps"] = dump_to(proto, file_nodes, file_cap, file_names, dump_partitions, dims)
    if explain_fusions:
        from .fusions import explain_fusions as explain

        doc["fusions"] = explain(file_nodes, file_cap, tgt, names if nodes is file_nodes else None)
    if compare:
        from .compare import compare as run_compare

        doc["compare"] = _npu_guarded(where, lambda: run_compare(proto, feeds, opts, float_model=fproto),
                                      creating=True)
    return doc


def _run(proto: onnx.ModelProto, where: str, opts: Mapping[str, str], cpu, feeds, dims: Mapping[str, int],
         tgt: Target, runs: int, prefill_tokens: int, memory: str = "host"
         ) -> tuple[Any, Any, dict[str, Any], dict[str, Any] | None]:
    """``--run``: with the CPU EP session that validated the model and ``feeds``, ONE profiled NpuEP session gives
    the ORT profile (per-node time), the latency/bridge measurement and the prefill/decode phases. Returns
    (session, EpSession, measurement, phases)."""
    import onnxruntime as ort

    model_bytes = proto.SerializeToString()
    so = ort.SessionOptions()
    folder = report_profile.enable(so)
    try:
        session, ep = _npu_guarded(where, lambda: npu_session(model_bytes, opts, so=so, memory=memory),
                                   creating=True)
    except BaseException:
        report_profile.discard(folder)
        raise
    few = min(runs, 5)
    profile = _npu_guarded(where, lambda: report_profile.profile_runs(session, folder, feeds, min(runs, 10),
                                                                      warmup=3))
    measurement = _npu_guarded(where, lambda: measure(session, ep, cpu, feeds, runs))
    measurement["profile"] = profile
    phases = _npu_guarded(where, lambda: measure_phases(session, ep, cpu, proto, dims, tgt, runs=few,
                                                        prefill_tokens=prefill_tokens))
    return session, ep, measurement, phases


def _npu_guarded(where: str, fn: Callable[[], Any], *, creating: bool = False) -> Any:
    """Run an NpuEP step; ORT errors there (the CPU EP already ran the model) are NpuEP failures. ORT reports a
    failure to create a plugin EP (e.g. a bad provider option) as a plain ``RuntimeError``: caught when
    ``creating``, so that other RuntimeErrors (report bugs) keep their traceback."""
    caught = (*ort_exceptions(), RuntimeError) if creating else ort_exceptions()
    try:
        return fn()
    except caught as exc:
        raise NpuEPFailure(f"{where}: NpuEP failed on a model the CPU EP runs: {ort_message(exc)}") from exc


def _same_inputs(model: onnx.ModelProto, where: str, fmodel: onnx.ModelProto, fwhere: str) -> None:
    """The float model must take the same feeds as the quantized one (three-way numerics run both on them)."""
    def names(m):
        inits = {t.name for t in m.graph.initializer}
        return sorted(i.name for i in m.graph.input if i.name not in inits)
    if names(model) != names(fmodel):
        raise ReportInputError(f"{fwhere}: float model inputs {names(fmodel)} differ from {where}'s {names(model)}")


def _with_dims(model: onnx.ModelProto, dims: Mapping[str, int]) -> onnx.ModelProto:
    """Copy with symbolic and unknown (``-1``) input dims set to ``dims`` so shape inference makes intermediate
    shapes concrete."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                continue
            name = d.dim_param if d.HasField("dim_param") and d.dim_param else dim_key(vi.name, axis)
            if name in dims:
                d.dim_value = int(dims[name])
    return m


def _ep_of(session) -> Any:
    """The EpSession behind ``session`` (its options tagged by ``tag_session_options``)."""
    try:
        return session_of(session)
    except LookupError as exc:
        raise ReportInputError(f"report on an InferenceSession: {exc}") from None


def validate(doc: Mapping[str, Any]) -> None:
    """jsonschema validation against ``schema.json`` (raises ``jsonschema.ValidationError``)."""
    import jsonschema

    jsonschema.validate(doc, json.loads(SCHEMA_PATH.read_text()))


def json_bytes(doc: Mapping[str, Any]) -> bytes:
    """The document as the JSON file holds it."""
    return json.dumps(doc, indent=1, default=str).encode()


def write_json(doc: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Atomically (temp file, fsync, rename): a failed write leaves what was there."""
    atomic_write_bytes(path, json_bytes(doc))
