"""``npu-rewrite`` outputs: self-contained (own data file, never the input's), atomic, never over an input file;
bad initializers refused in one line before any rule runs (issue 14 items 3, 4, 7)."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.rewriter import model_io
from npu_ep.tools.npu_rewrite import main

RNG = np.random.default_rng(7)


def _external_model(folder, name="model.onnx"):
    """x[2, 64] -> MatMul(W1) -> Add(b) -> MatMul(W2): three initializers in one external data file."""
    folder.mkdir(parents=True, exist_ok=True)
    inits = [numpy_helper.from_array(RNG.standard_normal((64, 64)).astype(np.float32), "W1"),
             numpy_helper.from_array(RNG.standard_normal((64,)).astype(np.float32), "b"),
             numpy_helper.from_array(RNG.standard_normal((64, 32)).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("MatMul", ["hb", "W2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path = folder / name
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=name + ".data",
              size_threshold=0)
    return path


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(sess_path, x):
    return ort.InferenceSession(str(sess_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _locations(path) -> set[str]:
    proto = onnx.load(str(path), load_external_data=False)
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


@pytest.mark.parametrize("passes", ["cleanup", "int4"])
def test_output_in_another_folder_is_self_contained(tmp_path, capsys, passes):
    src = _external_model(tmp_path / "in")
    before = {p.name: _digest(p) for p in (tmp_path / "in").iterdir()}
    out = tmp_path / "elsewhere" / "out.onnx"
    args = [str(src), "-o", str(out), "--passes", passes, "--int4-block-size", "16", "--check", "--json"]
    assert main(args) == 0, capsys.readouterr().err
    assert _locations(out) == {"out.onnx.data"}  # its own data file, never ../in/model.onnx.data
    assert (tmp_path / "elsewhere" / "out.onnx.data").is_file()
    # the input folder is untouched, and the output still loads once the input is gone
    assert {p.name: _digest(p) for p in (tmp_path / "in").iterdir()} == before
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    expected = _run(src, x)
    for p in (tmp_path / "in").iterdir():
        p.unlink()
    got = _run(out, x)
    if passes == "cleanup":
        np.testing.assert_array_equal(got, expected)
    else:
        assert [n.op_type for n in onnx.load(str(out)).graph.node].count("MatMulNBits") == 2


def test_untouched_external_initializers_are_copied_not_referenced(tmp_path):
    src = _external_model(tmp_path / "in")
    result = model_io.load_model(src)
    out = model_io.save_model(result, tmp_path / "out" / "copy.onnx")
    loaded = onnx.load(str(out))  # loads the data through copy.onnx.data
    want = {t.name: numpy_helper.to_array(t, str(src.parent)) for t in onnx.load(str(src)).graph.initializer}
    for t in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(t), want[t.name])


@pytest.mark.parametrize("target", ["model.onnx", "model.onnx.data", "link.onnx", "hard.onnx", "alias"])
def test_output_onto_an_input_file_is_refused(tmp_path, capsys, target):
    src = _external_model(tmp_path)
    os.symlink(src, tmp_path / "link.onnx")
    os.link(src.with_name("model.onnx.data"), tmp_path / "hard.onnx")
    os.symlink(tmp_path, tmp_path / "alias")
    before = {p.name: _digest(p) for p in tmp_path.iterdir() if p.is_file()}
    out = tmp_path / "alias" / "model.onnx" if target == "alias" else tmp_path / target
    assert main([str(src), "-o", str(out), "--passes", "cleanup"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the input model reads" in err[0], err
    assert {p.name: _digest(p) for p in tmp_path.iterdir() if p.is_file()} == before


def test_output_data_file_onto_the_input_is_refused(tmp_path, capsys):
    """``-o model`` for an input ``model.onnx`` whose data file is ``model.data``: the output's data file
    ``model.data`` would replace the input's weights."""
    src = _external_model(tmp_path, name="model")
    before = _digest(tmp_path / "model.data")
    assert main([str(src), "-o", str(tmp_path / "model"), "--passes", "cleanup"]) == 2
    assert "the input model reads" in capsys.readouterr().err
    assert _digest(tmp_path / "model.data") == before


def test_failed_write_leaves_the_previous_output_and_no_temp_files(tmp_path, capsys, monkeypatch):
    src = _external_model(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.onnx").write_bytes(b"previous model")
    (out / "m.onnx.data").write_bytes(b"previous data")

    def disk_full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_io, "_serialize", disk_full)
    assert main([str(src), "-o", str(out / "m.onnx"), "--passes", "cleanup"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left" in err[0]
    assert (out / "m.onnx").read_bytes() == b"previous model"
    assert sorted(p.name for p in out.iterdir()) == ["m.onnx", "m.onnx.data"]  # no temp file left behind


def _matmul_with(w: TensorProto, folder, name="bad.onnx"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    m = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g", [x],
                                            [y], [w]), opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = folder / name
    path.write_bytes(m.SerializeToString())
    return path


def _short_external(folder):
    (folder / "w.bin").write_bytes(bytes(100))
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[64, 64], data_location=TensorProto.EXTERNAL)
    w.external_data.add(key="location", value="w.bin")
    return w


@pytest.mark.parametrize("case,message", [
    ("short_raw", "raw_data size (100 bytes) is too small"),
    ("short_external", "needs 16384 bytes at offset 0 of 'w.bin', which holds only 100"),
    ("negative_dim", "has a negative dim"),
])
def test_initializer_smaller_than_its_dims_is_one_line(tmp_path, capsys, case, message):
    w = {"short_raw": lambda: TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[64, 64], raw_data=bytes(100)),
         "short_external": lambda: _short_external(tmp_path),
         "negative_dim": lambda: TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[64, -64],
                                             raw_data=bytes(100))}[case]()
    src = _matmul_with(w, tmp_path)
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "int4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "initializer 'W' FLOAT[64, " in err[0] and message in err[0], err
    assert not (tmp_path / "out.onnx").exists()


def _relu_model(folder, in_shape, out_shape, inner=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    vi = [helper.make_tensor_value_info("a", TensorProto.FLOAT, inner)] if inner else []
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Neg", ["a"], ["y"], name="neg")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], value_info=vi),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_negative_declared_dims_are_unknown_dims_without_traceback(tmp_path, capsys):
    """Exporters write -1 for "unknown": shape inference failed on it and onnx_ir printed its traceback (exit 0)."""
    src = _relu_model(tmp_path, [-3, 4], [-3, 4], inner=[-7, 4])
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "cleanup", "--check", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == "" and json.loads(captured.out)["check"]["passed"]
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert not out.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run(tmp_path / "out.onnx", x), -np.maximum(x, 0))


def test_library_warnings_are_one_line(tmp_path, capsys):
    """A declared shape that contradicts inference: onnx_ir warns with a traceback; the CLI shows one line."""
    src = _relu_model(tmp_path, [2, 4], [2, 4], inner=[3, 4])
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "cleanup"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err and all(ln.startswith("npu-rewrite: warning: ") for ln in err), err
    assert "Inferred shape and existing shape differ" in err[0]


def test_string_initializers_stay_inline_beside_a_data_file(tmp_path):
    import onnx_ir as ir

    model = model_io.load_model(_external_model(tmp_path / "in"))
    words = ir.Value(name="words", const_value=ir.StringTensor([b"a" * 2000, b"b"], shape=ir.Shape([2]), name="words"))
    model.graph.register_initializer(words)
    out = model_io.save_model(model, tmp_path / "out" / "m.onnx")
    proto = onnx.load(str(out))
    (t,) = [t for t in proto.graph.initializer if t.name == "words"]
    assert t.data_location == TensorProto.DEFAULT and list(t.string_data) == [b"a" * 2000, b"b"]


def test_check_refuses_to_generate_giant_declared_inputs(tmp_path, capsys):
    """``--check`` sizes its inputs from the declared shapes: above its limit it says so (exit 1) unallocated."""
    src = _relu_model(tmp_path, [8192, 8192], [8192, 8192])
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "cleanup", "--check", "--json"]) == 1
    check = json.loads(capsys.readouterr().out)["check"]
    assert not check["passed"] and check["reason"].startswith("not checked: the declared inputs need 256 MiB")
