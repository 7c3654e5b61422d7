"""``npu-rewrite --static-dim NAME=VALUE``: a model specialized to fixed input sizes, for static-shape targets.

Static-shape NPUs (``npu-edge``) compile one program per shape, so exporters' symbolic dims and the shape plumbing
computed from them (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) keep whole graphs on the CPU. One static
model per bucket (e.g. prefill 128 / decode 1) fixes that. onnx-graphsurgeon does the graph work: set the input
dims, fold every subgraph that became constant (``fold_constants`` evaluates it with ORT), drop what is left
unused, re-infer shapes.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
import onnx_graphsurgeon as gs


class StaticShapeError(ValueError):
    """The requested sizes do not fit the model; the message names the input and dim."""


def specialize(model: onnx.ModelProto, dims: Mapping[str, int]) -> onnx.ModelProto:
    """``model`` with every graph input dim named in ``dims`` (by its symbolic name, or ``input:axis``) fixed,
    constant subgraphs folded and shapes re-inferred. Every named dim must exist in some graph input."""
    graph = gs.import_onnx(model)
    used: set[str] = set()
    for inp in graph.inputs:
        if inp.shape is None:
            continue
        shape = list(inp.shape)
        for axis, d in enumerate(shape):
            for key in (d if isinstance(d, str) and d else None, f"{inp.name}:{axis}"):
                if key is not None and key in dims:
                    if isinstance(d, int) and d >= 0 and d != dims[key]:
                        raise StaticShapeError(f"input '{inp.name}' dim {axis} is {d}, --static-dim {key}="
                                               f"{dims[key]} contradicts it")
                    shape[axis] = int(dims[key])
                    used.add(key)
        inp.shape = shape
    unknown = sorted(set(dims) - used)
    if unknown:
        raise StaticShapeError(f"--static-dim {', '.join(unknown)}: no graph input has such a dim "
                               f"(inputs: {', '.join(f'{i.name}{list(i.shape or [])}' for i in graph.inputs)})")
    for t in graph.tensors().values():  # stale shapes would contradict the new sizes; inference redoes them
        if isinstance(t, gs.Variable) and t not in graph.inputs:
            t.shape = None
    inferred = _infer(gs.export_onnx(graph), model)
    graph = gs.import_onnx(inferred)
    graph.fold_constants(fold_shapes=True).cleanup().toposort()
    for t in graph.tensors().values():
        if isinstance(t, gs.Variable) and t not in graph.inputs:
            t.shape = None
    return _infer(gs.export_onnx(graph), model)


def _infer(out: onnx.ModelProto, like: onnx.ModelProto) -> onnx.ModelProto:
    out.ir_version = like.ir_version
    del out.opset_import[:]
    out.opset_import.extend(like.opset_import)
    del out.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(out, data_prop=True)
