"""``npu-report`` on declared shapes it must size itself: ``-1``/unnamed and symbolic dims are sized, said on the
terminal and settable with ``--dim``; giant declared inputs are refused before allocation; outputs never replace a
file the report reads (issue 13 "Messages", issue 14 items 4 and 7)."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from onnx import TensorProto, helper

from _child import assert_no_crash, run_child
from npu_ep.tools.npu_report import main
from npu_testing import make_model


def _relu(shape_in, shape_out=None):
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out or shape_in)])


def _save(model, path):
    onnx.save(model, path)
    return str(path)


def _report(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@pytest.mark.parametrize("dim", [-1, -5, None])
def test_unknown_dims_are_sized_said_and_settable(tmp_path, capsys, dim):
    """dim_value -1 (exporters' "unknown"), another negative value, or no value at all: keyed ``x:1``."""
    model = _relu([2, 8], [2, "n"])
    d = model.graph.input[0].type.tensor_type.shape.dim[1]
    d.Clear()
    if dim is not None:
        d.dim_value = dim
    path = _save(model, tmp_path / "m.onnx")
    code, err = _report([path, "--run", "--runs", "1", "--quiet", "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    assert err == ["npu-report: input dims not given were sized x:1=1 (set them with --dim NAME=VALUE)"]
    code, err = _report([path, "--run", "--runs", "1", "--quiet", "--dim", "x:1=16", "--json",
                         str(tmp_path / "r.json")], capsys)
    assert code == 0 and err == []
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["dims"] == {"x:1": 16}
    assert doc["measurement"]["assignment"] == {"NpuEP": 1}  # ORT's own record: the Relu ran on NpuEP
    assert all(c["bytes"] is None or c["bytes"] >= 0 for c in doc["crossings"])


def test_symbolic_image_dims_get_image_sizes_and_are_reported(tmp_path, capsys):
    path = _save(_relu(["batch", 3, "height", "width"]), tmp_path / "img.onnx")
    code, err = _report([path, "--quiet", "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0
    assert err == ["npu-report: input dims not given were sized batch=1, height=224, width=224 "
                   "(set them with --dim NAME=VALUE)"]
    assert json.loads((tmp_path / "r.json").read_text())["dims"] == {"batch": 1, "height": 224, "width": 224}
    code, err = _report([path, "--quiet", "--dim", "height=32", "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0 and "height" not in err[0] and "width=224" in err[0]
    assert json.loads((tmp_path / "r.json").read_text())["dims"]["height"] == 32


def test_unnamed_spatial_dims_of_a_rank4_input_are_image_sized(tmp_path, capsys):
    model = _relu([1, 3, 8, 8])
    for axis in (2, 3):
        model.graph.input[0].type.tensor_type.shape.dim[axis].dim_value = -1
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "h"
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_param = "w"
    code, err = _report([_save(model, tmp_path / "m.onnx"), "--quiet"], capsys)
    assert code == 0 and "x:2=224, x:3=224" in err[0]


def test_giant_declared_input_is_refused_before_allocating(tmp_path):
    """The 79-byte model with an [8192, 8192] input: one line, exit 2, and the process stays small."""
    path = _save(_relu([8192, 8192]), tmp_path / "giant.onnx")
    child = run_child(f"""
        from npu_ep.tools.npu_report import main
        from npu_ep.tools.bench.peak_rss import peak_rss_bytes
        code = main([{path!r}, "--run", "--runs", "1", "--quiet"])
        print("RSS_MB", peak_rss_bytes() >> 20, "CODE", code)
    """, timeout=120)
    assert_no_crash(child)
    err = [ln for ln in child.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "need 256 MiB (largest: 'x' [8192, 8192]), above the 128 MiB limit" in err[0], err
    assert "--max-input-mib" in err[0] and "--dim" not in err[0]  # the shape is fixed: only the limit helps
    words = child.last_line().split()
    assert words[3] == "2"
    assert int(words[1]) < 512, f"peak RSS {words[1]} MB: the inputs were allocated"  # 256 MiB input + ORT


def test_giant_symbolic_input_names_the_dim_flag(tmp_path, capsys):
    path = _save(_relu(["rows", "cols"]), tmp_path / "m.onnx")
    code, err = _report([path, "--run", "--runs", "1", "--quiet", "--dim", "rows=100000", "--dim", "cols=1000"],
                        capsys)
    assert code == 2 and len(err) == 1 and "--dim NAME=VALUE or raise --max-input-mib" in err[0]
    code, err = _report([path, "--run", "--runs", "1", "--quiet", "--dim", "rows=100000", "--dim", "cols=1000",
                         "--max-input-mib", "1024"], capsys)
    assert code == 0, err


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("flag", ["--json", "--html"])
@pytest.mark.parametrize("onto", ["model", "data", "link"])
def test_report_output_onto_an_input_file_is_refused(tmp_path, capsys, flag, onto):
    model = make_model([helper.make_node("Add", ["x", "b"], ["y"], name="add")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
                       {"b": __import__("numpy").ones((4, 256), "float32")})
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "link.onnx").symlink_to(tmp_path / "m.onnx")
    before = {p.name: _digest(p) for p in tmp_path.iterdir()}
    out = {"model": "m.onnx", "data": "m.data", "link": "link.onnx"}[onto]
    code, err = _report([str(tmp_path / "m.onnx"), "--quiet", flag, str(tmp_path / out)], capsys)
    assert code == 2 and len(err) == 1 and "which the report reads" in err[0], err
    assert {p.name: _digest(p) for p in tmp_path.iterdir()} == before


def test_json_and_html_onto_each_other_is_refused(tmp_path, capsys):
    path = _save(_relu([2, 8]), tmp_path / "m.onnx")
    code, err = _report([path, "--quiet", "--json", str(tmp_path / "r"), "--html", str(tmp_path / "r")], capsys)
    assert code == 2 and "same file" in err[0]
