"""What a KV cache format does to generation (``npu-generate --compare-kv``): the same greedy generation on NpuEP
with the KV cache in float32 and in each format asked for (provider option ``kv_cache_dtype``), compared.

Per format: greedy token agreement over the N generated tokens (the fraction equal at their position, and the
first step where they differ), and the logit drift against float32 KV (max and mean |difference| of the logits
rows) over the steps before that first difference, where both runs have read the same tokens; after it the
contexts differ and the logits are no longer comparable. The KV bytes per token are the format's own size
(``kernels/ops/_kv_format.row_bytes``: codes plus scales, every layer's keys and values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

BASELINE = "float32"


@dataclasses.dataclass
class KvFormatEffect:
    kv_cache_dtype: str
    tokens: list[int]
    agreement: float              # fraction of generated tokens equal to float32 KV's at the same position
    first_divergence: int | None  # first generated step whose token differs (None: all equal)
    compared_steps: int           # steps whose logits are compared (before the first divergence, inclusive)
    max_abs_drift: float          # max |logits - float32 KV's logits| over the compared steps
    mean_abs_drift: float         # mean of the same
    kv_bytes_per_token: float     # every layer's K and V of one token in this format

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def kv_bytes_per_token(fmt: str, n_layers: int, kv_heads: int, head_dim: int) -> float:
    from ...kernels.ops._kv_format import row_bytes

    return 2 * n_layers * row_bytes(fmt, kv_heads, head_dim, 4)


def effect(fmt: str, got, base, n_layers: int, kv_heads: int, head_dim: int) -> KvFormatEffect:
    """Compare one format's GenerationResult with float32 KV's (both kept their logits)."""
    n = min(len(got.tokens), len(base.tokens))
    same = [a == b for a, b in zip(got.tokens[:n], base.tokens[:n])]
    first = next((i for i, ok in enumerate(same) if not ok), None)
    upto = n if first is None else first + 1  # the first differing step still read the same context
    diffs = [np.abs(a.astype(np.float64) - b) for a, b in zip(got.logits[:upto], base.logits[:upto])]
    return KvFormatEffect(fmt, list(got.tokens), sum(same) / n if n else 1.0, first, upto,
                          float(max(d.max() for d in diffs)) if diffs else 0.0,
                          float(np.mean([d.mean() for d in diffs])) if diffs else 0.0,
                          kv_bytes_per_token(fmt, n_layers, kv_heads, head_dim))


def compare_kv_formats(model, prompt: Sequence[int], max_new_tokens: int, formats: Sequence[str], *,
                       npu_options: dict[str, str] | None = None, **generator_args: Any) -> list[KvFormatEffect]:
    """float32 KV first, then each of ``formats``, one NpuEP session each (see the module docstring)."""
    import npu_ep

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
        gen = Generator(model, providers=[(npu_ep.get_ep_name(), options), "CPUExecutionProvider"],
                        **generator_args)
        info = gen.info
        if info.layouts is None or any(x is not KvLayout.VALID_PREFIX for x in info.layouts):
            raise ValueError("KV cache formats are kept by GroupQueryAttention's kernel: this graph's presents do "
                             "not all come from GroupQueryAttention (rewrite it with npu-rewrite --passes ...,gqa)")
        results[fmt] = gen.generate(prompt, max_new_tokens, keep_logits=True)
    base = results[BASELINE]
    return [effect(fmt, res, base, info.n_layers, info.kv_heads, info.head_dim) for fmt, res in results.items()]


def format_effects(effects: Sequence[KvFormatEffect]) -> str:
    lines = [f"{'KV format':<16s} {'bytes/token':>12s} {'agreement':>10s} {'first diff':>10s} "
             f"{'max |dlogit|':>13s} {'mean |dlogit|':>14s}"]
    for e in effects:
        first = "-" if e.first_divergence is None else str(e.first_divergence)
        lines.append(f"{e.kv_cache_dtype:<16s} {e.kv_bytes_per_token:12,.0f} {e.agreement:10.1%} {first:>10s} "
                     f"{e.max_abs_drift:13.3e} {e.mean_abs_drift:14.3e}")
    return "\n".join(lines)
