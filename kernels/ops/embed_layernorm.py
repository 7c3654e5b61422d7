"""com.microsoft EmbedLayerNormalization (the BERT embedding fusion of ORT's transformer optimizer): three row
gathers by DMA, their sum and a LayerNorm on the vector unit.

Inputs (ORT 1.31's CPU kernel, float32): input_ids int32 [B, S]; optional segment_ids int32 [B, S];
word_embedding [V, D]; position_embedding [P, D]; optional segment_embedding [G, D]; gamma [D]; beta [D];
optional mask int32 [B, S]; optional position_ids int32 [B, S] or [1, S] (default: the token's index s).
Outputs: output [B, S, D]; mask_index int32 [B] (the count of mask entries equal to 1, zeros without a mask:
the key lengths com.microsoft Attention reads); optional embedding_sum [B, S, D] (the sum before the norm).
e = word[id] + position[pos] (+ segment[seg]); mean = E[e], var = E[(e - mean)^2] (two passes, as ORT);
y = (e - mean) / sqrt(var + epsilon) * gamma + beta, all in float32. An id out of its table's range is an error
naming the table, as ORT's "input index out of range". On the native kernels ``embed_layernorm``
(kernels/native/embed_layernorm.cc) computes the same float32 operations in the same order (numpy's pairwise sums),
so the same bits, bound as the step, the output into ORT's buffer when it is a partition output.

Cost: ``_vector.stream_cost`` over B*S*D elements (~6 vector ops each, one rsqrt per row); DMA of the gathered
rows, gamma/beta and the outputs.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, stash_constants
from ._vector import stream_cost

_F32 = np.float32


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"epsilon": float(node.attr("epsilon", 1e-12)), "outputs": [not v.missing for v in node.outputs]}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    ids = node.input(0)
    if ids is None or ids.dtype != np.int32:
        return f"{op}: input_ids must be int32"
    for i, what in ((2, "word_embedding"), (3, "position_embedding"), (5, "gamma"), (6, "beta")):
        v = node.input(i)
        if v is None:
            return f"{op}: {what} is required"
        if v.dtype != np.float32:
            return f"{op}: {what} {v.describe()} must be float32 (ORT's CPU kernel, the reference, is float32-only)"
    if (node.input(1) is None) != (node.input(4) is None):
        return f"{op}: segment_ids and segment_embedding go together"
    if ids.shape is not None and len(ids.shape) != 2:
        return f"{op}: input_ids {ids.describe()} must be [batch, sequence]"
    for i in (1, 7, 8):
        v = node.input(i)
        if v is not None and v.dtype != np.int32:
            return f"{op}: {v.describe()} must be int32"
    return None


def _rows(table: np.ndarray, idx: np.ndarray, what: str) -> np.ndarray:
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise ValueError(f"EmbedLayerNormalization: {what} index out of range [0, {table.shape[0]})")
    return table[idx]


_INT_INPUTS = (0, 1, 7, 8)  # input_ids, segment_ids, mask, position_ids


def _native_args(p: Prepared, values: list) -> bool:
    """Whether ``embed_layernorm`` takes these inputs: C-order int32 ids, float32 tables, gamma and beta."""
    for i, v in enumerate(values):
        if v is None:
            continue
        if type(v) is not np.ndarray or not v.flags.c_contiguous or v.dtype != (np.int32 if i in _INT_INPUTS
                                                                                 else _F32):
            return False
    return values[0].ndim == 2 and all(values[i] is not None for i in (2, 3, 5, 6))


def _native_call_args(p: Prepared, values: list, threads: int) -> tuple:
    ids, seg, word, pos_table, seg_table, gamma, beta, mask, pos_ids = values
    want = p.attrs["outputs"]
    return (ids, seg, word, pos_table, seg_table, gamma.reshape(-1), beta.reshape(-1), mask, pos_ids,
            p.attrs["epsilon"], len(want) > 2 and want[2], None, threads)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    """The reference below; on the native kernels ``embed_layernorm`` (kernels/native/embed_layernorm.cc: the same
    float32 operations in the same order, numpy's pairwise sums)."""
    values = [arg(p, inputs, i) for i in range(9)]
    nat = runtime.native(p)
    if nat is not None and _native_args(p, values):
        y, count, e = nat.embed_layernorm(*_native_call_args(p, values, runtime.threads(p)))
        return [y, count, e][:len(p.attrs["outputs"])]
    ids, seg, word, pos_table, seg_table, gamma, beta, mask, pos_ids = values
    b, s = ids.shape
    pos = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s)) if pos_ids is None else \
        np.broadcast_to(pos_ids, (b, s))
    e = _rows(word, ids, "input_ids").astype(_F32, copy=True)
    e += _rows(pos_table, pos, "position")
    if seg is not None:
        e += _rows(seg_table, seg, "segment_ids")
    d = e.shape[-1]
    centered = e - np.add.reduce(e, axis=-1, keepdims=True) / _F32(d)
    var = np.add.reduce(centered * centered, axis=-1, keepdims=True) / _F32(d)
    y = centered / np.sqrt(var + _F32(p.attrs["epsilon"]))
    y *= gamma
    y += beta
    outs = [y]
    want = p.attrs["outputs"]
    if len(want) > 1:
        count = (mask == 1).sum(axis=1) if mask is not None else np.zeros(b)
        outs.append(count.astype(np.int32))
    if len(want) > 2:
        outs.append(e)
    return outs


def _bind(p: Prepared, inputs, outs):
    """EmbedLayerNormalization as one ``embed_layernorm`` call for these input shapes, constants held in place, the
    output into ORT's buffer when it is a partition output."""
    values = [arg(p, inputs, i) for i in range(9)]
    nat = runtime.native(p)
    if nat is None or not _native_args(p, values):
        return None
    args = list(_native_call_args(p, values, runtime.threads(p)))
    live = []
    for i, v in enumerate(values):
        if v is not None and i < len(inputs) and inputs[i] is not None:
            if i in (5, 6) and v.ndim != 1:
                return None  # the kernel reads gamma/beta flattened: a runtime one must come as [D]
            live.append((i, i, v.dtype, v.shape, None))
            args[i] = None
    if not live:
        return None
    where = p.runtime.partition_outputs or {}
    into = [(at, where[k], list(outs[k].shape)) for k, at in ((0, 11), (1, 13), (2, 14))
            if k in where and k < len(outs) and outs[k] is not None]
    outputs = [(k, None) for k in range(len(p.attrs["outputs"]))]
    return runtime.call_step(p, nat.embed_layernorm, (*args, None, None), live, outputs, None, into)


def _cost(p: Prepared, shapes) -> OpCost:
    b, s = shapes[0]
    d = shapes[2][1] if shapes[2] is not None else p.consts["in2"].shape[1]
    n = b * s * d
    tables = 3 if len(shapes) > 4 and (shapes[4] is not None or "in4" in p.consts) else 2
    want = p.attrs["outputs"]
    b_out = n * 4 * (1 + (len(want) > 2 and want[2])) + b * 4
    return stream_cost(p, n, n * 4 * tables + 2 * d * 4 + b * s * 4 * 3, b_out, 6.0, 1.0 / max(d, 1))


register(KernelDef("com.microsoft", "EmbedLayerNormalization", _prepare, _run, _cost, _check, bind=_bind))
