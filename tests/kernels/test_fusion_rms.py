"""An RMS norm written out op by op (as exporters write Llama's) becomes one SimplifiedLayerNormalization, which the
norm pass then folds into the projection reading it. Positive cases run through a real NpuEP session against the
CPU EP on the same graph (graph assignment and the compiled steps checked), with ORT's graph optimizations on (its
level-1 pass rewrites Div(1, s) * x as x / s) and off (the chain as the file has it); near misses stay unfused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.target import Target
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session, session_options

REF = Target.load("npu-ref")
D, N = 64, 48


def rms_model(form: str = "div_one", gamma_first: bool = False, exponent: float = 2.0, axis: int = -1,
              one: float = 1.0, gamma_shape: tuple = (D,), shape_reader: bool = False, mean_reader: bool = False,
              runtime_eps: bool = False) -> onnx.ModelProto:
    """x [batch, 3, D] -> the chain -> MatMul(W) -> y. ``form``: how 1 / sqrt(mean + eps) reaches x: "div_x" (x / s),
    "div_one" (Div(1, s), then Mul(x, .)), "reciprocal" (Reciprocal(s), then Mul(., x))."""
    rng = np.random.default_rng(7)
    inits = {"two": np.array([exponent], np.float32), "axes": np.array([axis], np.int64),
             "one": np.array([one], np.float32),
             "gamma": (1 + 0.1 * rng.standard_normal(gamma_shape)).astype(np.float32),
             "w": (rng.standard_normal((D, N)) / 8).astype(np.float32)}
    ins = [helper.make_tensor_value_info("x", F32, ["batch", 3, D])]
    if runtime_eps:
        ins.append(helper.make_tensor_value_info("eps", F32, [1]))
    else:
        inits["eps"] = np.array([1e-6], np.float32)
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"], "pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], "mean", keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"], "add"),
             helper.make_node("Sqrt", ["mse"], ["rms"], "sqrt")]
    if form == "div_x":
        nodes.append(helper.make_node("Div", ["x", "rms"], ["xn"], "div"))
    elif form == "div_one":
        nodes += [helper.make_node("Div", ["one", "rms"], ["inv"], "div"),
                  helper.make_node("Mul", ["x", "inv"], ["xn"], "scale")]
    else:
        nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"], "recip"),
                  helper.make_node("Mul", ["inv", "x"], ["xn"], "scale")]
    nodes.append(helper.make_node("Mul", ["gamma", "xn"] if gamma_first else ["xn", "gamma"], ["normed"], "gamma"))
    nodes.append(helper.make_node("MatMul", ["normed", "w"], ["y"], "proj"))
    outs = [helper.make_tensor_value_info("y", F32, ["batch", 3, N])]
    if shape_reader:  # exporters read the normalized tensor's shape for the Reshape that splits heads
        nodes.append(helper.make_node("Shape", ["normed"], ["shape"], "shape", start=0, end=2))
        outs.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [2]))
    if mean_reader:
        outs.append(helper.make_tensor_value_info("ms", F32, ["batch", 3, 1]))
    return make_model(nodes, ins, outs, inits, opset=18)


def compiled_ops(model) -> list[str]:
    return [nd.op_type for nd in fuse_partition(nodes_from_model(model), REF)]


def run_on_npu(model, optimized: bool) -> list[str]:
    """Run on NpuEP and the CPU EP on the same feeds; returns the ops of the compiled steps."""
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3, D)).astype(np.float32)}
    if any(i.name == "eps" for i in model.graph.input):
        feeds["eps"] = np.array([1e-6], np.float32)
    so = session_options()
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    LIVE_SESSIONS.clear()
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return [s.op for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]


@pytest.mark.parametrize("optimized", [True, False])
@pytest.mark.parametrize("form,gamma_first,gamma_shape", [("div_x", False, (D,)), ("div_one", True, (D,)),
                                                          ("reciprocal", False, (1, 1, D)), ("div_one", False, (D,))])
def test_the_chain_becomes_one_norm_folded_into_its_projection(form, gamma_first, gamma_shape, optimized):
    model = rms_model(form, gamma_first, gamma_shape=gamma_shape)
    assert compiled_ops(model) == ["NormMatMul"]
    assert run_on_npu(model, optimized) == ["npu::NormMatMul"]


def test_a_shape_of_the_normalized_tensor_reads_the_norms_input():
    """The Shape stays a step, on x (the same shape), so the norm still folds into the projection."""
    model = rms_model(shape_reader=True)
    assert compiled_ops(model) == ["NormMatMul", "Shape"]
    assert sorted(run_on_npu(model, True)) == ["Shape", "npu::NormMatMul"]


@pytest.mark.parametrize("kwargs", [dict(exponent=3.0), dict(axis=1), dict(one=2.0), dict(gamma_shape=(3, D)),
                                    dict(mean_reader=True), dict(runtime_eps=True)])
def test_near_misses_stay_as_written(kwargs):
    """x^3, a mean over another axis, 2 / s, a gamma that is not one value per channel, the mean read elsewhere,
    an eps that is not a constant: no norm (the ops run as written, still on NpuEP)."""
    model = rms_model(**kwargs)
    ops = compiled_ops(model)
    assert "SimplifiedLayerNormalization" not in ops and "NormMatMul" not in ops and "Pow" in ops, ops
    assert "Pow" in run_on_npu(model, False)


def test_a_target_without_the_norm_keeps_the_chain():
    raw = dict(REF.raw)
    raw["ops"] = {k: v for k, v in REF.raw["ops"].items() if k != "SimplifiedLayerNormalization"}
    ops = [nd.op_type for nd in fuse_partition(nodes_from_model(rms_model()), Target.from_dict(raw))]
    assert ops[:2] == ["Pow", "ReduceMean"]


def test_a_layer_norm_written_out_keeps_its_centering_and_bias():
    """LayerNorm as TorchScript writes it below opset 17: x - mean(x), then the chain above on that, then + beta.
    The chain is an RMS norm of the centered x, so it fuses as one; the centering and beta stay steps."""
    rng = np.random.default_rng(4)
    inits = {"axes": np.array([-1], np.int64), "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
             "gamma": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
             "beta": (0.1 * rng.standard_normal(D)).astype(np.float32)}
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"], "center_mean"),
             helper.make_node("Sub", ["x", "mu"], ["xc"], "center"),
             helper.make_node("Pow", ["xc", "two"], ["sq"], "pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], "var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], "add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], "sqrt"),
             helper.make_node("Div", ["xc", "sd"], ["xn"], "div"),
             helper.make_node("Mul", ["xn", "gamma"], ["g"], "gamma"),
             helper.make_node("Add", ["g", "beta"], ["y"], "beta")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 3, D])],
                       [helper.make_tensor_value_info("y", F32, ["batch", 3, D])], inits, opset=18)
    assert compiled_ops(model) == ["ReduceMean", "Sub", "SimplifiedLayerNormalization", "Add"]
    # ORT's level-1 LayerNormFusion takes this graph when optimizations are on; TorchScript's BERT and ViT exports at
    # opset 14 reach NpuEP written out all the same
    assert run_on_npu(model, False) == ["ReduceMean", "Sub", "SimplifiedLayerNormalization", "Add"]


@pytest.mark.parametrize("kwargs, reason", [
    (dict(exponent=3.0), "Pow 'pow' exponent two:float32[1] is not the constant 2"),
    (dict(axis=1), "ReduceMean 'mean' reduces axes [1], not the last axis of rank 3 alone"),
    (dict(one=2.0), "Div 'div' does not divide the constant 1"),
    (dict(gamma_shape=(3, D)), f"gamma gamma:float32[3,{D}] is not {D} values along the last axis"),
    (dict(mean_reader=True), "an intermediate value has other readers or is read outside the partition"),
    (dict(runtime_eps=True), "Add 'add' does not add a float32 scalar constant eps >= 0"),
])
def test_each_near_miss_says_why(kwargs, reason):
    """The rule's candidate (the last Mul) that does not fuse leaves a FusionMiss with the reason (npu-report
    --explain-fusions and the debug log show it)."""
    misses = []
    ops = [nd.op_type for nd in fuse_partition(nodes_from_model(rms_model(**kwargs)), REF, misses)]
    assert "SimplifiedLayerNormalization" not in ops and "NormMatMul" not in ops
    # the other passes report their own declines of the same graph (an epilogue, siblings): only the rule's here
    assert [(m.fusion, m.node, m.reason) for m in misses if m.fusion == "rms"] == [("rms", "gamma", reason)]
