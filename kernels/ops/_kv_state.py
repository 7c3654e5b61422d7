"""Stateful KV for callers without IOBinding (as OpenVINO's stateful models): NpuEP keeps each sequence's K/V of
every GroupQueryAttention node between runs of a session. ``ep.kv_state.enable`` turns it on for a session; the
contract (README, "Stateful KV"):

  * past_key/past_value are fed EMPTY ([B, Nkv, 0, H]): no KV crosses into the run. The presents come back empty
    ([B, Nkv, 0, H]) too: the K/V stay in the node's state.
  * attention_mask is [B, L + S], seqlens_k = L + S - 1 per row (right padding within the S new tokens as usual),
    so total_sequence_length = L + S.
  * a new prompt is total_sequence_length == S (ORT's first-prompt rule): the sequence restarts at 0 whatever it
    held, also after an error.
  * otherwise the run continues the sequence: each row's past length (seqlens_k + 1 - S) must equal what the
    sequence holds (an error names both), and L + S must fit the capacity (an error names it; nothing is written).
  * sequences are named per thread by ``KvState.sequence(name)``; runs outside one use ``DEFAULT``. Each
    (session, sequence) owns its buffers, so no other sequence or session sees its writes.

Each sequence of a node holds one [2, B, Nkv, C, H] buffer (keys, values) and its valid length per batch row; a run
attends against it and appends its S new rows at L..L+S-1 in place (``_kv_traffic`` counts it as an in-place call).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import numpy as np

DEFAULT = "default"


class KvStateError(ValueError):
    """A stateful run that does not fit its sequence: a wrong past length or capacity overflow."""


@dataclasses.dataclass
class Sequence:
    kv: np.ndarray          # [2, B, Nkv, C, H]: keys, values
    lengths: list[int]      # valid slots per batch row


class KvState:
    """A session's stateful KV: ``capacity`` slots per sequence and node."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"stateful KV capacity must be >= 1 token, got {capacity}")
        self.capacity = int(capacity)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sequences: dict[tuple[str, int], Sequence] = {}

    @contextlib.contextmanager
    def sequence(self, name: str) -> Iterator[None]:
        """Runs of this thread inside the block read and write sequence ``name``."""
        previous = self.current()
        self._local.name = str(name)
        try:
            yield
        finally:
            self._local.name = previous

    def current(self) -> str:
        return getattr(self._local, "name", DEFAULT)

    def reset(self, name: str | None = None) -> None:
        """Drop sequence ``name`` (every sequence when None): its next run must be a new prompt."""
        with self._lock:
            for key in [k for k in self._sequences if name is None or k[0] == name]:
                del self._sequences[key]

    def length(self, name: str = DEFAULT) -> list[int]:
        """Valid slots per batch row of sequence ``name`` (of its first node; every node holds the same)."""
        with self._lock:
            for (seq, _), state in self._sequences.items():
                if seq == name:
                    return list(state.lengths)
        return []

    def buffers(self, node: int, shape: tuple[int, int, int], dtype: np.dtype, first: bool) -> Sequence:
        """The current sequence's state of ``node`` for batch, kv heads, head size ``shape``; a new prompt
        (``first``) starts it at length 0 (fresh buffers when the shape or dtype changed)."""
        key = (self.current(), node)
        b, nkv, h = shape
        with self._lock:
            seq = self._sequences.get(key)
            if first:
                if seq is None or seq.kv.shape != (2, b, nkv, self.capacity, h) or seq.kv.dtype != dtype:
                    seq = self._sequences[key] = Sequence(np.zeros((2, b, nkv, self.capacity, h), dtype), [0] * b)
                seq.lengths = [0] * b
            elif seq is None:
                raise KvStateError(f"sequence '{key[0]}' holds no tokens: its first run must be a new prompt "
                                   "(total_sequence_length == the new tokens)")
            return seq


def check_continues(seq: Sequence, name: str, past_b: list[int], s: int, capacity: int, first: bool) -> None:
    """Refuse, before anything is written, a run whose past length is not the sequence's or that overflows."""
    if not first and past_b != seq.lengths:
        raise KvStateError(f"sequence '{name}' holds {seq.lengths} tokens per batch row but the run continues from "
                           f"{past_b} (seqlens_k + 1 - new tokens); feed total_sequence_length = held + new, or "
                           "start a new prompt")
    top = max(past_b) + s
    if top > capacity:
        raise KvStateError(f"sequence '{name}': {max(past_b)} held + {s} new tokens exceed the stateful KV capacity "
                           f"of {capacity} tokens; nothing was written (start a new prompt, or enable a larger "
                           "capacity)")
