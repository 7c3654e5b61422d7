"""Model analysis for ``npu-report``: coverage, partitions and CPU<->NPU crossings from a capability result.

Input is the node list the capability decided on (``nodes_from_model`` for a file, or the live session's graph,
which differs after ORT's level-1 fusions) and its ``Capability``. Output is plain JSON-ready dicts.

A *crossing* is one tensor passing the bridge in one partition call: every non-constant partition input
(direction ``to_npu``) and every partition output read outside the partition or returned by the graph
(direction ``to_cpu``). That is exactly what the shim's ``bytes_in``/``bytes_out`` counters see, so measured
bridge time can be split over crossings. Sizes in bytes; unresolved symbolic dims give ``bytes: null``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...ep.capability import Capability
from ...kernels.node import NodeInfo, ValueInfo

_LAYER_RE = re.compile(r"(?:^|[/._:])(?:layers?|blocks?|h|block)[/._]?(\d+)(?=$|[/._:+])", re.IGNORECASE)


def op_name(n: NodeInfo) -> str:
    return f"{n.domain}::{n.op_type}" if n.domain else n.op_type


_AUTO_NAME_RE = re.compile(r"^/?(?:node_)?[A-Za-z]+(?:_\d+)?$")  # "node_GroupQueryAttention_78", "/Add_4"
_WEIGHT_RE = re.compile(r"[._](?:weight|bias)$")
_LAYERS: contextvars.ContextVar[Mapping[str, int | None] | None] = contextvars.ContextVar("npu_report_layers",
                                                                                         default=None)


def _named_layer(name: str) -> int | None:
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def layer_of(name: str) -> int | None:
    """Layer index of a node: from the graph's data flow inside ``layer_scope``, else from exporter naming
    (``/model/layers.3/...``, ``layers.3.mlp``, ``h.3``, ``block_3``)."""
    known = _LAYERS.get()
    if known is not None and name in known:
        return known[name]
    return _named_layer(name)


def infer_layers(nodes: Sequence[NodeInfo]) -> dict[str, int | None]:
    """Layer of every node. Exporter names decide where they carry a layer; nodes the rewriter or exporter named
    by op type alone (``node_GroupQueryAttention_78``) take the layer of their weights (``...layers.2...weight``),
    else of the producers of their inputs, so fused attention and residual Adds land in their layer."""
    produced: dict[str, int | None] = {}
    layers: dict[str, int | None] = {}
    for n in nodes:  # topological order
        layer = _named_layer(n.name)
        if layer is None and _AUTO_NAME_RE.match(n.name):
            weights = [v.name for v in n.inputs if v.is_constant and _WEIGHT_RE.search(v.name)]
            if weights:
                layer = max((ly for ly in map(_named_layer, weights) if ly is not None), default=None)
            else:
                layer = max((ly for v in n.inputs if not v.missing
                             for ly in (produced.get(v.name),) if ly is not None), default=None)
        layers[n.name] = layer
        for v in n.outputs:
            produced[v.name] = layer
    return layers


@contextlib.contextmanager
def layer_scope(nodes: Sequence[NodeInfo]) -> Iterator[None]:
    """Make ``layer_of`` answer from the data flow of ``nodes`` for the duration of one report."""
    token = _LAYERS.set(infer_layers(nodes))
    try:
        yield
    finally:
        _LAYERS.reset(token)


def resolve_shape(v: ValueInfo, dims: Mapping[str, int]) -> list | None:
    """Declared shape with symbolic dims from ``dims``; a negative (unknown, ``-1``) dim stays unknown (None)."""
    if v.shape is None:
        return None
    return [(d if d >= 0 else None) if isinstance(d, int) else dims.get(d, d) if isinstance(d, str) else None
            for d in v.shape]


def tensor_bytes(v: ValueInfo, dims: Mapping[str, int]) -> int | None:
    shape = resolve_shape(v, dims)
    if shape is None or v.dtype is None or not all(isinstance(d, int) for d in shape):
        return None
    return math.prod(shape) * v.dtype.itemsize


def coverage(cap: Capability) -> dict[str, Any]:
    """claimed/total, per op type, and every declined node with its reason."""
    total, claimed = Counter(), Counter()
    for d in cap.decisions:
        total[op_name(d.node)] += 1
        claimed[op_name(d.node)] += d.claimed
    declined = [{"node": d.node.name, "op": op_name(d.node), "reason": d.reason, "layer": layer_of(d.node.name)}
                for d in cap.declined]
    by_op = [{"op": op, "total": total[op], "claimed": claimed[op]}
             for op in sorted(total, key=lambda o: (-total[o], o))]
    return {"total": len(cap.decisions), "claimed": sum(claimed.values()), "declined": len(declined),
            "by_op": by_op, "declined_nodes": declined}


def _tensor(v: ValueInfo, dims: Mapping[str, int]) -> dict[str, Any]:
    return {"name": v.name, "dtype": v.dtype.name if v.dtype is not None else None,
            "shape": resolve_shape(v, dims), "bytes": tensor_bytes(v, dims)}


def partition_id(index: int) -> str:
    """``p0``, ``p1``...: how the report names a partition to people (the partition dumps' files are ``p000.onnx``);
    ``name`` stays the EP's (ORT's fused node, the key of the measurements and of ORT's profile)."""
    return f"p{index}"


def partition_label(index: int, layers: Sequence[int], n_nodes: int) -> str:
    """``p0: layers 0-3, 65 nodes``: the partition by what it holds."""
    return f"{partition_id(index)}: {_layer_ranges(layers)}{n_nodes} node{'s' if n_nodes != 1 else ''}"


def _layer_ranges(layers: Sequence[int]) -> str:
    """``layer 2, `` / ``layers 0-3, 5, `` / ``"`` (no layers known)."""
    runs: list[list[int]] = []
    for ly in sorted(set(layers)):
        if runs and ly == runs[-1][1] + 1:
            runs[-1][1] = ly
        else:
            runs.append([ly, ly])
    if not runs:
        return ""
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {text}, "


def partitions_and_crossings(nodes: Sequence[NodeInfo], cap: Capability, dims: Mapping[str, int],
                             names: Sequence[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Partitions (nodes, inputs, outputs) and the crossings they create. ``names``: the EP's partition names
    in the same order when known (live session), else ``partition_<i>``."""
    by_index = {n.index: n for n in nodes}
    partition_of = {i: p for p, group in enumerate(cap.partitions) for i in group}
    producer = {v.name: n for n in nodes for v in n.outputs if not v.missing}
    consumers: dict[str, list[NodeInfo]] = defaultdict(list)
    for n in nodes:
        for v in n.inputs:
            if not v.missing:
                consumers[v.name].append(n)

    def side(n: NodeInfo | None) -> str:
        if n is None:
            return "graph input"
        p = partition_of.get(n.index)
        return f"cpu:{n.name}" if p is None else f"partition:{partition_id(p)}"

    parts, crossings = [], []
    for p, group in enumerate(cap.partitions):
        name = names[p] if names else f"partition_{p}"
        members = [by_index[i] for i in group]
        inside = set(group)
        produced = {v.name for n in members for v in n.outputs if not v.missing}
        inputs: dict[str, tuple[ValueInfo, NodeInfo]] = {}
        for n in members:
            for v in n.inputs:
                if not v.missing and not v.is_constant and v.name not in produced and v.name not in inputs:
                    inputs[v.name] = (v, n)
        outputs: dict[str, tuple[ValueInfo, NodeInfo, list[str]]] = {}
        for n in members:
            for v in n.outputs:
                if v.missing:
                    continue
                readers = [side(c) for c in consumers.get(v.name, []) if c.index not in inside]
                if v.is_graph_output:
                    readers.append("graph output")
                if readers:
                    outputs[v.name] = (v, n, sorted(set(readers)))
        layers = sorted({ly for ly in (layer_of(n.name) for n in members) if ly is not None})
        parts.append({"name": name, "id": partition_id(p), "label": partition_label(p, layers, len(members)),
                      "nodes": [n.name for n in members], "ops": [op_name(n) for n in members],
                      "inputs": [_tensor(v, dims) for v, _ in inputs.values()],
                      "outputs": [_tensor(v, dims) for v, _, _ in outputs.values()], "layers": layers})
        for v, reader in inputs.values():
            crossings.append({**_tensor(v, dims), "direction": "to_npu", "partition": name,
                              "peer": [side(producer.get(v.name))], "npu_node": reader.name,
                              "layer": layer_of(reader.name), "per_run": 1})
        for v, writer, readers in outputs.values():
            crossings.append({**_tensor(v, dims), "direction": "to_cpu", "partition": name, "peer": readers,
                              "npu_node": writer.name, "layer": layer_of(writer.name), "per_run": 1})
    return parts, crossings


def layer_summary(nodes: Sequence[NodeInfo], crossings: Sequence[dict], layers_arg: int | None) -> dict[str, Any]:
    """Repeated layer structure: from node names, or ``--layers``; crossings per layer (n_b)."""
    found = sorted({ly for ly in (layer_of(n.name) for n in nodes) if ly is not None})
    count, source = (layers_arg, "argument") if layers_arg else (len(found), "node names") if found else (0, "none")
    per_layer = Counter(c["layer"] for c in crossings if c["layer"] is not None)
    in_layers = sum(per_layer.values())
    spread = in_layers if found else len(crossings)  # --layers on a model without layer names: spread them all
    n_b = spread / count if count else 0.0
    return {"count": count, "source": source, "crossings_per_layer": n_b,
            "crossings_by_layer": [{"layer": ly, "crossings": per_layer.get(ly, 0)} for ly in found],
            "crossings_outside_layers": len(crossings) - in_layers}
