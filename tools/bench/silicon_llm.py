"""Llama-3.2-shaped int4 decoders for the calibration's LLM rows, projected per token without building all layers.

``shared/reference/npu-measured/llm_calibration.csv`` gives tokens per second and the time to first token of
Llama-3.2-1B/3B-Instruct (w4a16 through Qualcomm's Genie) on real devices. The decoders are built by the project's
own builder (``models/tiny_llama.py``) at the real widths with random weights and rewritten by ``npu-rewrite``
(cleanup, rope, gqa, int4). Layers are identical, so the cost model's work is affine in the layer count: a 1-layer
and a 2-layer build give the embedding/head work and the per-layer work, and the real depth is extrapolated
exactly (``Work`` is additive). Scenarios, stated once: TTFT is one prompt-processor window (128 new tokens, no
past), the measured ``ttft_min_ms``; a decode step has that window as its past, and tokens/s is its inverse.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...kernels.projection import Work, timeline_work
from ...kernels.target import Target

ARCHS: dict[str, dict[str, int | bool]] = {  # the models' published configs (hidden, FFN, heads, layers, vocab)
    "llama_v3_2_1b_instruct": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                   num_key_value_heads=8, num_hidden_layers=16, vocab_size=128256,
                                   tie_word_embeddings=True),
    "llama_v3_2_3b_instruct": dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                                   num_key_value_heads=8, num_hidden_layers=28, vocab_size=128256,
                                   tie_word_embeddings=True),
}
WINDOW = 128  # the prompt processor's sequence length in every LLM row


def decoder_path(name: str, layers: int, cache: Path) -> Path:
    """The rewritten int4 decoder of ``name``'s widths with ``layers`` layers, built on first use."""
    from ...models.tiny_llama import build_tiny_llama
    from ...models.weights import LlamaConfig
    from ...rewriter import rewrite

    dst = cache / f"{name}_L{layers}.int4.onnx"
    if dst.is_file():
        return dst
    cache.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(**{**ARCHS[name], "num_hidden_layers": layers, "max_position_embeddings": 4096})
    src = build_tiny_llama(cache / f"{name}_L{layers}.{os.getpid()}.fp32.onnx", cfg)
    try:
        result = rewrite(str(src), passes=("cleanup", "rope", "gqa", "int4"))
        tmp = dst.with_suffix(f".{os.getpid()}.tmp")
        result.save(tmp)
        os.replace(tmp, dst)
    finally:
        src.unlink(missing_ok=True)
        Path(f"{src}.data").unlink(missing_ok=True)
    return dst


def _work(path: Path, target: Target, new_tokens: int, past: int) -> Work:
    from ..report.build import build_report

    dims = {"batch": 1, "sequence": new_tokens, "past_sequence": past, "total_sequence": past + new_tokens}
    doc = build_report(str(path), target=target.name, dims=dims, check=False)
    return timeline_work(doc["timeline"], target)


def scenario_work(name: str, target: Target, cache: Path) -> dict[str, Work]:
    """{"ttft": Work of one 128-token window, "decode": Work of one token after it} at the real depth."""
    one, two = decoder_path(name, 1, cache), decoder_path(name, 2, cache)
    layers = int(ARCHS[name]["num_hidden_layers"])
    out = {}
    for scenario, (new, past) in {"ttft": (WINDOW, 0), "decode": (1, WINDOW)}.items():
        w1, w2 = _work(one, target, new, past), _work(two, target, new, past)
        per_layer = Work(*(b - a for a, b in zip(_fields(w1), _fields(w2))))
        out[scenario] = Work(*(a + (layers - 1) * d for a, d in zip(_fields(w1), _fields(per_layer))))
    return out


def _fields(w: Work) -> tuple:
    import dataclasses

    return dataclasses.astuple(w)
