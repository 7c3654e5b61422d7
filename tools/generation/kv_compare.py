"""What a KV cache format does to generation (``npu-generate --compare-kv``): the same greedy generation on NpuEP
with the KV cache in float32 and in each format asked for (provider option ``kv_cache_dtype``), compared.

Per format, two runs against float32 KV's greedy tokens:
  * teacher-forced: every decode step reads float32 KV's token (``Generator.generate(feed_tokens=...)``), so each
    of the N steps sees the same context in both runs: logit drift (max and mean |difference| of the logits rows
    over the N steps) and top-1 agreement (the fraction of steps whose greedy token is float32 KV's);
  * free-running: greedy on its own tokens: the fraction equal to float32 KV's at the same position, and the first
    step where they differ (after it the contexts differ, so only this run's tokens are compared).
The KV bytes per token are the format's own size (``kernels/ops/_kv_format.row_bytes``: codes plus scales, every
layer's keys and values).
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

BASELINE = "float32"


@dataclasses.dataclass
class KvFormatEffect:
    kv_cache_dtype: str
    tokens: list[int]             # free-running greedy tokens
    agreement: float              # teacher-forced: fraction of steps whose greedy token is float32 KV's
    max_abs_drift: float          # teacher-forced: max |logits - float32 KV's logits| over the N steps
    mean_abs_drift: float         # teacher-forced: mean of the same
    free_agreement: float         # free-running: fraction of tokens equal to float32 KV's at the same position
    first_divergence: int | None  # free-running: first step whose token differs (None: all equal)
    kv_bytes_per_token: float     # every layer's K and V of one token in this format

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def kv_bytes_per_token(fmt: str, n_layers: int, kv_heads: int, head_dim: int) -> float:
    from ...kernels.ops._kv_format import row_bytes

    return 2 * n_layers * row_bytes(fmt, kv_heads, head_dim, 4)


def effect(fmt: str, forced, free, base, n_layers: int, kv_heads: int, head_dim: int) -> KvFormatEffect:
    """One format's teacher-forced and free-running GenerationResults against float32 KV's (logits kept)."""
    n = min(len(forced.tokens), len(base.tokens))
    diffs = [np.abs(a.astype(np.float64) - b) for a, b in zip(forced.logits[:n], base.logits[:n])]
    same = [a == b for a, b in zip(free.tokens, base.tokens)]
    return KvFormatEffect(fmt, list(free.tokens), sum(a == b for a, b in zip(forced.tokens, base.tokens)) / n,
                          float(max(d.max() for d in diffs)), float(np.mean([d.mean() for d in diffs])),
                          sum(same) / len(same), next((i for i, ok in enumerate(same) if not ok), None),
                          kv_bytes_per_token(fmt, n_layers, kv_heads, head_dim))


def compare_kv_formats(model, prompt: Sequence[int], max_new_tokens: int, formats: Sequence[str], *,
                       npu_options: dict[str, str] | None = None, **generator_args: Any) -> list[KvFormatEffect]:
    """float32 KV first, then each of ``formats``, one NpuEP session each (see the module docstring)."""

    from ...kernels.target import KV_CACHE_DTYPES
    from .generator import Generator
    from .shapes import KvLayout

    bad = [f for f in formats if f not in KV_CACHE_DTYPES]
    if bad:
        raise ValueError(f"unknown KV cache format(s) {', '.join(bad)} (known: {', '.join(KV_CACHE_DTYPES)})")
    results = {}
    info = None
    for fmt in [BASELINE, *[f for f in formats if f != BASELINE]]:
        options = {**(npu_options or {}), "kv_cache_dtype": fmt}
        gen = Generator(model, providers=[(get_ep_name(), options), "CPUExecutionProvider"],
                        **generator_args)
        info = gen.info
        if info.layouts is None or any(x is not KvLayout.VALID_PREFIX for x in info.layouts):
            raise ValueError("KV cache formats are kept by GroupQueryAttention's kernel: this graph's presents do "
                             "not all come from GroupQueryAttention (rewrite it with npu-rewrite --passes ...,gqa)")
        free = gen.generate(prompt, max_new_tokens, keep_logits=True)
        forced = free if fmt == BASELINE else gen.generate(prompt, max_new_tokens, keep_logits=True,
                                                           feed_tokens=results[BASELINE][1].tokens)
        results[fmt] = (forced, free)
    base = results[BASELINE][1]
    return [effect(fmt, forced, free, base, info.n_layers, info.kv_heads, info.head_dim)
            for fmt, (forced, free) in results.items()]


def format_effects(effects: Sequence[KvFormatEffect]) -> str:
    lines = [f"{'KV format':<16s} {'bytes/token':>12s} {'max |dlogit|':>13s} {'mean |dlogit|':>14s} "
             f"{'top-1 agree':>11s} {'free agree':>10s} {'first diff':>10s}"]
    for e in effects:
        first = "-" if e.first_divergence is None else str(e.first_divergence)
        lines.append(f"{e.kv_cache_dtype:<16s} {e.kv_bytes_per_token:12,.0f} {e.max_abs_drift:13.3e} "
                     f"{e.mean_abs_drift:14.3e} {e.agreement:11.1%} {e.free_agreement:10.1%} {first:>10s}")
    return "\n".join(lines)
