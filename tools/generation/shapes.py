"""Static shapes for decoder generation on the NPU: prefill shape buckets, chunk plans and the fixed-capacity KV
cache. Pure numpy, no ORT: the generation loop (``generator.py``) builds its feeds from these.

Dimensions: S new tokens of a step (a bucket size when padded), L valid KV length before the step, C KV capacity
(the fixed past length of every step that has a past), Nkv kv heads, H head dim. KV layout [1, Nkv, *, H].

Why RIGHT padding, and why the padded tokens are marked valid in the mask. After rewriting, ORT's
GroupQueryAttention reads only ``seqlens_k = sum(attention_mask) - 1`` and derives a step's past length as
``valid_total - S`` (ORT CPU 1.31), treating each row's valid keys as a prefix of the buffer. A step's S executed
tokens (its bucket) are therefore all ones in the mask, padding included: valid_total - S is then exactly the valid
past L for every step, the first (L = 0) and any later one. Right padding keeps the padded tokens AFTER the valid
ones, so causal attention hides them from every valid query in both graphs (the exporter graph's causal mask and
GQA's); their outputs and KV are discarded (the cache copies only the valid entries). Left padding would put them
in front of valid queries. (Marking padding with zeros is exact only for the first step: GQA then takes
past = 0 from S == total_sequence_length, while for a later step it would derive L - padding. That is why the plan
used to pad only the first chunk.)

Why a fixed-capacity past with a gap mask (not trimming). Every step that has a past feeds the whole C-slot buffer
(valid slots 0..L-1, zeros after) with ``attention_mask = [1]*L + [0]*(C-L) + [1]*S``. Shapes never change, so
decode is ONE shape and compiles once; trimming would make every decode step a new shape. Both graphs compute the
same attention from this mask (the exporter graph masks the gap; GQA only counts L + S valid keys and takes past
slots 0..L-1). They differ only in WHERE the new keys land in ``present`` (``KvLayout``): the exporter Concat
appends after all C past slots, GQA writes them at slot L. The cache copies them into slots L..L+S-1 of its own
buffer, and refuses (``KvCapacityError``) instead of ever overwriting when L + S > C. (A present that aliases the
past in place, GQA's shared buffer, also receives the padded rows at L+n..L+S-1: such a caller needs L + S <= C.)

Why chunks have this plan (``plan_prefill``). A prompt runs as entries of static shapes (``entries``): the first
prefill (empty past), prefill with history (a chunk appended after the valid past) and decode. With chunk size K
(``--prefill-chunk``; default the largest bucket): full chunks of K first, then the remainder r < K as the bucket
pieces that execute the fewest tokens (ties: fewer steps), only the LAST piece padded. The demo's 40-token prompt
with buckets (32, 128, 512) runs 32 + 8->32 (64 tokens, 38% waste) instead of 40->128 (69%), and with a 16
bucket 32 + 8->16 (17%); a 1000-token prompt at K = 128 runs 7x128 + 3x32 + 8->16 (0.8%; 7x128 + 104->128, 2.3%,
without the 16 bucket). Only the last piece pads: fewer padded tokens than its bucket holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import Enum

import numpy as np

DEFAULT_BUCKETS: tuple[int, ...] = (16, 32, 128, 512)


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
    first: bool  # empty past: the first-prefill entry; later chunks run the prefill-with-history entry

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


def chunk_buckets(buckets: Sequence[int], chunk: int | None) -> tuple[int, ...]:
    """The step sizes a prefill may use: the buckets up to the chunk size, and the chunk size itself."""
    buckets = check_buckets(buckets)
    if chunk is None:
        return buckets
    if chunk < 1:
        raise ValueError(f"the prefill chunk must be a positive number of tokens, got {chunk}")
    return check_buckets([b for b in buckets if b < chunk] + [chunk])


def _fewest_executed(r: int, sizes: tuple[int, ...]) -> list[int]:
    """Bucket sizes covering r tokens with only the last one padded: the fewest executed tokens, then the fewest
    steps, then the largest pieces first. A table over 0..r: r is below the chunk size."""
    best: list[tuple[int, int, list[int]]] = [(0, 0, [])]
    for m in range(1, r + 1):
        options = [(b, 1, [b]) for b in sizes if b >= m]  # m fits one (padded) piece
        options += [(best[m - b][0] + b, best[m - b][1] + 1, [b] + best[m - b][2]) for b in sizes if b < m]
        best.append(min(options, key=lambda o: (o[0], o[1], [-b for b in o[2]])))
    return best[r][2]


def plan_prefill(n: int, buckets: Sequence[int], *, chunked: bool = True, chunk: int | None = None) -> list[Chunk]:
    """Steps covering a prompt of n tokens: chunks of ``chunk`` tokens (default: the largest bucket), then the
    remainder in the buckets that execute the fewest tokens, only the last step padded (module docstring).
    Without ``chunked``, one step padded to the smallest bucket holding the prompt."""
    sizes = chunk_buckets(buckets, chunk)
    if n < 1:
        raise ValueError("the prompt is empty: generation needs at least one prompt token")
    if not chunked:
        buckets = check_buckets(buckets)
        if n > buckets[-1]:
            raise PromptTooLongError(
                f"prompt of {n} tokens is longer than the largest prefill bucket ({buckets[-1]}) and chunked "
                f"prefill is disabled (chunked_prefill=False; npu-generate --no-chunked-prefill); leave it on or "
                f"add a bucket >= {n} (--buckets)")
        return [Chunk(0, n, bucket_for(n, buckets), True)]
    size = sizes[-1]
    pieces = [size] * (n // size) + _fewest_executed(n % size, sizes)
    chunks, start = [], 0
    for bucket in pieces:
        length = min(bucket, n - start)
        chunks.append(Chunk(start, length, bucket, start == 0))
        start += length
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

    def mask(self, executed: int) -> np.ndarray:
        """[1, C + executed] int64: the valid past, the gap, then the step's executed tokens, right padding
        included (module docstring: GQA's past length is then L for a padded step too)."""
        m = np.zeros((1, self.capacity + executed), np.int64)
        m[0, : self.length] = 1
        m[0, self.capacity:] = 1
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
