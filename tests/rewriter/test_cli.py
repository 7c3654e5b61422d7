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


def test_target_flag_emits_only_ops_the_target_lists(tmp_path, capsys):
    """--target reaches the qdq pass: npu-ref runs QLinearMatMul, a copy of it without that op keeps the unit."""
    from tests.ep.test_policy import target_without
    from tests.rewriter.test_qdq import _matmul_model

    src = tmp_path / "qdq.onnx"
    onnx.save(_matmul_model(), src)
    assert main([str(src), "-o", str(tmp_path / "ref.onnx"), "--passes", "qdq", "--json"]) == 0
    assert sum(json.loads(capsys.readouterr().out)["counts"].values()) == 1
    assert [n.op_type for n in onnx.load(tmp_path / "ref.onnx").graph.node] == ["QLinearMatMul"]

    target = target_without(tmp_path, ("QLinearMatMul",), name="npu-ref-no-qlmm")
    assert main([str(src), "-o", str(tmp_path / "t.onnx"), "--passes", "qdq", "--target", target, "--json",
                 "--verbose"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["counts"] == {}
    assert any("QLinearMatMul is not in the ops table of target npu-ref-no-qlmm" in f["reason"]
               for f in summary["failures"]), summary["failures"]
    assert "QLinearMatMul" not in [n.op_type for n in onnx.load(tmp_path / "t.onnx").graph.node]


def test_unknown_target_is_exit_2_one_line(tmp_path, capsys):
    src = _lm(tmp_path / "lm.onnx")
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "--target", "npu-nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rewrite target: unknown target 'npu-nope'" in err[0], err
    assert not (tmp_path / "out.onnx").exists()


def test_notes_are_printed_and_bracketed_names_survive_rich_markup(tmp_path, capsys):
    """gqa needs cleanup: the note says so (table and JSON); rule names such as 'GroupQueryAttention[expand,...]'
    print whole (rich would eat a lowercase '[...]' as markup)."""
    from npu_ep.models.tiny_llama import build_tiny_llama

    src = build_tiny_llama(tmp_path / "tl.onnx")
    assert main([str(src), "-o", str(tmp_path / "a.onnx"), "--passes", "gqa", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["notes"] == ["pass 'cleanup' added: gqa need(s) it"]
    bracketed = [rule for rule in summary["counts"] if "[" in rule]
    assert bracketed, summary["counts"]
    assert main([str(src), "-o", str(tmp_path / "b.onnx"), "--passes", "gqa"]) == 0
    out = capsys.readouterr().out
    assert "note: pass 'cleanup' added: gqa need(s) it" in out
    for rule in bracketed:
        assert rule in out, out
