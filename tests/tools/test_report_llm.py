"""npu-report on the rewritten INT4 tiny Llama: three-way numerics (float / quantized / NpuEP) and prefill vs decode.

One small decoder (2 layers, hidden 64) is built, rewritten with cleanup,rope,gqa,int4 and reported once through
the CLI (``--run --float-model``); the tests read that one JSON document (and its HTML)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.models.weights import LlamaConfig
from npu_ep.rewriter import rewrite
from npu_ep.tools.npu_report import main
from npu_ep.tools.report.build import validate
from npu_ep.tools.report.html import PHASES_ID, THREE_WAY_ID
from npu_ep.tools.report.quant import float_reference
from npu_ep.tools.report.run import make_feeds

CFG = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=128)
PREFILL = 8
MATMULS = 7 * CFG.num_hidden_layers + 1  # q, k, v, o, gate, up, down per layer + lm_head


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("llama")
    float_path = build_tiny_llama(folder / "float.onnx", CFG)
    q_path = rewrite(str(float_path), passes=("cleanup", "rope", "gqa", "int4")).save(folder / "int4.onnx")
    out_json, out_html = folder / "r.json", folder / "r.html"
    rc = main([str(q_path), "--run", "--runs", "3", "--float-model", str(float_path), "--prefill-tokens",
               str(PREFILL), "--json", str(out_json), "--html", str(out_html), "--quiet"])
    assert rc == 0
    return {"float": str(float_path), "int4": str(q_path), "doc": json.loads(out_json.read_text()),
            "html": out_html.read_text()}


def test_document_is_schema_valid_and_npu_ep_ran_the_model(llama):
    doc = llama["doc"]
    validate(doc)
    assert doc["source"] == "session"
    assert doc["measurement"]["assignment"]["NpuEP"] == doc["coverage"]["claimed"] > 0.9 * doc["coverage"]["total"]
    assert doc["validation"]["checker"].startswith("skipped")  # ORT-only ops in the ONNX domain


def test_three_way_separates_quantization_error_from_kernel_error(llama):
    cmp_ = llama["doc"]["compare"]
    tw = cmp_["three_way"]
    assert cmp_["quantized"] is True
    assert tw["float_source"] == "substituted" and tw["substituted"] == MATMULS and tw["unmatched_weights"] == []
    outputs = {r["tensor"]: r for r in tw["outputs"]}
    assert next(iter(outputs)) == "logits" and set(outputs) == {"logits"} | {
        f"present.{i}.{kv}" for i in range(CFG.num_hidden_layers) for kv in ("key", "value")}
    logits = outputs["logits"]
    # int4 weights move the logits by ~1e-1; NpuEP reproduces the quantized model to float rounding
    assert logits["quant_max_abs"] > 1e-2 and logits["kernel_max_abs"] < 1e-4
    assert logits["dominant"] == tw["dominant"] == "quantization"
    rows = {r["tensor"]: r for r in tw["nodes"]}
    # the MatMulNBits outputs, per node (q/k/v recorded as their group's slices); gate and up live only inside
    # the SwiGLU epilogue, so each layer shows 5 projections
    proj = [r for r in rows.values() if r["node"].endswith("_Q4")]
    assert len(proj) >= MATMULS - 2 * CFG.num_hidden_layers - 1 and all(r["quant_max_abs"] > 0 for r in proj)
    assert all(any(f"layers.0.self_attn/{p}_proj/" in r["node"] for r in proj) for p in "qkv")
    first = next(r for r in tw["nodes"] if r["quant_max_abs"])  # before the first projection: no error at all
    assert first["node"].endswith("_Q4")


def test_float_reference_is_the_float_model_computation(llama):
    """The substituted graph (rewritten structure, float weights) computes what the original float model does:
    the 'quantization' column is quantization only, not rewrite error."""
    q, f = onnx.load(llama["int4"]), onnx.load(llama["float"])
    ref, info = float_reference(q, f)
    assert len(info["substituted"]) == MATMULS and not info["unmatched"]
    assert not any(n.op_type == "MatMulNBits" for n in ref.graph.node)
    feeds = make_feeds(q, {"batch": 1, "sequence": 4, "past_sequence": 0, "total_sequence": 4})
    want = ort.InferenceSession(f.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    got = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    quant = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    assert np.max(np.abs(quant - want)) > 100 * np.max(np.abs(got - want))


def test_prefill_and_decode_are_both_run_and_reported(llama):
    doc = llama["doc"]
    pre, dec = doc["phases"]["prefill"], doc["phases"]["decode"]
    assert (pre["new_tokens"], pre["past_tokens"], dec["new_tokens"], dec["past_tokens"]) == (PREFILL, 0, 1, PREFILL)
    for r in (pre, dec):
        assert r["npu_cycles"] > 0 and r["npu_us"] > 0 and r["dma_bytes"] > 0 and r["npu_dma_cycles"] > 0
        assert r["host_us"] > 0 and r["cpu_host_us"] > 0 and r["partition_calls"] == len(doc["partitions"])
    assert pre["npu_compute_cycles"] > dec["npu_compute_cycles"]  # 8 rows of matrix work vs 1
    sigs = {p["partition"]: p["signature"] for p in dec["partitions"]}
    past_shapes = [s for sig in sigs.values() for s in sig if len(s) == 4]
    assert past_shapes and all(s[2] == PREFILL for s in past_shapes)  # decode read the prefill's KV cache
    phases = {e["phase"] for e in doc["timeline"]}
    assert {"prefill", "decode"} <= phases


def test_html_has_phase_and_three_way_plots(llama):
    page = llama["html"]
    for fid in ("coverage-by-op", "partition-map", "layer-timeline", PHASES_ID, THREE_WAY_ID):
        assert f'id="{fid}"' in page
    assert '<script src="http' not in page
