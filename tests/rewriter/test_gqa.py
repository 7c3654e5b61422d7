"""GQA normalization: decomposed attention with repeated KV -> com.microsoft GroupQueryAttention, drop-in."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxscript import optimizer

from npu_ep.models._builder import GraphBuilder
from npu_ep.models.feeds import decoder_feeds
from npu_ep.models.tiny_llama import build_tiny_llama_proto
from npu_ep.models.weights import LlamaConfig
from npu_ep.rewriter import gqa, rotary
from npu_ep.rewriter.options import RewriteOptions, RewriteReport

CFG = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=97, max_position_embeddings=64)


def fuse(proto: onnx.ModelProto, families=(rotary, gqa)) -> tuple[onnx.ModelProto, RewriteReport]:
    model, report = ir.serde.deserialize_model(proto), RewriteReport()
    ir.passes.common.ShapeInferencePass()(model)
    optimizer.optimize(model)
    ir.passes.common.ShapeInferencePass()(model)
    for fam in families:  # the attention rules alone; folding RoPE into GQA is tested in test_gqa_rotary.py
        fam.apply(model, RewriteOptions(fold_rotary=False), report)
    return ir.serde.serialize_model(model), report


def run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def ops(proto: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in proto.graph.node]


def io_signature(proto: onnx.ModelProto) -> list:
    def sig(vi):
        t = vi.type.tensor_type
        return vi.name, t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim]
    return [sig(v) for v in proto.graph.input], [sig(v) for v in proto.graph.output]


VARIANTS = [
    dict(style="dynamo", rope="half"),
    dict(style="torchscript", rope="half"),
    dict(style="dynamo", rope="interleaved"),
    dict(style="torchscript", rope="interleaved", partial_rotary=0.5),
    dict(style="dynamo", rope="half", partial_rotary=0.5, fused_qkv=True, mask="where", nan_guard=True),
    dict(style="torchscript", rope="half", fused_qkv=True),
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_tiny_llama_attention_becomes_gqa_drop_in(kw):
    original = build_tiny_llama_proto(CFG, **kw)
    fused, _report = fuse(original)
    o = ops(fused)
    assert o.count("GroupQueryAttention") == CFG.num_hidden_layers
    assert o.count("RotaryEmbedding") == 2 * CFG.num_hidden_layers
    assert "Expand" not in o and "Tile" not in o and "Softmax" not in o, "repeated KV / softmax must be gone"
    assert io_signature(fused) == io_signature(original)
    ids = np.array([[3, 14, 15, 92, 65, 35, 8], [8, 9, 7, 9, 3, 2, 3]]) % CFG.vocab_size
    feeds = decoder_feeds(CFG, ids)
    ref, got = run(original, feeds), run(fused, feeds)
    for a, b in zip(ref, got):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, atol=1e-4)
    past = [(got[1 + 2 * i], got[2 + 2 * i]) for i in range(CFG.num_hidden_layers)]
    # one decode token (batch 2), then a 2-token chunk on top of the cache (ORT's GQA allows that at batch 1 only)
    for step_ids, rows in (([[5], [6]], slice(0, 2)), ([[7, 1]], slice(0, 1))):
        step = decoder_feeds(CFG, np.array(step_ids), past=[(k[rows], v[rows]) for k, v in past])
        ref, got = run(original, step), run(fused, step)
        for a, b in zip(ref, got):
            assert a.shape == b.shape
            np.testing.assert_allclose(b, a, atol=1e-4)


def test_right_padded_batch_matches_on_valid_positions():
    original = build_tiny_llama_proto(CFG)
    fused, _ = fuse(original)
    ids = np.array([[3, 14, 15, 92, 65], [8, 9, 7, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ref, got = run(original, decoder_feeds(CFG, ids, attention_mask=mask)), \
        run(fused, decoder_feeds(CFG, ids, attention_mask=mask))
    np.testing.assert_allclose(got[0][0], ref[0][0], atol=1e-4)
    np.testing.assert_allclose(got[0][1, :3], ref[0][1, :3], atol=1e-4)
    for a, b in zip(ref[1:], got[1:]):  # present KV at valid positions
        np.testing.assert_allclose(b[1, :, :3], a[1, :, :3], atol=1e-5)


def test_rewrite_is_idempotent():
    fused, _ = fuse(build_tiny_llama_proto(CFG))
    again, report = fuse(fused)
    assert sum(report.counts.values()) == 0
    assert ops(again).count("GroupQueryAttention") == CFG.num_hidden_layers


# --- handcrafted attention block: q [B,N,S,H], k/v [B,Nkv,S,H], past [B,Nkv,P,H], attention_mask [B,T] ------
N, NKV, H = 4, 2, 8


def attention_graph(*, unsqueeze_axis: int = 2, mask: str = "causal", scale_op: str = "Mul") -> onnx.ModelProto:
    g = GraphBuilder()
    s = g.op("Shape", "q", start=2, end=3)
    t = g.op("Shape", "attention_mask", start=1, end=2)
    sq = lambda v: g.op("Squeeze", v, g.const([0]))
    cache_pos = g.op("Range", sq(g.op("Sub", t, s)), sq(t), g.const(1))
    key_pos = g.op("Range", g.const(0), sq(t), g.const(1))
    query_pos = cache_pos if mask != "causal_no_past" else g.op("Range", g.const(0), sq(s), g.const(1))
    causal = g.op("LessOrEqual", g.op("Unsqueeze", key_pos, g.const([0])), g.op("Unsqueeze", query_pos, g.const([1])))
    pad = g.op("Cast", g.op("Unsqueeze", "attention_mask", g.const([1, 2])), to=TensorProto.BOOL)
    allowed = pad if mask == "padding_only" else g.op("And", g.op("Unsqueeze", causal, g.const([0, 1])), pad)
    additive = g.op("Where", allowed, g.const(0.0, np.float32), g.const(float(np.finfo(np.float32).min), np.float32))

    def repeat(x):
        x5 = g.op("Unsqueeze", x, g.const([unsqueeze_axis]))
        grown = [g.op("Shape", x, start=0, end=1)]
        grown += [g.const([NKV]), g.const([N // NKV])] if unsqueeze_axis == 2 else [g.const([N // NKV]), g.const([NKV])]
        grown += [g.op("Shape", x, start=2, end=4)]
        x5 = g.op("Expand", x5, g.op("Concat", *grown, axis=0))
        return g.op("Reshape", x5, g.op("Concat", g.op("Shape", x, start=0, end=1), g.const([N, -1, H]), axis=0))

    k_all = g.op("Concat", "past_k", "k", axis=2, outputs=["present_k"])
    v_all = g.op("Concat", "past_v", "v", axis=2, outputs=["present_v"])
    scores = g.op("MatMul", "q", g.op("Transpose", repeat(k_all), perm=[0, 1, 3, 2]))
    scale = H ** -0.5 if scale_op == "Mul" else H ** 0.5
    scores = g.op("Add", g.op(scale_op, scores, g.const(scale, np.float32)), additive)
    out = g.op("MatMul", g.op("Softmax", scores, axis=-1), repeat(v_all))
    g.op("Reshape", g.op("Transpose", out, perm=[0, 2, 1, 3]), g.const([0, 0, N * H]), outputs=["out"])
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, ["B", N, "S", H]),
              helper.make_tensor_value_info("k", f, ["B", NKV, "S", H]),
              helper.make_tensor_value_info("v", f, ["B", NKV, "S", H]),
              helper.make_tensor_value_info("past_k", f, ["B", NKV, "P", H]),
              helper.make_tensor_value_info("past_v", f, ["B", NKV, "P", H]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"])]
    outputs = [helper.make_tensor_value_info("out", f, ["B", "S", N * H]),
               helper.make_tensor_value_info("present_k", f, ["B", NKV, "T", H]),
               helper.make_tensor_value_info("present_v", f, ["B", NKV, "T", H])]
    return g.make_model("attn", inputs, outputs)


def _feeds(s: int = 3, p: int = 2, b: int = 1) -> dict:
    rng = np.random.default_rng(1)
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return {"q": r(b, N, s, H), "k": r(b, NKV, s, H), "v": r(b, NKV, s, H), "past_k": r(b, NKV, p, H),
            "past_v": r(b, NKV, p, H), "attention_mask": np.ones((b, p + s), np.int64)}


@pytest.mark.parametrize("scale_op", ["Mul", "Div"])
def test_handcrafted_attention_fuses(scale_op):
    proto = attention_graph(scale_op=scale_op)
    fused, report = fuse(proto, families=(gqa,))
    assert ops(fused).count("GroupQueryAttention") == 1, report.failures
    assert any(f"{scale_op.lower()}]" in k for k in report.counts)
    for s, p, b in ((3, 2, 1), (1, 5, 3), (4, 0, 2)):
        for want, got in zip(run(proto, _feeds(s, p, b)), run(fused, _feeds(s, p, b))):
            np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("kw, reason", [
    (dict(unsqueeze_axis=1), "Unsqueeze is not on axis 2"),     # heads tiled k0,k1,k0,k1: not GQA grouping
    (dict(mask="padding_only"), "not causal+padding"),          # bidirectional attention
    (dict(mask="causal_no_past"), "not causal+padding"),        # causal mask that ignores the past offset
])
def test_handcrafted_near_misses_are_left_alone_with_reason(kw, reason):
    proto = attention_graph(**kw)
    fused, report = fuse(proto, families=(gqa,))
    assert "GroupQueryAttention" not in ops(fused)
    assert any(reason in f.reason for f in report.failures), report.failures
    assert len(set(report.failures)) == len(report.failures), "a declined candidate is reported once"
    for a, b in zip(run(proto, _feeds()), run(fused, _feeds())):
        np.testing.assert_allclose(b, a, atol=1e-6)


def test_llama_query_reaches_gqa_without_layout_shuffles():
    """RoPE is applied on the [B,S,D] tensor, so GQA's query/key come straight from RotaryEmbedding."""
    fused, _ = fuse(build_tiny_llama_proto(CFG))
    producer = {o: n for n in fused.graph.node for o in n.output}
    for node in (n for n in fused.graph.node if n.op_type == "GroupQueryAttention"):
        assert producer[node.input[0]].op_type == "RotaryEmbedding"
        assert producer[node.input[1]].op_type == "RotaryEmbedding"
    assert ops(fused).count("Transpose") == 0
    # the length inputs derived from attention_mask are computed once and shared by every layer's attention
    seqlens = {n.input[5] for n in fused.graph.node if n.op_type == "GroupQueryAttention"}
    totals = {n.input[6] for n in fused.graph.node if n.op_type == "GroupQueryAttention"}
    assert len(seqlens) == len(totals) == 1 and ops(fused).count("ReduceSum") == 1
