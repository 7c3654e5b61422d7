"""Static-shape specialization (onnx-graphsurgeon): a dynamic model becomes one a static-shape target takes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_ep.tools.npu_rewrite import main as npu_rewrite
from npu_ep.tools.static_shapes import StaticShapeError, specialize
from tests.npu_testing import assignment, cpu_run, make_model, npu_session, save

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def dynamic_model() -> onnx.ModelProto:
    """y = Reshape(Relu(x), [batch, 2, 4]) + 1 with the target shape computed from Shape(x): exporter plumbing."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["b"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"], name="unsqueeze"),
             helper.make_node("Concat", ["b1", "tail"], ["shp"], name="concat", axis=0),
             helper.make_node("Reshape", ["r", "shp"], ["rr"], name="reshape"),
             helper.make_node("Add", ["rr", "one"], ["y"], name="add")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 8])],
                      [helper.make_tensor_value_info("y", F32, ["batch", 2, 4])],
                      {"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64),
                       "tail": np.array([2, 4], np.int64), "one": np.ones((1,), np.float32)})


def test_specialized_model_runs_wholly_on_the_static_target_and_matches():
    model = dynamic_model()
    before = assignment(npu_session(model, {"target": "npu-edge"}))
    assert before["relu"] == "CPUExecutionProvider"  # symbolic batch: npu-edge compiles static shapes only
    static = specialize(model, {"batch": 3})
    assert [d.dim_value for d in static.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    assert [d.dim_value for d in static.graph.output[0].type.tensor_type.shape.dim] == [3, 2, 4]
    assert {n.op_type for n in static.graph.node} == {"Relu", "Reshape", "Add"}  # the plumbing folded away
    sess = npu_session(static, {"target": "npu-edge"}, cpu=False)  # no CPU EP: every node must be NpuEP's
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])


def test_dims_by_input_axis_and_bad_dims_are_errors():
    static = specialize(dynamic_model(), {"x:0": 2})
    assert [d.dim_value for d in static.graph.input[0].type.tensor_type.shape.dim] == [2, 8]
    with pytest.raises(StaticShapeError, match="no graph input has such a dim"):
        specialize(dynamic_model(), {"seq": 4})
    with pytest.raises(StaticShapeError, match="dim 1 is 8"):
        specialize(dynamic_model(), {"x:1": 4})


def test_npu_rewrite_static_dim_flag(tmp_path, capsys):
    src = save(dynamic_model(), tmp_path, "dyn.onnx")
    out = tmp_path / "static.onnx"
    assert npu_rewrite([src, "-o", str(out), "--passes", "cleanup", "--static-dim", "batch=5"]) == 0
    m = onnx.load(out)
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [5, 8]
    assert npu_rewrite([src, "-o", str(tmp_path / "bad.onnx"), "--static-dim", "nope=1"]) == 2
    assert "no graph input has such a dim" in capsys.readouterr().err
