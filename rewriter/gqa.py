"""GQA normalization: decomposed attention with repeated KV heads -> com.microsoft GroupQueryAttention.

Dimensions: B batch, S sequence (new tokens), P past, T total (= P + S), N query heads, Nkv kv heads,
H head dim, D = N*H, G = N/Nkv (group size).

Matched (one rule per variant; exporter output of HF eager attention):
  present_k = Concat(past_k [B,Nkv,P,H], k [B,Nkv,S,H], axis=2)    -> graph output, kept by name
  k_rep     = Reshape(Expand|Tile(Unsqueeze(present_k, 2)))  [B,N,T,H]   (repeat_kv; absent when N == Nkv)
  scores    = MatMul(q [B,N,S,H], Transpose(k_rep, [0,1,3,2])) * scale   (or / d)
  masked    = scores + mask   |   Where(mask_bool, scores, -inf)
  probs     = Softmax(masked) [optionally Where(IsNaN(probs), 0, probs)]
  out       = Reshape(Transpose(MatMul(probs, v_rep), [0,2,1,3]))  [B,S,D]
The repeated KV disappears: GroupQueryAttention reads the Nkv heads directly.

Also matched: torch's ``scaled_dot_product_attention`` decomposition (transformers' default "sdpa" attention),
which scales both operands by sqrt(scale) and always guards the Softmax with IsNaN/Where:
  scores    = MatMul(q * sqrt(s), kt * sqrt(s)) + mask
  kt        = Transpose(k_rep, [0,1,3,2])                                         (TorchScript exporter)
            | Reshape(Transpose(Reshape(k_rep, [-1,T,H]), [0,2,1]), [B,N,H,T])   (dynamo: torchlib's transpose)
  out       = Reshape(Transpose([Reshape(]attn[, [B,-1,S,H])], [0,2,1,3]))  (an inner view, e.g. TorchScript's)
(The cleanup re-reads the dims of those Reshape targets from graph inputs/outputs, so k_rep is single-use.)

The mask is verified by evaluating its subgraph on ORT CPU for a few (S, P, attention_mask) cases and comparing
with "key j visible to query i iff j <= P + i and attention_mask[b, j] == 1". GQA then derives the same from
  seqlens_k             = ReduceSum(attention_mask, axis 1) - 1   (int32 [B]: index of the last valid key)
  total_sequence_length = Shape(attention_mask)[1]                (int32 scalar: T)
Supported masks: no padding, or RIGHT padding (ones then zeros) — ORT's GQA takes each row's valid length to be
a prefix of the buffer. LEFT padding is NOT equivalent (GQA would treat the padded prefix as valid keys); outputs
at right-padded query positions are unspecified. Past and present are separate buffers here (past P, present
T = P + S, layout [B,Nkv,*,H]), exactly the original graph's KV contract, so the model is a drop-in replacement.
ORT CPU limit (1.31): with past KV, S > 1 (chunked prefill) is accepted only for batch 1 ("batch_size must be 1
when sequence_length > 1 and past context is given"); prefill with an empty past and decode (S = 1) work at any B.

The repeat_kv, scale and masked Softmax pieces are ``kernels.fusion.patterns``', shared with the compiler's
in-partition ``npu::AttentionChain`` fusion.

Needs before it: the RoPE family (q/k may come out of RotaryEmbedding), constant folding, shape inference.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ..kernels.fusion import patterns
from . import gqa_rotary
from .options import RewriteOptions, RewriteReport
from .rule_set import apply_rule_set
from .subgraph_eval import backward_slice, evaluate_values, static_ints

_MASK_CASES = ((3, 0, None), (2, 3, None), (4, 0, [[1, 1, 1, 1], [1, 1, 1, 0]]), (1, 4, [[1] * 5, [1, 1, 1, 0, 0]]))


def _perm(v: ir.Value) -> list[int] | None:
    node = v.producer()
    attr = node.attributes.get("perm") if node is not None else None
    return list(attr.value) if attr is not None else None


class MaskAnalyses:
    """The attention-mask analyses of one ``apply`` (per graph): verifying a mask evaluates it on ORT, and every
    layer reads the same mask, so each mask is verified once, and the GroupQueryAttention length inputs derived
    from its attention_mask are emitted once, shared by all layers."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self._masks: dict[ir.Value, ir.Value | str] = {}
        self._lengths: dict[ir.Value, tuple[ir.Value, ir.Value]] = {}

    def attention_mask(self, mask: ir.Value, q: ir.Value, past_k: ir.Value, *, boolean: bool) -> ir.Value | str:
        """The attention_mask graph input ``mask`` is causal+padding from, else the reason it is not."""
        if mask not in self._masks:
            self._masks[mask] = _verify_mask(self.model, mask, q, past_k, boolean=boolean)
        return self._masks[mask]

    def lengths(self, op, attention_mask: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(seqlens_k, total_sequence_length) computed from ``attention_mask``, emitted on first use."""
        if attention_mask not in self._lengths:
            total = op.Cast(op.Squeeze(op.Shape(attention_mask, start=1, end=2), op.Constant(value_ints=[0])),
                            to=ir.DataType.INT32)
            last = op.Sub(op.ReduceSum(attention_mask, op.Constant(value_ints=[1]), keepdims=0),
                          op.Constant(value=ir.tensor(np.array(1, dtype=attention_mask.dtype.numpy()))))
            self._lengths[attention_mask] = (op.Cast(last, to=ir.DataType.INT32), total)
        return self._lengths[attention_mask]


class _AttentionToGQA(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, *, repeat: str, mask: str, scale_op: str, nan_guard: bool,
                 analyses: MaskAnalyses, attn_view: bool = False, kt3d: bool = False):
        super().__init__(name)
        self.repeat, self.mask, self.scale_op, self.nan_guard = repeat, mask, scale_op, nan_guard
        self.analyses = analyses
        self.attn_view = attn_view  # TorchScript SDPA's [B,-1,S,H] view of the output, see the module docstring
        self.kt3d = kt3d  # dynamo SDPA's K^T through a 3-D reshape, see the module docstring

    # pattern ------------------------------------------------------------------------------------------------
    def _repeat_kv(self, op, x, tag):
        return x if self.repeat == "none" else patterns.repeat_kv(op, x, tag, self.repeat)

    def pattern(self, op, q, k, v, past_k, past_v, mask, scale, scale_k):
        present_k = op.Concat(past_k, k, _outputs=["present_k"])
        present_v = op.Concat(past_v, v, _outputs=["present_v"])
        k_all = self._repeat_kv(op, present_k, "k")
        if self.kt3d:
            k3 = op.Reshape(k_all, _allow_other_inputs=True, _outputs=["k3"])
            kt = op.Reshape(op.Transpose(k3, _outputs=["kt3"]), _allow_other_inputs=True, _outputs=["kt"])
        else:
            kt = op.Transpose(k_all, _outputs=["kt"])
        if self.scale_op == "split":
            scores = op.MatMul(op.Mul(q, scale), op.Mul(kt, scale_k))
        else:
            scores = patterns.scaled(op, op.MatMul(q, kt), scale, self.scale_op)
        probs = patterns.masked_softmax(op, scores, mask, self.mask, self.nan_guard, pattern.ANY_VALUE)
        attn = op.MatMul(probs, self._repeat_kv(op, present_v, "v"), _outputs=["attn"])
        if self.attn_view:
            attn = op.Reshape(attn, _allow_other_inputs=True, _outputs=["attn_view"])
        out = op.Transpose(attn, _outputs=["attn_t"])
        return op.Reshape(out, _allow_other_inputs=True, _outputs=["out"]), present_k, present_v

    # check --------------------------------------------------------------------------------------------------
    def check(self, context, q, k, v, past_k, past_v, mask, scale, present_k, present_v, kt, probs, attn_t, out,
              scale_k=None, **b) -> pattern.MatchResult:
        result = pattern.MatchResult()
        qs, ks = q.shape, present_k.shape
        if qs is None or len(qs) != 4 or not all(isinstance(qs[i], int) for i in (1, 3)):
            return result.fail(f"query {q.name}: expected [B,N,S,H] with static N and H, got {qs}", q)
        if ks is None or len(ks) != 4 or not isinstance(ks[1], int) or ks[3] != qs[3]:
            return result.fail(f"key {present_k.name}: expected [B,Nkv,T,H] with static Nkv and H={qs[3]}, "
                               f"got {ks}", present_k)
        n, nkv, h = qs[1], ks[1], qs[3]
        for name, cat in (("key", present_k), ("value", present_v)):
            if (cat.producer().attributes["axis"].as_int() % 4) != 2:
                return result.fail(f"past {name} Concat is not on the sequence axis 2", cat)
        if v.shape is None or len(v.shape) != 4 or v.shape[1] != nkv or v.shape[3] != h:
            return result.fail(f"value {v.name}: expected [B,{nkv},S,{h}], got {v.shape}", v)
        if n % nkv:
            return result.fail(f"{n} query heads are not a multiple of {nkv} kv heads", [q, present_k])
        if self.repeat == "none" and n != nkv:
            return result.fail(f"no repeat_kv but {n} query heads vs {nkv} kv heads", [q, present_k])
        if self.repeat != "none":
            for tag in ("k", "v"):
                unsqueeze = b[f"{tag}_5d"].producer()
                axes = static_ints(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
                if axes is None or [a % 5 for a in axes] != [2]:
                    return result.fail(f"repeat_kv ({tag}): Unsqueeze is not on axis 2, so heads would not be "
                                       "grouped", b[f"{tag}_5d"])
                grown = b[f"{tag}_grown"].shape
                rep = b[f"{tag}_rep"].shape
                if grown is None or len(grown) != 5 or grown[1] != nkv or grown[2] != n // nkv:
                    return result.fail(f"repeat_kv ({tag}): expanded shape {grown} is not "
                                       f"[B,{nkv},{n // nkv},T,H]", b[f"{tag}_grown"])
                if rep is None or len(rep) != 4 or rep[1] != n:
                    return result.fail(f"repeat_kv ({tag}): reshaped to {rep}, expected [B,{n},T,H]",
                                       b[f"{tag}_rep"])
        if self.kt3d:
            reason = _check_kt3d(b["k_rep"] if self.repeat != "none" else present_k, b["k3"], b["kt3"], kt)
            if reason:
                return result.fail(reason, kt)
        elif _perm(kt) != [0, 1, 3, 2]:
            return result.fail(f"key transpose has perm {_perm(kt)}, expected [0,1,3,2]", kt)
        if _perm(attn_t) != [0, 2, 1, 3]:
            return result.fail(f"output transpose has perm {_perm(attn_t)}, expected [0,2,1,3]", attn_t)
        if self.attn_view:
            reason = _check_attn_view(b["attn"], b["attn_view"], q)
            if reason:
                return result.fail(reason, b["attn_view"])
        if probs.producer().attributes.get("axis") is None or probs.producer().attributes["axis"].as_int() % 4 != 3:
            return result.fail("Softmax is not over the key axis", probs)
        if out.shape is None or len(out.shape) != 3 or out.shape[2] != n * h:
            return result.fail(f"attention output reshaped to {out.shape}, expected [B,S,{n * h}]", out)
        scales = (scale, scale_k) if self.scale_op == "split" else (scale,)
        if any(x.const_value is None or x.const_value.size != 1 for x in scales):
            return result.fail("attention scale is not a constant scalar", [x for x in scales if x is not None])
        attention_mask = self.analyses.attention_mask(mask, q, past_k, boolean=self.mask == "where")
        if isinstance(attention_mask, str):
            return result.fail(attention_mask, mask)
        return result

    def _scale(self, scale: ir.Value, scale_k: ir.Value | None) -> float:
        """The softmax scale GroupQueryAttention takes: the product of the (checked) constant factors."""
        scales = (scale, scale_k) if self.scale_op == "split" else (scale,)
        s = float(np.prod([float(x.const_value.numpy().reshape(-1)[0]) for x in scales]))
        return 1.0 / s if self.scale_op == "div" else s

    # rewrite ------------------------------------------------------------------------------------------------
    def rewrite(self, op, q, k, v, past_k, past_v, mask, scale, present_k, scale_k=None, **_):
        n, nkv = q.shape[1], present_k.shape[1]
        attention_mask = self.analyses.attention_mask(mask, q, past_k, boolean=self.mask == "where")  # checked
        seqlens_k, total = self.analyses.lengths(op, attention_mask)
        return op.GroupQueryAttention(_to_bsd(op, q), _to_bsd(op, k), _to_bsd(op, v), past_k, past_v, seqlens_k,
                                      total, num_heads=n, kv_num_heads=nkv, scale=self._scale(scale, scale_k),
                                      _domain="com.microsoft", _outputs=3)


def _same_dim(a, b) -> bool:
    """Provably equal dims: equal ints, or the same symbolic name (not one shape inference made up)."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a is not None and a.value is not None and not a.value.startswith("unk__") and a == b


def _check_kt3d(k_rep: ir.Value, k3: ir.Value, kt3: ir.Value, kt: ir.Value) -> str | None:
    """torchlib's K^T of a 4-D tensor: Reshape to [B*N,T,H], Transpose [0,2,1], Reshape to [B,N,H,T]. Proven by
    shapes: the first Reshape keeps the last two dims (merging the leading ones), the last splits them back."""
    ks, k3s, kts = k_rep.shape, k3.shape, kt.shape
    if ks is None or len(ks) != 4 or k3s is None or len(k3s) != 3 or kts is None or len(kts) != 4:
        return f"K^T via a 3-D reshape: shapes {ks} -> {k3s} -> {kts} are not 4-D -> 3-D -> 4-D"
    if _perm(kt3) != [0, 2, 1]:
        return f"K^T via a 3-D reshape: the transpose has perm {_perm(kt3)}, expected [0,2,1]"
    if not (_same_dim(k3s[1], ks[2]) and _same_dim(k3s[2], ks[3])):
        return f"K^T via a 3-D reshape: {k3s} does not keep the last two dims of {ks}"
    if not all(_same_dim(kts[i], ks[j]) for i, j in ((0, 0), (1, 1), (2, 3), (3, 2))):
        return f"K^T via a 3-D reshape: {kts} is not {ks} with the last two dims swapped"
    return None


def _check_attn_view(attn: ir.Value, view: ir.Value, q: ir.Value) -> str | None:
    """TorchScript's SDPA re-views its [B,N,S,H] output as [B,-1,S,H]: an identity when the view's dims are the
    output's own batch and head dims and the query's sequence dim."""
    from .shape_plumbing import resolve_dims

    target = resolve_dims(view.producer().inputs[1])
    shape = attn.shape
    if target is None or len(target) != 4 or shape is None or len(shape) != 4:
        return f"attention output view: target {target} / shape {shape} are not 4-D"
    d0, d1, d2, d3 = target
    copy = view.producer().attributes.get_int("allowzero", 0) == 0  # else a literal 0 means an empty dim
    ok0 = (d0 == 0 and copy) or (d0 is not None and not isinstance(d0, int) and d0.same_as(attn, 0))
    ok1 = d1 in (-1, shape[1]) and isinstance(shape[1], int)
    ok2 = not isinstance(d2, int) and d2 is not None and d2.same_as(q, 2)
    ok3 = isinstance(shape[3], int) and d3 == shape[3]
    if not (ok0 and ok1 and ok2 and ok3):
        return f"attention output view to {target} is not the identity on {shape}"
    return None


def _to_bsd(op, x: ir.Value) -> ir.Value:
    """[B,Nh,S,H] -> [B,S,Nh*H]; reuses the 3-D tensor when x is Transpose(Reshape(x3d)) as exporters emit."""
    t = x.producer()
    if t is not None and t.op_type == "Transpose" and list(t.attributes["perm"].value) == [0, 2, 1, 3]:
        r = t.inputs[0].producer()
        if r is not None and r.op_type == "Reshape" and r.inputs[0].shape is not None \
                and len(r.inputs[0].shape) == 3 and r.inputs[0].shape[2] == x.shape[1] * x.shape[3]:
            return r.inputs[0]
        return op.Reshape(t.inputs[0], op.Constant(value_ints=[0, 0, -1]))
    return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))


def _verify_mask(model: ir.Model, mask: ir.Value, q: ir.Value, past_k: ir.Value, *, boolean: bool
                 ) -> ir.Value | str:
    """Return the attention_mask graph input if ``mask`` is causal+padding from it, else the reason."""
    try:
        _, leaves = backward_slice(model.graph, [mask])
    except ValueError as e:
        return f"mask: {e}"
    am = [v for v in leaves if v.dtype in (ir.DataType.INT64, ir.DataType.INT32) and v.shape is not None
          and len(v.shape) == 2 and "mask" in (v.name or "")]
    if len(am) != 1:
        return f"mask is not computed from one 2-D integer attention_mask input (inputs: {[v.name for v in leaves]})"
    am = am[0]
    b_sym, t_sym = am.shape[0], am.shape[1]
    s_sym = q.shape[2]
    p_sym = past_k.shape[2] if past_k.shape is not None and len(past_k.shape) == 4 else None
    feed_sets, expected = [], []
    roles = {leaf: "bs" for leaf in leaves if leaf.shape is not None and len(leaf.shape) == 2
             and any(k in (leaf.name or "") for k in ("input_ids", "position", "inputs_embeds"))}
    roles.update({leaf: "past" for leaf in leaves if leaf.shape is not None and len(leaf.shape) == 4})
    for s, p, pad in _MASK_CASES:
        b, t = 2, s + p
        dims = {b_sym: b, t_sym: t, s_sym: s, p_sym: p}
        for leaf, role in roles.items():  # exporters name dims differently per input: tie them by role
            if role == "bs":
                dims.setdefault(leaf.shape[0], b), dims.setdefault(leaf.shape[1], s)
            else:
                dims.setdefault(leaf.shape[0], b), dims.setdefault(leaf.shape[2], p)
        feeds = {}
        for leaf in leaves:
            if leaf.shape is None or any(not isinstance(d, int) and d not in dims for d in leaf.shape):
                return f"mask depends on {leaf.name} with dims {leaf.shape} not tied to batch/sequence/past"
            shape = [d if isinstance(d, int) else dims[d] for d in leaf.shape]
            np_dtype = leaf.dtype.numpy()
            if leaf is am:
                feeds[leaf] = np.array(pad if pad is not None else np.ones((b, t)), dtype=np_dtype)
            elif "position" in (leaf.name or "") and len(shape) == 2:
                feeds[leaf] = np.tile(np.arange(p, p + s), (b, 1)).astype(np_dtype)
            else:
                feeds[leaf] = np.zeros(shape, dtype=np_dtype)
        feed_sets.append(feeds)
        causal = np.arange(t)[None, :] <= (p + np.arange(s))[:, None]
        expected.append(causal[None, None] & (feeds[am][:, None, None, :] != 0))
    try:
        results = evaluate_values(model.graph, [mask], feed_sets)
    except Exception as e:  # noqa: BLE001 - the rule declines with the reason
        return f"mask could not be evaluated: {str(e).splitlines()[0][:200]}"
    for (s, p, pad), (got,), want in zip(_MASK_CASES, results, expected):
        try:
            got = np.broadcast_to(got, want.shape)
        except ValueError:
            return f"mask has shape {got.shape}, not broadcastable to [B,1,S,T]={want.shape}"
        allowed = got if boolean else (got == 0)
        blocked_ok = True if boolean else bool(np.all(got[~want] <= -1e4))
        if not (np.array_equal(allowed.astype(bool), want) and blocked_ok):
            return (f"mask is not causal+padding from {am.name} (S={s}, P={p}, "
                    f"{'right-padded' if pad else 'no padding'})")
    return am


def rules(model: ir.Model) -> pattern.RewriteRuleSet:
    """One rule per exporter variant (repeat_kv spelling, mask kind, scale spelling, NaN guard, SDPA views)."""
    analyses = MaskAnalyses(model)
    variants = [
        _AttentionToGQA.rule(f"GroupQueryAttention[{rep},{mask},{sc}{',nanguard' if ng else ''}]", repeat=rep,
                             mask=mask, scale_op=sc, nan_guard=ng, analyses=analyses)
        for ng in (True, False) for rep in ("expand", "tile", "none") for mask in ("add", "where")
        for sc in ("mul", "div")
    ]
    variants += [  # torch SDPA decomposition: split scale, NaN guard, additive mask
        _AttentionToGQA.rule(f"GroupQueryAttention[{rep},add,sdpa{',kt3d' if kt3d else ''}{',view' if view else ''}]",
                             repeat=rep, mask="add", scale_op="split", nan_guard=True, analyses=analyses,
                             attn_view=view, kt3d=kt3d)
        for rep in ("expand", "none") for kt3d in (True, False) for view in (True, False)
    ]
    return pattern.RewriteRuleSet(variants)


def apply(model: ir.Model, options: RewriteOptions, report: RewriteReport) -> None:
    """Fuse decomposed attention in ``model`` in place; counts under 'GroupQueryAttention[variant]'. Then, unless
    ``options.fold_rotary`` is off, fold the RotaryEmbeddings feeding each attention into it (``gqa_rotary``)."""
    apply_rule_set(model, rules(model), report)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    if options.fold_rotary:
        apply_rule_set(model, gqa_rotary.rules(), report)
        ir.passes.common.RemoveUnusedNodesPass()(model)
