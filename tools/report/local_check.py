"""Is a node out of tolerance because of its own kernel, or because its inputs already differed?

``compare`` measures every node against the CPU EP's run of the whole model, so an error made upstream shows up
again at every node after it, and ops that quantize their activations (MatMulNBits with accuracy_level 4,
DynamicQuantize*) amplify a rounding difference of their input into a much larger one of their output. Here the
node runs alone on the CPU EP (optimizations off, as the reference) on exactly the inputs NpuEP recorded for it:
if NpuEP's output agrees with that, the kernel is right and the difference was propagated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .run import quiet

MAX_CHECKS = 8  # sessions per report: the first failing nodes are the ones that explain the rest
MAX_NODES = 8  # a node whose inputs NpuEP did not record (fused away) runs with their producers, up to this many


def _subgraph(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto], order: Mapping[str, int],
              known: Mapping[str, np.ndarray], consts: Mapping[str, Any]) -> list[onnx.NodeProto] | None:
    """``node`` and the producers of its unknown inputs (transitively, up to ``MAX_NODES``) in graph order, so
    that every input of the set is a constant or a known value; None when that takes more nodes."""
    chosen, todo = {node.name: node}, [node]
    while todo:
        for name in todo.pop().input:
            if not name or name in consts or name in known:
                continue
            p = producers.get(name)
            if p is None or p.op_type in ("If", "Loop", "Scan") or len(chosen) >= MAX_NODES:
                return None
            if p.name not in chosen:
                chosen[p.name] = p
                todo.append(p)
    return sorted(chosen.values(), key=lambda n: order[n.name])


def _local_model(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray],
                       consts: Mapping[str, onnx.TensorProto]) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for n, v in feeds.items()]
    node = nodes[-1]
    outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]  # types: ORT infers them
    used = {i for n in nodes for i in n.input if i in consts}
    graph = helper.make_graph(list(nodes), "local_check", inputs, outputs, [consts[n] for n in sorted(used)])
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m


def local_checks(model: onnx.ModelProto, rows: Sequence[dict[str, Any]], npu_values: Mapping[str, np.ndarray],
                 graph_feeds: Mapping[str, np.ndarray],
                 within: Callable[[np.ndarray, np.ndarray], dict[str, Any]]) -> list[dict[str, Any]]:
    """For the first ``MAX_CHECKS`` failing rows: ``{"node", "tensor", "nodes_run", "max_abs", "max_rel", "ok"}``
    of NpuEP's output vs the node run alone on the CPU EP on NpuEP's recorded inputs (with the producers of inputs
    NpuEP did not record, fused into one of its steps: ``_subgraph``); rows that needs more nodes are skipped."""
    nodes = {n.name: n for n in model.graph.node}
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    producers = {o: n for n in model.graph.node for o in n.output if o}
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:  # Constant nodes are constants to the node that reads them
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = onnx.TensorProto()
            consts[n.output[0]].CopyFrom(n.attribute[0].t)
            consts[n.output[0]].name = n.output[0]
    out: list[dict[str, Any]] = []
    for row in rows:
        if len(out) >= MAX_CHECKS:
            break
        node = nodes.get(row["node"])
        if row["ok"] or node is None or node.op_type in ("If", "Loop", "Scan"):
            continue
        known = {**graph_feeds, **npu_values}
        sub = _subgraph(node, producers, order, known, consts)
        if sub is None:
            continue
        made = {o for n in sub for o in n.output}
        feeds = {i: known[i] for n in sub for i in n.input if i and i not in consts and i not in made}
        so = quiet(ort.SessionOptions())
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            sess = ort.InferenceSession(_local_model(model, sub, feeds, consts).SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
            ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(feeds))))
        except Exception:  # noqa: BLE001 - a node ORT cannot run alone is left unchecked, never a report failure
            continue
        if row["tensor"] in ref:
            out.append({"node": row["node"], "tensor": row["tensor"], "nodes_run": len(sub),
                        **within(ref[row["tensor"]], npu_values[row["tensor"]])})
    return out


def numpy_values(recorded: Sequence[tuple[str, str, np.ndarray]]) -> dict[str, np.ndarray]:
    """tensor name -> NpuEP's value, from compare's recorded rows."""
    return {tensor: np.asarray(value) for _, tensor, value in recorded}

