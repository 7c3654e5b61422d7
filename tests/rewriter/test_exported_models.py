"""The rewriter on graphs that torch's exporters really emit: tiny random Llama, Qwen2, Phi-3 (fused QKV) and
GPT-J (interleaved, partial RoPE; no GQA) exported with the dynamo and the TorchScript exporter.

For each: the export matches torch; cleanup+rope+gqa fuses 2 RotaryEmbedding and 1 GroupQueryAttention per
layer and keeps fp32 logits and presents within 1e-4 for prefill and one decode step; int4 then packs every
Linear into MatMulNBits and matches, on ORT CPU, the fp32 graph whose weights are replaced by their dequantized
INT4 values, each within one quantization step of the float weight (the quantizer's own error).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from npu_ep.models import torch_export
from npu_ep.quantization import dequantize_b, quantize_matmul_nbits
from npu_ep.rewriter import rewrite

pytestmark = pytest.mark.torch

LAYERS, HEADS, KV_HEADS, HIDDEN = 2, 4, 2, 64
BLOCK_SIZE = 32
CASES = [(arch, exporter) for arch in torch_export.ARCHS for exporter in torch_export.EXPORTERS]
IDS = [f"{a}-{e}" for a, e in CASES]
FP32_TOL = 1e-4
INT4_TOL = 1e-4  # MatMulNBits vs MatMul with the same dequantized weights: float accumulation order only


@dataclasses.dataclass
class Case:
    arch: str
    exporter: str
    model: object             # the torch module (same seed as the export)
    original: onnx.ModelProto
    fused: onnx.ModelProto    # cleanup, rope, gqa
    counts: Counter
    int4: onnx.ModelProto     # fused, then int4
    int4_counts: Counter

    @property
    def kv_heads(self) -> int:
        return torch_export.kv_layout(self.model)[1]

    @property
    def n_linear(self) -> int:
        return sum(isinstance(m, torch.nn.Linear) for m in self.model.modules())


_CACHE: dict[tuple[str, str], Case] = {}


@pytest.fixture(params=CASES, ids=IDS)
def case(request, tmp_path_factory) -> Case:
    """Each arch x exporter is exported and rewritten once per session."""
    key = request.param
    if key not in _CACHE:
        arch, exporter = key
        path = torch_export.export_tiny_hf(arch, tmp_path_factory.mktemp(f"{arch}_{exporter}") / "model.onnx",
                                           exporter=exporter, layers=LAYERS, hidden=HIDDEN, heads=HEADS,
                                           kv_heads=KV_HEADS)
        original = onnx.load(str(path))
        fused = rewrite(original, passes=("cleanup", "rope", "gqa"))
        fused_proto = ir.serde.serialize_model(fused.model)
        int4 = rewrite(fused_proto, passes=("int4",), int4_block_size=BLOCK_SIZE)
        model = torch_export.make_model(arch, layers=LAYERS, hidden=HIDDEN, heads=HEADS,
                                        kv_heads=HEADS if arch == "gptj" else KV_HEADS)
        _CACHE[key] = Case(arch, exporter, model, original, fused_proto, Counter(fused.report.counts),
                           ir.serde.serialize_model(int4.model), Counter(int4.report.counts))
    return _CACHE[key]


# --- helpers -------------------------------------------------------------------------------------------------
def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _prefill_feeds(case: Case, batch: int = 2, seq: int = 7) -> dict[str, np.ndarray]:
    _, nkv, hd = torch_export.kv_layout(case.model)
    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(0, case.model.config.vocab_size, (batch, seq)).astype(np.int64),
             "attention_mask": np.ones((batch, seq), np.int64),
             "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1))}
    for i in range(LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((batch, nkv, 0, hd), np.float32)
    return feeds


def _decode_feeds(prefill: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One greedy step after ``prefill``, with its presents as the past."""
    batch, seq = prefill["input_ids"].shape
    feeds = {"input_ids": outputs["logits"][:, -1].argmax(-1).astype(np.int64)[:, None],
             "attention_mask": np.ones((batch, seq + 1), np.int64),
             "position_ids": np.full((batch, 1), seq, np.int64)}
    for i in range(LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = outputs[f"present.{i}.{kind}"]
    return feeds


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    assert a.keys() == b.keys()
    return {k: float(np.abs(a[k] - b[k]).max()) for k in a}


def _signature(model: onnx.ModelProto) -> list[tuple[str, bytes]]:
    return [(v.name, v.type.SerializeToString()) for v in (*model.graph.input, *model.graph.output)]


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _dequantized_reference(fused: onnx.ModelProto) -> tuple[onnx.ModelProto, float]:
    """``fused`` with every constant 2-D MatMul weight W replaced by dequant(quant_int4(W)), same settings as the
    int4 pass. Also checks each weight is within the quantizer's own RTN error (at most one step, ``|scale|``, per
    block: the max-|w| element maps to -8 exactly, so +max clips to 7) and returns the largest error/step ratio."""
    model = ir.serde.deserialize_model(fused)
    worst = 0.0
    for node in model.graph:
        if node.op_type != "MatMul" or node.domain != "":
            continue
        w = node.inputs[1]
        if w is None or w.const_value is None or len(w.const_value.shape) != 2:
            continue
        weight = w.const_value.numpy()
        packed = quantize_matmul_nbits(weight, BLOCK_SIZE, True)
        deq = dequantize_b(packed)
        k, n = weight.shape
        step = np.repeat(np.abs(packed.scales).reshape(n, -1), BLOCK_SIZE, axis=1)[:, :k].T  # [K, N]
        worst = max(worst, float((np.abs(weight - deq) / step).max()))
        w.const_value = ir.tensor(deq, name=w.name)
    return ir.serde.serialize_model(model), worst


# --- tests ---------------------------------------------------------------------------------------------------
def test_export_matches_torch(case):
    sess = _session(case.original)
    prefill = _prefill_feeds(case)
    got = _run(sess, prefill)
    assert max(_max_diff(torch_export.run_torch(case.model, prefill), got).values()) < FP32_TOL
    decode = _decode_feeds(prefill, got)
    assert max(_max_diff(torch_export.run_torch(case.model, decode), _run(sess, decode)).values()) < FP32_TOL


def test_graph_contract(case):
    names_in, names_out = torch_export.io_names(LAYERS)
    assert [v.name for v in case.original.graph.input] == names_in
    assert [v.name for v in case.original.graph.output] == names_out
    for proto in (case.fused, case.int4):  # a drop-in replacement: same names, dtypes and shapes
        assert _signature(proto) == _signature(case.original)


def _assert_rope_fused(ops, arch: str, model) -> None:
    """2 RotaryEmbedding per layer, folded into GQA (do_rotary=1) except GPT-J's partial rotary (GQA rotates whole
    heads only, so its RotaryEmbeddings stay separate)."""
    if arch == "gptj":
        assert ops["RotaryEmbedding"] == 2 * LAYERS
    else:
        assert ops["RotaryEmbedding"] == 0
        assert all(_attrs(n).get("do_rotary") == 1 for n in model.graph.node if n.op_type == "GroupQueryAttention")


def test_rope_and_gqa_are_fused(case):
    ops = _ops(case.fused)
    _assert_rope_fused(ops, case.arch, case.fused)
    assert case.counts.get("FoldRotaryIntoGQA", 0) == (0 if case.arch == "gptj" else LAYERS), case.counts
    assert ops["GroupQueryAttention"] == LAYERS, case.counts
    assert ops["Softmax"] == 0 and ops["Expand"] == 0 and ops["Tile"] == 0  # the repeated KV is gone
    heads, kv, hd = HEADS, case.kv_heads, HIDDEN // HEADS
    for node in case.fused.graph.node:
        attrs = _attrs(node)
        if node.op_type == "GroupQueryAttention":
            assert (attrs["num_heads"], attrs["kv_num_heads"]) == (heads, kv)
            assert attrs["scale"] == pytest.approx(hd ** -0.5)
        elif node.op_type == "RotaryEmbedding":
            assert attrs["num_heads"] in (heads, kv)
            if case.arch == "gptj":  # rotate_every_two on the first half of each head
                assert attrs["interleaved"] == 1 and attrs["rotary_embedding_dim"] == hd // 2
            else:
                assert attrs.get("interleaved", 0) == 0 and attrs.get("rotary_embedding_dim", 0) in (0, hd)
    if case.arch != "gptj":  # RMSNorm -> (Skip)SimplifiedLayerNormalization
        assert ops["SimplifiedLayerNormalization"] + ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS + 1


@pytest.mark.parametrize("case", [("gptj", "dynamo")], ids=["gptj-dynamo"], indirect=True)
def test_gptj_dynamo_rope_fuses_from_its_gathernd_table_without_position_metadata(case):
    """torch.onnx.export(dynamo=True) reads GPT-J's sin/cos table with GatherND and, called directly, writes no
    max_position_embeddings metadata (torch_export adds it): the table's rows alone bound the positions, and every
    rotary site (q and k per layer) fuses, partial and interleaved, as TorchScript's Gather export does."""
    original = onnx.ModelProto()
    original.CopyFrom(case.original)
    kept = [p for p in original.metadata_props if p.key != "max_position_embeddings"]
    del original.metadata_props[:]
    original.metadata_props.extend(kept)
    hd = HIDDEN // HEADS
    tables = {i.name for i in original.graph.initializer if list(i.dims) == [case.model.config.n_positions, hd // 2]}
    assert any(n.op_type == "GatherND" and n.input[0] in tables for n in original.graph.node)
    result = rewrite(original, passes=("cleanup", "rope", "gqa"))
    counts = result.report.counts
    assert counts["RotaryEmbeddingInterleaved"] == counts["RotaryEmbeddingPartialBSNH"] == 2 * LAYERS, counts
    fused = ir.serde.serialize_model(result.model)
    ops = _ops(fused)
    assert ops["RotaryEmbedding"] == 2 * LAYERS and ops["GroupQueryAttention"] == LAYERS and ops["Neg"] == 0, ops
    for node in fused.graph.node:
        if node.op_type == "RotaryEmbedding":
            attrs = _attrs(node)
            assert (attrs["interleaved"], attrs["rotary_embedding_dim"], attrs["num_heads"]) == (1, hd // 2, HEADS)
    ref, new = _session(original), _session(fused)
    prefill = _prefill_feeds(case)
    want = _run(ref, prefill)
    assert max(_max_diff(want, _run(new, prefill)).values()) < FP32_TOL
    decode = _decode_feeds(prefill, want)
    assert max(_max_diff(_run(ref, decode), _run(new, decode)).values()) < FP32_TOL


def test_fp32_rewrite_keeps_prefill_and_decode_numerics(case):
    ref, new = _session(case.original), _session(case.fused)
    prefill = _prefill_feeds(case)
    want = _run(ref, prefill)
    diffs = _max_diff(want, _run(new, prefill))
    assert max(diffs.values()) < FP32_TOL, diffs
    decode = _decode_feeds(prefill, want)
    diffs = _max_diff(_run(ref, decode), _run(new, decode))
    assert max(diffs.values()) < FP32_TOL, diffs


def test_rewrite_is_idempotent_on_exported_graphs(case):
    again = rewrite(case.fused, passes=("cleanup", "rope", "gqa"))
    fusions = {k: v for k, v in again.report.counts.items() if k != "cleanup.removed_nodes"}
    assert fusions == {}, fusions


def test_int4_packs_every_linear_within_quantizer_error(case):
    ops = _ops(case.int4)
    assert ops["MatMulNBits"] == case.n_linear, case.int4_counts
    assert ops["MatMul"] == 0
    _assert_rope_fused(ops, case.arch, case.int4)
    assert ops["GroupQueryAttention"] == LAYERS
    reference, worst_step = _dequantized_reference(case.fused)
    assert 0.4 < worst_step <= 1.0 + 1e-5, worst_step  # RTN: within one quantization step per block
    ref, q4 = _session(reference), _session(case.int4)
    prefill = _prefill_feeds(case)
    want, got = _run(ref, prefill), _run(q4, prefill)
    diffs = _max_diff(want, got)
    assert max(diffs.values()) < INT4_TOL, diffs
    decode = _decode_feeds(prefill, want)
    diffs = _max_diff(_run(ref, decode), _run(q4, decode))
    assert max(diffs.values()) < INT4_TOL, diffs
    # and the weights really are 4-bit: the logits moved away from fp32 (by 19-43% of max |logit| on these tiny
    # random models, top-1 agreement 71-93%: the quantizer's error, identical in the reference above)
    float_logits = _run(_session(case.fused), prefill)["logits"]
    assert np.abs(got["logits"] - float_logits).max() > 1e-3


# --- transformers' default attention ("sdpa"): torch's scaled_dot_product_attention decomposition ----------
SDPA_CASES = [pytest.param((a, "torchscript"), id=f"{a}-torchscript") for a in torch_export.ARCHS] + [
    pytest.param(("phi3", "dynamo"), id="phi3-dynamo"),  # K^T via a 3-D reshape and an output view
    *[pytest.param((a, "dynamo"), id=f"{a}-dynamo", marks=pytest.mark.slow) for a in ("llama", "qwen2", "gptj")]]
_SDPA: dict[tuple[str, str], tuple[onnx.ModelProto, object]] = {}


@pytest.fixture(params=SDPA_CASES)
def sdpa(request, tmp_path_factory) -> tuple[str, str, onnx.ModelProto, object]:
    """(arch, exporter, exported graph, torch model) with attn_implementation="sdpa", exported once."""
    arch, exporter = request.param
    if request.param not in _SDPA:
        kv = HEADS if arch == "gptj" else KV_HEADS
        path = torch_export.export_tiny_hf(arch, tmp_path_factory.mktemp(f"sdpa_{arch}_{exporter}") / "m.onnx",
                                           exporter=exporter, layers=LAYERS, hidden=HIDDEN, heads=HEADS,
                                           kv_heads=kv, attn_implementation="sdpa")
        model = torch_export.make_model(arch, layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=kv,
                                        attn_implementation="sdpa")
        _SDPA[request.param] = (onnx.load(str(path)), model)
    return (arch, exporter, *_SDPA[request.param])


def test_sdpa_attention_is_fused_with_unchanged_numerics(sdpa):
    arch, exporter, original, model = sdpa
    result = rewrite(original, passes=("cleanup", "rope", "gqa"))
    fused = ir.serde.serialize_model(result.model)
    ops = _ops(fused)
    _assert_rope_fused(ops, arch, fused)
    assert ops["GroupQueryAttention"] == LAYERS, result.report.counts
    assert ops["Softmax"] == 0 and ops["IsNaN"] == 0
    assert sum(v for k, v in result.report.counts.items() if ",sdpa" in k) == LAYERS
    case = Case(arch, exporter, model, original, fused, Counter(), fused, Counter())
    ref, new = _session(original), _session(fused)
    prefill = _prefill_feeds(case)
    want = _run(ref, prefill)
    assert max(_max_diff(torch_export.run_torch(model, prefill), want).values()) < FP32_TOL
    assert max(_max_diff(want, _run(new, prefill)).values()) < FP32_TOL
    decode = _decode_feeds(prefill, want)
    assert max(_max_diff(_run(ref, decode), _run(new, decode)).values()) < FP32_TOL


def _first(model: onnx.ModelProto, pred) -> onnx.NodeProto:
    return next(n for n in model.graph.node if pred(n))


@pytest.mark.parametrize("sdpa", [SDPA_CASES[4]], indirect=True)
def test_sdpa_near_miss_key_transpose_is_left_alone(sdpa):
    """A 3-D K^T whose inner Transpose swaps the wrong dims (perm [1,0,2]) is not attention: layer 0 stays."""
    original = onnx.ModelProto()
    original.CopyFrom(sdpa[2])
    t = _first(original, lambda n: n.op_type == "Transpose" and list(_attrs(n)["perm"]) == [0, 2, 1])
    t.attribute[0].ints[:] = [1, 0, 2]
    stale = [v for v in original.graph.value_info if v.name == t.output[0]]
    for v in stale:  # the exporter's shape for the transposed value no longer holds
        original.graph.value_info.remove(v)
    result = rewrite(original, passes=("cleanup", "rope", "gqa"))
    assert _ops(ir.serde.serialize_model(result.model))["GroupQueryAttention"] == LAYERS - 1
    assert any("K^T via a 3-D reshape" in f.reason for f in result.report.failures), result.report.failures


@pytest.mark.parametrize("sdpa", [SDPA_CASES[0]], indirect=True)
def test_sdpa_near_miss_output_view_is_left_alone(sdpa):
    """TorchScript's output view [B,-1,S,H] with S and -1 swapped ([B,S,-1,H]) reorders heads: layer 0 stays."""
    original = onnx.ModelProto()
    original.CopyFrom(sdpa[2])
    producers = {o: n for n in original.graph.node for o in n.output}
    guard = _first(original, lambda n: n.op_type == "Where" and producers.get(n.input[0]) is not None
                   and producers[n.input[0]].op_type == "IsNaN")
    matmul = _first(original, lambda n: n.op_type == "MatMul" and n.input[0] == guard.output[0])
    view = _first(original, lambda n: n.op_type == "Reshape" and n.input[0] == matmul.output[0])
    target = producers[view.input[1]]
    target.input[1], target.input[2] = target.input[2], target.input[1]
    result = rewrite(original, passes=("cleanup", "rope", "gqa"))
    assert _ops(ir.serde.serialize_model(result.model))["GroupQueryAttention"] == LAYERS - 1
    assert any("attention output view" in f.reason for f in result.report.failures), result.report.failures
