"""com.microsoft MultiHeadAttention on the matrix and vector units (``_sdpa.attend``, the reference); on the native
kernels the bound step and the kernel run ``kernels.sdpa`` (kernels/native/sdpa.cc) for every input it takes.

Inputs (ORT's CPU kernel, 1.31): query [B, S, D]; key/value [B, L, D] / [B, L, Dv], or key and value already per
head [B, N, L, H] (cross attention, no past); packed QKV/KV are declined (ORT's CPU kernel has neither); bias [D + D +
Dv] (added to the projected Q, K, V); key_padding_mask int32 [B] (valid key count), [B, T] or [B, S, T] (0 masks);
attention_bias [B or 1, N or 1, S, T] added to the scores; past_key/past_value [B, N, P, H]. Outputs: output [B, S,
N*Hv], present_key/present_value [B, N, P + L, H] (past then new), optional qk. Attributes: num_heads, scale (default
1/sqrt(H)), mask_filter_value (default -10000: masked keys get this added, not -inf, so a fully masked row averages its
values as ORT's does), unidirectional (query i sees keys j <= i + P; only for as many new keys as queries, where ORT's
result is defined by that rule).

Cost: ``_sdpa.attention_cost`` plus DMA of masks and the presents.
"""

from __future__ import annotations

import math

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._sdpa import (CAUSAL_ADD_FILL, MASK_LENGTHS, MASK_NONZERO, attend, attention_cost, bind_sdpa, broadcasts_to,
                    float_mode_reason, plain, run_sdpa, runtime_slots)
from ._util import arg, stash_constants
from ._vector import itemsize_of

_F32 = np.float32


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"num_heads": int(node.attr("num_heads", 0)), "scale": float(node.attr("scale", 0.0)),
             "mask_filter_value": float(node.attr("mask_filter_value", -10000.0)),
             "unidirectional": int(node.attr("unidirectional", 0)),
             "outputs": [not v.missing for v in node.outputs], "itemsize": itemsize_of(node.inputs[0]),
             "dtype": node.input(0).dtype.name}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    q = node.input(0)
    reason = float_mode_reason(target, q.dtype if q is not None else None, "MultiHeadAttention")
    if reason:
        return f"{op}: {reason}"
    if int(node.attr("num_heads", 0)) <= 0:
        return f"{op}: num_heads must be positive"
    if q.shape is not None and len(q.shape) != 3:
        return f"{op}: packed QKV query {q.describe()} not supported (ORT's CPU kernel takes [B, S, D] only)"
    k = node.input(1)
    if k is None:
        return f"{op}: key is required"
    if k.shape is not None and len(k.shape) == 5:
        return f"{op}: packed key/value {k.describe()} not supported (ORT's CPU kernel does not implement it either)"
    if (int(node.attr("unidirectional", 0)) and q.shape is not None and k.shape is not None and len(k.shape) == 3
            and isinstance(q.shape[1], int) and isinstance(k.shape[1], int) and q.shape[1] != k.shape[1]):
        return (f"{op}: unidirectional with {k.shape[1]} new keys for {q.shape[1]} queries not supported "
                "(ORT's CPU kernel defines it for equal lengths)")
    for i, what in ((8, "past_sequence_length"), (9, "cache_indirection")):
        if len(node.inputs) > i and node.input(i) is not None:
            return f"{op}: input {what} not supported"
    return None


def _per_head(x: np.ndarray, n: int) -> np.ndarray:
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _mask_bias(mask: np.ndarray, b: int, s: int, t: int, fill: float) -> np.ndarray:
    """key_padding_mask as a [B, 1, S or 1, T] additive bias (``fill`` where masked)."""
    if mask.ndim == 1:
        keep = np.arange(t)[None, :] < mask[:, None]
        keep = keep[:, None, None, :]
    elif mask.ndim == 2:
        keep = (mask != 0)[:, None, None, :]
    else:
        keep = (mask != 0)[:, None, :, :]
    return np.where(keep, _F32(0.0), _F32(fill))


_SLOTS = {"q": 0, "k": 1, "v": 2, "qkv_bias": 3, "mask": 4, "attention_bias": 5, "past_k": 6, "past_v": 7}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_INT32 = np.dtype(np.int32)


def _mask_kind(kpm: np.ndarray | None, b: int, s: int, t: int) -> int | None:
    """key_padding_mask's kind for the native core (0: none), None where it declines (the reference runs)."""
    if kpm is None:
        return 0
    if not plain(kpm, _INT32):
        return None
    if kpm.ndim == 1:
        return MASK_LENGTHS if kpm.shape == (b,) else None
    lead = (b, t) if kpm.ndim == 2 else (b, s, t)
    return MASK_NONZERO if kpm.ndim in (2, 3) and all(d in (1, w) for d, w in zip(kpm.shape, lead)) else None


def _kv_dims(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None, n: int) -> tuple | None:
    """(head size, new keys, value head size) of [B, L, D] or per-head [B, N, L, H] key/value, None when they do
    not attend the query [B, S, D] or the bias is not [D + D + Dv] (rank-3 key/value) or at least D long."""
    b, _, d = q.shape
    if d % n or (k.ndim == 3 and (k.shape[2] % n or v.shape[2] % n)) or (k.ndim == 4 and k.shape[1] != n):
        return None
    ks, vs = ((x.shape[0], n, x.shape[1], x.shape[2] // n) if x.ndim == 3 else x.shape for x in (k, v))
    if ks[0] != b or vs[0] != b or vs[1] != n or ks[3] != d // n or vs[2] != ks[2]:
        return None
    width = 2 * d + v.shape[2] if k.ndim == 3 else d  # rank-3 key/value take their bias too
    if bias is not None and (bias.ndim != 1 or bias.shape[0] < width or (k.ndim == 3 and bias.shape[0] != width)):
        return None
    return d // n, ks[2], vs[3]


def _native_call(p: Prepared, inputs) -> dict | None:
    """``kernels.sdpa``'s call for these inputs on the native kernels, or None where it declines (the reference
    runs): operands not C-order of the query's float dtype, shapes that do not attend, a key_padding_mask not
    int32 or of another shape, an attention_bias that does not broadcast to the scores."""
    a = p.attrs
    want, n = a["outputs"], a["num_heads"]
    q, k, v, bias, kpm, ab, past_k, past_v = (arg(p, inputs, i) for i in range(8))
    if (runtime.native(p) is None or q is None or k is None or v is None or q.dtype not in _FLOATS or q.ndim != 3
            or k.ndim not in (3, 4) or v.ndim != k.ndim or (past_k is None) != (past_v is None)
            or not all(plain(x, q.dtype) for x in (q, k, v, bias, past_k, past_v))):
        return None
    dims = _kv_dims(q, k, v, bias, n)
    if dims is None:
        return None
    (b, s, _), (h, kv_len, hv) = q.shape, dims
    past = 0 if past_k is None else past_k.shape[2]
    t = past + kv_len
    if (t == 0 or (past_k is not None and (past_k.shape != (b, n, past, h) or past_v.shape != (b, n, past, hv)))
            or (a["unidirectional"] and kv_len != s) or not (plain(ab, *_FLOATS) and broadcasts_to(ab, (b, n, s, t)))):
        return None
    kind = _mask_kind(kpm, b, s, t)
    if kind is None:
        return None
    return {"q": q, "k": k, "v": v, "past_k": past_k, "past_v": past_v, "heads": n, "kv_heads": n,
            "scale": a["scale"] or 1.0 / math.sqrt(h), "mask": kpm, "mask_kind": kind, "attention_bias": ab,
            "causal": CAUSAL_ADD_FILL if a["unidirectional"] else 0, "fill": a["mask_filter_value"],
            "qkv_bias": bias, "present": 1 if any(want[1:3]) else 0,
            "qk_mode": 0 if len(want) > 3 and want[3] else -1, "threads": runtime.threads(p)}


def _bind(p: Prepared, inputs, outs):
    """The native core as this node's step for these input shapes (``_native_call``)."""
    call = _native_call(p, inputs)
    if call is None:
        return None
    return bind_sdpa(p, runtime.native(p), call, runtime_slots(inputs, _SLOTS), inputs, outs,
                     list(range(len(p.attrs["outputs"]))))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    a = p.attrs
    call = _native_call(p, inputs)
    if call is not None:
        return list(run_sdpa(runtime.native(p), call)[:len(a["outputs"])])
    n = a["num_heads"]
    q, k, v, bias, kpm, ab, past_k, past_v = (arg(p, inputs, i) for i in range(8))
    b, s, d = q.shape
    qf = q.astype(_F32)
    kh, vh = k.astype(_F32), v.astype(_F32)  # [B, L, D] or already per head [B, N, L, H]
    if bias is not None:
        bf = bias.astype(_F32)
        dv = bf.shape[0] - 2 * d
        qf = qf + bf[:d]
        if kh.ndim == 3:
            kh, vh = kh + bf[d:2 * d], vh + bf[2 * d:2 * d + dv]
    qh = _per_head(qf, n)
    if kh.ndim == 3:
        kh, vh = _per_head(kh, n), _per_head(vh, n)
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        kh = np.concatenate((past_k.astype(_F32), kh), axis=2)
        vh = np.concatenate((past_v.astype(_F32), vh), axis=2)
    t = kh.shape[2]
    add = None
    if kpm is not None:
        add = _mask_bias(kpm, b, s, t, a["mask_filter_value"])
    if a["unidirectional"]:
        if kh.shape[2] - past != s:
            raise ValueError(f"MultiHeadAttention: unidirectional needs as many new keys as queries "
                             f"({kh.shape[2] - past} keys, {s} queries)")
        causal = np.where(np.arange(t)[None, :] <= np.arange(s)[:, None] + past, _F32(0.0),
                          _F32(a["mask_filter_value"]))
        add = causal if add is None else add + causal
    if ab is not None:
        add = ab.astype(_F32) if add is None else add + ab.astype(_F32)
    scale = a["scale"] or 1.0 / math.sqrt(qh.shape[3])
    want = a["outputs"]
    out, qk = attend(qh, kh, vh, scale, add, 0.0, 0 if len(want) > 3 and want[3] else None, runtime.native(p),
                     runtime.threads(p))
    out = out.transpose(0, 2, 1, 3).reshape(b, s, n * vh.shape[3])
    outs = [out.astype(q.dtype, copy=False)]
    if len(want) > 1:
        outs.append(kh.astype(q.dtype))
    if len(want) > 2:
        outs.append(vh.astype(q.dtype))
    if len(want) > 3 and want[3]:
        outs.append(qk.astype(q.dtype))
    return outs


def _cost(p: Prepared, shapes) -> OpCost:
    a = p.attrs
    n = a["num_heads"]
    b, s, d = shapes[0]
    ks = shapes[1]
    h = d // n
    if len(ks) == 4:
        t, hv = ks[2], shapes[2][3]
    else:
        t, hv = ks[1], shapes[2][2] // n
    past = shapes[6][2] if len(shapes) > 6 and shapes[6] is not None else 0
    extra = sum(int(np.prod(shapes[i])) * 4 for i in (4, 5) if len(shapes) > i and shapes[i] is not None)
    extra += 2 * b * n * (past + t) * h * a["itemsize"]
    return attention_cost(p.target, a["dtype"], b, n, n, s, past + t, h, hv, extra)


register(KernelDef("com.microsoft", "MultiHeadAttention", _prepare, _run, _cost, _check, bind=_bind))
