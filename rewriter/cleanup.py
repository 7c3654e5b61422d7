"""Clean-ups the other families rely on: constant folding of shape plumbing, dead code, shapes, RMSNorm.

Reuses onnxscript: its optimizer folds constants (it never folds QuantizeLinear/DequantizeLinear, so Q/DQ
structure survives for the ``qdq`` family), removes dead nodes/initializers and folds Transposes of constant
weights; onnx shape inference then gives the rope/gqa checks static ranks and head dims. RMSNorm becomes
SimplifiedLayerNormalization (onnxscript's rule for ``x * Reciprocal(rms)``, ours below for the exporters'
``x * Div(1, rms)`` / ``Div(x, rms)`` spelling), and Add + RMSNorm becomes com.microsoft
SkipSimplifiedLayerNormalization (onnxscript). ORT's CPU EP runs both.

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
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet
from onnxscript.rewriter.ort_fusions import rms_normalization, skip_normalization

from ._core import apply_rule_set
from .options import RewriteOptions, RewriteReport

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


class RmsNormDivFusion(RewriteRuleClassBase):
    """``scale * (x * Div(1, Sqrt(ReduceMean(x^2, [-1]) + eps)))`` (or ``Div(x, rms)``) -> SimplifiedLayerNorm.

    ``axes_attr``: ReduceMean takes its axes as an attribute (opset <= 17, e.g. TorchScript's default opset 17).
    """

    def __init__(self, name: str, reciprocal: bool, axes_attr: bool = False) -> None:
        super().__init__(name)
        self.reciprocal = reciprocal
        self.axes_attr = axes_attr

    def pattern(self, op, x, two, axes, eps, scale, one):
        if self.axes_attr:
            mean = op.ReduceMean(op.Pow(x, two), _allow_other_attributes=True, _outputs=["mean"])
        else:
            mean = op.ReduceMean(op.Pow(x, two), axes, _allow_other_attributes=True, _outputs=["mean"])
        rms = op.Sqrt(op.Add(mean, eps))
        normalized = op.Mul(x, op.Div(one, rms)) if self.reciprocal else op.Div(x, rms)
        return op.Mul(scale, normalized)

    def check(self, context, x, two, eps, scale, mean, axes=None, one=None, **_) -> MatchResult:
        result = MatchResult()
        for value, want in ((two, 2.0), (one, 1.0)) if self.reciprocal else ((two, 2.0),):
            arr = value.const_value.numpy() if value.const_value is not None else None
            if arr is None or arr.size != 1 or float(arr.reshape(-1)[0]) != want:
                return result.fail(f"expected the constant {want}", value)
        if x.dtype not in FLOAT_TYPES or scale.dtype != x.dtype:
            return result.fail(f"x {x.dtype} / scale {scale.dtype}: needs one float type", x)
        if self.axes_attr:
            attr = mean.producer().attributes.get("axes")
            axes_np = np.asarray(attr.value) if attr is not None else None
        else:
            axes_np = axes.const_value.numpy() if axes.const_value is not None else None
        rank = len(x.shape) if x.shape is not None else None
        if axes_np is None or axes_np.size != 1 or int(axes_np.reshape(-1)[0]) not in (-1, (rank or 0) - 1):
            return result.fail("ReduceMean must reduce the last axis only", mean)
        if mean.producer().attributes.get_int("keepdims", 1) != 1:
            return result.fail("ReduceMean keepdims must be 1", mean)
        eps_np = eps.const_value.numpy() if eps.const_value is not None else None
        if eps_np is None or eps_np.size != 1:
            return result.fail("epsilon is not a constant scalar", eps)
        if scale.shape is None or len(scale.shape) != 1:
            return result.fail("scale must be 1-D [hidden]", scale)
        return result

    def rewrite(self, op, x, eps, scale, **_):
        return op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=float(np.asarray(
            eps.const_value.numpy()).reshape(-1)[0]), stash_type=1)


def _rms_div_rules() -> RewriteRuleSet:
    return RewriteRuleSet([RmsNormDivFusion.rule("RmsNormDivFusion", reciprocal=True),
                           RmsNormDivFusion.rule("RmsNormDivFusion2", reciprocal=False),
                           RmsNormDivFusion.rule("RmsNormDivFusionAxesAttr", reciprocal=True, axes_attr=True),
                           RmsNormDivFusion.rule("RmsNormDivFusion2AxesAttr", reciprocal=False, axes_attr=True)],
                          commute=True)


# --- shape plumbing -> constants (TorchScript exports) ---------------------------------------------------------
_MAX_PLUMBING_ROUNDS = 8
_PLUMBING_DEPTH = 12


class _DimOf:
    """A dim read at run time: ``value.shape[axis]``, with the symbolic name shape inference gave it (if any)."""

    __slots__ = ("value", "axis", "name")

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


def _resolve(v: ir.Value | None, depth: int = _PLUMBING_DEPTH) -> list[_Dim] | None:
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
    sub = lambda i: _resolve(ins[i], depth - 1) if i < len(ins) else None  # noqa: E731
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
        data, other, repl = sub(2), _resolve(cond.inputs[1], depth - 1), sub(1)
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
            dims = _resolve(node.inputs[1])
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
                dims = _resolve(v)
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


def _node_count(model: ir.Model) -> int:
    return sum(1 for _ in model.graph.all_nodes())


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Fold constants and drop dead code (counted as ``cleanup.removed_nodes``), infer shapes, fuse RMSNorm."""
    before = _node_count(model)
    optimizer.optimize(model)
    removed = before - _node_count(model)
    if removed > 0:
        report.add("cleanup.removed_nodes", removed)
    ShapeInferencePass()(model)
    report.add("ShapePlumbingToConstant", normalize_shape_plumbing(model))
    apply_rule_set(model, rms_normalization.rms_normalization_ruleset, report)
    apply_rule_set(model, _rms_div_rules(), report)
    apply_rule_set(model, skip_normalization.skip_rms_normalization_ruleset, report)
    optimizer.remove_unused_nodes(model)
