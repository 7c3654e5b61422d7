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

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from .model_info import ModelInfo
from .shapes import KvCapacityError, KvLayout


@dataclasses.dataclass
class StepBinding:
    """An IOBinding kept per step shape, the KV and logits bound once. A step writes its tokens, positions and
    mask into the arrays and binds their OrtValues again (``inputs``): a session whose inputs live in NPU memory
    copies a host input when it is bound, so an array written after binding would not be seen."""

    io: ort.IOBinding
    ids: np.ndarray              # [1, S] int64
    positions: np.ndarray        # [1, S] int64 (bound only when the graph has position_ids)
    mask: np.ndarray             # [1, S] first prefill, else [1, C]
    logits: np.ndarray | None    # [1, S, V] bound output, when the vocabulary is known
    inputs: dict[str, ort.OrtValue]  # graph input -> the OrtValue over its array
    _keep: list                  # the logits' OrtValue: it must live as long as the binding


class ResidentKv:
    """Per-layer K and V buffers [1, Nkv, C, H] that every step binds as both past and present (module docstring).

    In host memory (default) ``keys``/``values`` are the numpy arrays under the OrtValues: they show what the
    kernels wrote, in place. With ``npu_session`` (a session on NpuEP's "npu" device, ``ep.device_memory``) the
    buffers are OrtValues in NPU memory: no KV byte crosses to the host (``keys``/``values`` are then None; ``valid``
    copies out, and the copy is counted).
    """

    def __init__(self, info: ModelInfo, capacity: int, dtype=np.float32,
                 npu_session: ort.InferenceSession | None = None):
        if info.layouts is not None and any(x is not KvLayout.VALID_PREFIX for x in info.layouts):
            raise ValueError("resident KV needs GroupQueryAttention presents (every layer's present written at the "
                             f"valid length); this graph's layouts are {[x.value for x in info.layouts]}")
        if capacity < 1:
            raise ValueError(f"KV capacity must be >= 1, got {capacity}")
        self.info, self.capacity, self.length = info, int(capacity), 0
        shape = (1, info.kv_heads, self.capacity, info.head_dim)
        if npu_session is None:
            self.keys = [np.zeros(shape, dtype) for _ in range(info.n_layers)]
            self.values = [np.zeros(shape, dtype) for _ in range(info.n_layers)]
            self._values = [(ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v))
                            for k, v in zip(self.keys, self.values)]
        else:
            from ...ep.device_memory import device_value

            self.keys = self.values = None
            self._values = [(device_value(npu_session, shape, dtype), device_value(npu_session, shape, dtype))
                            for _ in range(info.n_layers)]
        self._bindings: dict[tuple[int, int, bool], StepBinding] = {}

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

    def binding(self, sess: ort.InferenceSession, executed: int, first: bool) -> StepBinding:
        """The kept binding of ``sess`` for steps of ``executed`` tokens (``first``: the first prefill): every
        layer's past and present bound to its buffer, the inputs bound to arrays the step fills in place."""
        key = (id(sess), executed, first)
        bound = self._bindings.get(key)
        if bound is not None:
            return bound
        names, info = self.info.io, self.info
        ids, positions = np.zeros((1, executed), np.int64), np.zeros((1, executed), np.int64)
        mask = np.ones((1, executed if first else self.capacity), np.int64)
        logits = None if info.vocab is None else np.zeros((1, executed, info.vocab), np.float32)
        arrays = {names.input_ids: ids, names.attention_mask: mask}
        if info.feeds_position_ids:
            arrays[names.position_ids] = positions
        io = sess.io_binding()
        keep = []
        for i, (k, v) in enumerate(self._values):
            io.bind_ortvalue_input(names.past_key % i, k)
            io.bind_ortvalue_input(names.past_value % i, v)
            io.bind_ortvalue_output(names.present_key % i, k)
            io.bind_ortvalue_output(names.present_value % i, v)
        if logits is None:
            io.bind_output(names.logits)
        else:
            keep.append(ort.OrtValue.ortvalue_from_numpy(logits))
            io.bind_ortvalue_output(names.logits, keep[-1])
        inputs = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()}
        bound = self._bindings[key] = StepBinding(io, ids, positions, mask, logits, inputs, keep)
        return bound

    def run(self, sess: ort.InferenceSession, tokens: Sequence[int], positions: np.ndarray, executed: int,
            first: bool) -> np.ndarray:
        """One step: ``tokens`` (padded to ``executed``) at ``positions`` [executed]; returns the logits
        [1, S, V] (the bound array itself: valid until the next step of this shape). Advance separately."""
        bound = self.binding(sess, executed, first)
        bound.ids[0, :len(tokens)] = tokens
        bound.ids[0, len(tokens):] = 0
        bound.positions[0] = positions
        if not first:
            bound.mask[0, : self.length + executed] = 1
            bound.mask[0, self.length + executed:] = 0
        for name, value in bound.inputs.items():
            bound.io.bind_ortvalue_input(name, value)
        sess.run_with_iobinding(bound.io)
        return bound.logits if bound.logits is not None else bound.io.get_outputs()[-1].numpy()

    def advance(self, new: int) -> None:
        """The step's ``new`` valid tokens now hold their slots."""
        self.check_room(new)
        self.length += new

    def valid(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The valid K and V of ``layer`` (views in host memory; copies out of NPU memory)."""
        if self.keys is not None:
            return self.keys[layer][:, :, : self.length], self.values[layer][:, :, : self.length]
        k, v = self._values[layer]
        return k.numpy()[:, :, : self.length], v.numpy()[:, :, : self.length]


def kv_counters(sess: ort.InferenceSession, eps: Sequence) -> dict[str, int]:
    """Counters of ``sess`` (NpuEP sessions ``eps`` behind it): the GroupQueryAttention nodes' KV traffic
    (``kernels/ops/_kv_traffic``: in_place, appended_bytes, copied_bytes, full_copies) and the bytes that crossed
    between host and NPU memory: ``bridge_host_bytes``, partition inputs and outputs the bridge found in host
    memory, and ``copied_across_bytes``, ORT's copies through NpuEP's data transfer (a session on the "npu"
    device). Empty without an NpuEP session."""
    if not eps:
        return {}
    from ...ep.device_memory import device_counters
    from ...ep.kv_state import gqa_steps
    from ...kernels.ops import _kv_traffic
    from ...kernels.runtime import extension

    out = _kv_traffic.total(p for ep in eps for p in gqa_steps(ep))
    names = {name for ep in eps for name in ep.programs}
    stats = [s for name, s in extension().partition_stats().items() if name in names]
    out["bridge_host_bytes"] = sum(s["bytes_in"] - s["bytes_in_npu"] + s["bytes_out"] - s["bytes_out_npu"]
                                   for s in stats)
    device = device_counters(sess)
    out["copied_across_bytes"] = device["bytes_to_npu"] + device["bytes_to_host"]
    return out


def decode_step_bytes(info: ModelInfo, mask_width: int) -> int:
    """Bytes of a decode step's tensors other than the KV, which cross in every mode: input_ids, position_ids and
    the mask in, the logits [1, 1, V] out (0 for an unknown vocabulary)."""
    return 8 * (1 + int(info.feeds_position_ids) + mask_width) + 4 * (info.vocab or 0)
