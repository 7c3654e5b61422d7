"""The pipeline: idempotent, keeps graph inputs/outputs, emits only ORT-CPU ops, clear errors for bad input."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.rewriter import RewriteError, RewriteOptions, rewrite
from npu_ep.rewriter import _core, model_io

MY_PASSES = ("cleanup", "qdq", "int4")


def _model() -> onnx.ModelProto:
    """RMSNorm (exporter Div spelling) -> MatMul -> residual Add: exercises cleanup, RMSNorm and int4."""
    rng = np.random.default_rng(0)
    h = 64
    inits = [numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32) * 0.1, "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, h).astype(np.float32), "gamma"),
             numpy_helper.from_array(np.array([2.0], np.float32), "two"),
             numpy_helper.from_array(np.array([1.0], np.float32), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array([1e-6], np.float32), "eps"),
             numpy_helper.from_array(np.array([0, -1, h], np.int64), "shape")]
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["var"]),
        helper.make_node("Sqrt", ["var"], ["rms"]),
        helper.make_node("Div", ["one", "rms"], ["inv"]),
        helper.make_node("Mul", ["x", "inv"], ["xn"]),
        helper.make_node("Mul", ["gamma", "xn"], ["normed"]),
        helper.make_node("Reshape", ["normed", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["proj"], name="proj"),
        helper.make_node("Add", ["proj", "x"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, h])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _run(model, x):
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _io(model: onnx.ModelProto):
    return [(v.name, v.type.SerializeToString()) for v in (*model.graph.input, *model.graph.output)]


def test_float_rewrites_keep_numerics_and_io():
    model = _model()
    result = rewrite(model, passes=("cleanup",))
    assert result.report.counts["RmsNormDivFusion"] == 1
    out = ir.serde.serialize_model(result.model)
    assert _io(out) == _io(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(model, x), rtol=1e-4, atol=1e-4)


def test_all_my_passes_then_rerun_changes_nothing():
    once = rewrite(_model(), passes=MY_PASSES)
    assert once.report.counts["MatMulToNBits"] == 1
    proto_once = ir.serde.serialize_model(once.model)
    twice = rewrite(onnx.ModelProto.FromString(proto_once.SerializeToString()), passes=MY_PASSES)
    assert dict(twice.report.counts) == {}
    proto_twice = ir.serde.serialize_model(twice.model)
    assert list(proto_twice.graph.node) == list(proto_once.graph.node)
    # the optimizer may reorder initializers; their names and bytes must not change
    assert ({t.name: t.SerializeToString() for t in proto_twice.graph.initializer}
            == {t.name: t.SerializeToString() for t in proto_once.graph.initializer})
    assert _io(proto_twice) == _io(proto_once)


def test_only_ops_ort_cpu_runs_are_emitted():
    result = rewrite(_model(), passes=MY_PASSES)
    proto = ir.serde.serialize_model(result.model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert {n.op_type for n in proto.graph.node} <= {"SimplifiedLayerNormalization", "MatMulNBits", "Reshape", "Add"}
    x = np.random.default_rng(2).standard_normal((1, 3, 64)).astype(np.float32)
    assert sess.run(None, {"x": x})[0].shape == (1, 3, 64)


def test_ir_model_is_rewritten_in_place_and_options_object_works():
    model = ir.serde.deserialize_model(_model())
    result = rewrite(model, RewriteOptions(passes=("int4",), int4_block_size=64))
    assert result.model is model
    assert [n.op_type for n in model.graph].count("MatMulNBits") == 1


def test_save_uses_external_data_above_threshold(tmp_path, monkeypatch):
    monkeypatch.setattr(model_io, "EXTERNAL_DATA_THRESHOLD", 1000)
    result = rewrite(_model(), passes=("int4",))
    path = result.save(tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx.data").is_file()
    x = np.random.default_rng(3).standard_normal((1, 3, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _run(result.model, x))


def test_missing_file_is_a_rewrite_error(tmp_path):
    with pytest.raises(RewriteError, match="no such file"):
        rewrite(tmp_path / "missing.onnx")


def test_garbage_file_is_a_rewrite_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a protobuf" * 10)
    with pytest.raises(RewriteError, match=r"bad.onnx: not a readable ONNX model"):
        rewrite(bad)


def test_external_data_escaping_model_dir_is_refused(tmp_path):
    model = _model()
    (tmp_path / "sub").mkdir()
    onnx.save(model, tmp_path / "sub" / "m.onnx", save_as_external_data=True, location="m.data",
              size_threshold=0)
    proto = onnx.load(str(tmp_path / "sub" / "m.onnx"), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../m.data"
    (tmp_path / "sub" / "m.data").rename(tmp_path / "m.data")
    onnx.save(proto, tmp_path / "sub" / "evil.onnx")
    with pytest.raises(RewriteError, match=r"evil.onnx: initializer '.*' external data path '../m.data' escapes"):
        rewrite(tmp_path / "sub" / "evil.onnx")


def test_missing_family_module_is_an_error_only_when_requested(monkeypatch):
    monkeypatch.delitem(_core.FAMILIES, "rope")
    assert rewrite(_model(), passes=("int4",)).report.counts["MatMulToNBits"] == 1
    with pytest.raises(RewriteError, match="pass 'rope' is not available"):
        rewrite(_model(), passes=("rope",))


@pytest.mark.parametrize("passes,expected,notes", [
    (("int4",), ("int4",), []),
    (("cleanup", "gqa"), ("cleanup", "gqa"), []),
    (("gqa",), ("cleanup", "gqa"), ["pass 'cleanup' added: gqa need(s) it"]),
    (("int4", "rope", "qdq"), ("cleanup", "qdq", "rope", "int4"), ["pass 'cleanup' added: rope need(s) it"]),
])
def test_passes_that_need_cleanup_get_it_first_with_a_note(passes, expected, notes):
    assert _core.with_requirements(passes) == (expected, notes)


@pytest.mark.parametrize("overrides,message", [
    ({"passes": ("int4", "fold")}, "unknown pass 'fold'"),
    ({"int4_block_size": 48}, "block size must be a power of two"),
    ({"exclude": "("}, "bad --exclude regex"),
    ({"no_such_option": 1}, "bad rewrite option"),
])
def test_bad_options_are_rewrite_errors(overrides, message):
    with pytest.raises(RewriteError, match=message):
        rewrite(_model(), **overrides)


def test_output_without_a_declared_shape_may_gain_an_inferred_one():
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = rewrite(model, passes=("cleanup",)).model
    assert [v.name for v in out.graph.outputs] == ["y"]


def test_changed_declared_output_shape_is_caught():
    before = ((("x", 1, ("2", "4")),), (("y", 1, ("2", "3")),))
    assert _core._same_io(before, before)
    assert not _core._same_io(before, ((("x", 1, ("2", "4")),), (("y", 1, ("2", "5")),)))
    assert _core._same_io(((("x", 1, ("2", "4")),), (("y", 1, None),)), before)
