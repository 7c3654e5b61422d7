"""com.microsoft Attention (packed QKV projection) vs ORT's CPU EP, through the kernel and an NpuEP session on
npu-ref (ORT's assignment shows NpuEP ran it): every mask_index form ORT's CPU kernel implements ([B] key lengths,
[2B] end/start positions, [B, T] and [B, S, T] raw masks, the [B, 1] dummy, a fully masked row), past/present
in the combined [2, B, N, P, H] layout, unidirectional with and without past, attention_bias, qkv_hidden_sizes
with a different V width, scale/mask_filter_value, runtime (non-constant) weights, odd sizes. 4-D masks, do_rotary,
float16 and npu-edge are declined with reasons.

Tolerances: float32 rtol=atol=1e-5 (``_vector_ortref.TOL``).
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import make_model, rand

MS = "com.microsoft"
B, S, N, H, P, DIN = 2, 5, 3, 4, 3, 7   # odd sizes: 5 tokens, 3 heads of 4, 7 input features
D = N * H


def _inputs(s=S, din=DIN, cols=3 * D, const_w=True, seed=0):
    return [("x", rand((B, s, din), seed=seed + 1), False), ("w", rand((din, cols), seed=seed + 2), const_w),
            ("bias", rand((cols,), seed=seed + 3, lo=-1, hi=1), True)]


def _check(inputs, attrs=None, present=False, v_width=D):
    outs = [("y", np.float32, [B, inputs[0][1].shape[1], v_width])]
    if present:
        outs.append(("present", np.float32, None))
    check_on_ep("Attention", inputs, outs, {"num_heads": N, **(attrs or {})}, domain=MS)


def test_attention_plain():
    _check(_inputs())


def test_attention_runtime_weights():
    _check(_inputs(const_w=False))


@pytest.mark.parametrize("kind", ["lengths", "end_start", "2d", "2d_dummy", "3d", "fully_masked_row"])
def test_attention_mask_index(kind):
    rng = np.random.default_rng(5)
    mask = {"lengths": np.array([3, 5], np.int32), "end_start": np.array([4, 5, 1, 2], np.int32),
            "2d": (rng.random((B, S)) < 0.6).astype(np.int32), "2d_dummy": np.ones((B, 1), np.int32),
            "3d": (rng.random((B, S, S)) < 0.6).astype(np.int32), "fully_masked_row": np.array([0, 5], np.int32)}
    _check(_inputs() + [("m", mask[kind], False)])


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_past_present(unidirectional):
    rng = np.random.default_rng(6)
    mask = (rng.random((B, P + S)) < 0.8).astype(np.int32)
    mask[:, 0] = 1
    _check(_inputs() + [("m", mask, False), ("past", rand((2, B, N, P, H), seed=7), False)],
           {"unidirectional": unidirectional}, present=True)


def test_attention_past_decode_step():
    _check(_inputs(s=1) + [None, ("past", rand((2, B, N, P, H), seed=8), False)], {"unidirectional": 1},
           present=True)


@pytest.mark.parametrize("mask", [np.array([4, 2], np.int32), np.array([4, 5, 0, 1], np.int32),
                                  (np.random.default_rng(3).random((B, S, S)) < 0.7).astype(np.int32)],
                         ids=["lengths", "end_start", "3d"])
def test_attention_unidirectional_with_masks(mask):
    _check(_inputs() + [("m", mask, False)], {"unidirectional": 1})


@pytest.mark.parametrize("bias_shape", [(1, N, S, S), (B, 1, S, S), (B, N, S, S)])
def test_attention_attention_bias(bias_shape):
    _check(_inputs() + [("m", np.array([4, 5], np.int32), True), None, ("ab", rand(bias_shape, seed=9), False)])


def test_attention_qkv_hidden_sizes_and_scale():
    dv = 2 * N
    _check(_inputs(cols=2 * D + dv), {"qkv_hidden_sizes": [D, D, dv], "scale": 0.3, "mask_filter_value": -50.0},
           v_width=dv)
    _check(_inputs(cols=2 * D + dv) + [("m", np.array([1, 3], np.int32), False)],
           {"qkv_hidden_sizes": [D, D, dv], "mask_filter_value": -50.0}, v_width=dv)


def _reason(inputs, attrs, target="npu-ref"):
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.support import why_not
    from npu_ep.kernels.target import Target
    model = make_model("Attention", inputs, [("y", np.float32, [B, S, D])], {"num_heads": N, **attrs}, domain=MS)
    (node,) = nodes_from_model(model)
    return why_not(node, Target.load(target))


def test_attention_declines_with_reasons():
    mask4 = ("m", np.ones((B, 1, 8, 8), np.int32), False)
    assert "4-D (Megatron) mask_index" in _reason(_inputs() + [mask4], {})
    assert "do_rotary not supported" in _reason(_inputs(), {"do_rotary": 1})
    assert "past_present_share_buffer" in _reason(_inputs(), {"past_present_share_buffer": 1})
    assert "bias is required" in _reason(_inputs()[:2], {})
    assert "need Dq == Dk" in _reason(_inputs(cols=3 * D), {"qkv_hidden_sizes": [D, 2 * N, 2 * D - 2 * N]})
    assert "must be [batch] or [2 * batch]" in _reason(_inputs() + [("m", np.ones((3 * B + 2,), np.int32), False)],
                                                        {})
    f16 = [("x", rand((B, S, DIN), np.float16, 1), False), ("w", rand((DIN, 3 * D), np.float16, 2), True),
           ("bias", rand((3 * D,), np.float16, 3), True)]
    assert "input dtype float16 not supported by target npu-ref" in _reason(f16, {})
    assert "not listed" in _reason(_inputs(), {}, "npu-edge")


def test_bert_fused_by_orts_transformer_optimizer_runs_attention_on_npuep(tmp_path):
    """A real producer of this op: ORT's transformer optimizer fuses a TorchScript-exported BERT's self-attention
    into com.microsoft Attention (mask_index from EmbedLayerNormalization: key lengths [B]; the optimizer fuses
    no Attention in the dynamo export). The whole fused graph (EmbedLayerNormalization, Attention,
    SkipLayerNormalization, BiasGelu, the pooler) runs on NpuEP in one partition, within 1e-5 relative of the
    CPU EP."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import onnxruntime as ort
    from onnxruntime.transformers.optimizer import optimize_model

    from npu_ep.models import encoders
    from npu_testing import assignment, npu_partitions, npu_session

    path = encoders.export_encoder("bert", tmp_path / "bert.onnx", exporter="torchscript")
    fused = optimize_model(str(path), model_type="bert", num_heads=4, hidden_size=64)
    attention = [n.name for n in fused.model.graph.node if (n.domain, n.op_type) == (MS, "Attention")]
    assert len(attention) == 2, [n.op_type for n in fused.model.graph.node]  # one per layer
    fused_path = str(tmp_path / "bert_fused.onnx")
    fused.save_model_to_file(fused_path)
    feeds = encoders.sample_feeds("bert", np.random.default_rng(1))  # last row padded: a real key-length mask
    want = ort.InferenceSession(fused_path, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = npu_session(fused_path)
    got = sess.run(None, feeds)
    ran = assignment(sess)
    assert all(ran[name] == "NpuEP" for name in attention), ran
    assert set(ran.values()) == {"NpuEP"} and len(npu_partitions(sess)) == 1, ran
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert float(np.abs(g - w).max()) <= 1e-5 * float(np.abs(w).max())
