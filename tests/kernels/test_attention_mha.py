"""com.microsoft MultiHeadAttention vs ORT's CPU EP, through the kernel and an NpuEP session on npu-ref (ORT's
assignment shows NpuEP ran it): separate Q/K/V, QKV bias, key_padding_mask as key lengths [B], [B, T] and
[B, S, T] (a fully masked row included: ORT adds mask_filter_value, not -inf), attention_bias, per-head [B, N, L, H]
key/value (cross attention), past/present, unidirectional, scale and mask_filter_value, float16; packed KV and
npu-edge are declined with reasons.

Tolerances: float32 rtol=atol=1e-5, float16 2e-3 (``_vector_ortref.TOL``).
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import make_model, rand

MS = "com.microsoft"
B, S, L, N, H, P = 2, 4, 5, 2, 8, 3
D = N * H


def _qkv(dtype=np.float32, s=S, kv_len=L):
    return [("q", rand((B, s, D), dtype, 1), False), ("k", rand((B, kv_len, D), dtype, 2), False),
            ("v", rand((B, kv_len, D), dtype, 3), False)]


def _check(inputs, attrs=None, outs=1, dtype=np.float32):
    names = [("y", dtype), ("present_k", dtype), ("present_v", dtype)][:outs]
    check_on_ep("MultiHeadAttention", inputs, names, {"num_heads": N, **(attrs or {})}, domain=MS)


def test_mha_plain_and_bias():
    _check(_qkv())
    _check(_qkv() + [("bias", rand((3 * D,), seed=4, lo=-1, hi=1), True)])


@pytest.mark.parametrize("kind", ["lengths", "2d", "3d", "fully_masked_row"])
def test_mha_key_padding_mask(kind):
    rng = np.random.default_rng(5)
    mask = {"lengths": np.array([3, 5], np.int32), "fully_masked_row": np.array([0, 5], np.int32),
            "2d": (rng.random((B, L)) < 0.6).astype(np.int32), "3d": (rng.random((B, S, L)) < 0.6).astype(np.int32)}
    _check(_qkv() + [None, ("m", mask[kind], False)])


@pytest.mark.parametrize("bias_shape", [(1, N, S, L), (B, 1, S, L), (B, N, S, L)])
def test_mha_attention_bias(bias_shape):
    _check(_qkv() + [None, ("m", np.array([4, 5], np.int32), True), ("ab", rand(bias_shape, seed=6), False)])


def test_mha_per_head_cross_attention_key_value():
    inputs = [("q", rand((B, S, D), seed=1), False), ("k", rand((B, N, L, H), seed=2), False),
              ("v", rand((B, N, L, H), seed=3), False)]
    _check(inputs)


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mha_past_present(unidirectional):
    inputs = _qkv(kv_len=S) + [None, None, None, ("pk", rand((B, N, P, H), seed=7), False),
                          ("pv", rand((B, N, P, H), seed=8), False)]
    _check(inputs, {"unidirectional": unidirectional}, outs=3)


def test_mha_unidirectional_without_past():
    _check(_qkv(kv_len=S), {"unidirectional": 1})


def test_mha_scale_and_mask_filter_value():
    _check(_qkv() + [None, ("m", np.array([2, 5], np.int32), False)], {"scale": 0.3, "mask_filter_value": -100.0})


def test_mha_float16():
    _check(_qkv(np.float16) + [("bias", rand((3 * D,), np.float16, seed=4, lo=-1, hi=1), True)], dtype=np.float16)


def _reason(inputs, attrs, target):
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.support import why_not
    from npu_ep.kernels.target import Target
    model = make_model("MultiHeadAttention", inputs, [("y", np.float32)], {"num_heads": N, **attrs}, domain=MS)
    (node,) = nodes_from_model(model)
    return why_not(node, Target.load(target))


def test_mha_declines_with_reasons():
    packed = [("q", rand((B, S, D), seed=1), False), ("k", rand((B, L, N, 2, H), seed=2), False)]
    assert "has rank 5 > max_rank 4 of target npu-ref" in _reason(packed, {}, "npu-ref")  # packed KV [B, L, N, 2, H]
    assert "unidirectional with 5 new keys for 4 queries" in _reason(_qkv(), {"unidirectional": 1}, "npu-ref")
    assert "not listed" in _reason(_qkv(), {}, "npu-edge")
