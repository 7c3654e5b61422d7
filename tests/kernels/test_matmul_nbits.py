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


def _with_g_idx(inputs, g_idx):
    return [("g_idx", g_idx, True) if name == "g_idx" else (name, *rest) for name, *rest in inputs]


@pytest.mark.parametrize("level", [0, 4])
def test_g_idx_of_the_plain_blocks_without_zero_points_runs_and_matches_cpu(level):
    """g_idx[k] == k // block_size is the node without g_idx (ORT's CPU kernel agrees when there are no zero
    points): accepted and run."""
    K, N, bs = 96, 40, 32
    a = RNG.standard_normal((3, K)).astype(np.float32)
    inputs = _with_g_idx(_inputs(a, K, N, bs, True, False), (np.arange(K) // bs).astype(np.int32))
    ours, ref, _, _ = both("MatMulNBits", inputs, domain="com.microsoft", K=K, N=N, bits=4, block_size=bs,
                           accuracy_level=level)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-4, atol=(1e-4 if level == 0 else 2e-3) * np.sqrt(K))


@pytest.mark.parametrize("symmetric", [True, False])
def test_act_order_g_idx_is_declined_and_runs_on_the_cpu_ep(symmetric):
    """Issue 38: a reordering g_idx (GPTQ act-order) was accepted and ignored (NpuEP gave the node's answer without
    it, up to 2.15 off). It is declined with its reason, and in a session the node runs on the CPU EP with ORT's
    answer."""
    from _single_op import model as single_op_model
    from npu_testing import assignment, cpu_run, npu_session

    K, N, bs = 128, 32, 32
    g_idx = RNG.permutation(np.arange(K) // bs).astype(np.int32)
    a = RNG.standard_normal((2, K)).astype(np.float32)
    inputs = _with_g_idx(_inputs(a, K, N, bs, symmetric, False), g_idx)
    attrs = dict(domain="com.microsoft", K=K, N=N, bits=4, block_size=bs)
    assert "g_idx (act-order) reorders rows across blocks" in declined("MatMulNBits", inputs, "npu-ref", **attrs)
    model = single_op_model("MatMulNBits", inputs, **attrs)
    model.graph.node[0].name = "mm"
    sess = npu_session(model)
    assert assignment(sess) == {"mm": "CPUExecutionProvider"}
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], cpu_run(model, {"a": a})[0])


def test_g_idx_with_zero_points_is_declined():
    """ORT's CPU kernel computes (code - 8) * scale once g_idx is given, whatever the zero points (1.31): even a
    g_idx of the plain blocks has no single answer to match, so it is declined with that reason."""
    K, N, bs = 64, 16, 16
    a = RNG.standard_normal((1, K)).astype(np.float32)
    inputs = _with_g_idx(_inputs(a, K, N, bs, False, False), (np.arange(K) // bs).astype(np.int32))
    reason = declined("MatMulNBits", inputs, "npu-ref", domain="com.microsoft", K=K, N=N, bits=4, block_size=bs)
    assert "ignores the zero points" in reason


def _level4_session_vs_cpu(a, w, scales, K, N, bs, kernels):
    """(NpuEP's output with ``kernels``, the CPU EP's) for one accuracy_level 4 node, NpuEP's assignment checked."""
    from _single_op import model as single_op_model
    from npu_testing import assignment, cpu_run, npu_session

    inputs = [("a", a, False), ("B", w.B, True), ("scales", scales, True), ("zp", w.zero_points, True)]
    model = single_op_model("MatMulNBits", inputs, domain="com.microsoft", K=K, N=N, bits=4, block_size=bs,
                            accuracy_level=4)
    model.graph.node[0].name = "mm"
    sess = npu_session(model, {"kernels": kernels})
    assert assignment(sess) == {"mm": "NpuEP"}
    return sess.run(None, {"a": a})[0], cpu_run(model, {"a": a})[0]


@pytest.mark.parametrize("kernels", ["native", "reference"])
@pytest.mark.parametrize("bs", [16, 32, 128])
def test_level4_nan_and_inf_follow_orts_compint8(kernels, bs):
    """Issue 38: at accuracy_level 4 one NaN in A made its whole row NaN (the CPU EP's row is finite where MLAS's
    block maximum drops the NaN, and the NaN quantizes to code 0), and an infinite weight scale gave -inf (the CPU
    EP: NaN). NpuEP now quantizes A as MLAS's QuantizeARow_CompInt8 does and takes ORT's NaN rule for non-finite
    scales: the same finite/NaN/Inf pattern as the CPU EP, values within level 4's tolerance."""
    rng = np.random.default_rng(bs)
    K, N = 3 * bs + bs // 2, 40
    w = quantize_matmul_nbits(rng.standard_normal((K, N)).astype(np.float32), bs, False)
    a = rng.standard_normal((6, K)).astype(np.float32)
    a[0, 3] = np.nan  # kept or dropped by its lane and chunk, as MLAS's maximum does
    a[1, bs + 5], a[1, 2 * bs + bs - 1] = np.nan, np.nan
    a[2, bs - 1] = np.nan  # the last chunk of its block: the NaN may survive into the scale
    a[3, 2 * bs] = np.inf  # an infinite block scale: the row is NaN
    a[4, 1] = -np.inf
    scales = w.scales.copy().reshape(N, -1)
    scales[5, 1], scales[17, 0], scales[30, 2] = np.inf, -np.inf, np.nan  # those columns are NaN
    got, want = _level4_session_vs_cpu(a, w, scales.reshape(w.scales.shape), K, N, bs, kernels)
    plain = np.setdiff1d(np.arange(N), [5, 17, 30])
    assert np.isfinite(want[0, plain]).all() == (bs > 16)  # 16-blocks have one chunk: the NaN stays in the maximum
    assert np.isnan(want[3]).all() and np.isnan(want[:, 5]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=2e-3 * np.sqrt(K))


def test_an_act_order_sibling_stays_out_of_the_group_and_the_cpu_ep_runs_it():
    """Three MatMulNBits reading one A (a sibling group, npu::MatMulGroup), the middle one with an act-order g_idx:
    it is declined (the group's native call would have multiplied its weights without g_idx), the other two and the
    Sum run on NpuEP, and the result is the CPU EP's."""
    from onnx import TensorProto, helper

    from npu_testing import assignment, cpu_run, make_model, npu_session

    K, N, bs = 128, 32, 32
    ws = [quantize_matmul_nbits(RNG.standard_normal((K, N)).astype(np.float32), bs, True) for _ in range(3)]
    inits = {"g": RNG.permutation(np.arange(K) // bs).astype(np.int32)}
    nodes = []
    for i, w in enumerate(ws):
        inits[f"B{i}"], inits[f"s{i}"] = w.B, w.scales
        extra = ["", "g"] if i == 1 else []
        nodes.append(helper.make_node("MatMulNBits", ["a", f"B{i}", f"s{i}", *extra], [f"y{i}"], name=f"mm{i}",
                                      domain="com.microsoft", K=K, N=N, bits=4, block_size=bs))
    nodes.append(helper.make_node("Sum", ["y0", "y1", "y2"], ["y"], name="sum"))
    model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, K])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, N])],
                       inits, extra_opsets=[("com.microsoft", 1)])
    sess = npu_session(model)
    assert assignment(sess) == {"mm0": "NpuEP", "mm1": "CPUExecutionProvider", "mm2": "NpuEP", "sum": "NpuEP"}
    a = RNG.standard_normal((2, K)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"a": a})[0], cpu_run(model, {"a": a})[0], rtol=1e-5, atol=1e-5)
