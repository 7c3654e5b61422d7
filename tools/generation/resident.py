"""KV resident across runs: each layer's past and present bound (IOBinding) to the SAME OrtValue of C slots.

This is GroupQueryAttention's shared-buffer mode (ORT's contrib spec: ``past_present_share_buffer`` when
present_key/present_value alias past_key/past_value): the kernel writes only the step's S new rows at slots
L..L+S-1 and leaves every other slot as it was, so a decode step moves one token's K/V and nothing copies the
cache, neither inside the EP nor back to the caller (``KvCache.append`` in the copying path copies the new rows out
of a fresh [1, Nkv, C+S, H] present every step).

Feeds of a step (S executed tokens, n <= S of them valid, L valid past slots; GQA reads only
``seqlens_k = sum(mask) - 1`` and ``total_sequence_length = mask width``):
  * first prefill: ``attention_mask`` is [1, S] of ones. S == total marks GQA's first prompt (past length 0,
    whatever the buffer holds); the present keeps the buffer's C slots (T = max(total, C)).
  * later steps: ``attention_mask`` is [1, C]: ones for the L + S executed slots, zeros after. total = C is a static
    cache (total <= past length: present T = C, the bound buffer's shape) and GQA's past length is
    seqlens_k + 1 - S = L.
Padded rows of a step land at L+n..L+S-1 and are overwritten by the next step (whose past length is L + n); no
valid query sees them (causal). So a step needs L + S <= C (``KvCapacityError`` otherwise, before running).

Only GroupQueryAttention graphs (``KvLayout.VALID_PREFIX``) can run this way: an exporter graph's Concat always
returns a fresh P + S present.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from .model_info import ModelInfo
from .shapes import KvCapacityError, KvLayout


class ResidentKv:
    """Per-layer K and V buffers [1, Nkv, C, H] that every step binds as both past and present (module docstring).

    ``keys``/``values`` are the numpy arrays under the OrtValues: they show what the kernels wrote, in place.
    """

    def __init__(self, info: ModelInfo, capacity: int, dtype=np.float32):
        if info.layouts is not None and any(x is not KvLayout.VALID_PREFIX for x in info.layouts):
            raise ValueError("resident KV needs GroupQueryAttention presents (every layer's present written at the "
                             f"valid length); this graph's layouts are {[x.value for x in info.layouts]}")
        if capacity < 1:
            raise ValueError(f"KV capacity must be >= 1, got {capacity}")
        self.info, self.capacity, self.length = info, int(capacity), 0
        shape = (1, info.kv_heads, self.capacity, info.head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(info.n_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(info.n_layers)]
        self._values = [(ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v))
                        for k, v in zip(self.keys, self.values)]

    def check_room(self, executed: int) -> None:
        """Refuse a step whose executed rows (padding included: they are written in place) pass the capacity."""
        if self.length + executed > self.capacity:
            raise KvCapacityError(
                f"KV cache full: {self.length} valid tokens + {executed} executed > capacity {self.capacity} "
                f"(max_kv_len); raise max_kv_len (--max-kv-len) or generate fewer tokens")

    def mask(self, executed: int, first: bool) -> np.ndarray:
        """The step's attention_mask (module docstring): [1, S] ones first, else [1, C] with L + S ones."""
        if first:
            return np.ones((1, executed), np.int64)
        m = np.zeros((1, self.capacity), np.int64)
        m[0, : self.length + executed] = 1
        return m

    def bind(self, sess: ort.InferenceSession, feeds: dict[str, np.ndarray], outputs: Sequence[str]
             ) -> ort.IOBinding:
        """An IOBinding of ``feeds`` (CPU inputs), every layer's past and present to its resident buffer, and
        ``outputs`` (ORT allocates them)."""
        io, names = sess.io_binding(), self.info.io
        for name, value in feeds.items():
            io.bind_cpu_input(name, value)
        for i, (k, v) in enumerate(self._values):
            io.bind_ortvalue_input(names.past_key % i, k)
            io.bind_ortvalue_input(names.past_value % i, v)
            io.bind_ortvalue_output(names.present_key % i, k)
            io.bind_ortvalue_output(names.present_value % i, v)
        for name in outputs:
            io.bind_output(name)
        return io

    def advance(self, new: int) -> None:
        """The step's ``new`` valid tokens now hold their slots."""
        self.check_room(new)
        self.length += new

    def valid(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self.keys[layer][:, :, : self.length], self.values[layer][:, :, : self.length]

    def step_bytes(self, executed: int) -> int:
        """K/V bytes a step writes into the buffers: its executed rows of every layer, keys and values."""
        info = self.info
        return 2 * info.n_layers * info.kv_heads * executed * info.head_dim * self.keys[0].itemsize
