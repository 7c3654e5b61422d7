"""Epilogue fusion: MatMul/Gemm/MatMulNBits + bias Add + Relu (+ QuantizeLinear) become npu::MatMulEpilogue;
numerics match ORT CPU on the unfused graph, and the fused op is cheaper in emulated cycles, DMA bytes and host
time than the chain it replaces."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import PASSES
from npu_ep.kernels.fusion.epilogue import fuse
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.quantization import quantize_matmul_nbits

RNG = np.random.default_rng(6)
REF = Target.load("npu-ref")


def _graph(m, k, n, base="MatMul", relu=True, quant=False, extra_consumer=False):
    w = RNG.standard_normal((k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "bias")]
    if base == "MatMulNBits":
        q = quantize_matmul_nbits(w, 32, False)
        inits += [numpy_helper.from_array(q.B, "B"), numpy_helper.from_array(q.scales, "S"),
                  numpy_helper.from_array(q.zero_points, "Z")]
        nodes = [helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["mm"], "mm", domain="com.microsoft",
                                  K=k, N=n, bits=4, block_size=32)]
    else:
        inits.append(numpy_helper.from_array(w, "W"))
        nodes = [helper.make_node(base, ["x", "W"], ["mm"], "mm")]
    nodes.append(helper.make_node("Add", ["mm", "bias"], ["biased"], "add"))
    last = "biased"
    if relu:
        nodes.append(helper.make_node("Relu", ["biased"], ["act"], "relu"))
        last = "act"
    outs = []
    if quant:
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "qs"),
                  numpy_helper.from_array(np.array(-5, np.int8), "qz")]
        nodes.append(helper.make_node("QuantizeLinear", [last, "qs", "qz"], ["q"], "quant"))
        last = "q"
    outs.append(helper.make_tensor_value_info(last, TensorProto.INT8 if quant else TensorProto.FLOAT, [m, n]))
    if extra_consumer:
        nodes.append(helper.make_node("Neg", ["mm"], ["neg"], "neg"))
        outs.append(helper.make_tensor_value_info("neg", TensorProto.FLOAT, [m, n]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])], outs, inits,
                          value_info=[helper.make_tensor_value_info("mm", TensorProto.FLOAT, [m, n])])  # contrib op
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _run_nodes(nodes, x, reps=1):
    """Run a node list (our kernels) on one input; returns (outputs by name, best host seconds)."""
    prepared = [(nd, kernel_for(nd.domain, nd.op_type), None) for nd in nodes]
    prepared = [(nd, k, k.prepare(nd, REF)) for nd, k, _ in prepared]
    best = float("inf")
    for _ in range(reps):
        env = {"x": x}
        t0 = time.perf_counter()
        for nd, k, p in prepared:
            outs = k.run(p, [None if v.missing or v.is_constant else env[v.name] for v in nd.inputs])
            env.update({o.name: a for o, a in zip(nd.outputs, outs)})
        best = min(best, time.perf_counter() - t0)
    return env, best, prepared


@pytest.mark.parametrize("base,relu,quant", [("MatMul", True, False), ("MatMul", False, False),
                                             ("MatMul", True, True), ("MatMulNBits", True, False)])
def test_fused_chain_matches_cpu(base, relu, quant):
    m, k, n = 9, 96, 40
    model = _graph(m, k, n, base, relu, quant)
    nodes = nodes_from_model(model)
    fused = fuse(nodes, REF)
    assert len(fused) == 1 and fused[0].op_type == "MatMulEpilogue" and fused[0].domain == "npu"
    x = RNG.standard_normal((m, k)).astype(np.float32)
    env, _, _ = _run_nodes(fused, x)
    out = model.graph.output[0].name
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if quant:
        assert env[out].dtype == np.int8
        assert np.abs(env[out].astype(int) - ref.astype(int)).max() <= 1  # ties after fp32 reassociation only
    else:
        np.testing.assert_allclose(env[out], ref, rtol=1e-4, atol=1e-4)


def test_no_fusion_when_intermediate_has_two_consumers_or_target_disallows():
    nodes = nodes_from_model(_graph(4, 32, 16, extra_consumer=True))
    assert [nd.op_type for nd in fuse(nodes, REF)] == ["MatMul", "Add", "Relu", "Neg"]
    raw = dict(REF.raw)
    raw["fusion"] = {"epilogues": []}
    assert [nd.op_type for nd in fuse(nodes_from_model(_graph(4, 32, 16)), Target.from_dict(raw))] == \
        ["MatMul", "Add", "Relu"]


def _add_of_two_activations(m=4, k=32, n=16):
    """x @ W + y with y a graph input: the Add is no bias, so the matmul keeps no epilogue."""
    w = numpy_helper.from_array(RNG.standard_normal((k, n)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], "mm"), helper.make_node("Add", ["mm", "y"], ["s"], "add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]),
                                       helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, [m, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("model,reason", [
    (lambda: _add_of_two_activations(), "Add 'add' reads ['y'] besides 'mm', not one constant bias of N=16 "
                                        "elements broadcasting over the last axis"),
    (lambda: _graph(4, 32, 16, extra_consumer=True), "MatMul output 'mm' has 2 readers, not one")])
def test_a_matmul_left_without_epilogue_says_why(model, reason):
    """The pass's candidate (the matmul) that takes no epilogue op leaves a FusionMiss with the reason
    (npu-report --explain-fusions)."""
    nodes = nodes_from_model(model())
    misses = []
    assert fuse(nodes, REF, misses) == nodes
    assert [(m.fusion, m.node, m.op, m.reason) for m in misses] == [("epilogue", "mm", "MatMul", reason)]


def test_fusion_is_cheaper_in_cost_model_and_host_memory():
    m, k, n = 512, 64, 1024  # a short K so the epilogue is a visible share of the work
    model = _graph(m, k, n)
    nodes = nodes_from_model(model)
    fused = fuse(nodes, REF)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    env_u, _, prep_u = _run_nodes(nodes, x)
    env_f, _, prep_f = _run_nodes(fused, x)
    np.testing.assert_allclose(env_f["act"], env_u["act"], rtol=1e-6, atol=1e-6)

    def costs(prep):
        out = []
        for nd, kd, p in prep:
            shapes = [None if v.missing else (v.value.shape if v.value is not None else v.shape) for v in nd.inputs]
            out.append(kd.cost(p, shapes))
        return out

    cu, cf = costs(prep_u), costs(prep_f)
    assert sum(c.cycles for c in cf) < sum(c.cycles for c in cu)
    assert sum(c.dma_bytes for c in cf) < sum(c.dma_bytes for c in cu)
    # host: the in-place epilogue allocates one [M, N] result instead of three (deterministic under machine load)
    import tracemalloc

    def allocated(prep):
        tracemalloc.start()
        env = {"x": x}
        for nd, kd, p in prep:
            outs = kd.run(p, [None if v.missing or v.is_constant else env[v.name] for v in nd.inputs])
            env.update({o.name: a for o, a in zip(nd.outputs, outs)})
        total = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return total

    assert allocated(prep_f) * 2 < allocated(prep_u)  # host time belongs in benchmarks, not in tests


def test_every_declared_fusion_pass_produces_an_op_with_a_kernel_and_a_target_entry():
    target = Target.load("npu-ref")
    assert [p.name for p in PASSES] == ["qdq", "qdq_bytes", "qdq_lut", "conv_bn", "conv_tail", "attention", "rotary",
                                       "epilogue", "siblings", "rms", "norm", "eltwise_chain"]
    for p in PASSES:
        assert kernel_for(*p.produces) is not None, p.name
        assert target.rule(*p.produces) is not None, p.name
