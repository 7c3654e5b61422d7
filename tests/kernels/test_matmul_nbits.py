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


def _act_order_session(inputs, attrs, kernels="native"):
    from _single_op import model as single_op_model
    from npu_testing import assignment, npu_session

    model = single_op_model("MatMulNBits", inputs, **attrs)
    model.graph.node[0].name = "mm"
    sess = npu_session(model, {"kernels": kernels})
    return model, sess, assignment(sess)["mm"]


@pytest.mark.parametrize("kernels", ["native", "reference"])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("K,bs,zp8", [(128, 32, False), (200, 64, False), (96, 16, True)])
def test_act_order_g_idx_runs_on_npuep_as_the_cpu_ep(kernels, level, K, bs, zp8):
    """Issue 38: an act-order g_idx (GPTQ: each group block_size rows, in any order) was accepted and ignored: NpuEP
    gave the node's answer without it, up to 2.15 off. Now B's rows are permuted into blocks at compile time and A's
    columns follow: the CPU EP's result (which runs any node with g_idx at level 0, as NpuEP does), also with a
    partial last group and with zero points that are all 8."""
    from npu_ep.quantization.matmul_nbits import pack_zero_points
    from npu_testing import cpu_run

    N = 48
    rng = np.random.default_rng(K + bs)
    g_idx = rng.permutation(np.arange(K) // bs).astype(np.int32)
    a = rng.standard_normal((3, K)).astype(np.float32)
    inputs = _with_g_idx(_inputs(a, K, N, bs, True, True), g_idx)
    if zp8:
        inputs = [("zp", pack_zero_points(np.full((N, -(-K // bs)), 8, np.uint8)), True) if s[0] == "zp" else s
                  for s in inputs]
    model, sess, ep = _act_order_session(inputs, dict(domain="com.microsoft", K=K, N=N, bits=4, block_size=bs,
                                                      accuracy_level=level), kernels)
    assert ep == "NpuEP"
    want = cpu_run(model, {"a": a})[0]
    without = cpu_run(_act_order_session(_with_g_idx(inputs, None), dict(
        domain="com.microsoft", K=K, N=N, bits=4, block_size=bs))[0], {"a": a})[0]
    assert np.abs(want - without).max() > 0.1  # g_idx matters here
    np.testing.assert_allclose(sess.run(None, {"a": a})[0], want, rtol=1e-4, atol=1e-4 * np.sqrt(K))


def test_g_idx_whose_groups_are_not_blocks_is_declined():
    """Groups of other sizes than block_size: no permutation makes them blocks, so the node stays on the CPU EP
    (with its reason)."""
    K, N, bs = 64, 16, 16
    a = RNG.standard_normal((1, K)).astype(np.float32)
    g_idx = np.minimum(np.arange(K) // 12, 3).astype(np.int32)  # groups of 12, 12, 12 and 28 rows
    reason = declined("MatMulNBits", _with_g_idx(_inputs(a, K, N, bs, True, False), g_idx), "npu-ref",
                      domain="com.microsoft", K=K, N=N, bits=4, block_size=bs)
    assert "g_idx must give each group 16 rows" in reason


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


def test_an_act_order_sibling_stays_out_of_the_group():
    """Three MatMulNBits reading one A (a sibling group, npu::MatMulGroup), the middle one with an act-order g_idx:
    it stays out of the group (the group's native call would multiply its weights without permuting A), all run on
    NpuEP, and the result is the CPU EP's."""
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
    assert set(assignment(sess).values()) == {"NpuEP"}
    a = RNG.standard_normal((2, K)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"a": a})[0], cpu_run(model, {"a": a})[0], rtol=1e-5, atol=1e-5)


def test_an_act_order_matmul_keeps_its_norm():
    """An RMS norm feeding an act-order MatMulNBits stays a separate step (npu::NormMatMul's kernel would multiply
    the weights without permuting A); the session runs on NpuEP with the CPU EP's result."""
    from onnx import numpy_helper

    from npu_testing import assignment, cpu_run, npu_session
    from tests.kernels.test_fusion_norm import D, _fused_ops, _model

    model = _model()
    mm = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    del mm.input[3:]
    mm.input.extend(["", "p0_g"])
    model.graph.initializer.append(numpy_helper.from_array(RNG.permutation(np.arange(D) // 32).astype(np.int32),
                                                           "p0_g"))
    assert "NormMatMul" not in _fused_ops(model)
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = {"x": RNG.standard_normal((1, 3, D)).astype(np.float32)}
    np.testing.assert_allclose(sess.run(None, x)[0], cpu_run(model, x)[0], rtol=1e-4, atol=1e-4)
