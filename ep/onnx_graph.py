"""Build the compiler's ``NodeInfo`` view straight from an ONNX model (no ORT session).

Used by offline tools (``npu-report`` without ``--run``) and by kernel tests; the EP itself gets the same view
from ORT's graph through the plugin shim (``ep.graph_convert``). Shapes come from ONNX shape inference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import onnx
from onnx import helper, numpy_helper

from ..kernels.node import Dim, NodeInfo, ValueInfo, canonical_domain
from ..kernels.ops.control_flow import BranchGraph
from ..dtypes import numpy_dtype


def _shape(t: onnx.TypeProto) -> tuple[Dim, ...] | None:
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _attr_value(a: onnx.AttributeProto):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes) and a.name != "ep_cache_context":
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8", "replace") for s in v]
    return v


def infer_all_shapes(model: onnx.ModelProto, *, symbolic: bool = False) -> onnx.ModelProto:
    """Shapes for every value, com.microsoft ops included: ONNX's inference knows only standard ops, so models
    with contrib ops (rewritten LLMs) go through ORT's symbolic shape inference, as an ORT session would.
    ``symbolic``: every model does, for inputs given concrete sizes: it also evaluates the shape arithmetic that
    ONNX's data propagation leaves unknown (a Range over Shape values: an exported decoder's causal mask, and so
    every attention and projection after it).

    Its inference loop is driven here rather than through ``SymbolicShapeInference.infer_shapes``, which on an
    incomplete result writes ``sym_shape_infer_temp.onnx`` and its external data into the current directory and
    raises; the partial shapes are still worth keeping."""
    if symbolic or any(n.domain == "com.microsoft" for n in model.graph.node):
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        try:
            inference = SymbolicShapeInference(2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0)
            inference.dispatcher_.setdefault("DynamicQuantizeLSTM", lambda n: _lstm_shapes(inference, n))
            inference._preprocess(model)
            while inference.run_:
                inference._infer_impl()
            inference._update_output_from_vi()
            return inference.out_mp_
        except Exception:  # noqa: BLE001 - it gives up on some graphs; ONNX's inference still gives most shapes
            pass
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _lstm_shapes(inference: Any, node: onnx.NodeProto) -> None:
    """Y [seq, dirs, batch, H], Y_h and Y_c [dirs, batch, H] of a com.microsoft DynamicQuantizeLSTM, the LSTM
    schema's shapes (ORT's symbolic inference has no rule for it, so everything after one had no types)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    dirs = 2 if attrs.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    hid = int(attrs.get("hidden_size", 0)) or None
    seq, batch = (inference._get_shape(node, 0) + [None, None])[:2]
    for i, out in enumerate(node.output):
        if out:
            shape = [seq, dirs, batch, hid] if i == 0 else [dirs, batch, hid]
            inference.known_vi_[out].CopyFrom(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, shape))


def nodes_from_model(model: onnx.ModelProto, *, infer_shapes: bool = True, symbolic: bool = False) -> list[NodeInfo]:
    """Every node of the main graph in topological (file) order, with inferred shapes (``symbolic``: as
    ``infer_all_shapes``) and constant values. A node holding graphs (If/Loop/Scan) gets each as a ``BranchGraph``
    and the outer-scope values they read appended to its inputs, as the plugin shim gives them to the EP
    (``ep.graph_convert``)."""
    if infer_shapes:
        model = infer_all_shapes(model, symbolic=symbolic)
    return _graph_nodes(model, model.graph, None, {})[0]


def _graph_nodes(model: onnx.ModelProto, g: onnx.GraphProto, outer_consts: dict[str, onnx.TensorProto] | None,
                 outer_types: dict[str, onnx.TypeProto]) -> tuple[list[NodeInfo], Callable[[str], ValueInfo]]:
    """The nodes of ``g`` and its value lookup; ``outer_consts`` None for the main graph, else the enclosing
    scopes' constants (a subgraph's formal inputs shadow them)."""
    consts = {} if outer_consts is None else {k: v for k, v in outer_consts.items()
                                               if k not in {i.name for i in g.input}}
    consts.update({t.name: t for t in g.initializer})
    for n in g.node:  # Constant nodes are constants too
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    types: dict[str, onnx.TypeProto] = dict(outer_types)
    for vi in (*g.input, *g.value_info, *g.output):
        types[vi.name] = vi.type
    graph_inputs = {i.name for i in g.input} - (set(consts) if outer_consts is None else set())
    graph_outputs = {o.name for o in g.output}

    def value(name: str) -> ValueInfo:
        if not name:
            return ValueInfo("", None, None)
        if name in consts:
            t = consts[name]
            arr = numpy_helper.to_array(t)
            return ValueInfo(name, numpy_dtype(t.data_type), tuple(int(d) for d in t.dims), arr, True,
                             False, name in graph_outputs, onnx_type=int(t.data_type))
        t = types.get(name)
        dtype = numpy_dtype(t.tensor_type.elem_type) if t is not None and t.HasField("tensor_type") else None
        return ValueInfo(name, dtype, _shape(t) if t is not None else None, None, False,
                         name in graph_inputs, name in graph_outputs,
                         onnx_type=int(t.tensor_type.elem_type) if t is not None and t.HasField("tensor_type") else 0)

    nodes = []
    for i, n in enumerate(g.node):
        attrs, inputs = {}, [value(x) for x in n.input]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                sub_nodes, sub_value = _graph_nodes(model, a.g, consts, types)
                attrs[a.name] = BranchGraph(a.g.name, tuple(sub_nodes), tuple(sub_value(o.name) for o in a.g.output),
                                            tuple(sub_value(x.name) for x in a.g.input))
            else:
                attrs[a.name] = _attr_value(a)
        graphs = [v for v in attrs.values() if isinstance(v, BranchGraph)]
        outer = {v.name: None for b in graphs for v in b.outer_values()}  # what the shim calls implicit inputs
        inputs += [value(name) for name in outer]
        nodes.append(NodeInfo(
            index=i, name=n.name or f"{n.op_type}_{i}", op_type=n.op_type, domain=canonical_domain(n.domain),
            inputs=tuple(inputs), outputs=tuple(value(x) for x in n.output),
            attrs=attrs, since_version=_opset(model, n.domain)))
    return nodes, value


def all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph stores: initializers and tensor attributes, recursing into subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from all_tensors(g)


def _opset(model: onnx.ModelProto, domain: str) -> int:
    d = canonical_domain(domain)
    for o in model.opset_import:
        if canonical_domain(o.domain) == d:
            return int(o.version)
    return 0
