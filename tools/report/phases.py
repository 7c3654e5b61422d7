"""Prefill vs decode for ``npu-report --run`` on a model with a KV cache (``past_key_values`` inputs).

Why both: a decoder runs one wide prefill (S prompt tokens, empty past) and then many one-token decode steps
(S = 1, past = everything so far). Their profiles differ: prefill is matrix-bound, decode moves the weights
and the KV cache for one row, so boundaries and DMA dominate. One report number for "the model" hides which.

What runs: on the same NpuEP session as the rest of the report (no second compile), one prefill-shaped execution
(``prefill_tokens`` new tokens, past length 0) and one decode-shaped execution (1 new token, past = the prefill's
``present`` outputs, mask of P + 1 ones), each ``runs`` times on NpuEP and on the CPU EP for the host time
(median, us). Emulated NPU cycles, DMA cycles and bytes come from the programs' cost model for the input
signatures the phase's first execution called (each program counts calls per signature).

Graph I/O conventions (HF/Optimum, see ``npu_ep.models.feeds``): ``input_ids`` [B, S], ``attention_mask``
[B, P + S], ``position_ids`` [B, S], past ``[B, Nkv, P, H]`` named ``past_key_values.<i>.key|value`` (or
``past_*``), presents named ``present.<i>.key|value`` (or ``present_*``). The past length must be a symbolic dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ...ep.entry_points import EpSession
from .run import make_feeds

DEFAULT_PREFILL_TOKENS = 16


def _dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in vi.type.tensor_type.shape.dim]


def kv_io(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The model's KV-cache plumbing, ``None`` when it has no past inputs, or ``{"skipped": reason}``."""
    inputs = {i.name: i for i in model.graph.input}
    past = [n for n in inputs if n.startswith("past_key_values") or n.startswith("past_")]
    if not past:
        return None
    outputs = {o.name for o in model.graph.output}
    present = {}
    for name in past:
        for cand in (name.replace("past_key_values", "present", 1), name.replace("past", "present", 1)):
            if cand in outputs:
                present[name] = cand
                break
        else:
            return {"skipped": f"no present output for past input '{name}'"}
    shape = _dims(inputs[past[0]])
    if len(shape) != 4 or not isinstance(shape[2], str):
        return {"skipped": f"past input '{past[0]}' has shape {shape}: needs [B, Nkv, past (symbolic), H]"}
    if "input_ids" not in inputs or len(_dims(inputs["input_ids"])) != 2:
        return {"skipped": "no input_ids [B, S] input"}
    seq = _dims(inputs["input_ids"])[1]
    total = _dims(inputs["attention_mask"])[1] if "attention_mask" in inputs else None
    return {"present": present, "past_dim": shape[2], "seq_dim": seq, "total_dim": total}


def _phase_dims(kv: Mapping[str, Any], dims: Mapping[str, int], new: int, past: int) -> dict[str, int]:
    out = dict(dims)
    out[kv["past_dim"]] = past
    for key, value in ((kv["seq_dim"], new), (kv["total_dim"], past + new)):
        if isinstance(key, str):
            out[key] = value
    return out


def decode_feeds(model: onnx.ModelProto, kv: Mapping[str, Any], dims: Mapping[str, int], prefill_tokens: int,
                 presents: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One new token after ``prefill_tokens``: past = the prefill's presents, position P, mask of P + 1 ones."""
    feeds = make_feeds(model, _phase_dims(kv, dims, 1, prefill_tokens), seed=1)
    for past, present in kv["present"].items():
        feeds[past] = presents[present]
    if "position_ids" in feeds:
        feeds["position_ids"] = np.full_like(feeds["position_ids"], prefill_tokens)
    return feeds


def _snapshot(ep: EpSession) -> dict[str, dict]:
    return {name: dict(p.signatures) for name, p in ep.programs.items()}


def _emulated(ep: EpSession, before: Mapping[str, dict]) -> dict[str, Any]:
    """Cost-model totals of the calls made since ``before``, and which (partition, signature) they were."""
    cycles = compute = dma_cycles = 0.0
    dma_bytes = calls = 0
    parts = []
    for name, prog in ep.programs.items():
        for sig, n in prog.signatures.items():
            new = n - before.get(name, {}).get(sig, 0)
            cost = prog.cost_for(sig) if new > 0 else None
            if cost is None:
                continue
            calls += new
            cycles += cost.cycles * new
            compute += sum(s.compute_cycles for s in cost.steps) * new
            dma_cycles += sum(s.dma_cycles for s in cost.steps) * new
            dma_bytes += cost.dma_bytes * new
            parts.append({"partition": name, "signature": [list(s) for s in sig], "calls": new,
                          "cycles": float(cost.cycles), "dma_bytes": int(cost.dma_bytes)})
    return {"npu_cycles": cycles, "npu_compute_cycles": compute, "npu_dma_cycles": dma_cycles,
            "dma_bytes": int(dma_bytes), "partition_calls": calls, "partitions": parts}


def _host_us(sess: ort.InferenceSession, cpu: ort.InferenceSession, feeds: Mapping[str, np.ndarray],
             runs: int) -> tuple[float, float]:
    """(NpuEP, CPU EP) median us per execution, the two alternating in blocks (``bench.timing``)."""
    from ..bench.timing import alternating_blocks, medians

    feeds = dict(feeds)
    blocks = alternating_blocks({"npu": lambda: sess.run(None, feeds), "cpu": lambda: cpu.run(None, feeds)},
                                runs, rounds=max(1, min(3, runs)))
    med = medians(blocks)
    return med["npu"] * 1e6, med["cpu"] * 1e6


class _Skip(Exception):
    """The CPU EP refuses a phase's generated feeds: the model's cache plumbing is not the convention."""


def _phase(name: str, sess, ep, cpu, feeds, runs: int, target, tokens: int, past: int) -> tuple[dict, dict]:
    from .validate import ort_exceptions

    try:  # the CPU EP first: a refusal there means our feeds do not fit the model, not an NpuEP failure
        cpu.run(None, dict(feeds))
    except ort_exceptions() as exc:
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise _Skip(f"the CPU EP refuses the {name}-shaped feeds: {first[:300]}") from None
    before = _snapshot(ep)
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(feeds))))
    emu = _emulated(ep, before)
    host_us, cpu_host_us = _host_us(sess, cpu, feeds, runs)
    row = {"phase": name, "new_tokens": tokens, "past_tokens": past, **emu,
           "npu_us": target.cycles_to_seconds(emu["npu_cycles"]) * 1e6,
           "host_us": host_us, "cpu_host_us": cpu_host_us}
    return row, outs


def measure_phases(sess: ort.InferenceSession, ep: EpSession, cpu: ort.InferenceSession, model: onnx.ModelProto,
                   dims: Mapping[str, int], target, *, runs: int = 5,
                   prefill_tokens: int = DEFAULT_PREFILL_TOKENS) -> dict[str, Any] | None:
    """``{"prefill": row, "decode": row}`` (see module docstring), ``None`` without a KV cache, or
    ``{"skipped": reason}`` when the cache plumbing is not the convention above."""
    kv = kv_io(model)
    if kv is None or "skipped" in kv:
        return kv
    runs = max(1, runs)
    try:
        pre_feeds = make_feeds(model, _phase_dims(kv, dims, prefill_tokens, 0))
        prefill, outs = _phase("prefill", sess, ep, cpu, pre_feeds, runs, target, prefill_tokens, 0)
        dec_feeds = decode_feeds(model, kv, dims, prefill_tokens, outs)
        decode, _ = _phase("decode", sess, ep, cpu, dec_feeds, runs, target, 1, prefill_tokens)
    except _Skip as exc:
        return {"skipped": str(exc)}
    return {"prefill": prefill, "decode": decode}


def label_timeline(timeline: list[dict], phases: Mapping[str, Any] | None) -> None:
    """Set ``phase`` on timeline entries whose (partition, signature) a phase executed (else ``None``)."""
    seen = {}
    for key in ("prefill", "decode"):
        row = (phases or {}).get(key)
        for p in (row or {}).get("partitions", []):
            seen[(p["partition"], repr(p["signature"]))] = key
    for entry in timeline:
        entry["phase"] = seen.get((entry["partition"], repr(entry["signature"])))


def entries_report(ep: EpSession | None) -> dict[str, Any] | None:
    """The generation entry points that ran on this session (``tools.generation.entries``: first prefill, prefill
    with history, decode, each its bucket, calls and the program signatures it ran), or None when no generator
    ran on it. ``weight_bytes``: the distinct weight buffers the programs hold, one copy for every entry;
    ``declared``: the entry points the session was told of before it compiled (or its context model names)."""
    from ..generation.entries import EntryTable, entries_of

    table = entries_of(ep) if ep is not None else None
    declared = list(getattr(ep, "declared_entries", []) or [])
    if (table is None or not table.entries) and not declared:
        return None
    if table is None:  # a session that declares entries (or loaded a context naming them) and ran none yet
        table = EntryTable([ep], register=False)
    return {"entries": table.rows(), "weight_bytes": table.weight_bytes(),
            "programs": sorted(name for e in table.eps for name in e.programs), "declared": declared,
            "kv_per_decode_step": kv_decode_report(ep)}


def kv_decode_report(ep: EpSession) -> list[dict[str, Any]]:
    """Issue 41's three KV facts per decode token, one row per KV mode a generator ran on this session: KV bytes
    across the host<->NPU boundary, bytes moved inside NPU memory (appends in place), full copies (and the past
    bytes they copied); each priced as the target's DMA (``kernels.cost.dma_cycles``) beside the emulated step."""
    from ...kernels.cost import dma_cycles
    from ..generation.entries import kv_decode_of

    def dma_us(nbytes: float, transfers: float) -> float:
        if nbytes <= 0:
            return 0.0
        return dma_cycles(ep.target, int(nbytes), transfers=max(transfers, 1.0)) / ep.target.clock_hz * 1e6

    rows = []
    for kv in kv_decode_of(ep):
        across = kv["kv_across_boundary_bytes"]
        rows.append({"mode": kv["mode"], "decode_steps": kv["decode_steps"],
                     "kv_across_boundary_bytes": across, "moved_in_npu_memory_bytes": kv["appended_in_place_bytes"],
                     "appended_into_copy_bytes": kv["appended_into_copy_bytes"],
                     "past_copied_bytes": kv["past_copied_bytes"], "full_copies": kv["full_copies"],
                     "npu_us": kv["npu_s"] * 1e6, "inter_token_us": kv["inter_token_s"] * 1e6,
                     "dma_us": {"across_boundary": dma_us(across or 0.0, 2.0),  # past in, present out
                                "in_place": dma_us(kv["appended_in_place_bytes"], 1.0),
                                "full_copies": dma_us(kv["past_copied_bytes"] + kv["appended_into_copy_bytes"],
                                                      kv["full_copies"])}})
    return rows


def label_entries(timeline: list[dict], entries: Mapping[str, Any] | None) -> None:
    """Set ``entry`` on timeline entries whose (partition, signature) a generation entry ran (else ``None``)."""
    seen = {}
    for e in (entries or {}).get("entries", []):
        for name, sig in e["programs"].items():
            seen[(name, repr([list(s) for s in sig]))] = e["name"]
    for entry in timeline:
        entry["entry"] = seen.get((entry["partition"], repr(entry["signature"])))

