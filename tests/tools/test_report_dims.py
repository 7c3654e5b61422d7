"""npu-report's sizes for symbolic input dims: the KV head count and head size come from the attention nodes (not
a generic 1), and the total sequence length is past + new, as onnxruntime-genai's models need. Torch-free: the
model is built here with genai's I/O declarations; the genai-built model is tested in test_genai.py."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_ep.tools.report.run import make_feeds, resolve_dims
from npu_ep.tools.report.validate import ReportInputError
from tests.npu_testing import assignment, make_model, npu_session

HEADS, KV_HEADS, HEAD, D = 4, 2, 8, 32
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def genai_style_gqa(packed: bool = True, *, kv_dim: str = "kv_cache_dim"):
    """Embedding -> q/k/v projections -> GroupQueryAttention with genai's mask plumbing and I/O declarations:
    past [batch_size, Nkv, past_sequence_length, kv_cache_dim], mask [batch_size, total_sequence_length]."""
    rng = np.random.default_rng(0)
    width = (HEADS + 2 * KV_HEADS) * HEAD
    inits = {"embed": rng.standard_normal((64, D)).astype(np.float32),
             "one": np.array([1], np.int64), "one_s": np.array(1, np.int64)}
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h"]),
             helper.make_node("ReduceSum", ["attention_mask", "one"], ["msum"]),
             helper.make_node("Sub", ["msum", "one"], ["seqlens"]),
             helper.make_node("Cast", ["seqlens"], ["seqlens_k"], to=TensorProto.INT32),
             helper.make_node("Shape", ["attention_mask"], ["mshape"]),
             helper.make_node("Gather", ["mshape", "one_s"], ["total"]),
             helper.make_node("Cast", ["total"], ["total_len"], to=TensorProto.INT32)]
    if packed:
        inits["w_qkv"] = (rng.standard_normal((D, width)) / 8).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["h", "w_qkv"], ["qkv"]))
        qkv = ["qkv", "", ""]
    else:
        for name, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            inits[f"w_{name}"] = (rng.standard_normal((D, n * HEAD)) / 8).astype(np.float32)
            nodes.append(helper.make_node("MatMul", ["h", f"w_{name}"], [name]))
        qkv = ["q", "k", "v"]
    nodes.append(helper.make_node(
        "GroupQueryAttention", qkv + ["past_key_values.0.key", "past_key_values.0.value", "seqlens_k", "total_len"],
        ["attn", "present.0.key", "present.0.value"], domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        name="/model/layers.0/attn/GroupQueryAttention"))
    past = ["batch_size", KV_HEADS, "past_sequence_length", kv_dim]
    present = ["batch_size", KV_HEADS, "total_sequence_length", kv_dim]
    inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", I64, ["batch_size", "total_sequence_length"]),
              helper.make_tensor_value_info("past_key_values.0.key", F32, past),
              helper.make_tensor_value_info("past_key_values.0.value", F32, past)]
    outputs = [helper.make_tensor_value_info("attn", F32, ["batch_size", "sequence_length", HEADS * HEAD]),
               helper.make_tensor_value_info("present.0.key", F32, present),
               helper.make_tensor_value_info("present.0.value", F32, present)]
    return make_model(nodes, inputs, outputs, inits, extra_opsets=[("com.microsoft", 1)])


@pytest.mark.parametrize("packed", [True, False], ids=["packed_qkv", "separate_qkv"])
def test_kv_dims_come_from_the_attention_node_and_total_is_past_plus_new(packed):
    model = genai_style_gqa(packed)
    dims = resolve_dims(model, {})
    assert dims["kv_cache_dim"] == HEAD  # before: 1, and GQA refused the past inputs
    assert dims["total_sequence_length"] == dims["past_sequence_length"] + dims["sequence_length"]
    dims = resolve_dims(model, {"past_sequence_length": 5, "sequence_length": 3})
    assert (dims["kv_cache_dim"], dims["total_sequence_length"]) == (HEAD, 8)
    feeds = make_feeds(model, dims)
    assert feeds["past_key_values.0.key"].shape == (1, KV_HEADS, 5, HEAD)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = npu_session(model)
    got = sess.run(None, feeds)
    assert "NpuEP" in set(assignment(sess).values())
    for want, have in zip(ref, got):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)


def test_a_dim_contradicting_the_structure_is_refused_in_one_line():
    with pytest.raises(ReportInputError, match=r"--dim kv_cache_dim=16 contradicts the model: GroupQueryAttention "
                                               r"'/model/layers.0/attn/GroupQueryAttention' needs head size 8"):
        resolve_dims(genai_style_gqa(), {"kv_cache_dim": 16})


def test_a_past_input_no_attention_node_reads_keeps_the_generic_sizes():
    """Near miss: genai's declarations without an attention node say nothing about the head size."""
    past = ["batch_size", KV_HEADS, "past_sequence_length", "kv_cache_dim"]
    model = make_model([helper.make_node("Identity", ["past_key_values.0.key"], ["out"])],
                       [helper.make_tensor_value_info("past_key_values.0.key", F32, past)],
                       [helper.make_tensor_value_info("out", F32, past)])
    assert resolve_dims(model, {}) == {"batch_size": 1, "past_sequence_length": 1, "kv_cache_dim": 1}


def strided_skip_net(scale: float = 2.0):
    """x [1, 3, h, w] (dims named neither height nor width: sized 1 by default) -> conv a -> stride-2 conv b ->
    Resize x``scale`` c -> Concat(a, c) over channels: runs only where c's size equals a's (h, w multiples of 2
    for scale 2; never for scale 3). At h = w = 1 ORT fails the Concat."""
    rng = np.random.default_rng(0)
    inits = {"wa": (rng.standard_normal((4, 3, 3, 3)) / 4).astype(np.float32),
             "wb": (rng.standard_normal((4, 4, 3, 3)) / 4).astype(np.float32),
             "scales": np.array([1, 1, scale, scale], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["a", "wb"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv_b"),
             helper.make_node("Resize", ["b", "", "scales"], ["c"], mode="nearest", name="up"),
             helper.make_node("Concat", ["a", "c"], ["y"], axis=1, name="cat")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 3, "h", "w"])],
                      [helper.make_tensor_value_info("y", F32, [1, 8, None, None])], inits)


def test_dims_sized_one_that_cannot_run_take_the_models_stride_hint(tmp_path, capsys):
    """Size 1 failed with only ORT's 'cannot run the model on the CPU EP' (exit 2); the strides and the Resize
    scale say the size must be a multiple of 2, and 2 runs."""
    from npu_ep.tools.npu_report import main
    from npu_ep.tools.report.dim_hints import candidate_sizes, downsampling

    model = strided_skip_net()
    assert downsampling(model) == 2 and candidate_sizes(model)[0] == 2
    path = tmp_path / "net.onnx"
    onnx.save(model, path)
    out = tmp_path / "r.json"
    assert main([str(path), "--run", "--runs", "1", "--quiet", "--json", str(out)]) == 0, capsys.readouterr().err
    assert "input dims not given were sized h=2, w=2" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["dims"] == {"h": 2, "w": 2} and doc["measurement"]["assignment"] == {"NpuEP": 4}


def test_dims_sized_one_that_nothing_runs_are_named_with_the_flag_to_set_them(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    path = tmp_path / "net.onnx"
    onnx.save(strided_skip_net(scale=3.0), path)
    assert main([str(path), "--run", "--runs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ONNX Runtime cannot run the model on the CPU EP" in err[0], err
    assert "the input dims not given were sized h=1, w=1" in err[0] and "--dim NAME=VALUE" in err[0], err
    assert main([str(path), "--run", "--runs", "1", "--quiet", "--dim", "h=1", "--dim", "w=1"]) == 2
    given = capsys.readouterr().err
    assert "sized h=1" not in given and "--dim" not in given.split("CPU EP", 1)[1]  # the user chose them: no hint
