"""What generation needs to know about a decoder graph: its I/O names (exporter defaults, or those a
genai_config.json declares), layer count, KV heads and head size, KV layout per layer and vocabulary size.

KV dims the graph leaves symbolic (onnxruntime-genai declares ``kv_cache_dim``) are read from the attention node
that consumes the past inputs (``report.attention_dims``), never guessed.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import onnxruntime as ort

from ..report.attention_dims import attention_dims
from .shapes import KvCache, KvLayout


@dataclasses.dataclass(frozen=True)
class IoNames:
    """Graph I/O names; ``%d`` in the KV names is the layer index (genai_config.json's convention)."""

    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    position_ids: str | None = "position_ids"  # None: the graph derives positions itself (e.g. GQA's rotary)
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    logits: str = "logits"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"

    def past_feeds(self, cache: KvCache) -> dict[str, np.ndarray]:
        feeds = {}
        for i, (k, v) in enumerate(zip(cache.keys, cache.values)):
            feeds[self.past_key % i] = k
            feeds[self.past_value % i] = v
        return feeds


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    n_layers: int
    kv_heads: int
    head_dim: int
    layouts: tuple[KvLayout, ...] | None  # None: unknown (a session was given), detected at run time
    vocab: int | None  # logits' last dim when declared: token ids must lie in [0, vocab)
    io: IoNames = IoNames()
    feeds_position_ids: bool = True  # the graph has the position_ids input


def _count_layers(names, io: IoNames) -> int:
    n = 0
    while io.past_key % n in names:
        n += 1
    return n


def _kv_dims(model: onnx.ModelProto, name: str) -> tuple[int, int]:
    """(KV heads, head size) of past input ``name``: declared, else what its attention node needs."""
    inp = next(i for i in model.graph.input if i.name == name)
    dims = inp.type.tensor_type.shape.dim
    if len(dims) != 4:
        raise ValueError(f"past input '{name}' has rank {len(dims)}; expected [batch, kv heads, past, head size]")
    declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    fixed = {axis: size for (inp_name, axis), (size, _) in attention_dims(model).sizes.items() if inp_name == name}
    heads, head = declared[1] or fixed.get(1), declared[3] or fixed.get(3)
    if not heads or not head:
        raise ValueError(f"past input '{name}' declares {[d.dim_param or d.dim_value for d in dims]} and no "
                         "attention node fixes its KV heads and head size")
    return int(heads), int(head)


def inspect_model(model: onnx.ModelProto, io: IoNames = IoNames()) -> ModelInfo:
    g = model.graph
    inputs = {vi.name: vi for vi in g.input}
    for need in (io.input_ids, io.attention_mask, io.past_key % 0):
        if need not in inputs:
            raise ValueError(f"model has no input '{need}': expected the decoder I/O (input_ids, attention_mask, "
                             "[position_ids,] past key/value per layer; a genai_config.json may rename them)")
    n_layers = _count_layers(inputs, io)
    kv_heads, head_dim = _kv_dims(model, io.past_key % 0)
    producers = {o: n for n in g.node for o in n.output}
    layouts = []
    for i in range(n_layers):
        node = producers.get(io.present_key % i)
        op = node.op_type if node is not None else ""
        layouts.append(KvLayout.VALID_PREFIX if op == "GroupQueryAttention" else KvLayout.APPEND
                       if op == "Concat" else None)
    return ModelInfo(n_layers, kv_heads, head_dim, None if None in layouts else tuple(layouts),
                     _vocab(model, io), io, io.position_ids is not None and io.position_ids in inputs)


def _vocab(model: onnx.ModelProto, io: IoNames) -> int | None:
    """Vocabulary size: the declared last dim of the logits, else the rows of the table ``input_ids`` gathers."""
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        if out.name == io.logits and dims and dims[-1].dim_value > 0:
            return int(dims[-1].dim_value)
    tables = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == io.input_ids and n.input[0] in tables:
            return int(tables[n.input[0]].dims[0])
    return None


def check_kv_memory(info: ModelInfo, capacity: int) -> None:
    """Refuse, before allocating, a KV cache (fp32 keys and values of every layer) above half the machine's RAM."""
    need = 2 * info.n_layers * max(info.kv_heads, 1) * max(capacity, 0) * max(info.head_dim, 1) * 4
    try:
        budget = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        budget = 8 << 30
    if need > budget:
        raise ValueError(f"a KV cache of {capacity} tokens needs {need / 2**30:,.1f} GiB ({info.n_layers} layers x "
                         f"key+value x {info.kv_heads} heads x {info.head_dim}, fp32), more than half of this "
                         f"machine's memory ({budget / 2**30:,.1f} GiB); lower max_kv_len (--max-kv-len)")


def info_from_session(sess: ort.InferenceSession, io: IoNames = IoNames()) -> ModelInfo:
    ins = {i.name: i for i in sess.get_inputs()}
    if io.past_key % 0 not in ins:
        raise ValueError(f"session has no input '{io.past_key % 0}'")
    n_layers = _count_layers(ins, io)
    shape = ins[io.past_key % 0].shape
    if not (isinstance(shape[1], int) and isinstance(shape[3], int)):
        raise ValueError(f"past input '{io.past_key % 0}' declares {shape}: a session hides which attention node "
                         "fixes its KV heads and head size; pass the model file instead")
    logits = next((o.shape for o in sess.get_outputs() if o.name == io.logits), None)
    vocab = logits[-1] if logits and isinstance(logits[-1], int) and logits[-1] > 0 else None
    return ModelInfo(n_layers, int(shape[1]), int(shape[3]), None, vocab, io,
                     io.position_ids is not None and io.position_ids in ins)


def detect_layouts(presents, cache: KvCache, new: int) -> tuple[KvLayout, ...]:
    """Without the graph: the cache keeps unused slots at zero, so an APPEND present (a copy of the past there)
    holds zeros at slots L..L+new-1, while a VALID_PREFIX present holds the new keys."""
    lo = cache.length
    return tuple(KvLayout.APPEND if not np.any(pk[:, :, lo: lo + new]) else KvLayout.VALID_PREFIX
                 for pk, _ in presents)
