"""RoPE normalization: decomposed rotary -> com.microsoft RotaryEmbedding, numerics unchanged on ORT CPU."""

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
from npu_ep.models.weights import LlamaConfig, inv_freq
from npu_ep.rewriter import rotary
from npu_ep.rewriter.options import RewriteOptions, RewriteReport

CFG = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=97, max_position_embeddings=64)


def prepare(proto: onnx.ModelProto) -> ir.Model:
    """The clean-ups rope/gqa need first: shape inference and constant folding."""
    model = ir.serde.deserialize_model(proto)
    ir.passes.common.ShapeInferencePass()(model)
    optimizer.optimize(model)
    ir.passes.common.ShapeInferencePass()(model)
    return model


def run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def fuse(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, RewriteReport]:
    model, report = prepare(proto), RewriteReport()
    rotary.apply(model, RewriteOptions(), report)
    return ir.serde.serialize_model(model), report


def op_count(proto: onnx.ModelProto, op_type: str) -> int:
    return sum(n.op_type == op_type for n in proto.graph.node)


VARIANTS = [
    dict(style="dynamo", rope="half"),
    dict(style="torchscript", rope="half"),
    dict(style="dynamo", rope="interleaved"),
    dict(style="torchscript", rope="interleaved", partial_rotary=0.5),
    dict(style="dynamo", rope="half", partial_rotary=0.5, fused_qkv=True),
    dict(style="torchscript", rope="half", partial_rotary=0.5, fused_qkv=True),
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_tiny_llama_rope_fused_and_numerics_unchanged(kw):
    original = build_tiny_llama_proto(CFG, **kw)
    fused, report = fuse(original)
    assert op_count(fused, "RotaryEmbedding") == 2 * CFG.num_hidden_layers  # q and k per layer
    assert op_count(fused, "Neg") == 0, "the decomposed rotation must be gone"
    partial = kw.get("partial_rotary", 1.0) < 1
    assert any(k.startswith("RotaryEmbeddingPartial") for k in report.counts) == partial
    # every layer reads the same cos/sin: one analysis, one cache pair shared by all RotaryEmbeddings
    assert sorted(i.name for i in fused.graph.initializer if i.name.startswith("rope_")) == [
        "rope_cos_cache_0", "rope_sin_cache_0"]
    ids = np.array([[3, 14, 15, 92, 65, 35], [8, 9, 7, 9, 3, 2]])
    feeds = decoder_feeds(CFG, ids)
    ref, got = run(original, feeds), run(fused, feeds)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, atol=1e-4)
    past = [(ref[1 + 2 * i], ref[2 + 2 * i]) for i in range(CFG.num_hidden_layers)]
    step = decoder_feeds(CFG, np.array([[5], [6]]), past=past)
    for a, b in zip(run(original, step), run(fused, step)):
        np.testing.assert_allclose(b, a, atol=1e-4)


def test_rewrite_is_idempotent():
    fused, _ = fuse(build_tiny_llama_proto(CFG))
    again, report = fuse(fused)
    assert sum(report.counts.values()) == 0
    assert op_count(again, "RotaryEmbedding") == op_count(fused, "RotaryEmbedding")


# --- handcrafted graphs: one rotary on x [B,N,S,H] ---------------------------------------------------------
H, N = 16, 2


def rope_graph(*, lo_end: int = H // 2, hi_start: int = H // 2, cos_scale: float = 1.0, extra_input: bool = False,
               swap_halves: bool = False) -> onnx.ModelProto:
    g = GraphBuilder()
    inv = g.weight("inv_freq", inv_freq(H, 10000.0).reshape(1, H // 2, 1))
    pos = g.op("Cast", g.op("Unsqueeze", "position_ids", g.const([1])), to=TensorProto.FLOAT)   # [B,1,S]
    freqs = g.op("Transpose", g.op("MatMul", inv, pos), perm=[0, 2, 1])                        # [B,S,H/2]
    emb = g.op("Concat", freqs, freqs, axis=-1)
    if extra_input:  # the angles also depend on a second input: not a position table
        emb = g.op("Add", emb, g.op("Cast", g.op("Unsqueeze", "offset", g.const([1, 2])), to=TensorProto.FLOAT))
    cos = g.op("Unsqueeze", g.op("Mul", g.op("Cos", emb), g.const(cos_scale, np.float32)), g.const([1]))
    sin = g.op("Unsqueeze", g.op("Sin", emb), g.const([1]))
    x1 = g.op("Slice", "x", g.const([0]), g.const([lo_end]), g.const([3]), g.const([1]))
    x2 = g.op("Slice", "x", g.const([hi_start]), g.const([H]), g.const([3]), g.const([1]))
    rot = g.op("Concat", x1, g.op("Neg", x2), axis=-1) if swap_halves else g.op("Concat", g.op("Neg", x2), x1, axis=-1)
    g.op("Add", g.op("Mul", "x", cos), g.op("Mul", rot, sin), outputs=["y"])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", N, "S", H]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "S"])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("offset", TensorProto.INT64, ["B"]))
    proto = g.make_model("rope", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", N, "S", H])])
    proto.metadata_props.add(key="max_position_embeddings", value="128")
    return proto


def _feeds(extra: bool = False) -> dict:
    rng = np.random.default_rng(0)
    f = {"x": rng.standard_normal((2, N, 5, H)).astype(np.float32),
         "position_ids": np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])}
    if extra:
        f["offset"] = np.array([1, 2])
    return f


def test_handcrafted_half_rotation_fuses():
    proto = rope_graph()
    fused, report = fuse(proto)
    assert report.counts["RotaryEmbeddingHalf"] == 1 and op_count(fused, "RotaryEmbedding") == 1
    cache = [i for i in fused.graph.initializer if i.name.startswith("rope_cos_cache")]
    assert len(cache) == 1 and list(cache[0].dims) == [128, H // 2]
    np.testing.assert_allclose(run(fused, _feeds())[0], run(proto, _feeds())[0], atol=1e-5)


@pytest.mark.parametrize("kw, reason", [
    (dict(lo_end=H // 2 - 2, hi_start=H // 2 - 2), "rotate_half"),       # halves of the wrong size
    (dict(cos_scale=2.0), "cos^2 + sin^2"),                               # scaled rotary
    (dict(extra_input=True), "graph inputs"),                            # not a function of positions only
])
def test_handcrafted_near_misses_are_left_alone_with_reason(kw, reason):
    proto = rope_graph(**kw)
    fused, report = fuse(proto)
    assert op_count(fused, "RotaryEmbedding") == 0
    assert any(reason in f.reason for f in report.failures), report.failures
    assert len(set(report.failures)) == len(report.failures), "a declined candidate is reported once"
    feeds = _feeds(kw.get("extra_input", False))
    np.testing.assert_allclose(run(fused, feeds)[0], run(proto, feeds)[0], atol=1e-6)


def test_swapped_halves_is_not_rope():
    """Concat(x1, -x2) rotates the other way: no match at all (structural), graph unchanged."""
    fused, report = fuse(rope_graph(swap_halves=True))
    assert op_count(fused, "RotaryEmbedding") == 0 and sum(report.counts.values()) == 0


# --- handcrafted GPT-J rotary as the dynamo exporter spells it: x [B,S,N,H], interleaved, partial ---------------
R, M = 8, 64  # rotary dim (< H), rows of the position table
BIG = np.iinfo(np.int64).max


def gptj_rope_graph(*, cos_sin_dup: str = "interleaved", pass_start: int = R, rotation: str = "interleaved",
                    half_at: int = R // 2) -> onnx.ModelProto:
    """``Concat(rope(x[..., :R]), x[..., pass_start:])`` with ``rotate_every_two`` and sin/cos read from a constant
    [M, R] table by ``GatherND(table, position_ids[..., None])`` (dynamo's ``embed_positions[position_ids]``), no
    ``max_position_embeddings`` metadata: the table's rows are the only cache length. ``cos_sin_dup="half"``
    duplicates the angles as rotate_half does; ``rotation="half"`` rotates as GPT-NeoX does instead,
    ``Concat(-x_rot[..., half_at:], x_rot[..., :half_at])``."""
    g = GraphBuilder()
    angles = np.arange(M, dtype=np.float32)[:, None] * inv_freq(R, 10000.0)[None, :]
    table = g.weight("embed_positions", np.concatenate([np.sin(angles), np.cos(angles)], axis=1))  # [M, R]
    sincos = g.op("GatherND", table, g.op("Unsqueeze", "position_ids", g.const([-1])))           # [B,S,R]
    sin_h = g.op("Slice", sincos, g.const([0]), g.const([R // 2]), g.const([-1]))
    cos_h = g.op("Slice", sincos, g.const([R // 2]), g.const([R]), g.const([-1]))

    def widen(v: str) -> str:  # [B,S,R/2] -> [B,S,1,R]
        if cos_sin_dup == "half":
            return g.op("Unsqueeze", g.op("Concat", v, v, axis=-1), g.const([2]))
        u = g.op("Unsqueeze", v, g.const([-1]))
        pairs = g.op("Reshape", g.op("Concat", u, u, axis=-1), g.const([0, 0, R]))  # repeat_interleave(2)
        return g.op("Unsqueeze", pairs, g.const([2]))

    sin, cos = widen(sin_h), widen(cos_h)
    x_rot = g.op("Slice", "x", g.const([0]), g.const([R]), g.const([3]), g.const([1]))
    x_pass = g.op("Slice", "x", g.const([pass_start]), g.const([BIG]), g.const([3]), g.const([1]))
    if rotation == "half":
        hi = g.op("Slice", x_rot, g.const([half_at]), g.const([BIG]), g.const([3]), g.const([1]))
        lo = g.op("Slice", x_rot, g.const([0]), g.const([half_at]), g.const([3]), g.const([1]))
        rotated = g.op("Concat", g.op("Neg", hi), lo, axis=-1)
    else:
        odd = g.op("Slice", x_rot, g.const([1]), g.const([BIG]), g.const([3]), g.const([2]))
        even = g.op("Slice", x_rot, g.const([0]), g.const([BIG]), g.const([3]), g.const([2]))
        stacked = g.op("Concat", g.op("Unsqueeze", g.op("Neg", odd), g.const([-1])),
                       g.op("Unsqueeze", even, g.const([-1])), axis=-1)                           # [B,S,N,R/2,2]
        rotated = g.op("Reshape", stacked, g.const([0, 0, N, R]))
    rope_x = g.op("Add", g.op("Mul", x_rot, cos), g.op("Mul", rotated, sin))
    g.op("Concat", rope_x, x_pass, axis=-1, outputs=["y"])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", N, H]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "S"])]
    width = R + H - pass_start
    return g.make_model("gptj_rope", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                             ["B", "S", N, width])])


def _gptj_feeds() -> dict:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 5, N, H)).astype(np.float32),
            "position_ids": np.array([[0, 1, 2, 3, 4], [M - 5, M - 4, M - 3, M - 2, M - 1]])}


def _rotary_attrs(proto: onnx.ModelProto) -> list[dict]:
    return [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in proto.graph.node
            if n.op_type == "RotaryEmbedding"]


def test_gptj_partial_interleaved_rope_from_a_gathernd_table_fuses():
    """The dynamo exporter reads GPT-J's sin/cos table with GatherND: its rows bound the positions (without them
    the cos/sin were evaluated for 4096 positions, past the table, and no rotary site fused)."""
    proto = gptj_rope_graph()
    assert not any(p.key == "max_position_embeddings" for p in proto.metadata_props)
    fused, report = fuse(proto)
    assert report.counts["RotaryEmbeddingInterleaved"] == 1 and report.counts["RotaryEmbeddingPartialBSNH"] == 1
    assert _rotary_attrs(fused) == [{"interleaved": 1, "num_heads": N, "rotary_embedding_dim": R}]
    assert op_count(fused, "Neg") == 0 and op_count(fused, "GatherND") == 0
    cache = [i for i in fused.graph.initializer if i.name.startswith("rope_cos_cache")]
    assert len(cache) == 1 and list(cache[0].dims) == [M, R // 2]
    np.testing.assert_allclose(run(fused, _gptj_feeds())[0], run(proto, _gptj_feeds())[0], atol=1e-5)


def test_neox_partial_rope_from_a_gathernd_table_fuses_not_interleaved():
    """The same partial rotary with GPT-NeoX's rotate_half (and its half-duplicated angles) fuses with
    interleaved=0."""
    proto = gptj_rope_graph(rotation="half", cos_sin_dup="half")
    fused, report = fuse(proto)
    assert report.counts["RotaryEmbeddingHalf"] == 1 and report.counts["RotaryEmbeddingPartialBSNH"] == 1
    assert _rotary_attrs(fused) == [{"interleaved": 0, "num_heads": N, "rotary_embedding_dim": R}]
    np.testing.assert_allclose(run(fused, _gptj_feeds())[0], run(proto, _gptj_feeds())[0], atol=1e-5)


@pytest.mark.parametrize("kw, rule, reason", [
    (dict(cos_sin_dup="half"), "RotaryEmbeddingInterleaved", "not duplicated as interleaved"),  # NeoX cos/sin
    (dict(pass_start=R + 2), "RotaryEmbeddingPartialBSNH", "do not split head dim"),          # drops 2 channels
    (dict(rotation="half", cos_sin_dup="half", half_at=R // 2 - 1), "RotaryEmbeddingHalf",    # halves 5 and 3
     "rotate_half: expected x[..., 4:] and x[..., :4]"),
    (dict(rotation="half", cos_sin_dup="interleaved"), "RotaryEmbeddingHalf",                 # GPT-J cos/sin
     "not duplicated as half"),
], ids=["neox-cos-sin", "pass-slice-bounds", "half-slice-bounds", "gptj-cos-sin-for-half"])
def test_gptj_near_misses_are_left_alone_with_reason(kw, rule, reason):
    proto = gptj_rope_graph(**kw)
    fused, report = fuse(proto)
    assert all(a.get("rotary_embedding_dim", 0) == 0 for a in _rotary_attrs(fused)), "no partial rotary fused"
    assert any(f.rule == rule and reason in f.reason for f in report.failures), report.failures
    np.testing.assert_allclose(run(fused, _gptj_feeds())[0], run(proto, _gptj_feeds())[0], atol=1e-5)
