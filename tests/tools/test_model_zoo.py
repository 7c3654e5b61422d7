"""The model-zoo view: one row per model from a real NpuEP session in a worker process."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto, helper

from npu_ep.models.corpus import by_name
from npu_ep.tools.report.model_zoo import model_paths, render_html, render_terminal, zoo
from tests.npu_testing import make_model, save


def test_zoo_rows_come_from_real_sessions_with_reasons_and_errors(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    f32 = TensorProto.FLOAT
    save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                    [helper.make_tensor_value_info("x", f32, ["n", 8])],
                    [helper.make_tensor_value_info("y", f32, ["n", 8])]), folder, "relu.onnx")
    save(make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                     helper.make_node("Atan", ["r"], ["y"], name="atan")],
                    [helper.make_tensor_value_info("x", f32, [2, 8])],
                    [helper.make_tensor_value_info("y", f32, [2, 8])]), folder, "atan.onnx")
    (folder / "broken.onnx").write_bytes(b"not a model")
    doc = zoo([str(folder)], workers=2, runs=1)
    rows = {r["model"]: r for r in doc["models"]}
    assert set(rows) == {"relu", "atan", "broken"}
    assert rows["relu"]["coverage"] == 1.0 and rows["relu"]["partitions"] == 1 and rows["relu"]["crossings"] == 2
    assert rows["relu"]["max_rel_diff"] == 0.0
    assert rows["atan"]["on_npu"] == 1 and rows["atan"]["nodes"] == 2
    assert rows["atan"]["top_reasons"] and rows["atan"]["top_reasons"][0].startswith("1 x Atan")
    assert "error" in rows["broken"]
    json.dumps(doc)
    text = render_terminal(doc)
    assert "relu" in text and "100%" in text and "[ops]" in text  # rich markup is escaped, not eaten
    assert "<table>" in render_html(doc)


def test_corpus_source_names_the_installed_real_models():
    if by_name("ocr-cls").path() is None:
        pytest.skip("rapidocr-onnxruntime is not installed (./run installs it with --no-deps)")
    names = [n for n, _ in model_paths(["corpus"])]
    assert "ocr-cls" in names


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model file or folder"):
        model_paths([str(tmp_path / "nope")])


def _relu_folder(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    f32 = TensorProto.FLOAT
    save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                    [helper.make_tensor_value_info("x", f32, ["n", 8])],
                    [helper.make_tensor_value_info("y", f32, ["n", 8])]), folder, "relu.onnx")
    return folder


def test_cli_zoo_prints_the_table_and_writes_json_and_html(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    folder = _relu_folder(tmp_path)
    out_json, out_html = tmp_path / "zoo.json", tmp_path / "zoo.html"
    assert main(["--zoo", str(folder), "--workers", "1", "--runs", "1", "--json", str(out_json),
                 "--html", str(out_html)]) == 0
    out = capsys.readouterr().out
    assert "Model zoo on npu-ref" in out and "relu" in out and "100%" in out
    doc = json.loads(out_json.read_text())
    assert [(r["model"], r["coverage"], r["partitions"]) for r in doc["models"]] == [("relu", 1.0, 1)]
    assert "<table>" in out_html.read_text() and "relu" in out_html.read_text()


@pytest.mark.parametrize("extra, message", [
    (["--json", "{model}"], "output would replace"),
    (["--target", "no-such-target"], "no-such-target"),
    (["--run"], "--zoo does not take --run"),
    (["--workers", "0"], "--workers must be >= 1"),
])
def test_cli_zoo_bad_input_exits_2_in_one_line_and_writes_nothing(tmp_path, capsys, extra, message):
    from npu_ep.tools.npu_report import main

    folder = _relu_folder(tmp_path)
    model = folder / "relu.onnx"
    before = model.read_bytes()
    try:
        code = main(["--zoo", str(folder), "--workers", "1", *[a.format(model=model) for a in extra]])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert model.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["relu.onnx"]


def test_cli_zoo_missing_source_exits_2(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    assert main(["--zoo", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"npu-report: error: {tmp_path / 'nope'}: no such model file or folder\n"


def test_host_ratio_runs_the_two_sessions_alternately():
    """Load that comes and goes must weigh on both EPs: their timed runs alternate (after one warm-up each)."""
    from npu_ep.tools.report.model_zoo import host_ratio

    order: list[str] = []

    class Session:
        def __init__(self, name):
            self.name = name

        def run(self, outputs, feeds):
            order.append(self.name)

    ratio = host_ratio(Session("npu"), Session("cpu"), {}, runs=4)
    assert order == ["npu", "cpu"] * 5
    assert ratio > 0
