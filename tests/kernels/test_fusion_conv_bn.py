"""Conv -> BatchNormalization folds into one Conv at compile time (kernels/fusion/conv_bn.py). Positive cases run
through a real NpuEP session with ORT's own graph optimizations off (with them on, ORT's ConvBNFusion folds the
pair before GetCapability) against the CPU EP on the unfused graph (rtol/atol 1e-4); the compiled program is one
Conv step. Near misses keep both kernels."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion.conv_bn import fuse_conv_bn
from npu_ep.kernels.target import Target
from npu_testing import assignment, cpu_run, npu_session, session_options

RNG = np.random.default_rng(5)
C, M = 3, 4


def _model(conv_bias=True, extra_reader=False, bn_runtime_mean=False, one_d=False, group=1, m=M):
    wshape = (m, C // group, 3) if one_d else (m, C // group, 3, 3)
    inits = {"w": RNG.standard_normal(wshape).astype(np.float32), "s": RNG.standard_normal(m).astype(np.float32),
             "bb": RNG.standard_normal(m).astype(np.float32), "v": RNG.uniform(0.5, 2, m).astype(np.float32)}
    if conv_bias:
        inits["b"] = RNG.standard_normal(m).astype(np.float32)
    xshape = [1, C, 9] if one_d else [1, C, 8, 7]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)]
    if bn_runtime_mean:
        ins.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [m]))
    else:
        inits["m"] = RNG.standard_normal(m).astype(np.float32)
    pads = [1, 1] if one_d else [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if conv_bias else ["x", "w"], ["c"], "conv", pads=pads,
                              group=group),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], "bn", epsilon=1e-3),
             helper.make_node("Relu", ["y"], ["r"], "relu")]
    yshape = [1, m] + xshape[2:]
    outs = [helper.make_tensor_value_info("r", TensorProto.FLOAT, yshape)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["n"], "neg"))
        outs.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, yshape))
    graph = helper.make_graph(nodes, "conv_bn", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _run(model):
    feeds = {"x": RNG.standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
             .astype(np.float32)}
    if len(model.graph.input) > 1:
        feeds["m"] = RNG.standard_normal(M).astype(np.float32)
    so = session_options()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = npu_session(model, so=so, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    steps = [s.op for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps
             if "conv" in s.node_name.split("+")]
    return sess, steps


@pytest.mark.parametrize("kwargs", [{}, {"conv_bias": False}, {"one_d": True}, {"group": 3, "m": 6}])
def test_conv_bn_folds_into_one_conv_matching_cpu(kwargs):
    model = _model(**kwargs)
    fused = fuse_conv_bn(nodes_from_model(model), Target.load("npu-ref"))
    assert [n.op_type for n in fused] == ["Conv", "Relu"] and fused[0].name == "conv+bn"
    sess, steps = _run(model)
    assert steps == ["Conv"]
    del sess


@pytest.mark.parametrize("kwargs", [{"extra_reader": True}, {"bn_runtime_mean": True}])
def test_near_misses_keep_the_batch_norm(kwargs):
    model = _model(**kwargs)
    fused = fuse_conv_bn(nodes_from_model(model), Target.load("npu-ref"))
    assert "BatchNormalization" in [n.op_type for n in fused]
    sess, steps = _run(model)
    assert steps == ["Conv"] and "bn" in assignment(sess)
    del sess


@pytest.mark.parametrize("kwargs, reason", [
    ({"extra_reader": True}, "an intermediate value has other readers or is read outside the partition"),
    ({"bn_runtime_mean": True}, "node 'bn' (BatchNormalization): scale, B, mean and var are not all constants"),
])
def test_each_near_miss_says_why(kwargs, reason):
    """The rule's candidate (the BN) that does not fold leaves a FusionMiss with the reason (npu-report
    --explain-fusions and the debug log show it)."""
    misses = []
    fused = fuse_conv_bn(nodes_from_model(_model(**kwargs)), Target.load("npu-ref"), misses)
    assert "BatchNormalization" in [n.op_type for n in fused]
    assert [(m.fusion, m.node, m.reason) for m in misses] == [("conv_bn", "bn", reason)]


def test_the_folded_conv_takes_the_convs_place():
    """Nodes between the Conv and its BN keep their order after the folded Conv (it reads only the Conv's input)."""
    model = _model(extra_reader=False)
    graph = model.graph
    graph.node.insert(1, helper.make_node("Neg", ["x"], ["nx"], "between"))
    graph.output.append(helper.make_tensor_value_info("nx", TensorProto.FLOAT, [1, C, 8, 7]))
    fused = fuse_conv_bn(nodes_from_model(model), Target.load("npu-ref"))
    assert [n.name for n in fused] == ["conv+bn", "between", "relu"]
