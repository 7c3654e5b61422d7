"""The KV cache formats an NPU holds its keys and values in (the target's ``kv_cache_dtype``, provider option
``kv_cache_dtype``): opt-in, because every format but float32 changes the numerics.

Formats (symmetric quantization, no zero point; scales float32):
  float32         the model's own values (the default: nothing changes)
  float16         each value rounded to float16
  int8_per_head   int8 codes in [-127, 127], one scale per (token, kv head): amax over the H values / 127
  int8_per_token  int8 codes in [-127, 127], one scale per token: amax over all kv heads' values / 127
  int4_per_head   int4 codes in [-7, 7], one scale per (token, kv head): amax / 7

Keys and values get scales of their own. A code is ``rint(x / scale)`` (ties to even) clipped to the range, in
float32; a zero amax gives scale 0 and codes 0. Scales are per token because the cache is written one step at a
time: a token's scale never changes once written, so later writes never requantize earlier rows.

Emulated, as the rest of the NPU: the attention kernel quantizes each new K/V row when it writes it into the present
and keeps the dequantized value (codes * scale) there; every later read of that row is then what dequantizing the
stored codes gives, bit for bit. The format is costed at its own size (``row_bytes``): codes plus scales.
"""

from __future__ import annotations

import numpy as np

from ..target import KV_CACHE_DTYPES

DEFAULT = "float32"
_QMAX = {"int8_per_head": 127, "int8_per_token": 127, "int4_per_head": 7}
_CODE_BITS = {"float32": 32, "float16": 16, "int8_per_head": 8, "int8_per_token": 8, "int4_per_head": 4}
SCALE_BYTES = 4

assert set(_CODE_BITS) == set(KV_CACHE_DTYPES)


def check(fmt: str) -> str:
    if fmt not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV cache format {fmt!r} (known: {', '.join(KV_CACHE_DTYPES)})")
    return fmt


def store(fmt: str, rows: np.ndarray) -> None:
    """Quantize-dequantize new K or V rows in place as the format stores them. ``rows`` is [..., Nkv, S, H] (any
    leading dims, e.g. key and value stacked): per head, a scale per [H] vector; per token, per [Nkv, H] slab."""
    if fmt == DEFAULT or rows.size == 0:
        return
    if fmt == "float16":
        rows[...] = rows.astype(np.float16)
        return
    qmax = _QMAX[fmt]
    axes = (-3, -1) if fmt == "int8_per_token" else (-1,)
    amax = np.max(np.abs(rows), axis=axes, keepdims=True).astype(np.float32)
    scale = amax / np.float32(qmax)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.rint(rows.astype(np.float32) / safe), -qmax, qmax)
    rows[...] = np.where(scale > 0, codes * scale, np.float32(0))


def row_bytes(fmt: str, nkv: int, h: int, itemsize: int) -> float:
    """Bytes one token's K (or V) takes in the cache across its Nkv heads: codes plus scales (float32 keeps the
    model's own itemsize)."""
    if fmt == DEFAULT:
        return float(nkv * h * itemsize)
    codes = nkv * h * _CODE_BITS[fmt] / 8
    scales = {"int8_per_head": nkv, "int4_per_head": nkv, "int8_per_token": 1}.get(fmt, 0)
    return codes + scales * SCALE_BYTES
