"""RoPE normalization: decomposed rotary embedding -> com.microsoft RotaryEmbedding with cos/sin caches.

Dimensions: B batch, S sequence, N heads, H head dim, R rotary dim (R <= H), M cache rows (max positions).

Matched (x is [B,N,S,H] as in Llama, or [B,S,N,H] as in GPT-J, which rotates before the head transpose):
  half        x*cos + Concat(Neg(x[..., R/2:R]), x[..., :R/2]) * sin                       (rotate_half)
  interleaved x*cos + Reshape(Concat(Unsqueeze(Neg(x[..., 1::2])), Unsqueeze(x[..., 0::2]))) * sin
  partial     Concat(rope(x[..., :R]), x[..., R:])                                         (R < H)
cos/sin may come from anything that is a per-position function of ONE integer graph input (position_ids):
inv_freq MatMul + Cos/Sin, a Gather (or the dynamo exporter's GatherND) from a constant table, exporter Shape
plumbing. Instead of matching each of those spellings, the check *evaluates* the cos/sin subgraph on ORT CPU for
positions 0..M-1 (which gives the cache) and again for random positions (which proves the values depend on nothing
but the position), and checks the duplication RoPE implies (halves equal, or pairs equal for interleaved). M is the
row count of a gathered table (Gather, or GatherND with one index per row), else the model's
``max_position_embeddings`` metadata, else 4096.

The rotation's chain is ``kernels.fusion.patterns`` (``rotary`` over ``rotate_half``), the pattern the compiler's
in-partition ``npu::RotateHalf`` fusion matches too.

Needs before it: constant folding (onnxscript optimizer) so Slice bounds are constants, and shape inference
(so x has a known rank, N and H).

Emitted: RotaryEmbedding(x, position_ids, cos_cache [M,R/2], sin_cache [M,R/2], interleaved, num_heads,
rotary_embedding_dim) on the 3-D [B,S,N*H] tensor the heads were split from when x = Transpose(Reshape(y)) (so
GroupQueryAttention can take it directly), else on the 4-D [B,N,S,H] tensor, or, for [B,S,N,H], on a [B,S,N*H]
reshape of it, reshaped back.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ..kernels.fusion import patterns
from .options import RewriteOptions, RewriteReport
from .rule_set import apply_rule_set
from .subgraph_eval import backward_slice, evaluate_values, static_ints

DEFAULT_MAX_POSITIONS = 4096


def slice_params(node: ir.Node, rank: int) -> tuple[int, int, int, int] | None:
    """(start, end, axis, step) of a constant single-axis Slice, axis normalized to >= 0; None otherwise."""
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = static_ints(ins[1]), static_ints(ins[2])
    axes = static_ints(ins[3]) if ins[3] is not None else [0]
    steps = static_ints(ins[4]) if ins[4] is not None else [1]
    if None in (starts, ends, axes, steps) or not (len(starts) == len(ends) == len(axes) == len(steps) == 1):
        return None
    return starts[0], ends[0], axes[0] % rank, steps[0]


def _axis(node: ir.Node, rank: int) -> int | None:
    attr = node.attributes.get("axis")
    return None if attr is None else attr.as_int() % rank


def _max_positions(model: ir.Model, nodes: list[ir.Node]) -> int:
    for n in nodes:  # a table gathered by position: its rows are the cache length
        rows = _gathered_table_rows(n)
        if rows is not None:
            return rows
    meta = model.metadata_props.get("max_position_embeddings")
    return int(meta) if meta and meta.isdigit() else DEFAULT_MAX_POSITIONS


def _gathered_table_rows(node: ir.Node) -> int | None:
    """Row count of the constant [M, R] table ``node`` reads whole rows of: ``Gather`` on axis 0 (TorchScript's
    ``table[position_ids]``) or ``GatherND`` with one index per row (the dynamo exporter's, indices [B,S,1]);
    None for any other node."""
    if node.op_type not in ("Gather", "GatherND") or len(node.inputs) < 2:
        return None
    table, indices = node.inputs[0], node.inputs[1]
    if table is None or table.const_value is None or len(table.shape or ()) != 2:
        return None
    attrs = node.attributes
    if node.op_type == "Gather" and (attrs["axis"].as_int() if "axis" in attrs else 0) % 2 != 0:
        return None
    if node.op_type == "GatherND" and ((attrs["batch_dims"].as_int() if "batch_dims" in attrs else 0) != 0
                                       or indices is None or not indices.shape or indices.shape[-1] != 1):
        return None
    return int(table.shape[0])


class _CosSin:
    """Result of evaluating one (cos, sin) pair: caches [M,R/2], the layout and the position input."""

    def __init__(self, cos: np.ndarray, sin: np.ndarray, layout: str, position_ids: ir.Value) -> None:
        self.cos, self.sin, self.layout, self.position_ids = cos, sin, layout, position_ids
        self.values: tuple[ir.Value, ir.Value] | None = None  # initializers once emitted


def analyse_cos_sin(model: ir.Model, cos: ir.Value, sin: ir.Value, interleaved: bool) -> _CosSin | str:
    """Evaluate cos/sin as functions of the position input; return caches or the reason they are not RoPE."""
    graph = model.graph
    try:
        nodes, leaves = backward_slice(graph, [cos, sin])
    except ValueError as e:
        return f"cos/sin: {e}"
    if len(leaves) != 1:
        return f"cos/sin depend on {len(leaves)} graph inputs {[v.name for v in leaves]}, expected one (position_ids)"
    pos = leaves[0]
    if pos.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or pos.shape is None or len(pos.shape) != 2:
        return f"cos/sin come from {pos.name} which is not an integer [B,S] position tensor"
    m = _max_positions(model, nodes)
    np_int = pos.dtype.numpy()
    probe = np.random.default_rng(0).integers(0, m, size=(2, 3)).astype(np_int)
    try:
        (c, s), (c2, s2) = evaluate_values(graph, [cos, sin], [{pos: np.arange(m, dtype=np_int)[None]},
                                                               {pos: probe}])
    except Exception as e:  # noqa: BLE001 - ORT raises many types; the reason is what matters
        return f"cos/sin could not be evaluated for positions 0..{m - 1}: {str(e).splitlines()[0][:200]}"
    if c.ndim != 4 or c.shape != s.shape or c.shape[0] != 1:
        return f"cos/sin have shape {c.shape}, expected [1,1,M,R] or [1,M,1,R]"
    if c.shape[1:3] == (1, m):
        layout = "BNSH"
    elif c.shape[1:3] == (m, 1):
        layout = "BSNH"
    else:
        return f"cos/sin have shape {c.shape}, expected [1,1,{m},R] or [1,{m},1,R]"
    c, s = c.reshape(m, -1), s.reshape(m, -1)
    r = c.shape[1]
    first, second = (slice(0, None, 2), slice(1, None, 2)) if interleaved else (slice(0, r // 2), slice(r // 2, r))
    if r % 2 or not (np.array_equal(c[:, first], c[:, second]) and np.array_equal(s[:, first], s[:, second])):
        return f"cos/sin channels are not duplicated as {'interleaved' if interleaved else 'half'} RoPE needs"
    cos_cache, sin_cache = np.ascontiguousarray(c[:, first]), np.ascontiguousarray(s[:, first])
    if not (np.allclose(c2.reshape(6, -1)[:, first], cos_cache[probe.reshape(-1)], atol=1e-6)
            and np.allclose(s2.reshape(6, -1)[:, first], sin_cache[probe.reshape(-1)], atol=1e-6)):
        return "cos/sin are not a per-position function of the position input (batch or order dependent)"
    if not np.allclose(cos_cache ** 2 + sin_cache ** 2, 1.0, atol=1e-4):
        return "cos^2 + sin^2 != 1: scaled rotary (attention_scaling != 1) is not supported"
    return _CosSin(cos_cache, sin_cache, layout, pos)


class CosSinAnalyses:
    """The cos/sin analyses of one ``apply`` (per graph): evaluating a cos/sin pair runs ORT, and every layer reads
    the same pair, so each pair is analysed once and its caches are emitted once, shared by all layers."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self._results: dict[tuple[ir.Value, ir.Value, bool], _CosSin | str] = {}

    def get(self, cos: ir.Value, sin: ir.Value, interleaved: bool) -> _CosSin | str:
        key = (cos, sin, interleaved)
        if key not in self._results:
            self._results[key] = analyse_cos_sin(self.model, cos, sin, interleaved)
        return self._results[key]

    def emitted(self) -> int:
        return sum(1 for c in self._results.values() if not isinstance(c, str) and c.values)


# --- rules --------------------------------------------------------------------------------------------------
class _RotaryFusion(pattern.RewriteRuleClassBase):
    """One rule per rotation (half, interleaved); layers sharing a cos/sin pair share its cache initializers."""

    def __init__(self, name: str, *, interleaved: bool, analyses: CosSinAnalyses) -> None:
        super().__init__(name)
        self.interleaved, self.analyses = interleaved, analyses

    # pattern ------------------------------------------------------------------------------------------------
    def _rotate(self, op, x_rot):
        if self.interleaved:
            odd = op.Slice(x_rot, _allow_other_inputs=True, _outputs=["odd"])
            even = op.Slice(x_rot, _allow_other_inputs=True, _outputs=["even"])
            stacked = op.Concat(op.Unsqueeze(op.Neg(odd), _allow_other_inputs=True, _outputs=["u_odd"]),
                                op.Unsqueeze(even, _allow_other_inputs=True, _outputs=["u_even"]),
                                _outputs=["stacked"])
            return op.Reshape(stacked, _allow_other_inputs=True, _outputs=["rotated"])
        return patterns.rotate_half(op, x_rot)

    def pattern(self, op, x, cos, sin):
        return patterns.rotary(op, x, cos, sin, self._rotate(op, x))

    # check --------------------------------------------------------------------------------------------------
    def check(self, context, x, cos, sin, rotated, **b) -> pattern.MatchResult:
        result = pattern.MatchResult()
        shape = x.shape
        if shape is None or len(shape) != 4 or not isinstance(shape[3], int):
            return result.fail(f"{x.name}: needs a 4-D input with a static head dim, got shape {shape}", x)
        r = shape[3]
        reason = self._check_interleaved(b, rotated, shape) if self.interleaved else \
            self._check_rotate_half(b, rotated, r)
        if reason:
            return result.fail(reason, rotated)
        cs = self.analyses.get(cos, sin, self.interleaved)
        if isinstance(cs, str):
            return result.fail(cs, [cos, sin])
        if cs.cos.shape[1] * 2 != r:
            return result.fail(f"cos/sin rotate {cs.cos.shape[1] * 2} channels, the slices {r}", [cos, sin])
        if not isinstance(_heads(x, cs), int):
            return result.fail(f"{x.name}: head count is not static in shape {shape}", x)
        return result

    @staticmethod
    def _check_interleaved(b: dict, rotated: ir.Value, shape) -> str | None:
        r = shape[3]
        odd, even = slice_params(b["odd"].producer(), 4), slice_params(b["even"].producer(), 4)
        if odd is None or even is None or odd[0] != 1 or even[0] != 0 or odd[2:] != (3, 2) \
                or even[2:] != (3, 2) or min(odd[1], even[1]) < r:
            return (f"interleaved rotation: expected x[..., 1::2] and x[..., 0::2], got {odd} and {even} "
                    "(start, end, axis, step)")
        for u in ("u_odd", "u_even"):
            axes = static_ints(b[u].producer().inputs[1]) if len(b[u].producer().inputs) > 1 else None
            if axes is None or len(axes) != 1 or axes[0] % 5 != 4:
                return "interleaved rotation: pairs are not stacked on a new last axis"
        if _axis(b["stacked"].producer(), 5) != 4:
            return "interleaved rotation: Concat is not on the new last axis"
        if rotated.shape is None or len(rotated.shape) != 4 or rotated.shape[3] != r or \
                list(rotated.shape) != list(shape):
            return (f"interleaved rotation: reshape back gives {rotated.shape}, expected the input's shape (run "
                    "shape inference first)")
        return None

    @staticmethod
    def _check_rotate_half(b: dict, rotated: ir.Value, r: int) -> str | None:
        hi, lo = slice_params(b["hi"].producer(), 4), slice_params(b["lo"].producer(), 4)
        if hi is None or lo is None or hi[2:] != (3, 1) or lo[2:] != (3, 1) or lo[0] != 0 \
                or lo[1] != r // 2 or hi[0] != r // 2 or hi[1] < r or r % 2:
            return (f"rotate_half: expected x[..., {r // 2}:] and x[..., :{r // 2}], got {hi} and {lo} "
                    "(start, end, axis, step)")
        if _axis(rotated.producer(), 4) != 3:
            return "rotate_half: Concat is not on the last axis"
        return None

    # rewrite ------------------------------------------------------------------------------------------------
    def rewrite(self, op, x, cos, sin, **_):
        cs = self.analyses.get(cos, sin, self.interleaved)  # analysed by check
        heads = _heads(x, cs)
        if cs.values is None:
            dtype = x.dtype.numpy()
            k = self.analyses.emitted()
            cs.values = (op.initializer(ir.tensor(cs.cos.astype(dtype)), name=f"rope_cos_cache_{k}"),
                         op.initializer(ir.tensor(cs.sin.astype(dtype)), name=f"rope_sin_cache_{k}"))
        attrs = dict(interleaved=int(self.interleaved), num_heads=heads, _domain="com.microsoft")
        if cs.layout == "BNSH":
            y3d = _head_split_source(x)
            if y3d is None:
                return op.RotaryEmbedding(x, cs.position_ids, *cs.values, **attrs)
            # x = Transpose(Reshape(y3d [B,S,N*H])): rotate the 3-D tensor, so attention can take it as is
            rot3d = op.RotaryEmbedding(y3d, cs.position_ids, *cs.values, **attrs)
            rot3d.shape, rot3d.type = y3d.shape, y3d.type
            return op.Transpose(op.Reshape(rot3d, op.Constant(value_ints=[0, 0, heads, x.shape[3]])),
                                perm=[0, 2, 1, 3])
        x3 = op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))  # [B,S,N*H]
        out = op.RotaryEmbedding(x3, cs.position_ids, *cs.values, **attrs)
        return op.Reshape(out, op.Constant(value_ints=[0, 0, heads, x.shape[3]]))


def _heads(x: ir.Value, cs: _CosSin):
    """The head count of x in the layout its cos/sin broadcast over ([B,N,S,H] or [B,S,N,H])."""
    return x.shape[1] if cs.layout == "BNSH" else x.shape[2]


def _head_split_source(x: ir.Value) -> ir.Value | None:
    """y when x [B,N,S,H] = Transpose(Reshape(y [B,S,N*H]), [0,2,1,3]); None otherwise."""
    t = x.producer()
    if t is None or t.op_type != "Transpose" or list(t.attributes["perm"].value) != [0, 2, 1, 3]:
        return None
    r = t.inputs[0].producer()
    if r is None or r.op_type != "Reshape":
        return None
    y = r.inputs[0]
    if y.shape is None or len(y.shape) != 3 or x.shape is None or y.shape[2] != x.shape[1] * x.shape[3]:
        return None
    return y


class _PartialRotaryMerge(pattern.RewriteRuleClassBase):
    """Concat(RotaryEmbedding(x[..., :R]), x[..., R:]) -> RotaryEmbedding(x, rotary_embedding_dim=R).

    Runs after the full-rotation rules (the pass-through Slice is often shared with shape plumbing, so the
    whole partial pattern cannot be matched in one go). ``bsnh`` also looks through the [B,S,N*R] reshapes
    that the [B,S,N,H] layout gets.
    """

    def __init__(self, name: str, *, bsnh: bool) -> None:
        super().__init__(name)
        self.bsnh = bsnh

    def pattern(self, op, x, pos, cos, sin, shape_in, shape_out):
        x_rot = op.Slice(x, _allow_other_inputs=True, _outputs=["x_rot"])
        x_pass = op.Slice(x, _allow_other_inputs=True, _outputs=["x_pass"])
        inner = op.Reshape(x_rot, shape_in) if self.bsnh else x_rot
        rope = op.RotaryEmbedding(inner, pos, cos, sin, _domain="com.microsoft", _outputs=["rope"])
        if self.bsnh:
            rope = op.Reshape(rope, shape_out)
        return op.Concat(rope, x_pass, _outputs=["joined"])

    def check(self, context, x, x_rot, x_pass, rope, joined, shape_in=None, shape_out=None, **_):
        result = pattern.MatchResult()
        shape = x.shape
        if shape is None or len(shape) != 4 or not isinstance(shape[3], int):
            return result.fail(f"{x.name}: needs a 4-D input with a static head dim, got shape {shape}", x)
        h = shape[3]
        sp, pp = slice_params(x_rot.producer(), 4), slice_params(x_pass.producer(), 4)
        if sp is None or pp is None or sp[2:] != (3, 1) or pp[2:] != (3, 1):
            return result.fail("partial rotary: slices are not constant unit-step slices of the last axis",
                               [x_rot, x_pass])
        r = sp[1]
        if sp[0] != 0 or pp[0] != r or pp[1] < h or not 0 < r < h:
            return result.fail(f"partial rotary: x[..., {sp[0]}:{sp[1]}] and x[..., {pp[0]}:{pp[1]}] do not "
                               f"split head dim {h}", [x_rot, x_pass])
        if _axis(joined.producer(), 4) != 3:
            return result.fail("partial rotary: pass-through Concat is not on the last axis", joined)
        attrs = rope.producer().attributes
        if attrs.get("rotary_embedding_dim") is not None and attrs["rotary_embedding_dim"].as_int() not in (0, r):
            return result.fail("RotaryEmbedding already has a different rotary_embedding_dim", rope)
        if self.bsnh:
            heads = shape[2]
            if static_ints(shape_in) != [0, 0, -1] or static_ints(shape_out) != [0, 0, heads, r]:
                return result.fail("partial rotary: reshapes around RotaryEmbedding are not [B,S,N*R] and back",
                                   [shape_in, shape_out])
        return result

    def rewrite(self, op, x, pos, cos, sin, rope, **_):
        attrs = {k: a.value for k, a in rope.producer().attributes.items()}
        r = slice_params(rope.producer().inputs[0].producer().inputs[0].producer()
                         if self.bsnh else rope.producer().inputs[0].producer(), 4)[1]
        attrs["rotary_embedding_dim"] = r
        if not self.bsnh:
            return op.RotaryEmbedding(x, pos, cos, sin, _domain="com.microsoft", **attrs)
        x3 = op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))
        out = op.RotaryEmbedding(x3, pos, cos, sin, _domain="com.microsoft", **attrs)
        return op.Reshape(out, op.Constant(value_ints=[0, 0, x.shape[2], x.shape[3]]))


def rules(model: ir.Model) -> tuple[pattern.RewriteRuleSet, pattern.RewriteRuleSet]:
    """The two stages: full rotations (commuted), then merges of partial rotations into them."""
    analyses = CosSinAnalyses(model)
    full = pattern.RewriteRuleSet(
        [_RotaryFusion.rule(f"RotaryEmbedding{'Interleaved' if i else 'Half'}", interleaved=i, analyses=analyses)
         for i in (False, True)], commute=True)
    partial = pattern.RewriteRuleSet(
        [_PartialRotaryMerge.rule(f"RotaryEmbeddingPartial{'BSNH' if b else ''}", bsnh=b) for b in (False, True)])
    return full, partial


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Fuse decomposed RoPE in ``model`` in place; count per rule name in ``report``."""
    for stage in rules(model):
        apply_rule_set(model, stage, report)
        ir.passes.common.RemoveUnusedNodesPass()(model)
