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
