"""``npu_ep.report(...)`` / ``npu-report``: which nodes NpuEP takes, which fall back and why, what it costs.

``build_report`` returns one JSON-ready dict (schema: ``tools/report_schema.json``, ``schema_version`` below):
coverage, partitions, crossings, layers, emulated timeline, and with ``run=True`` measurements from a real NpuEP
session (what the session ran after ORT's own fusions, not what the file says), with ``compare=True`` per-node
numerics. Rendering lives in ``report_render`` (terminal) and ``report_html`` (HTML).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from ..ep.capability import Capability, analyze
from ..ep.onnx_graph import nodes_from_model
from ..ep.policy import bridge_cost_us, cost_aware_policy
from ..kernels.node import NodeInfo
from ..kernels.target import Target, TargetError
from . import report_model as rm
from . import report_timeline as rt
from .report_run import ReportInputError, attribute_bridge, make_feeds, measure, npu_session, resolve_dims

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).with_name("report_schema.json")

__all__ = ["SCHEMA_VERSION", "SCHEMA_PATH", "ReportInputError", "build_report", "validate", "write_json"]


def _load_model(model_or_path) -> tuple[onnx.ModelProto, str]:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, "<ModelProto>"
    path = os.fspath(model_or_path)
    if not os.path.isfile(path):
        raise ReportInputError(f"model file not found: {path}")
    try:
        return onnx.load(path), path
    except Exception as exc:
        raise ReportInputError(f"cannot read ONNX model {path}: {type(exc).__name__}: {exc}") from None


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


def _per_layer(nodes: list[NodeInfo], cap: Capability, timeline: list[dict], crossings: list[dict],
               measurement: dict | None, target: Target) -> list[dict]:
    """Per layer [us per run]: NPU compute, exposed DMA, CPU fallback, boundaries (``None`` layer: outside)."""
    rows: dict[Any, dict] = {}

    def row(layer):
        return rows.setdefault(layer, {"layer": layer, "npu_compute_us": 0.0, "dma_us": 0.0,
                                       "cpu_fallback_us": 0.0, "boundary_us": 0.0})
    best: dict[str, dict] = {}
    for entry in timeline:  # one run calls each partition once: take its most frequent signature
        if entry["partition"] not in best or entry["calls"] > best[entry["partition"]]["calls"]:
            best[entry["partition"]] = entry
    for entry in best.values():
        for op in entry["ops"]:
            r = row(op["layer"])
            r["npu_compute_us"] += target.cycles_to_seconds(op["compute_cycles"]) * 1e6
            r["dma_us"] += target.cycles_to_seconds(max(0.0, op["cycles"] - op["compute_cycles"])) * 1e6
    for c in crossings:
        r = row(c["layer"])
        r["boundary_us"] += c["measured_us"] * c["per_run"] if c.get("measured_us") is not None else bridge_cost_us()
    cpu_nodes = [d.node for d in cap.declined]
    for n in cpu_nodes:
        row(rm.layer_of(n.name))
    if measurement and cpu_nodes:
        in_partitions = sum(p["total_us_per_call"] * p["calls_per_run"] for p in measurement["partitions"])
        other = max(0.0, measurement["npu_mean_us"] - in_partitions)
        for n in cpu_nodes:  # estimate: host time outside partition calls, spread evenly over CPU nodes
            row(rm.layer_of(n.name))["cpu_fallback_us"] += other / len(cpu_nodes)
    return sorted(rows.values(), key=lambda r: (r["layer"] is None, r["layer"] or 0))


def _projection(layers: dict, crossings: list[dict], measurement: dict) -> dict[str, Any]:
    per_run = sum(c["measured_us"] * c["per_run"] for c in crossings if c.get("measured_us") is not None)
    count = sum(c["per_run"] for c in crossings)
    t_b = per_run / count if count else 0.0
    internal = [c for c in crossings if not set(c["peer"]) <= {"graph input", "graph output"}]
    saving = sum(c["measured_us"] * c["per_run"] for c in internal if c.get("measured_us") is not None)
    n_l, n_b = layers["count"], layers["crossings_per_layer"]
    return {"t_b_us": t_b, "boundary_us_per_run": per_run, "crossings_per_run": count, "layers": n_l,
            "crossings_per_layer": n_b, "per_token_us": n_l * n_b * t_b, "full_coverage_saving_us": saving}


def build_report(model_or_session, *, target: str = "npu-ref", dims: Mapping[str, int] | None = None,
                 run: bool = False, runs: int = 20, layers: int | None = None, compare: bool = False,
                 provider_options: Mapping[str, str] | None = None, model=None) -> dict[str, Any]:
    """The report document. ``model_or_session``: path, ``onnx.ModelProto`` or an ``InferenceSession`` created
    with NpuEP (then ``model=`` enables the CPU-EP comparison). ``dims``: symbolic dim -> size for inputs."""
    import onnxruntime as ort

    from ..ep.bridge import LIVE_SESSIONS

    opts = {"target": target, **(provider_options or {})}
    try:
        tgt = Target.load(opts["target"])
    except TargetError as exc:
        raise ReportInputError(str(exc)) from None
    session = model_or_session if isinstance(model_or_session, ort.InferenceSession) else None
    proto, where = _load_model(model if session is not None and model is not None else
                               model_or_session if session is None else _session_model(session))
    dims = resolve_dims(proto, dims or {})
    file_nodes = nodes_from_model(proto)
    policy = cost_aware_policy(tgt) if opts.get("partition_policy") == "cost_aware" else None
    file_cap = analyze(file_nodes, tgt, policy=policy)
    doc: dict[str, Any] = {"schema": "npu-report", "schema_version": SCHEMA_VERSION, "model": where,
                           "target": tgt.name, "policy": opts.get("partition_policy", "max_coverage"),
                           "source": "file", "dims": dims, "bridge_cost_us_default": bridge_cost_us(),
                           "file_coverage": {"total": len(file_cap.decisions),
                                             "claimed": sum(d.claimed for d in file_cap.decisions)},
                           "measurement": None, "projection": None, "compare": None}
    nodes, cap, measurement, names, timeline = file_nodes, file_cap, None, None, None
    ep = None
    if session is not None:
        ep = _ep_of(session, LIVE_SESSIONS)
    elif run:
        model_bytes = proto.SerializeToString()
        feeds = make_feeds(proto, dims)
        session, ep = npu_session(model_bytes, opts)
        measurement = measure(session, ep, model_bytes, feeds, runs)
    if ep is not None:
        doc["source"] = "session"
        nodes = [d.node for d in ep.capabilities[-1][1].decisions]
        cap = ep.capabilities[-1][1]
        names = _program_names(ep.programs, cap, nodes)
        timeline = rt.from_programs(ep.programs, tgt)
    names = names or [f"partition_{i}" for i in range(len(cap.partitions))]
    parts, crossings = rm.partitions_and_crossings(nodes, cap, dims, names)
    if measurement:
        attribute_bridge(crossings, measurement["partitions"])
    if timeline is None or not timeline:  # cost model on the file with the input dims made concrete
        timeline = rt.from_static(nodes_from_model(_with_dims(proto, dims)) if nodes is file_nodes else nodes,
                                  cap, names, tgt, dims)
    doc.update(coverage=rm.coverage(cap), partitions=parts, crossings=crossings,
               layers=rm.layer_summary(nodes, crossings, layers), timeline=timeline, measurement=measurement)
    doc["per_layer"] = _per_layer(nodes, cap, timeline, crossings, measurement, tgt)
    if measurement:
        doc["projection"] = _projection(doc["layers"], crossings, measurement)
    if compare:
        from .report_compare import compare as run_compare

        doc["compare"] = run_compare(proto, make_feeds(proto, dims), opts)
    return doc


def _with_dims(model: onnx.ModelProto, dims: Mapping[str, int]) -> onnx.ModelProto:
    """Copy with symbolic input dims set to ``dims`` so shape inference makes intermediate shapes concrete."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])
    return m


def _session_model(session) -> str:
    raise ReportInputError("report on an InferenceSession needs model= (path or ModelProto) for the file view")


def _ep_of(session, live) -> Any:
    """The EpSession behind ``session``: the newest one whose partitions' nodes all ran on NpuEP there."""
    ran = {n.name for sg in session.get_provider_graph_assignment_info() if sg.ep_name == "NpuEP"
           for n in sg.get_nodes()}
    for ep in sorted(live, key=id, reverse=True):
        steps = {s for p in ep.programs.values() for st in p.steps for s in st.node_name.split("+")}
        if ep.capabilities and steps and steps <= ran:
            return ep
    raise ReportInputError("no live NpuEP session found for this InferenceSession (created with "
                           "session.record_ep_graph_assignment_info=1?)")


def validate(doc: Mapping[str, Any]) -> None:
    """jsonschema validation against ``report_schema.json`` (raises ``jsonschema.ValidationError``)."""
    import jsonschema

    jsonschema.validate(doc, json.loads(SCHEMA_PATH.read_text()))


def write_json(doc: Mapping[str, Any], path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(doc, indent=1, default=str))
