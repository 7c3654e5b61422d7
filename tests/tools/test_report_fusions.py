"""npu-report --explain-fusions: per partition, the fusions applied and why each candidate node was not fused, on
the terminal and under ``fusions`` in the JSON (the same FusionMiss reasons the compiler logs at debug level)."""

from __future__ import annotations

import json

import pytest

from npu_ep.tools.npu_report import main
from tests.kernels.test_fusion_rotary import rotary_model
from tests.npu_testing import save


def test_explain_fusions_names_the_applied_fusion_and_each_miss_with_its_reason(tmp_path, capsys):
    fused, missed = save(rotary_model(), tmp_path, "fused.onnx"), save(rotary_model(split=4), tmp_path, "miss.onnx")
    out = tmp_path / "r.json"
    assert main([fused, "--explain-fusions", "--json", str(out)]) == 0
    assert "fused  npu::RotateHalf <- 7 nodes (add, ...)" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["fusions"]
    assert row["fused"] == [{"op": "npu::RotateHalf", "nodes": ["mul_cos", "slice_1", "slice_2", "neg", "concat",
                                                                 "mul_sin", "add"]}]
    assert row["misses"] == []
    out.unlink()
    assert main([missed, "--explain-fusions", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "missed rotary at add (Add): the halves split 8 channels, x's last dim is 16" in text
    assert "(passes that do not say why yet: qdq_lut)" in text
    (row,) = json.loads(out.read_text())["fusions"]
    assert row["fused"] == []
    assert row["misses"] == [{"fusion": "rotary", "node": "add", "op": "Add",
                              "reason": "the halves split 8 channels, x's last dim is 16"}]


def test_without_the_flag_the_report_has_no_fusions_section(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([save(rotary_model(split=4), tmp_path), "--json", str(out)]) == 0
    assert "Fusions (--explain-fusions)" not in capsys.readouterr().out
    assert "fusions" not in json.loads(out.read_text())


def test_zoo_refuses_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--zoo", "corpus", "--explain-fusions"])
    assert exc.value.code == 2
    assert "--zoo does not take --explain-fusions" in capsys.readouterr().err
