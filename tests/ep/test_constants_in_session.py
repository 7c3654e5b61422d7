"""Constants as the EP sees them inside ORT: weights over the capability view's 1 MiB value limit, and ONNX int4
initializers (numpy has no 4-bit dtype). Both must still be claimed and computed on NpuEP."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session

from npu_ep.quantization import quantize_matmul_nbits

RNG = np.random.default_rng(11)


def test_matmul_nbits_with_a_weight_larger_than_the_capability_value_limit_runs_on_npu():
    k = n = 2048  # packed B is 2 MiB: GetCapability sees it as constant without its bytes
    q = quantize_matmul_nbits(RNG.standard_normal((k, n)).astype(np.float32), 32, True)
    assert q.B.nbytes > 1 << 20
    node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], name="nbits", domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=32)
    model = make_model([node], [helper.make_tensor_value_info("x", F32, [2, k])],
                       [helper.make_tensor_value_info("y", F32, [2, n])], {"B": q.B, "S": q.scales},
                       extra_opsets=[("com.microsoft", 1)])
    x = RNG.standard_normal((2, k)).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"nbits": "NpuEP"}
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-4, atol=1e-3)


def test_int4_initializer_reaches_the_kernels_unpacked():
    w = RNG.integers(-8, 8, (64, 32)).astype(np.int8)
    scale = (RNG.random((2, 32)) * 0.1 + 0.01).astype(np.float32)  # blocked along K (axis 0), block 32
    nodes = [helper.make_node("DequantizeLinear", ["w", "scale"], ["wf"], name="dq", axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [3, 64])],
                       [helper.make_tensor_value_info("y", F32, [3, 32])],
                       {"w": w.astype(ml_dtypes.int4), "scale": scale}, opset=21)
    assert model.graph.initializer[0].data_type == TensorProto.INT4
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    sess = npu_session(model)
    where = assignment(sess)
    assert where and set(where.values()) == {"NpuEP"}, where  # DQ+MatMul, or the MatMulNBits ORT fused them into
    ref = x @ (w.astype(np.float32) * np.repeat(scale, 32, axis=0))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-4)
