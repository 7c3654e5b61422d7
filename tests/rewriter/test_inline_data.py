"""Inline weights are mapped from the model file instead of copied (``rewriter.inline_data``): the same tensors as
``onnx.load``, outputs that never point back at the input file, and a fallback on anything unusual."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.rewriter import inline_data, rewrite
from npu_ep.rewriter.model_io import load_model

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def map_small_files(monkeypatch):
    monkeypatch.setattr(inline_data, "MIN_FILE_BYTES", 0)


def _model(path):
    inits = [numpy_helper.from_array(RNG.standard_normal((64, 64)).astype(np.float32), "W1"),
             numpy_helper.from_array(RNG.standard_normal((8,)).astype(np.float32), "small"),
             numpy_helper.from_array(RNG.standard_normal((64, 32)).astype(np.float16).astype(np.float32), "W2"),
             helper.make_tensor("typed", TensorProto.FLOAT, [300], RNG.standard_normal(300).tolist())]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "W2"], ["h2"], name="mm2"),
             helper.make_node("ReduceSum", ["h2"], ["y"], name="sum", keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def test_mapped_load_has_the_same_tensors_as_onnx_load(tmp_path):
    path = _model(tmp_path / "m.onnx")
    mapped = inline_data.load_mapped(path)
    external = {t.name for t in mapped.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert external == {"W1", "W2"}  # above MIN_BYTES and stored as raw_data; 'small' and 'typed' stay inline
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    for t in mapped.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(t, base_dir=str(tmp_path)), want[t.name])
    mapped.graph.ClearField("initializer")
    plain = onnx.load(str(path))
    plain.graph.ClearField("initializer")
    assert mapped == plain  # everything else is byte-for-byte what onnx.load parses


@pytest.mark.parametrize("passes", [("cleanup",), ("int4",)])
def test_rewrite_of_an_inline_model_is_inline_and_self_contained(tmp_path, passes):
    (tmp_path / "in").mkdir()
    path = _model(tmp_path / "in" / "m.onnx")
    ir_model = load_model(path)
    mapped = {v.name for v in ir_model.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)}
    assert mapped == {"W1", "W2"}
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out = rewrite(path, passes=passes, int4_block_size=16).save(tmp_path / "out" / "o.onnx")
    proto = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location != TensorProto.EXTERNAL for t in proto.graph.initializer)
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.onnx"]
    path.unlink()
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if passes == ("cleanup",):
        np.testing.assert_array_equal(got, expected)
    else:
        assert got.shape == expected.shape and np.isfinite(got).all()


@pytest.mark.parametrize("tail", [b"\x0b", b"\x3a\xff\xff\xff\x0f"])  # a group start; a field past the end
def test_unwalkable_files_fall_back(tmp_path, tail):
    path = _model(tmp_path / "m.onnx")
    path.write_bytes(path.read_bytes() + tail)
    assert inline_data.load_mapped(path) is None


def test_small_or_text_files_are_not_mapped(tmp_path, monkeypatch):
    path = _model(tmp_path / "m.onnx")
    monkeypatch.setattr(inline_data, "MIN_FILE_BYTES", 1 << 30)
    assert inline_data.load_mapped(path) is None
    monkeypatch.setattr(inline_data, "MIN_FILE_BYTES", 0)
    assert inline_data.load_mapped(path.rename(tmp_path / "m.txtpb")) is None
