"""``npu-rewrite``: exit codes, JSON summary, --check by input role, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu_ep.tools.npu_rewrite import main


def _lm(path, vocab=50, hidden=32):
    """input_ids -> Gather(embedding) -> MatMul(lm_head) -> logits; plus an attention_mask input (unused)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embed"),
             numpy_helper.from_array(rng.standard_normal((hidden, vocab)).astype(np.float32), "lm_w")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed"),
             helper.make_node("MatMul", ["h", "lm_w"], ["logits"], name="lm_head")]
    graph = helper.make_graph(
        nodes, "lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return path


def test_json_summary_and_check_pass(tmp_path, capsys):
    src = _lm(tmp_path / "lm.onnx")
    code = main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "int4", "--int4-block-size", "16",
                 "--check", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["counts"] == {"MatMulToNBits": 1}
    assert summary["check"]["passed"] and summary["check"]["output_name"] == "logits"
    assert summary["check"]["top1_agreement"] >= 0.9
    assert 0 < summary["check"]["max_abs_diff"] < 5.0  # int4 error on logits of magnitude ~10


def test_exclude_and_verbose_reasons(tmp_path, capsys):
    src = _lm(tmp_path / "lm.onnx")
    code = main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "int4", "--exclude", "lm_head",
                 "--json", "--verbose", "--check"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["counts"] == {}
    assert any("--exclude" in f["reason"] for f in summary["failures"])
    assert summary["check"]["max_abs_diff"] == 0.0


def test_table_output(tmp_path, capsys):
    src = _lm(tmp_path / "lm.onnx")
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "int4"]) == 0
    out = capsys.readouterr().out
    assert "MatMulToNBits" in out and "wrote" in out


def test_check_failure_exit_code_1(tmp_path, capsys, monkeypatch):
    """A rewrite that changes numerics beyond tolerance must fail --check (exit 1): fake one by making the
    checker compare against a different model."""
    src = _lm(tmp_path / "lm.onnx")
    other = _lm(tmp_path / "other.onnx", vocab=50)
    proto = onnx.load(str(other))
    proto.graph.initializer[1].CopyFrom(numpy_helper.from_array(
        np.zeros((32, 50), np.float32), "lm_w"))
    onnx.save(proto, other)
    import npu_ep.tools.rewrite_check as rc

    real = rc.check_models
    monkeypatch.setattr(rc, "check_models", lambda a, b, **kw: real(a, other, **kw))
    code = main([str(src), "-o", str(tmp_path / "out.onnx"), "--passes", "cleanup", "--check", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1 and not summary["check"]["passed"]


def test_bad_input_is_exit_2_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    assert main([str(bad), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("npu-rewrite: error:") and "bad.onnx" in err[0]


def test_bad_arguments_are_exit_2(tmp_path, capsys):
    src = _lm(tmp_path / "lm.onnx")
    assert main([str(src), "-o", str(tmp_path / "o.onnx"), "--passes", "nope"]) == 2
    assert main([str(src)]) == 2  # missing -o
    assert main([str(src), "-o", str(tmp_path / "o.onnx"), "--int4-block-size", "20"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 3 and all(line.startswith("npu-rewrite: error:") for line in err)
