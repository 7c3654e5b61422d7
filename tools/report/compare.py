"""Stage-by-stage numerics for ``npu-report --compare``: golden per-node outputs vs what NpuEP computed.

Reference: the CPU EP on a copy of the model with every node output made a graph output, optimizations off (so
every node of the file exists). NpuEP: the unmodified model with provider option ``record_tensors=1``; each
program keeps ``"node_name:i" -> array`` for its steps (a fused epilogue step is named ``"a+b+c"``: its output
is the output of the last absorbed node ``c``). Per node: max abs diff and max relative diff
(``max|d| / max|ref|``); a node fails when ``max|d| > atol + rtol * max|ref|`` for its dtype (table below).
The first failing nodes are then run alone on the CPU EP with NpuEP's own inputs (``local_check``): ``local``
says whether each one's kernel agrees (the difference came from upstream) and ``first_kernel_failure`` names the
first that does not.

With a float model (``float_model=``) the result also carries ``three_way`` (see ``quant``): float
reference vs quantized reference vs NpuEP per graph output and per recorded tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from .local_check import local_checks, numpy_values
from .quant import diff, float_reference, is_quantized, three_way
from .run import npu_session, quiet

# dtype -> (atol, rtol): fp32 kernels reassociate sums; fp16 keeps ~3 decimal digits; integers allow 1 LSB
TOLERANCE = {"float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2), "float64": (1e-8, 1e-6)}
INT_TOLERANCE = (1.0, 0.0)


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    return TOLERANCE.get(np.dtype(dtype).name, INT_TOLERANCE if np.issubdtype(dtype, np.integer) else (0.0, 0.0))


def expose_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy of ``model`` whose graph outputs include every node output with a known type."""
    m = onnx.shape_inference.infer_shapes(model)
    known = {o.name for o in m.graph.output}
    types = {vi.name: vi for vi in m.graph.value_info}
    for n in m.graph.node:
        for out in n.output:
            if out and out not in known and out in types:
                m.graph.output.append(types[out])
                known.add(out)
    return m


def _reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    exposed = expose_all_outputs(model)
    so = quiet(ort.SessionOptions())
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(exposed.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds))))


def _recorded(ep, nodes) -> tuple[list[tuple[str, str, np.ndarray]], list[str]]:
    """NpuEP's recorded tensors as (step name, tensor name, value), and the keys that map to no tensor.

    A fused step's outputs belong to the last node it absorbed, unless the kernel names their owners
    (``output_owners``: a sibling group's output i is member i's output; the member then labels the row)."""
    outputs = {n.name: [v.name for v in n.outputs] for n in nodes}
    found, unmatched = [], []
    for prog in ep.programs.values():
        owners = {s.node_name: s.prepared.attrs.get("output_owners") for s in prog.steps}
        for key, got in prog.recorded.items():
            step, _, idx = key.rpartition(":")
            i, own = int(idx), owners.get(step)
            node, j = (own[i][0], int(own[i][1])) if own and i < len(own) else (step.split("+")[-1], i)
            names = outputs.get(node, [])
            if j < len(names):
                found.append((node if own else step, names[j], np.asarray(got)))
            else:
                unmatched.append(key)
    return found, unmatched


def _node_row(step: str, tensor: str, want: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    row = {"node": step, "tensor": tensor, "dtype": want.dtype.name, "shape": list(want.shape)}
    if got.shape != want.shape:
        return {**row, "max_abs": None, "max_rel": None, "ok": False,
                "note": f"shape {list(got.shape)} != reference {list(want.shape)}"}
    d = diff(want, got)
    finite = np.abs(want[np.isfinite(want)]) if np.issubdtype(want.dtype, np.floating) else np.abs(want)
    scale = float(np.max(finite)) if finite.size else 0.0  # an infinity in the reference must not widen the tolerance
    atol, rtol = tolerance(want.dtype)
    return {**row, **d, "ok": bool(d["max_abs"] <= atol + rtol * scale), "note": ""}


def _within(want: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    row = _node_row("", "", want, got)
    return {k: row[k] for k in ("max_abs", "max_rel", "ok", "note")}


def compare(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], provider_options: Mapping[str, str],
            float_model: onnx.ModelProto | None = None) -> dict[str, Any]:
    """Per-node diffs for every node NpuEP recorded, in graph order, and the first node out of tolerance;
    with ``float_model`` also the three-way view."""
    ref = _reference(model, feeds)
    # NpuEP sees the graph the reference runs: ORT's level-1 transforms (e.g. merging Q->DQ->Q->DQ pairs) rewrite
    # nodes before any EP is asked, and would show up as 'kernel' differences of the nodes they changed
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, ep = npu_session(model.SerializeToString(), {**provider_options, "record_tensors": "1"}, so=so)
    output_names = [o.name for o in sess.get_outputs()]
    npu_outputs = dict(zip(output_names, sess.run(None, dict(feeds))))
    nodes = [d.node for d in ep.capabilities[-1][1].decisions] if ep.capabilities else []
    order = {n.name: i for i, n in enumerate(nodes)}
    recorded, unmatched = _recorded(ep, nodes)
    rows = []
    for step, tensor, got in recorded:
        if tensor not in ref:
            unmatched.append(f"{step}:{tensor}")
            continue
        rows.append(_node_row(step, tensor, ref[tensor], got))
    rows.sort(key=lambda r: order.get(r["node"].split("+")[-1], 1 << 30))
    first_bad = next((r["node"] for r in rows if not r["ok"]), None)
    local = local_checks(model, rows, numpy_values(recorded), feeds, _within) if first_bad else []
    doc = {"nodes": rows, "first_failure": first_bad, "unmatched": sorted(unmatched),
           "local": local, "first_kernel_failure": next((c["node"] for c in local if not c["ok"]), None),
           "tolerances": {k: {"atol": a, "rtol": r} for k, (a, r) in TOLERANCE.items()},
           "quantized": is_quantized(model), "three_way": None}
    if float_model is not None:
        fmodel, info = float_reference(model, float_model)
        if info["unmatched"] or not info["substituted"]:
            fmodel = float_model
        info["float_source"] = "substituted" if fmodel is not float_model else "float model"
        fref = _reference(fmodel, feeds)
        recorded.sort(key=lambda r: order.get(r[0].split("+")[-1], 1 << 30))
        doc["three_way"] = three_way(fref, ref, npu_outputs, recorded, output_names, info)
    return doc
