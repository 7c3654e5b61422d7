"""Through the public pipeline (cleanup -> rope -> gqa): the tiny Llama stays a drop-in replacement for greedy
generation with the KV cache."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from npu_ep.models.feeds import decoder_feeds, split_outputs
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama_proto
from npu_ep.models.weights import LlamaConfig

rewriter = pytest.importorskip("npu_ep.rewriter")

CFG = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  intermediate_size=192, vocab_size=300, max_position_embeddings=256)


def _greedy(sess: ort.InferenceSession, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    names = [o.name for o in sess.get_outputs()]
    logits, past = split_outputs(names, sess.run(None, decoder_feeds(CFG, np.array([ids]))))
    tokens, last = [], [logits[0, -1]]
    for _ in range(steps):
        tokens.append(int(last[-1].argmax()))
        logits, past = split_outputs(names, sess.run(None, decoder_feeds(CFG, np.array([[tokens[-1]]]), past=past)))
        last.append(logits[0, -1])
    return tokens, last


@pytest.mark.parametrize("style", ["dynamo", "torchscript"])
def test_pipeline_fuses_and_generation_is_token_identical(style):
    original = build_tiny_llama_proto(CFG, style=style)
    result = rewriter.rewrite(original, passes=("cleanup", "rope", "gqa"))
    fused = ir.serde.serialize_model(result.model)
    op_types = [n.op_type for n in fused.graph.node]
    assert op_types.count("RotaryEmbedding") == 0  # folded into the attention (do_rotary=1)
    assert op_types.count("GroupQueryAttention") == CFG.num_hidden_layers
    assert result.report.counts["FoldRotaryIntoGQA"] == CFG.num_hidden_layers
    ref = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    new = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = [t % CFG.vocab_size for t in PROMPTS[1]]
    ref_tokens, ref_logits = _greedy(ref, ids, 12)
    new_tokens, new_logits = _greedy(new, ids, 12)
    assert new_tokens == ref_tokens
    assert max(float(np.abs(a - b).max()) for a, b in zip(ref_logits, new_logits)) < 1e-4


@pytest.mark.parametrize("style", ["dynamo", "torchscript"])
def test_rope_and_gqa_named_without_cleanup_run_it_and_fuse_every_layer(style):
    """rope/gqa match on static shapes and folded constants that only cleanup provides: naming them alone used to
    fuse nothing (0 of N attention blocks); the pipeline now runs cleanup first and says so."""
    original = build_tiny_llama_proto(CFG, style=style)
    alone = rewriter.rewrite(original, passes=("rope", "gqa"))
    named = rewriter.rewrite(original, passes=("cleanup", "rope", "gqa"))
    assert alone.report.counts == named.report.counts
    assert sum(n for rule, n in alone.report.counts.items()
               if rule.startswith("GroupQueryAttention[")) == CFG.num_hidden_layers
    assert alone.report.notes == ["pass 'cleanup' added: rope, gqa need(s) it"]
    assert named.report.notes == []
    fused = ir.serde.serialize_model(alone.model)
    ref = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    new = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = [t % CFG.vocab_size for t in PROMPTS[1]]
    assert _greedy(new, ids, 4)[0] == _greedy(ref, ids, 4)[0]
