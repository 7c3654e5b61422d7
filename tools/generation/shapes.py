"""Static shapes for decoder generation on the NPU: prefill shape buckets, chunk plans and the fixed-capacity KV
cache. Pure numpy, no ORT: the generation loop (``generate.py``) builds its feeds from these.

Dimensions: S new tokens of a step (a bucket size when padded), L valid KV length before the step, C KV capacity
(the fixed past length of every step that has a past), Nkv kv heads, H head dim. KV layout [1, Nkv, *, H].

Why RIGHT padding. The exporter graph's mask accepts any 0/1 pattern, but after rewriting, ORT's
GroupQueryAttention reads only ``seqlens_k = sum(attention_mask) - 1`` and treats each row's valid keys as a
prefix of the buffer. Right padding (ones, then zeros) keeps valid tokens a prefix, so both graphs agree: causal
attention means a valid query never sees the padded tail, and the padded positions' outputs/KV are discarded.
Left padding would make GQA attend to the padded prefix.

Why a fixed-capacity past with a gap mask (not trimming). Every step that has a past feeds the whole C-slot buffer
(valid slots 0..L-1, zeros after) with ``attention_mask = [1]*L + [0]*(C-L) + [1]*S``. Shapes never change, so
decode is ONE shape and compiles once; trimming would make every decode step a new shape. Both graphs compute the
same attention from this mask (the exporter graph masks the gap; GQA only counts L + S valid keys and takes past
slots 0..L-1). They differ only in WHERE the new keys land in ``present`` (``KvLayout``): the exporter Concat
appends after all C past slots, GQA writes them at slot L. The cache copies them into slots L..L+S-1 of its own
buffer, and refuses (``KvCapacityError``) instead of ever overwriting when L + S > C.

Why chunks have this plan. GQA (ORT CPU 1.31) derives a later chunk's past length as ``valid_total - S``, which is
wrong for a padded chunk. So only the FIRST chunk (empty past, where right padding is exact) is padded: a prompt
longer than the largest bucket B is split as [n - k*B (padded to its bucket), B, B, ...], later chunks unpadded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import Enum

import numpy as np

DEFAULT_BUCKETS: tuple[int, ...] = (32, 128, 512)


class PromptTooLongError(ValueError):
    """A prompt longer than the largest bucket while chunked prefill is disabled."""


class KvCapacityError(RuntimeError):
    """The KV cache would exceed its fixed capacity; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One prefill step: tokens ``start:start+length`` of the prompt, executed padded to ``bucket`` tokens."""

    start: int
    length: int
    bucket: int
    first: bool  # empty past (the only chunk that may be padded)

    @property
    def padding(self) -> int:
        return self.bucket - self.length


def check_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    out = tuple(sorted({int(b) for b in buckets}))
    if not out or out[0] < 1:
        raise ValueError(f"buckets must be positive integers, got {tuple(buckets)}")
    return out


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket holding n tokens (n <= largest bucket)."""
    for b in buckets:
        if n <= b:
            return b
    raise PromptTooLongError(f"{n} tokens exceed the largest bucket {buckets[-1]}")


def plan_prefill(n: int, buckets: Sequence[int], *, chunked: bool = True) -> list[Chunk]:
    """Chunks covering a prompt of n tokens (see the module docstring for why only the first is padded)."""
    buckets = check_buckets(buckets)
    if n < 1:
        raise ValueError("the prompt is empty: generation needs at least one prompt token")
    big = buckets[-1]
    if n <= big:
        return [Chunk(0, n, bucket_for(n, buckets), True)]
    if not chunked:
        raise PromptTooLongError(
            f"prompt of {n} tokens is longer than the largest prefill bucket ({big}) and chunked prefill is "
            f"disabled (chunked_prefill=False; npu-generate --no-chunked-prefill); leave it on or add a bucket "
            f">= {n} (--buckets)")
    k = -(-n // big) - 1            # full chunks after the first
    first = n - k * big
    chunks = [Chunk(0, first, bucket_for(first, buckets), True)]
    chunks += [Chunk(first + j * big, big, big, False) for j in range(k)]
    return chunks


@dataclasses.dataclass
class PaddingStats:
    logical_tokens: int = 0   # prompt tokens that mattered
    executed_tokens: int = 0  # tokens the NPU computed (bucket sizes)

    @property
    def padded_tokens(self) -> int:
        return self.executed_tokens - self.logical_tokens

    @property
    def waste(self) -> float:
        """Fraction of executed prefill tokens that were padding."""
        return self.padded_tokens / self.executed_tokens if self.executed_tokens else 0.0


class KvLayout(str, Enum):
    APPEND = "append"          # present = Concat(past, new): new keys at slot P (the past buffer length)
    VALID_PREFIX = "valid_prefix"  # GroupQueryAttention: new keys at slot L (the valid past length)


class KvCache:
    """Fixed-capacity KV buffers (one key and one value per layer, [1, Nkv, C, H]) and the valid length L."""

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, capacity: int, dtype=np.float32):
        if capacity < 1:
            raise ValueError(f"KV capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.length = 0
        shape = (1, kv_heads, capacity, head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(n_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(n_layers)]

    def check_room(self, new: int) -> None:
        if self.length + new > self.capacity:
            raise KvCapacityError(
                f"KV cache full: {self.length} valid tokens + {new} new > capacity {self.capacity} "
                f"(max_kv_len); raise max_kv_len (--max-kv-len) or generate fewer tokens")

    def past_feeds(self) -> dict[str, np.ndarray]:
        feeds = {}
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            feeds[f"past_key_values.{i}.key"] = k
            feeds[f"past_key_values.{i}.value"] = v
        return feeds

    def mask(self, new: int, executed: int) -> np.ndarray:
        """[1, C + executed] int64: valid past, gap, `new` valid tokens, then right padding."""
        m = np.zeros((1, self.capacity + executed), np.int64)
        m[0, : self.length] = 1
        m[0, self.capacity: self.capacity + new] = 1
        return m

    def append(self, presents: Sequence[tuple[np.ndarray, np.ndarray]], layouts: Sequence[KvLayout], new: int,
               past_len: int) -> None:
        """Copy the `new` valid entries of each layer's present into slots L..L+new-1; `past_len` = P fed."""
        self.check_room(new)
        lo = self.length
        for i, ((pk, pv), layout) in enumerate(zip(presents, layouts)):
            src = past_len if layout is KvLayout.APPEND else lo
            if pk.shape[2] < src + new:
                raise RuntimeError(f"layer {i}: present has {pk.shape[2]} slots, expected >= {src + new} "
                                   f"({layout.value} layout)")
            self.keys[i][:, :, lo: lo + new] = pk[:, :, src: src + new]
            self.values[i][:, :, lo: lo + new] = pv[:, :, src: src + new]
        self.length += new

    def valid(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self.keys[layer][:, :, : self.length], self.values[layer][:, :, : self.length]
