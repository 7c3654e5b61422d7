"""npu-report --explain-fusions: per partition, the fusions applied and why each candidate node was not fused, on
the terminal and under ``fusions`` in the JSON (the same FusionMiss reasons the compiler logs at debug level)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

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
    assert "passes that do not say why" not in text
    (row,) = json.loads(out.read_text())["fusions"]
    assert row["fused"] == []
    assert row["misses"] == [{"fusion": "rotary", "node": "add", "op": "Add",
                              "reason": "the halves split 8 channels, x's last dim is 16"}]


def _five_near_misses():
    """One near miss per chain-walking pass: a norm whose statistics are read, feeding a lone MatMul (siblings)
    whose Add reads a second activation (epilogue); a Conv scaled per channel (conv_tail); an 8-bit unit scaled per
    channel (qdq_lut)."""
    rng = np.random.default_rng(5)
    f32 = TensorProto.FLOAT
    inits = {"gamma": np.ones(64, np.float32), "W": rng.standard_normal((64, 48)).astype(np.float32),
             "w": rng.standard_normal((5, 3, 3, 3)).astype(np.float32), "s": np.full((1, 5, 1, 1), 1.5, np.float32),
             "dq_s": np.float32(0.04), "dq_z": np.uint8(128), "q_s": np.float32(0.05), "q_z": np.uint8(100)}
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y", "inv"], "norm", axis=-1),
             helper.make_node("MatMul", ["y", "W"], ["mm"], "mm"), helper.make_node("Add", ["mm", "r"], ["o1"], "add"),
             helper.make_node("Conv", ["img", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s"], ["o2"], "scale"),
             helper.make_node("DequantizeLinear", ["a", "dq_s", "dq_z"], ["af"], "dq"),
             helper.make_node("Mul", ["af", "s"], ["am"], "unit"),
             helper.make_node("QuantizeLinear", ["am", "q_s", "q_z"], ["o3"], "q")]
    ins = [helper.make_tensor_value_info("x", f32, [1, 3, 64]), helper.make_tensor_value_info("r", f32, [1, 3, 48]),
           helper.make_tensor_value_info("img", f32, [1, 3, 9, 7]),
           helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 5, 7, 9])]
    outs = [helper.make_tensor_value_info("o1", f32, [1, 3, 48]), helper.make_tensor_value_info("inv", f32, None),
            helper.make_tensor_value_info("o2", f32, [1, 5, 9, 7]),
            helper.make_tensor_value_info("o3", TensorProto.UINT8, [1, 5, 7, 9])]
    typed = [helper.make_tensor_value_info("y", f32, [1, 3, 64])]  # ONNX's inference does not know the norm
    graph = helper.make_graph(nodes, "five", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()],
                              value_info=typed)
    # no onnx.checker: ORT registers SimplifiedLayerNormalization in the default domain, ONNX does not
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def test_explain_fusions_shows_why_each_chain_walking_pass_declined(tmp_path, capsys):
    assert main([save(_five_near_misses(), tmp_path), "--explain-fusions"]) == 0
    text = capsys.readouterr().out
    for line in ("missed norm at norm (SimplifiedLayerNormalization): its statistics output(s) ['inv'] are read",
                 "missed epilogue at mm (MatMul): Add 'add' reads ['r'] besides 'mm', not one constant bias of N=48 "
                 "elements broadcasting over the last axis",
                 "missed siblings at mm (MatMul): no other matmul with constant weights reads its A 'y' (each reads a "
                 "different activation)",
                 "missed conv_tail at conv (Conv): its output 'c' is read by Mul 'scale', not a float32 link",
                 "missed qdq_lut at unit (Mul): input 's' is a constant of 5 elements, not one"):
        assert line in text, (line, text)


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
