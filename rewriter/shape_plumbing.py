"""Shape plumbing -> constant operands, for TorchScript exports (used by the ``cleanup`` family).

TorchScript exports compute every Reshape/Expand/Slice operand from Shape -> Gather -> Unsqueeze -> Concat chains
over symbolic dims (``view(*x.shape[:-1], -1, head_dim)``), so shape inference loses the head count and the
rope/gqa checks cannot match. ``normalize_shape_plumbing`` rewrites those operands into the constants the dynamo
exporter emits: a dim that provably equals the input's dim at the same position becomes 0 (Reshape "copy") or 1
(Expand "keep"), a dim known statically becomes its value, and one unknown dim may become -1 (Reshape). Nothing
is guessed: an operand with any dim it cannot prove is left alone.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass
from onnxscript import optimizer

_MAX_PLUMBING_ROUNDS = 8
_PLUMBING_DEPTH = 12


class _DimOf:
    """A dim read at run time: ``value.shape[axis]``, with the symbolic name shape inference gave it (if any)."""

    __slots__ = ("axis", "name", "value")

    def __init__(self, value: ir.Value, axis: int, name: str | None) -> None:
        self.value, self.axis, self.name = value, axis, name

    def same_as(self, value: ir.Value, axis: int) -> bool:
        """Provably equal to ``value.shape[axis]``: the same read, or the same (non-generated) symbolic name."""
        if self.value is value and self.axis == axis:
            return True
        if value.shape is None or axis >= len(value.shape) or not self.name or self.name.startswith("unk__"):
            return False
        dim = value.shape[axis]
        return isinstance(dim, ir.SymbolicDim) and dim.value == self.name


_Dim = int | _DimOf | None  # None: unknown


def _const_ints(v: ir.Value) -> list[int] | None:
    if v.const_value is None:
        return None
    arr = v.const_value.numpy()
    return [int(a) for a in np.asarray(arr).reshape(-1)] if arr.dtype.kind in "iu" else None


def resolve_dims(v: ir.Value | None, depth: int = _PLUMBING_DEPTH) -> list[_Dim] | None:
    """The elements of a 0-D/1-D integer shape tensor, each a constant, a dim of some value, or None."""
    if v is None:
        return None
    ints = _const_ints(v)
    if ints is not None:
        return list(ints)
    node = v.producer()
    if node is None or depth == 0 or node.domain not in ("", "ai.onnx"):
        return None
    op, ins = node.op_type, node.inputs
    sub = lambda i: resolve_dims(ins[i], depth - 1) if i < len(ins) else None
    if op == "Shape":
        src = ins[0]
        if src.shape is None:
            return None
        rank = len(src.shape)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        axes = range(rank)[slice(start, end)]
        return [d if isinstance(d := src.shape[a], int) else _DimOf(src, a, d.value) for a in axes]
    if op in ("Unsqueeze", "Squeeze", "Identity", "Cast"):
        if op == "Cast" and node.attributes.get_int("to", 0) not in (ir.DataType.INT64, ir.DataType.INT32):
            return None
        return sub(0)
    if op == "Reshape":  # a shape vector reshaped to [-1] / [n]
        return sub(0)
    if op == "Concat":
        parts = [sub(i) for i in range(len(ins))]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    if op == "Gather":
        data, idx = sub(0), _const_ints(ins[1])
        if data is None or idx is None or node.attributes.get_int("axis", 0) != 0:
            return None
        try:
            return [data[i] for i in idx]
        except IndexError:
            return None
    if op == "Slice":
        data = sub(0)
        bounds = [_const_ints(ins[i]) if i < len(ins) and ins[i] is not None else None for i in range(1, 5)]
        starts, ends, axes, steps = bounds
        if data is None or starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
            return None
        if (axes is not None and axes not in ([0], [-1])) or (steps is not None and len(steps) != 1):
            return None
        return data[slice(starts[0], ends[0], steps[0] if steps else 1)]
    if op == "ConstantOfShape":
        n, attr = _const_ints(ins[0]), node.attributes.get("value")
        fill = attr.value.numpy() if attr is not None else np.zeros(1, np.float32)
        if n is None or len(n) != 1 or fill.dtype.kind not in "iu":
            return None
        return [int(fill.reshape(-1)[0])] * n[0]
    if op in ("Add", "Sub", "Mul", "Div"):
        a, b = sub(0), sub(1)
        if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
            return None
        n = max(len(a), len(b))
        a, b = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
        return [_arith(op, x, y) for x, y in zip(a, b)]
    if op == "Where":  # Where(Equal(d, c), r, d): TorchScript's "-1 means keep" for Expand shapes
        cond = ins[0].producer()
        if cond is None or cond.op_type != "Equal" or cond.inputs[0] is not ins[2]:
            return None
        data, other, repl = sub(2), resolve_dims(cond.inputs[1], depth - 1), sub(1)
        if data is None or other is None or repl is None or not (len(data) == len(other) == len(repl)):
            return None
        return [_where_equal(d, c, r) for d, c, r in zip(data, other, repl)]
    return None


def _arith(op: str, a: _Dim, b: _Dim) -> _Dim:
    if isinstance(a, int) and isinstance(b, int):
        if op == "Div":
            return a // b if b else None
        return {"Add": a + b, "Sub": a - b, "Mul": a * b}[op]
    if op in ("Mul", "Div") and b == 1:
        return a
    if op == "Mul" and a == 1:
        return b
    if op in ("Add", "Sub") and b == 0:
        return a
    return None


def _where_equal(d: _Dim, c: _Dim, r: _Dim) -> _Dim:
    """Where(d == c, r, d) per element; a run-time dim is >= 0, so it never equals a negative constant."""
    if isinstance(d, int) and isinstance(c, int):
        return r if d == c else d
    if isinstance(d, _DimOf) and isinstance(c, int) and c < 0:
        return d
    return None


def _reshape_target(node: ir.Node, dims: list[_Dim], sources: _DimSources) -> list[int | _DimOf] | None:
    """A target equivalent to ``dims`` for Reshape(y, .): 0 copies y's dim, at most one -1, and a dim that is
    not y's own is read from a graph input or output carrying its symbolic name, not from an intermediate."""
    y = node.inputs[0]
    if node.attributes.get_int("allowzero", 0) != 0:
        return None
    target: list[int | _DimOf | None] = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            target.append(d)
        elif isinstance(d, _DimOf) and y.shape is not None and i < len(y.shape) and d.same_as(y, i):
            target.append(0)
        elif isinstance(d, _DimOf) and sources.find(d.name, node) is not None:
            target.append(sources.find(d.name, node))
        else:
            target.append(None)
    unknown = [i for i, d in enumerate(target) if d is None]
    if len(unknown) > 1 or (unknown and -1 in target):
        return None
    if unknown:
        target[unknown[0]] = -1
    if -1 in target and y.shape is not None and all(isinstance(d, int) for d in target):  # static when every
        # dim the -1 absorbs is
        absorbed = [y.shape[i] for i in range(len(y.shape)) if i >= len(target) or target[i] != 0]
        known = [d for d in target if d not in (0, -1)]
        if all(isinstance(d, int) for d in absorbed) and np.prod(known) > 0 \
                and np.prod(absorbed) % np.prod(known) == 0:
            target[target.index(-1)] = int(np.prod(absorbed) // np.prod(known))
    return target


def _expand_target(node: ir.Node, dims: list[_Dim]) -> list[int] | None:
    """A constant shape equivalent to ``dims`` for Expand(x, .): 1 keeps x's dim (numpy broadcasting)."""
    x = node.inputs[0]
    if x.shape is None:
        return None
    offset = len(dims) - len(x.shape)
    target = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            target.append(d)
        elif isinstance(d, _DimOf) and i - offset >= 0 and d.same_as(x, i - offset):
            target.append(1)
        else:
            return None
    return target


class _DimSources:
    """Where a named symbolic dim can be read without touching intermediates: a graph input, else a graph output
    computed before the node that needs it (an attention rule keeps its present-KV outputs, so reading their
    shape leaves its intermediates single-use)."""

    def __init__(self, graph: ir.Graph) -> None:
        self.order = {n: i for i, n in enumerate(graph)}
        self.inputs: dict[str, _DimOf] = {}
        self.outputs: dict[str, list[_DimOf]] = {}
        for values, table in ((graph.inputs, None), (graph.outputs, self.outputs)):
            for v in values:
                for axis, d in enumerate(v.shape or ()):
                    if isinstance(d, ir.SymbolicDim) and d.value and not _generated(d):
                        if table is None:
                            self.inputs.setdefault(d.value, _DimOf(v, axis, d.value))
                        else:
                            table.setdefault(d.value, []).append(_DimOf(v, axis, d.value))
        self.values = set(graph.inputs) | set(graph.outputs)  # reading these never holds an intermediate

    def find(self, name: str | None, node: ir.Node) -> _DimOf | None:
        if not name:
            return None
        if name in self.inputs:
            return self.inputs[name]
        for d in self.outputs.get(name, ()):
            producer = d.value.producer()
            if producer is not None and self.order.get(producer, len(self.order)) < self.order.get(node, -1):
                return d
        return None


def _static_operands(graph: ir.Graph) -> list[ir.Node]:
    """Replace resolvable Reshape/Expand shapes and Slice bounds by constants (Reshape: or by constants and
    graph-input dims); returns the changed nodes."""
    changed = []
    sources = _DimSources(graph)
    for node in list(graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in ("Reshape", "Expand") and len(node.inputs) == 2 and node.inputs[1] is not None \
                and node.inputs[1].const_value is None:
            dims = resolve_dims(node.inputs[1])
            if dims is None:
                continue
            if node.op_type == "Reshape":
                target = _reshape_target(node, dims, sources)
            else:
                target = _expand_target(node, dims)
            if target is None:
                continue
            if all(isinstance(d, int) for d in target):
                _set_const_input(graph, node, 1, target)
            elif any(isinstance(d, _DimOf) and d.value not in sources.values for d in dims):
                _set_shape_input(graph, node, target)
            else:
                continue  # already as simple as it gets
            changed.append(node)
        elif node.op_type == "Slice":
            done = False
            for i in range(1, min(len(node.inputs), 5)):
                v = node.inputs[i]
                if v is None or v.const_value is not None:
                    continue
                dims = resolve_dims(v)
                if dims is not None and all(isinstance(d, int) for d in dims):
                    _set_const_input(graph, node, i, dims)
                    done = True
            if done:
                changed.append(node)
    return changed


def _set_const_input(graph: ir.Graph, node: ir.Node, index: int, ints: list[int]) -> None:
    base = f"{node.name or node.op_type}_static_{index}"
    name, k = base, 1
    while name in graph.initializers:
        name, k = f"{base}_{k}", k + 1
    value = ir.Value(name=name, shape=ir.Shape([len(ints)]), type=ir.TensorType(ir.DataType.INT64),
                     const_value=ir.tensor(np.array(ints, dtype=np.int64), name=name))
    graph.register_initializer(value)
    node.replace_input_with(index, value)


def _set_shape_input(graph: ir.Graph, node: ir.Node, target: list[int | _DimOf]) -> None:
    """Concat(constants, Shape(graph input, start=a, end=a+1), ...) as ``node``'s shape operand."""
    pieces, run = [], []
    for d in [*target, None]:
        if isinstance(d, int):
            run.append(d)
            continue
        if run:
            name = f"{node.name or node.op_type}_dims_{len(pieces)}"
            value = ir.Value(name=name, shape=ir.Shape([len(run)]), type=ir.TensorType(ir.DataType.INT64),
                             const_value=ir.tensor(np.array(run, dtype=np.int64), name=name))
            graph.register_initializer(value) if name not in graph.initializers else None
            pieces.append(graph.initializers[name])
            run = []
        if d is not None:
            shape = ir.node("Shape", [d.value], attributes={"start": d.axis, "end": d.axis + 1})
            graph.insert_before(node, shape)
            pieces.append(shape.outputs[0])
    concat = ir.node("Concat", pieces, attributes={"axis": 0})
    graph.insert_before(node, concat)
    node.replace_input_with(1, concat.outputs[0])


def _forget_shapes_below(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Forget the dims shape inference could not name ("unk__*") in everything computed from ``nodes``, so the
    next inference fills them in; dims the exporter or inference did know stay (they are still true)."""
    stack, seen = [v for n in nodes for v in n.outputs], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v.shape is not None and any(_generated(d) for d in v.shape):
            v.shape = ir.Shape([ir.SymbolicDim(None) if _generated(d) else d for d in v.shape])
        stack.extend(out for use in v.uses() for out in use.node.outputs)


def _generated(dim) -> bool:
    return isinstance(dim, ir.SymbolicDim) and (dim.value is None or dim.value.startswith("unk__"))


def _last_dims_from_weights(graph: ir.Graph) -> None:
    """MatMul(a, W const [K, N]) only runs when a.shape[-1] == K: record that where inference lost it (e.g. the
    attention output Reshape(.., [B, S, -1]) after a mask whose shape TorchScript's Range chains hide)."""
    for node in graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        a, w = node.inputs
        if a is None or w is None or w.const_value is None or len(w.const_value.shape) != 2:
            continue
        if a.shape is not None and len(a.shape) >= 2 and not isinstance(a.shape[-1], int):
            a.shape = ir.Shape([*a.shape[:-1], int(w.const_value.shape[0])])


def normalize_shape_plumbing(model: ir.Model) -> int:
    """Turn TorchScript-style shape plumbing into constant operands (see the module docstring); returns the
    number of operands made constant. Runs until nothing changes, re-inferring shapes in between, since fixing
    one Reshape's head count is what lets the next one downstream be resolved."""
    total = 0
    for _ in range(_MAX_PLUMBING_ROUNDS):
        changed = _static_operands(model.graph)
        if not changed:
            break
        total += len(changed)
        _forget_shapes_below(model.graph, changed)
        optimizer.optimize(model)
        ShapeInferencePass()(model)
    _last_dims_from_weights(model.graph)
    return total
