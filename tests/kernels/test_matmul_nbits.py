"""MatMulNBits (4-bit, blocks 16..256, zero points or not, bias, accuracy_level 0 and 4) vs ORT CPU.

Tolerances: level 0 fp32: rtol 1e-4, atol 1e-4 * sqrt(K) (same dequantized weights, fp32 summation order);
level 4: atol 2e-3 * sqrt(K) (A quantized to int8 per block on both sides; rounding ties/summation may differ);
fp16 A: rtol/atol 2e-2.
"""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.quantization import quantize_matmul_nbits
from _single_op import both, declined

RNG = np.random.default_rng(2)


def _inputs(a, K, N, bs, symmetric, with_bias, dt=np.float32):
    w = quantize_matmul_nbits(RNG.standard_normal((K, N)).astype(np.float32), bs, symmetric)
    bias = RNG.standard_normal(N).astype(dt) if with_bias else None
    return [("a", a.astype(dt), False), ("B", w.B, True), ("scales", w.scales.astype(dt), True),
            ("zp", w.zero_points, True), ("g_idx", None, True), ("bias", bias, True)]


@pytest.mark.parametrize("m,K,N,bs", [(1, 64, 32, 16), (5, 200, 70, 32), (3, 1000, 48, 128), (2, 300, 16, 256),
                                      (17, 512, 96, 64)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("level", [0, 4])
def test_matmulnbits_matches_cpu(m, K, N, bs, symmetric, level):
    a = RNG.standard_normal((m, K)).astype(np.float32)
    inputs = _inputs(a, K, N, bs, symmetric, with_bias=(m % 2 == 1))
    ours, ref, p, cost = both("MatMulNBits", inputs, domain="com.microsoft", K=K, N=N, bits=4, block_size=bs,
                              accuracy_level=level)
    atol = (1e-4 if level == 0 else 2e-3) * np.sqrt(K)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-4, atol=atol)
    assert cost.macs == m * K * N and p.attrs["plan"]["tk"] % bs == 0


def test_matmulnbits_fp16_batched_input():
    K, N = 256, 64
    a = RNG.standard_normal((2, 3, K)).astype(np.float32)
    ours, ref, _, _ = both("MatMulNBits", _inputs(a, K, N, 32, False, True, np.float16), domain="com.microsoft",
                           K=K, N=N, bits=4, block_size=32)
    assert ours[0].dtype == np.float16
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), rtol=2e-2, atol=2e-2 * 16)


def test_matmulnbits_declined_on_edge_without_int4_mode():
    a = RNG.standard_normal((1, 64)).astype(np.float32)
    reason = declined("MatMulNBits", _inputs(a, 64, 32, 16, True, False), "npu-edge", domain="com.microsoft",
                      K=64, N=32, bits=4, block_size=16)
    assert "npu-edge" in reason
