"""MatMulNBits through real NpuEP sessions, native kernels and the reference model, against ORT's CPU EP at the
widths of a 1B decoder (K=2048, N=5632), graph assignment checked; the compiled program keeps the weights packed.

Tolerances (relative to the output's largest magnitude): accuracy_level 4 1e-5 (A's int8 codes are ORT's own:
``rint(a * 127 / max|a|)``; only float summation order differs); level 0 1e-5; the SwiGLU MLP 1e-4 (the CPU EP
fuses x * sigmoid(x) into its own approximate SiLU)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session, session_options

RNG = np.random.default_rng(12)
MS = [("com.microsoft", 1)]


def _nbits(name, a, k, n, block=32, level=4, symmetric=False):
    q = quantize_matmul_nbits((RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), block, symmetric)
    inits = {f"{name}_B": q.B, f"{name}_S": q.scales}
    ins = [a, f"{name}_B", f"{name}_S"]
    if q.zero_points is not None:
        inits[f"{name}_Z"] = q.zero_points
        ins.append(f"{name}_Z")
    node = helper.make_node("MatMulNBits", ins, [name], name, domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=level)
    return node, inits, q


def _single(m, k, n, level, block=32, symmetric=False):
    node, inits, q = _nbits("y", "x", k, n, block, level, symmetric)
    model = make_model([node], [helper.make_tensor_value_info("x", F32, [1, m, k])],
                       [helper.make_tensor_value_info("y", F32, [1, m, n])], inits, opset=21, extra_opsets=MS)
    return model, q


def _mlp(m, hidden, ffn, level):
    nodes, inits = [], {}
    for name, a, k, n in (("gate", "x", hidden, ffn), ("up", "x", hidden, ffn)):
        nd, w, _ = _nbits(name, a, k, n, level=level)
        nodes.append(nd)
        inits.update(w)
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"], "sigmoid"),
              helper.make_node("Mul", ["gate", "sig"], ["silu"], "mul_silu"),
              helper.make_node("Mul", ["silu", "up"], ["h"], "mul_up")]
    nd, w, _ = _nbits("y", "h", ffn, hidden, level=level)
    nodes.append(nd)
    inits.update(w)
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, m, hidden])],
                      [helper.make_tensor_value_info("y", F32, [1, m, hidden])], inits, opset=21, extra_opsets=MS)


def _run_both(model, feeds, kernels, rel):
    sess = npu_session(model, {"kernels": kernels}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (ours,) = sess.run(None, feeds)
    (ref,) = cpu_run(model, feeds)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=rel * np.abs(ref).max())
    return sess


@pytest.mark.parametrize("kernels", ["native", "reference"])
@pytest.mark.parametrize("level,m", [(4, 1), (4, 3), (0, 1)])
def test_realistic_width_matches_cpu(kernels, level, m):
    model, _ = _single(m, 2048, 5632, level)
    x = RNG.standard_normal((1, m, 2048)).astype(np.float32)
    _run_both(model, {"x": x}, kernels, 1e-5)


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_swiglu_mlp_group_matches_cpu(kernels):
    model = _mlp(3, 2048, 5632, level=4)
    x = RNG.standard_normal((1, 3, 2048)).astype(np.float32)
    sess = _run_both(model, {"x": x}, kernels, 1e-4)
    ops = [s.op for ep in LIVE_SESSIONS if ep.options.kernels == kernels
           for prog in ep.programs.values() if any(s.node_name == "y" for s in prog.steps) for s in prog.steps]
    assert "npu::MatMulGroup" in ops, ops
    del sess


@pytest.mark.parametrize("level", [4, 0])
def test_same_bits_on_orts_pool_at_any_thread_count(level):
    """Inside a session the native loops run on ORT's intra-op pool (KernelContext_ParallelFor): the fixed
    column split gives the same bits whatever the pool's size and the session's host_threads."""
    model, _ = _single(2, 2048, 1536, level)
    x = RNG.standard_normal((1, 2, 2048)).astype(np.float32)
    results = []
    for intra, host in ((1, 1), (2, 2), (3, 2), (2, 1)):
        so = session_options()
        so.intra_op_num_threads = intra
        sess = npu_session(model, {"host_threads": str(host)}, cpu=False, so=so)
        assert assignment(sess) == {"y": "NpuEP"}
        results.append(sess.run(None, {"x": x})[0])
        del sess
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    (ref,) = cpu_run(model, {"x": x})
    np.testing.assert_allclose(results[0], ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_compiled_program_keeps_weights_packed():
    K, N = 2048, 512
    model, q = _single(1, K, N, 4)
    sess = npu_session(model, cpu=False)
    assert assignment(sess) == {"y": "NpuEP"}
    (step,) = [s for e in LIVE_SESSIONS for p in e.programs.values() for s in p.steps
               if s.node_name == "y" and s.prepared.attrs.get("N") == N]
    const_bytes = sum(v.nbytes for v in step.prepared.consts.values())
    packed = q.B.nbytes + q.scales.astype(np.float32).nbytes + q.zero_points.nbytes
    assert const_bytes <= packed * 1.01, (const_bytes, packed)  # not the 4 * K * N of a float32 copy
    assert const_bytes < K * N  # i.e. < 1/4 of the float weight
    assert {v.dtype for v in step.prepared.consts.values()} <= {np.dtype(np.uint8), np.dtype(np.float32)}
    del sess


def test_unknown_kernels_option_is_a_clear_error():
    model, _ = _single(1, 64, 16, 0)
    with pytest.raises(Exception, match="kernels='fast': expected one of native, reference"):
        npu_session(model, {"kernels": "fast"}, cpu=False)


def test_fp16_activations_native_equals_reference():
    """fp16 A and scales: both implementations compute in float32 and round to fp16 once (1 fp16 ulp apart at
    most, from float32 summation order)."""
    k, n = 512, 96
    q = quantize_matmul_nbits((RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), 32, False)
    node = helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], "y", domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=32, accuracy_level=4)
    f16 = TensorProto.FLOAT16
    model = make_model([node], [helper.make_tensor_value_info("x", f16, [3, k])],
                       [helper.make_tensor_value_info("y", f16, [3, n])],
                       {"B": q.B, "S": q.scales.astype(np.float16), "Z": q.zero_points}, opset=21, extra_opsets=MS)
    x = {"x": RNG.standard_normal((3, k)).astype(np.float16)}
    outs = []
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        assert assignment(sess) == {"y": "NpuEP"}
        outs.append(sess.run(None, x)[0])
    assert outs[0].dtype == np.float16
    np.testing.assert_allclose(outs[0].astype(np.float32), outs[1].astype(np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("m,k,n,symmetric,bias", [(2, 2048, 96, False, False), (5, 256, 300, True, True),
                                                  (17, 512, 77, False, True), (32, 2048, 96, False, False),
                                                  (128, 256, 300, True, True), (40, 512, 77, False, True)])
def test_fp32_level_prefill_has_orts_bits_on_avx512(m, k, n, symmetric, bias):
    """From 2 rows on, the fp32 levels' AVX-512 kernel sums each output by FMAs in order of k from zero and then
    adds the bias, as the CPU EP's MLAS kernel does: the same bits, exactly. Hosts without AVX-512 take per-column
    dot products or numpy's BLAS, whose orders are their own (1e-5 of the output's scale)."""
    from npu_ep.kernels.runtime import native_module

    node, inits, _ = _nbits("y", "x", k, n, level=0, symmetric=symmetric)
    if bias:
        inits["y_bias"] = RNG.standard_normal(n).astype(np.float32)
        node.input.extend([""] * (5 - len(node.input)) + ["y_bias"])
    model = make_model([node], [helper.make_tensor_value_info("x", F32, [1, m, k])],
                       [helper.make_tensor_value_info("y", F32, [1, m, n])], inits, opset=21, extra_opsets=MS)
    x = {"x": RNG.standard_normal((1, m, k)).astype(np.float32)}
    sess = _run_both(model, x, "native", 1e-5)
    if native_module().isa().startswith("avx512") or native_module().isa() == "amx_int8":
        np.testing.assert_array_equal(sess.run(None, x)[0], cpu_run(model, x)[0])
