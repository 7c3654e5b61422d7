"""FoldRotaryIntoGQA: RotaryEmbedding(q), RotaryEmbedding(k) -> GroupQueryAttention(do_rotary=1, position_ids)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

from npu_ep.models.feeds import decoder_feeds, split_outputs
from npu_ep.models.tiny_llama import build_tiny_llama_proto
from npu_ep.models.weights import LlamaConfig
from npu_ep.rewriter import RewriteOptions, RewriteReport, gqa_rotary, rewrite
from npu_ep.rewriter.rule_set import apply_rule_set

B, S, N, NKV, H, P, MAXP = 1, 3, 4, 2, 32, 5, 32
CFG = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=97, max_position_embeddings=64)


def _caches(width: int = H // 2) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / 10000 ** (np.arange(width) / width)
    ang = np.arange(MAXP)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def attention_graph(*, k_pos: str = "pos", rot_dim: int = 0, extra_reader: bool = False, k_interleaved: int = 0):
    cos, sin = _caches()
    ins = [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in (
        ("q", [B, S, N * H]), ("k", [B, S, NKV * H]), ("v", [B, S, NKV * H]), ("pk", [B, NKV, P, H]),
        ("pv", [B, NKV, P, H]))]
    ins += [helper.make_tensor_value_info("seq", T.INT32, [B]), helper.make_tensor_value_info("tot", T.INT32, []),
            helper.make_tensor_value_info("pos", T.INT64, [B, S]),
            helper.make_tensor_value_info("pos2", T.INT64, [B, S])]
    inits = [helper.make_tensor("cos", T.FLOAT, cos.shape, cos.flatten()),
             helper.make_tensor("sin", T.FLOAT, sin.shape, sin.flatten())]
    rot = {"rotary_embedding_dim": rot_dim} if rot_dim else {}
    nodes = [helper.make_node("RotaryEmbedding", ["q", "pos", "cos", "sin"], ["qr"], domain="com.microsoft",
                              num_heads=N, **rot),
             helper.make_node("RotaryEmbedding", ["k", k_pos, "cos", "sin"], ["kr"], domain="com.microsoft",
                              num_heads=NKV, interleaved=k_interleaved, **rot),
             helper.make_node("GroupQueryAttention", ["qr", "kr", "v", "pk", "pv", "seq", "tot"], ["o", "ok", "ov"],
                              domain="com.microsoft", num_heads=N, kv_num_heads=NKV)]
    outs = [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("o", "ok", "ov")]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["kr"], ["kr_copy"]))
        outs.append(helper.make_tensor_value_info("kr_copy", T.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "attn", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def _feeds(positions=(P, P + 1, P + 2)):
    rng = np.random.default_rng(0)
    f = {"q": rng.standard_normal((B, S, N * H)), "k": rng.standard_normal((B, S, NKV * H)),
         "v": rng.standard_normal((B, S, NKV * H)), "pk": rng.standard_normal((B, NKV, P, H)),
         "pv": rng.standard_normal((B, NKV, P, H))}
    f = {k: v.astype(np.float32) for k, v in f.items()}
    f.update(seq=np.array([P + S - 1], np.int32), tot=np.array(P + S, np.int32),
             pos=np.array([positions], np.int64), pos2=np.array([positions], np.int64))
    return f


def _fold(model: onnx.ModelProto) -> tuple[onnx.ModelProto, RewriteReport]:
    ir_model = ir.serde.deserialize_model(model)
    report = RewriteReport()
    apply_rule_set(ir_model, gqa_rotary.rules(), report)
    return ir.serde.serialize_model(ir_model), report


def _run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("positions", [(P, P + 1, P + 2), (7, 9, 12)])
def test_fold_is_exact_on_ort_cpu_including_non_contiguous_positions(positions):
    model = attention_graph()
    folded, report = _fold(model)
    assert report.counts["FoldRotaryIntoGQA"] == 1
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["GroupQueryAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in folded.graph.node[0].attribute}
    assert attrs["do_rotary"] == 1 and attrs["num_heads"] == N and attrs["kv_num_heads"] == NKV
    for a, b in zip(_run(model, _feeds(positions)), _run(folded, _feeds(positions))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("near_miss, reason", [
    (dict(k_pos="pos2"), None),  # q and k rotated at (possibly) different positions: no match at all
    (dict(rot_dim=16), "partial"),
    (dict(extra_reader=True), "other consumers"),
    (dict(k_interleaved=1), "interleaved"),
])
def test_near_misses_stay_unfolded_with_a_reason(near_miss, reason):
    folded, report = _fold(attention_graph(**near_miss))
    assert report.counts.get("FoldRotaryIntoGQA", 0) == 0
    assert [n.op_type for n in folded.graph.node].count("RotaryEmbedding") == 2
    if reason:
        assert any(reason in f.reason for f in report.failures), report.failures


def test_tiny_llama_prefill_and_decode_unchanged_and_every_layer_folded():
    proto = build_tiny_llama_proto(CFG)
    result = rewrite(proto, passes=("cleanup", "rope", "gqa"))
    assert result.report.counts["FoldRotaryIntoGQA"] == CFG.num_hidden_layers
    folded = ir.serde.serialize_model(result.model)
    assert [n.op_type for n in folded.graph.node].count("RotaryEmbedding") == 0
    unfolded = ir.serde.serialize_model(rewrite(proto, RewriteOptions(passes=("cleanup", "rope", "gqa"),
                                                                      fold_rotary=False)).model)
    ids = np.array([[3, 14, 15, 92, 65, 35]], np.int64)
    for model in (folded, unfolded):
        names = [o.name for o in model.graph.output]
        ref = split_outputs(names, _run(proto, decoder_feeds(CFG, ids)))
        got = split_outputs(names, _run(model, decoder_feeds(CFG, ids)))
        np.testing.assert_allclose(got[0], ref[0], atol=1e-4)
        step = decoder_feeds(CFG, np.array([[7]], np.int64), past=ref[1])
        np.testing.assert_allclose(split_outputs(names, _run(model, step))[0],
                                   split_outputs(names, _run(proto, step))[0], atol=1e-4)
