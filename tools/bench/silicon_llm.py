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
from collections.abc import Callable, Mapping
from pathlib import Path

from ...kernels.projection import Work
from ...kernels.target import Target

ModelWork = Callable[[Path, Target, Mapping[str, int]], Work]  # silicon.model_work's signature

# The models' published configs (hidden, FFN, heads, layers, vocab). Their embeddings are tied; the deployed w4a16
# models quantize the output projection as a weight of its own, so it is built untied here and becomes an int4
# MatMulNBits like every other projection (tied, it would stay a float MatMul behind a Transpose of the table).
ARCHS: dict[str, dict[str, int | bool]] = {
    "llama_v3_2_1b_instruct": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                   num_key_value_heads=8, num_hidden_layers=16, vocab_size=128256),
    "llama_v3_2_3b_instruct": dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                                   num_key_value_heads=8, num_hidden_layers=28, vocab_size=128256),
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
        rewrite(str(src), passes=("cleanup", "rope", "gqa", "int4")).save(dst)  # atomic, data file beside it
    finally:
        src.unlink(missing_ok=True)
        Path(f"{src}.data").unlink(missing_ok=True)
    return dst


def scenario_work(name: str, target: Target, cache: Path, model_work: ModelWork) -> dict[str, Work]:
    """{"ttft": Work of one 128-token window, "decode": Work of one token after it} at the real depth: the
    2-layer build's ops beyond the 1-layer build's are one layer, repeated. ``model_work`` is the benchmark's
    ``silicon.model_work`` (passed in: the benchmark imports this module)."""
    one, two = decoder_path(name, 1, cache), decoder_path(name, 2, cache)
    layers = int(ARCHS[name]["num_hidden_layers"])

    def work(path: Path, new_tokens: int, past: int) -> Work:
        return model_work(path, target, {"batch": 1, "sequence": new_tokens, "past_sequence": past,
                                         "total_sequence": past + new_tokens})

    return {scenario: work(two, new, past).scaled_difference(work(one, new, past), layers - 2)
            for scenario, (new, past) in {"ttft": (WINDOW, 0), "decode": (1, WINDOW)}.items()}
