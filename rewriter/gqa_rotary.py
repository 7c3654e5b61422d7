"""Fold the two RotaryEmbeddings that feed a GroupQueryAttention into it (``do_rotary=1``).

    q_rot = RotaryEmbedding(q, position_ids, cos, sin)      k_rot = RotaryEmbedding(k, position_ids, cos, sin)
    out, present_k, present_v = GroupQueryAttention(q_rot, k_rot, v, past_k, past_v, seqlens_k, total_len)
->  out, present_k, present_v = GroupQueryAttention(q, k, v, past_k, past_v, seqlens_k, total_len, cos, sin,
                                                    position_ids, do_rotary=1, rotary_interleaved=interleaved)

Exact, not approximate: GroupQueryAttention's optional ``position_ids`` input makes it rotate at the same positions
the RotaryEmbeddings did (verified on ORT's CPU EP, also for non-contiguous positions). Layouts: q [B, S, N*H],
k [B, S, Nkv*H], position_ids [B, S] int64, cos/sin [max_pos, H/2] (full rotary only: GQA rotates whole heads).
On the NPU this removes two vector passes and two DRAM round trips of q and k per layer and token.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


class FoldRotaryIntoGQA(RewriteRuleClassBase):
    def pattern(self, op, query, key, value, past_key, past_value, seqlens_k, total_len, position_ids, cos, sin):
        q = op.RotaryEmbedding(query, position_ids, cos, sin, _domain="com.microsoft", _allow_other_attributes=True,
                               _outputs=["q_rot"])
        k = op.RotaryEmbedding(key, position_ids, cos, sin, _domain="com.microsoft", _allow_other_attributes=True,
                               _outputs=["k_rot"])
        return op.GroupQueryAttention(q, k, value, past_key, past_value, seqlens_k, total_len,
                                      _domain="com.microsoft", _allow_other_attributes=True,
                                      _outputs=["out", "present_k", "present_v"])

    def check(self, context, query, position_ids, cos, q_rot, k_rot, out, **_) -> MatchResult:
        # (onnxscript already refuses matches whose rotated q/k have other readers)
        result = MatchResult()
        gqa, rq, rk = out.producer(), q_rot.producer(), k_rot.producer()
        if _attr(gqa, "do_rotary", 0):
            return result.fail("GroupQueryAttention already rotates (do_rotary=1)", gqa)
        for r in (rq, rk):
            if _attr(r, "rotary_embedding_dim", 0) or _attr(r, "is_packed_batching", 0):
                return result.fail("partial or packed-batch rotary: GroupQueryAttention rotates whole heads only", r)
            if _attr(r, "scale", 1.0) != 1.0:
                return result.fail(f"RotaryEmbedding scale={_attr(r, 'scale', 1.0)} (GroupQueryAttention has none)", r)
        if _attr(rq, "interleaved", 0) != _attr(rk, "interleaved", 0):
            return result.fail("q and k use different rotary layouts (interleaved differs)", [rq, rk])
        if query.shape is None or len(query.shape) != 3 or not isinstance(query.shape[2], int):
            return result.fail(f"query must be [B, S, N*H] with a static hidden size, got {query.shape}", query)
        head = query.shape[2] // _attr(gqa, "num_heads", 1)
        if cos.shape is None or len(cos.shape) != 2 or cos.shape[1] != head // 2:
            return result.fail(f"cos cache {cos.shape} does not rotate whole heads of size {head}", cos)
        if position_ids.shape is None or len(position_ids.shape) != 2:
            return result.fail(f"position_ids {position_ids.shape} is not [B, S] (GroupQueryAttention's form)",
                               position_ids)
        return result

    def rewrite(self, op, query, key, value, past_key, past_value, seqlens_k, total_len, position_ids, cos, sin,
                q_rot, out, **_):
        gqa = out.producer()
        attrs = {name: a.value for name, a in gqa.attributes.items()}
        attrs.update(do_rotary=1, rotary_interleaved=int(_attr(q_rot.producer(), "interleaved", 0)))
        return op.GroupQueryAttention(query, key, value, past_key, past_value, seqlens_k, total_len, cos, sin,
                                      position_ids, _domain="com.microsoft", _outputs=3, **attrs)


def rules() -> RewriteRuleSet:
    return RewriteRuleSet([FoldRotaryIntoGQA.rule()])
