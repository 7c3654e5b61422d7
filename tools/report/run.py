"""Running a model for ``npu-report --run``: input generation, a real NpuEP session, and bridge measurements.

Measured, not guessed: the shim counts per partition the whole Compute callback (``total_ns``) and the time
inside the Python program (``program_ns``); ``(total_ns - program_ns) / calls`` is the bridge cost of one call
(GIL, zero-copy input views, the call, output copies). It is split over that call's crossings in proportion to
their bytes. Latencies are medians over ``runs`` session.run calls [us], NpuEP and CPU EP on the same feeds.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ...kernels.runtime import extension
from ...ep.entry_points import EpSession
from ...ep.device_memory import add_npu_ep
from ...dtypes import numpy_dtype
from ...ep.sessions import session_of, tag_session_options
from .attention_dims import attention_dims
from .boundaries import boundaries
from .validate import ReportInputError, ort_error, ort_exceptions


class NpuEPFailure(RuntimeError):
    """NpuEP failed on a model the CPU EP runs: a finding about NpuEP, not bad input (CLI: one line, exit 1)."""


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int:
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == input_name and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    return 100


MEASURE_BLOCKS = 5  # --run: the EPs alternate in this many blocks of runs // 5 runs each
DEFAULT_SPATIAL = 224  # a symbolic or unknown height/width of an image input (rank 4, axes 2 and 3)
DEFAULT_MAX_INPUT_MIB = 128  # generated inputs above this are refused before anything is allocated


def dim_key(input_name: str, axis: int) -> str:
    """The ``--dim`` name of an input dim that has no name (``-1`` or unset): ``input:axis``."""
    return f"{input_name}:{axis}"


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _dim_name(inp: onnx.ValueInfoProto, axis: int, d) -> str | None:
    """None for a fixed size, else the key ``--dim`` sets: the dim's symbol, or ``input:axis`` without one."""
    if d.HasField("dim_value") and d.dim_value >= 0:
        return None
    return d.dim_param if d.HasField("dim_param") and d.dim_param else dim_key(inp.name, axis)


def _default_size(name: str, rank: int, axis: int, unnamed: bool) -> int:
    """Batch 1; height/width (by name, or an unnamed axis 2-3 of a rank-4 input) ``DEFAULT_SPATIAL``; else 1
    (a sequence of one token: a decode step; a named rank-4 axis such as ``past_sequence`` is not an image)."""
    low = name.lower()
    if "batch" in low:
        return 1
    if any(w in low for w in ("height", "width")) or (unnamed and rank == 4 and axis >= 2):
        return DEFAULT_SPATIAL
    return 1


def _sequence_names(model: onnx.ModelProto, past_axes: Sequence[tuple[str, int]]) -> tuple[set, set, set]:
    """(past, new, total) sequence dim names from the graph: the past axis of attention nodes' past inputs,
    ``input_ids``' axis 1, and the attention mask's last axis when it is neither (the model's total length)."""
    ins = {i.name: i for i in _graph_inputs(model)}

    def name(inp: str, axis: int) -> str | None:
        dims = ins[inp].type.tensor_type.shape.dim if inp in ins else []
        return _dim_name(ins[inp], axis, dims[axis]) if axis < len(dims) else None

    past = {n for n in (name(i, a) for i, a in past_axes) if n}
    new = {n for n in (name("input_ids", 1),) if n and n not in past}
    mask = ins.get("attention_mask")
    rank = len(mask.type.tensor_type.shape.dim) if mask is not None else 0
    total = {n for n in (name("attention_mask", rank - 1) if rank else None,) if n and n not in past | new}
    return past, new, total


def resolve_dims(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, int]:
    """A size for every symbolic or unknown (``-1``) dim of the graph inputs: the ``--dim`` values first; then the
    sizes attention nodes fix (KV heads, head size of the past inputs: ``attention_dims``); the total sequence
    length = past + new (the dims found in the graph, else those named ``total*``, ``past*``, ``*seq*``); batch 1;
    image height/width ``DEFAULT_SPATIAL``; others 1 (``_default_size``). Unnamed dims are keyed ``input:axis``
    (see ``dim_key``). A ``--dim`` contradicting a size the structure fixes is refused (``ReportInputError``)."""
    found: dict[str, tuple[int, int, bool]] = {}
    inputs = _graph_inputs(model)
    for inp in inputs:
        shape = inp.type.tensor_type.shape.dim
        for axis, d in enumerate(shape):
            name = _dim_name(inp, axis, d)
            if name is not None:
                found.setdefault(name, (len(shape), axis, name == dim_key(inp.name, axis)))
    out = {k: int(v) for k, v in dims.items()}
    structure = attention_dims(model)
    by_name = {i.name: i for i in inputs}
    for (inp, axis), (size, why) in structure.sizes.items():
        name = _dim_name(by_name[inp], axis, by_name[inp].type.tensor_type.shape.dim[axis])
        if name is None:
            continue
        if name in out and out[name] != size:
            raise ReportInputError(f"--dim {name}={out[name]} contradicts the model: {why} for '{inp}' "
                                   f"axis {axis}")
        out[name] = size
    past, new, total = _sequence_names(model, structure.past)
    for name in sorted((n for n in found if n not in out), key=lambda s: s in total or "total" in s.lower()):
        if name in total or "total" in name.lower():
            past_len = (sum(out.get(k, 1) for k in past) if past else
                        sum(v for k, v in out.items() if "past" in k.lower()))
            seq = (sum(out.get(k, 1) for k in new) if new else
                   sum(v for k, v in out.items() if "seq" in k.lower() and "past" not in k.lower()
                       and "total" not in k.lower()))
            out[name] = max(1, past_len + seq)
        else:
            out[name] = _default_size(name, *found[name])
    return out


def input_shapes(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, list[int]]:
    """Concrete shape of every graph input with ``dims`` (from ``resolve_dims``) applied."""
    shapes = {}
    for inp in _graph_inputs(model):
        shape = []
        for axis, d in enumerate(inp.type.tensor_type.shape.dim):
            name = _dim_name(inp, axis, d)
            shape.append(d.dim_value if name is None else int(dims.get(name, 1)))
        shapes[inp.name] = shape
    return shapes


def check_input_memory(model: onnx.ModelProto, dims: Mapping[str, int], where: str,
                       max_mib: float = DEFAULT_MAX_INPUT_MIB) -> None:
    """Refuse, before allocating, generated inputs whose declared shapes need more than ``max_mib`` MiB."""
    total, biggest = 0, ("", [], 0)
    shapes = input_shapes(model, dims)
    for inp in _graph_inputs(model):
        shape = shapes[inp.name]
        dtype = numpy_dtype(inp.type.tensor_type.elem_type)
        nbytes = math.prod(shape) * (np.dtype(dtype).itemsize if dtype is not None else 1)
        total += nbytes
        if nbytes >= biggest[2]:
            biggest = (inp.name, shape, nbytes)
    if total > max_mib * 2**20:
        how = "set smaller sizes with --dim NAME=VALUE or raise --max-input-mib" if dims else "raise --max-input-mib"
        raise ReportInputError(f"{where}: the generated inputs need {total / 2**20:,.0f} MiB (largest: "
                               f"'{biggest[0]}' {biggest[1]}), above the {max_mib:g} MiB limit; {how}")


def make_feeds(model: onnx.ModelProto, dims: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """input_ids: ints < vocab; masks: ones; position_ids: arange; other floats: random normal; other ints: 0.
    Sizes: ``input_shapes``; callers check ``check_input_memory`` first."""
    rng = np.random.default_rng(seed)
    shapes = input_shapes(model, dims)
    feeds = {}
    for inp in _graph_inputs(model):
        tt = inp.type.tensor_type
        shape = shapes[inp.name]
        dtype = numpy_dtype(tt.elem_type)
        if dtype is None:
            raise ReportInputError(f"input '{inp.name}' has an element type npu-report cannot generate")
        lname = inp.name.lower()
        if "input_ids" in lname:
            feeds[inp.name] = rng.integers(0, _vocab_size(model, inp.name), shape).astype(dtype)
        elif "mask" in lname:
            feeds[inp.name] = np.ones(shape, dtype)
        elif "position_ids" in lname:
            feeds[inp.name] = np.broadcast_to(np.arange(shape[-1] if shape else 1), shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = np.ones(shape, dtype)
        else:
            feeds[inp.name] = np.zeros(shape, dtype)
    return feeds


def quiet(so: ort.SessionOptions) -> ort.SessionOptions:
    """Only fatal messages in ORT's log for the report's sessions: an ORT error reaches the user once, as the
    exception the report turns into one line (ReportInputError / NpuEPFailure), not twice."""
    so.log_severity_level = 4
    return so


def npu_session(model_bytes: bytes, provider_options: Mapping[str, str], *,
                so: ort.SessionOptions | None = None, memory: str = "host") -> tuple[ort.InferenceSession, EpSession]:
    """An NpuEP session that records ORT's graph assignment and never silently falls back, and its EpSession.
    ``so``: session options to start from (e.g. with profiling enabled); ``memory``: NpuEP's OrtEpDevice, "host"
    (what providers=["NpuEP"] selects) or "npu" (partition inputs/outputs in NPU memory, ``ep.device_memory``)."""
    so = quiet(so or ort.SessionOptions())
    tag_session_options(so)
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    opts = {"cache_dir": "", **provider_options}
    if memory == "host":
        sess = ort.InferenceSession(model_bytes, sess_options=so, providers=[("NpuEP", opts), "CPUExecutionProvider"],
                                    enable_fallback=0)
    else:
        add_npu_ep(so, opts, memory=memory)  # ORT adds the CPU EP after it
        sess = ort.InferenceSession(model_bytes, sess_options=so, enable_fallback=0)
    return sess, session_of(sess)


def cpu_session(model_bytes: bytes, feeds: Mapping[str, np.ndarray], where: str) -> ort.InferenceSession:
    """A CPU EP session that has run ``feeds`` once: ORT's own validation of the model and the generated inputs.
    Anything ORT refuses here is bad input (``ReportInputError`` naming the file)."""
    cpu = cpu_loaded(model_bytes, where)
    cpu_run(cpu, feeds, where)
    return cpu


def cpu_loaded(model_bytes: bytes, where: str) -> ort.InferenceSession:
    """A CPU EP session of the model (ORT refusing it: ``ReportInputError``)."""
    try:
        return ort.InferenceSession(model_bytes, quiet(ort.SessionOptions()), providers=["CPUExecutionProvider"])
    except ort_exceptions() as exc:
        raise ort_error(where, "load the model", exc) from None


def cpu_run(cpu: ort.InferenceSession, feeds: Mapping[str, np.ndarray], where: str) -> None:
    """One run of ``feeds`` on the CPU EP (ORT refusing it: ``ReportInputError``)."""
    try:
        cpu.run(None, dict(feeds))
    except ort_exceptions() as exc:
        raise ort_error(where, "run the model on the CPU EP", exc) from None


def assignment(sess: ort.InferenceSession) -> dict[str, str]:
    """node name -> EP that ran it, from ORT's own record."""
    return {n.name: sg.ep_name for sg in sess.get_provider_graph_assignment_info() for n in sg.get_nodes()}


def measure(sess: ort.InferenceSession, ep: EpSession, cpu: ort.InferenceSession, feeds: Mapping[str, np.ndarray],
            runs: int, warmup: int = 2) -> dict[str, Any]:
    """Latency on NpuEP and on the CPU EP timed in alternating blocks after ``warmup`` runs of each
    (``bench.timing``: the host's slow phases weigh on both EPs), the spread of the per-block NpuEP / CPU EP
    ratios, the shim's per-partition counters over the same NpuEP runs, and how many nodes ORT's own graph
    assignment record puts on each EP (proof that NpuEP ran them)."""
    from ..bench.timing import alternating_blocks, block_ratios

    feeds = dict(feeds)
    for _ in range(warmup):
        sess.run(None, feeds)
        cpu.run(None, feeds)
    rounds = max(1, min(MEASURE_BLOCKS, runs))
    extension().reset_stats()
    counted = getattr(ep, "device_stats_key", None) is not None  # a session the plugin created
    device_before = ep.device_counters() if counted else None
    blocks = alternating_blocks({"npu": lambda: sess.run(None, feeds), "cpu": lambda: cpu.run(None, feeds)},
                                runs, rounds, warmup=False)
    stats = extension().partition_stats()
    device_after = ep.device_counters() if counted else None
    npu_s = [t for block in blocks["npu"] for t in block]
    cpu_s = [t for block in blocks["cpu"] for t in block]
    ratios = block_ratios(blocks, "npu", "cpu")
    runs = len(npu_s)
    parts = []
    for name in ep.programs:
        s = stats.get(name, {})
        calls = int(s.get("calls", 0))
        per = max(calls, 1)
        parts.append({"partition": name, "calls_per_run": calls / runs,
                      "total_us_per_call": s.get("total_ns", 0) / per / 1e3,
                      "program_us_per_call": s.get("program_ns", 0) / per / 1e3,
                      "bridge_us_per_call": (s.get("total_ns", 0) - s.get("program_ns", 0)) / per / 1e3,
                      "bytes_in_per_call": s.get("bytes_in", 0) // per,
                      "bytes_out_per_call": s.get("bytes_out", 0) // per,
                      "bytes_in_npu_per_call": s.get("bytes_in_npu", 0) // per,
                      "bytes_out_npu_per_call": s.get("bytes_out_npu", 0) // per})
    placed = Counter(assignment(sess).values())
    return {"runs": runs, "npu_latency_us": statistics.median(npu_s) * 1e6,
            "cpu_latency_us": statistics.median(cpu_s) * 1e6, "npu_mean_us": statistics.fmean(npu_s) * 1e6,
            "cpu_mean_us": statistics.fmean(cpu_s) * 1e6,
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                      "blocks": rounds, "runs_per_block": runs // rounds},
            "partitions": parts, "assignment": dict(sorted(placed.items())), "profile": None,
            "boundaries": boundaries(parts, device_before, device_after, runs) if counted else None}


def attribute_bridge(crossings: Sequence[dict], measured_parts: Sequence[dict]) -> None:
    """Set ``measured_us`` (per run) on every crossing: its partition's bridge time per call x calls per run,
    split by bytes (evenly when sizes are unknown)."""
    by_part: dict[str, list[dict]] = {}
    for c in crossings:
        by_part.setdefault(c["partition"], []).append(c)
    for m in measured_parts:
        group = by_part.get(m["partition"], [])
        sizes = [c["bytes"] or 0 for c in group]
        total = sum(sizes)
        for c, b in zip(group, sizes):
            share = b / total if total else 1 / len(group)
            c["measured_us"] = m["bridge_us_per_call"] * share
            c["per_run"] = m["calls_per_run"]
