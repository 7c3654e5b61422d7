"""Norm prologue fusion: an RMS norm whose output feeds one float matmul (MatMul, MatMulNBits, MatMulGroup) becomes
npu::NormMatMul with gamma folded into the weights. Positive cases run through a real NpuEP session against the CPU
EP on the unfused graph (graph assignment and the compiled step checked); near misses stay unfused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion.norm import fuse_norms
from npu_ep.kernels.fusion.siblings import fuse_siblings
from npu_ep.kernels.target import Target
from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, npu_session

RNG = np.random.default_rng(21)
REF = Target.load("npu-ref")
MS = [("com.microsoft", 1)]
D = 64


def _nbits(name, a, n, level=0):
    q = quantize_matmul_nbits(RNG.standard_normal((D, n)).astype(np.float32), 32, False)
    node = helper.make_node("MatMulNBits", [a, f"{name}_B", f"{name}_S", f"{name}_Z"], [name], name,
                            domain="com.microsoft", K=D, N=n, bits=4, block_size=32, accuracy_level=level)
    return node, {f"{name}_B": q.B, f"{name}_S": q.scales, f"{name}_Z": q.zero_points}


def _model(skip=False, consumers=("p0",), level=0, extra_reader=False, stats_used=False, float_mm=False):
    gamma = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    inits = {"gamma": gamma}
    ins = [helper.make_tensor_value_info("x", F32, [1, 3, D])]
    outs = []
    if skip:
        ins.append(helper.make_tensor_value_info("res", F32, [1, 3, D]))
        norm = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "res", "gamma"],
                                ["y", "", "inv" if stats_used else "", "sum"], "norm", domain="com.microsoft",
                                epsilon=1e-6)
        outs.append(helper.make_tensor_value_info("sum", F32, [1, 3, D]))
    else:
        norm = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y", "inv"] if stats_used else ["y"],
                                "norm", axis=-1, epsilon=1e-6)
    if stats_used:
        outs.append(helper.make_tensor_value_info("inv", F32, None))
    nodes = [norm]
    for name in consumers:
        if float_mm:
            inits[f"{name}_W"] = (RNG.standard_normal((D, 48)) / 8).astype(np.float32)
            nodes.append(helper.make_node("MatMul", ["y", f"{name}_W"], [name], name))
        else:
            nd, w = _nbits(name, "y", 48, level)
            nodes.append(nd)
            inits.update(w)
        outs.append(helper.make_tensor_value_info(name, F32, [1, 3, 48]))
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["y"], ["neg"], "neg"))
        outs.append(helper.make_tensor_value_info("neg", F32, [1, 3, D]))
    graph = helper.make_graph(nodes, "norm_mm", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    # no onnx.checker: ORT registers SimplifiedLayerNormalization in the default domain, ONNX does not
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(*MS[0])],
                             ir_version=10)


def _fused_ops(model):
    return [nd.op_type for nd in fuse_norms(fuse_siblings(nodes_from_model(model), REF), REF)]


def _check_on_npu(model):
    feeds = {i.name: RNG.standard_normal((1, 3, D)).astype(np.float32) for i in model.graph.input}
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    steps = [s.op for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps
             if "norm" in s.node_name.split("+")]
    return sess, steps


@pytest.mark.parametrize("skip,consumers,float_mm,level", [
    (False, ("p0",), False, 0), (True, ("p0",), False, 0), (True, ("q", "k", "v"), False, 0),
    (False, ("p0",), True, 0), (True, ("p0", "p1"), True, 0),
    (False, ("p0",), False, 4), (True, ("q", "k", "v"), False, 4)])  # level 4: A quantized after the norm
def test_norm_folds_into_its_matmul_matching_cpu(skip, consumers, float_mm, level):
    model = _model(skip=skip, consumers=consumers, float_mm=float_mm, level=level)
    assert _fused_ops(model) == ["NormMatMul"]
    sess, steps = _check_on_npu(model)
    assert steps == ["npu::NormMatMul"]
    del sess


@pytest.mark.parametrize("kwargs", [dict(extra_reader=True), dict(stats_used=True), dict(skip=True, stats_used=True)])
def test_near_misses_stay_unfused(kwargs):
    """A second reader of the normalized tensor, used statistics."""
    model = _model(**kwargs)
    ops = _fused_ops(model)
    assert "NormMatMul" not in ops, ops
    _check_on_npu(model)


def test_a_level_4_swiglu_group_keeps_its_norm():
    """The fused SwiGLU's exp is not numpy's: at accuracy_level 4 the gate/up group stays a
    separate step (kernels.fusion.norm); the same group at level 0 folds."""
    from tests.kernels.test_native_norm_matmul import _model as mlp_model

    for level, fused in ((4, False), (0, True)):
        ops = _fused_ops(mlp_model(96, 3, skip=True, mlp="swiglu", level=level))
        assert ("NormMatMul" in ops) == fused, (level, ops)


def test_target_without_the_rule_keeps_the_norm():
    raw = dict(REF.raw)
    raw["ops"] = {k: v for k, v in REF.raw["ops"].items() if k != "npu::NormMatMul"}
    ops = [nd.op_type for nd in fuse_norms(nodes_from_model(_model()), Target.from_dict(raw))]
    assert ops == ["SimplifiedLayerNormalization", "MatMulNBits"]


@pytest.mark.parametrize("kwargs,reason", [
    (dict(extra_reader=True), "output 'y' has 2 readers besides Shape, not one"),
    (dict(stats_used=True), "its statistics output(s) ['inv'] are read"),
    (dict(skip=True, stats_used=True), "its statistics output(s) ['inv'] are read")])
def test_a_norm_left_alone_says_why(kwargs, reason):
    """The pass's candidate (the norm) that does not fold leaves a FusionMiss with the reason
    (npu-report --explain-fusions)."""
    misses = []
    fuse_norms(fuse_siblings(nodes_from_model(_model(**kwargs)), REF), REF, misses)
    assert [(m.fusion, m.node, m.reason) for m in misses] == [("norm", "norm", reason)]
