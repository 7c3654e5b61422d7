"""Three-way numerics on a QDQ model (weights as DequantizeLinear of int8 constants), the fallback when weights do
not match, and the dominance rule."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npu_ep
from npu_ep.tools.report.build import validate
from npu_ep.tools.report.quant import dominant, float_reference, is_quantized
from tests.npu_testing import make_model

K, N = 64, 32


def _models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """float: x -> MatMul(W) -> Relu; QDQ: the same with W = DequantizeLinear(int8 Wq, per-tensor scale)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((K, N)) / 8).astype(np.float32)
    scale = np.float32(np.abs(w).max() / 127)
    wq = np.clip(np.round(w / scale), -128, 127).astype(np.int8)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])
    relu = helper.make_node("Relu", ["h"], ["y"], name="relu")
    fmodel = make_model([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), relu], [x], [y], {"W": w})
    qmodel = make_model([helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["W_dq"], name="dq"),
                         helper.make_node("MatMul", ["x", "W_dq"], ["h"], name="mm"), relu], [x], [y],
                        {"Wq": wq, "s": np.array(scale, np.float32), "z": np.array(0, np.int8)})
    return fmodel, qmodel


def test_qdq_weights_are_replaced_by_the_float_originals():
    fmodel, qmodel = _models()
    assert is_quantized(qmodel) and not is_quantized(fmodel)
    ref, info = float_reference(qmodel, fmodel)
    assert info == {"substituted": ["dq"], "unmatched": []}
    assert [n.op_type for n in ref.graph.node] == ["MatMul", "Relu"]
    w = next(t for t in ref.graph.initializer if t.name == "W_dq")
    want = onnx.numpy_helper.to_array(fmodel.graph.initializer[0])
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(w), want)


def test_three_way_report_on_a_qdq_model():
    fmodel, qmodel = _models()
    doc = npu_ep.report(qmodel, float_model=fmodel, dims={})
    validate(doc)
    tw = doc["compare"]["three_way"]
    assert tw["float_source"] == "substituted" and tw["substituted"] == 1
    (y,) = tw["outputs"]
    assert y["tensor"] == "y" and y["quant_max_abs"] > 1e-4 and y["kernel_max_abs"] < 1e-5
    assert y["dominant"] == tw["dominant"] == "quantization"
    assert doc["compare"]["nodes"], "NpuEP recorded no tensor: the model did not run on NpuEP"


def test_unmatched_weights_fall_back_to_the_float_model_itself():
    fmodel, qmodel = _models()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(fmodel)
    renamed.graph.node[0].name = "other"  # no float node named like the DQ's consumer
    _, info = float_reference(qmodel, renamed)
    assert info == {"substituted": [], "unmatched": ["dq"]}
    doc = npu_ep.report(qmodel, float_model=renamed, dims={})
    validate(doc)
    tw = doc["compare"]["three_way"]
    assert tw["float_source"] == "float model" and tw["unmatched_weights"] == ["dq"]
    assert tw["outputs"][0]["quant_max_abs"] > 1e-4  # per-output numbers still exact


def test_float_model_with_other_inputs_is_refused(tmp_path):
    fmodel, qmodel = _models()
    fmodel.graph.input[0].name = "z_in"
    fmodel.graph.node[0].input[0] = "z_in"
    with pytest.raises(npu_ep.tools.report.build.ReportInputError, match="float model inputs"):
        npu_ep.report(qmodel, float_model=fmodel, dims={})


@pytest.mark.parametrize("quant, kernel, want", [
    (0.3, 1e-6, "quantization"), (1e-6, 0.3, "compiler/kernel"), (0.0, 0.0, None), (None, 0.1, None),
])
def test_dominant_names_the_larger_error(quant, kernel, want):
    assert dominant(quant, kernel) == want


def test_diff_counts_equal_infinities_as_agreeing():
    """A QNN-style graph dequantizes float32's lowest mask value to -inf on both sides (ORT's kernel overflows the
    same way): that agreement is no NaN 'failure', and an infinity does not become the relative scale."""
    from npu_ep.tools.report.quant import diff
    ref = np.array([-np.inf, 1.0, 2.0], np.float32)
    assert diff(ref, ref.copy()) == {"max_abs": 0.0, "max_rel": 0.0}
    assert diff(ref, np.array([-np.inf, 1.0, 2.5], np.float32)) == {"max_abs": 0.5, "max_rel": 0.25}
    assert diff(ref, np.array([-3e38, 1.0, 2.0], np.float32))["max_abs"] == np.inf  # a finite value is a miss


def test_compare_runs_npuep_on_the_graph_the_reference_runs():
    """ORT's level-1 transforms merge Q(s1)->DQ->Q(s2)->DQ into one pair before any EP sees the graph; the
    reference runs unoptimized. NpuEP must see the reference's graph, or the merged node shows as a kernel error."""
    from onnx import numpy_helper

    from npu_ep.tools.report.compare import compare
    nodes = [helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["q1"], name="q1"),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z"], ["d1"], name="d1"),
             helper.make_node("QuantizeLinear", ["d1", "s2", "z"], ["q2"], name="q2"),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"], name="d2"),
             helper.make_node("Relu", ["d2"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             (("s1", 0.01, np.float32), ("s2", 0.037, np.float32), ("z", 128, np.uint8))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    doc = compare(model, {"x": x}, {"target": "npu-ref"})
    assert doc["first_failure"] is None
    assert [r["node"] for r in doc["nodes"]] == ["q1", "d1", "q2", "d2", "relu"]
    assert all(r["max_abs"] == 0.0 for r in doc["nodes"])
