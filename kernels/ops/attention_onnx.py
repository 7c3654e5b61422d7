"""ONNX Attention (opset 23) on the matrix and vector units (``_sdpa.attend``, the reference); on the native kernels
the bound step and the kernel run ``kernels.sdpa`` (kernels/native/sdpa.cc) for every input it takes.

Inputs: Q, K, V as 4-D [B, N, S, H] / [B, Nkv, T, H] / [B, Nkv, T, Hv], or 3-D [B, S, N*H] with the q_num_heads and
kv_num_heads attributes; attn_mask (bool: True attends, or float: added), broadcastable to [B, N, S, P + T];
past_key/past_value [B, Nkv, P, H]. Outputs: Y (the input's rank), present_key/present_value (past then the new
K/V along the sequence), qk_matmul_output (qk_matmul_output_mode 0..3).

As ORT 1.31's CPU kernel: scale defaults to 1/sqrt(H); is_causal lets query i see keys j <= i + P (the queries
follow the past), except that a single query (S = 1, a decode step) sees every key; softcap c > 0 applies
c * tanh(x / c) BEFORE the mask is added (the ONNX text orders them the other way; ORT's order is what users get),
and qk_matmul_output follows ORT's stages (see ``_sdpa.attend``); N must be a multiple of Nkv (GQA).
softmax_precision is accepted as the vector unit computes in float32 anyway.

Cost: ``_sdpa.attention_cost`` plus DMA of the mask and the presents.
"""

from __future__ import annotations

import math

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._sdpa import (CAUSAL_ADD_INF, MASK_BOOL, MASK_FLOAT, attend, attention_cost, bind_sdpa, bool_mask_bias,
                    broadcasts_to, causal_bias, float_mode_reason, plain, run_sdpa, runtime_slots)
from ._util import arg, stash_constants
from ._vector import itemsize_of

_ATTRS = (("is_causal", 0), ("kv_num_heads", 0), ("q_num_heads", 0), ("qk_matmul_output_mode", 0),
          ("scale", 0.0), ("softcap", 0.0))


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {k: node.attr(k, d) for k, d in _ATTRS}
    attrs["rank"] = len(node.input(0).shape) if node.input(0).shape is not None else 4
    attrs["outputs"] = [not v.missing for v in node.outputs]
    attrs["itemsize"] = itemsize_of(node.inputs[0])
    attrs["dtype"] = node.input(0).dtype.name
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    q = node.input(0)
    reason = float_mode_reason(target, q.dtype if q is not None else None, "Attention")
    if reason:
        return f"{op}: {reason}"
    if q.shape is not None and len(q.shape) == 3:
        n, nkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
        if n <= 0 or nkv <= 0:
            return f"{op}: 3-D Q/K/V need q_num_heads and kv_num_heads"
    if len(node.inputs) > 6 and node.input(6) is not None:
        return f"{op}: nonpad_kv_seqlen (opset 24) not supported"
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if not 0 <= mode <= 3:
        return f"{op}: qk_matmul_output_mode={mode} unknown"
    return None


def _heads(x: np.ndarray, rank: int, heads: int) -> np.ndarray:
    """[B, N, S, H] view of a 3-D [B, S, N*H] or 4-D input."""
    if rank == 4:
        return x
    b, s, d = x.shape
    return x.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)


_SLOTS = {"q": 0, "k": 1, "v": 2, "mask": 3, "past_k": 4, "past_v": 5}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _head_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray, n: int, nkv: int) -> list[tuple] | None:
    """[B, N, S, H], [B, Nkv, L, H] and [B, Nkv, L, Hv] of the operands (``_heads``'s views), None when they do
    not attend (a 3-D width that does not split into heads, mismatched batch, head size or length, N not a
    multiple of Nkv)."""
    if n <= 0 or nkv <= 0 or n % nkv or (q.ndim == 3 and (q.shape[2] % n or k.shape[2] % nkv or v.shape[2] % nkv)):
        return None
    qs, ks, vs = (x.shape if x.ndim == 4 else (x.shape[0], heads, x.shape[1], x.shape[2] // heads)
                  for x, heads in ((q, n), (k, nkv), (v, nkv)))
    if qs[0] != ks[0] or ks[0] != vs[0] or ks[1] != vs[1] or qs[3] != ks[3] or ks[2] != vs[2]:
        return None
    return [qs, ks, vs]


def _native_call(p: Prepared, inputs) -> dict | None:
    """``kernels.sdpa``'s call for these inputs on the native kernels, or None where it declines (the reference
    runs): operands not C-order of one float dtype, heads or lengths that do not attend, a mask that does not
    broadcast to the scores."""
    a = p.attrs
    want = a["outputs"]
    q, k, v, mask, past_k, past_v = (arg(p, inputs, i) for i in range(6))
    if (runtime.native(p) is None or q is None or k is None or v is None or q.dtype not in _FLOATS
            or q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim or (past_k is None) != (past_v is None)
            or not all(plain(x, q.dtype) for x in (q, k, v, past_k, past_v))):
        return None
    n, nkv = (int(a["q_num_heads"]), int(a["kv_num_heads"])) if q.ndim == 3 else (q.shape[1], k.shape[1])
    shapes = _head_shapes(q, k, v, n, nkv)
    if shapes is None:
        return None
    (b, _, s, h), (_, _, kv_len, _), (*_, hv) = shapes
    past = 0 if past_k is None else past_k.shape[2]
    if past_k is not None and (past_k.shape != (b, nkv, past, h) or past_v.shape != (b, nkv, past, hv)):
        return None
    if past + kv_len == 0 or (mask is not None and not (plain(mask, np.dtype(np.bool_), *_FLOATS)
                                                         and broadcasts_to(mask, (b, n, s, past + kv_len)))):
        return None
    kind = 0 if mask is None else MASK_BOOL if mask.dtype == np.bool_ else MASK_FLOAT
    return {"q": q, "k": k, "v": v, "past_k": past_k, "past_v": past_v, "heads": n, "kv_heads": nkv,
            "scale": float(a["scale"]) or 1.0 / math.sqrt(h), "softcap": float(a["softcap"]), "mask": mask,
            "mask_kind": kind, "causal": CAUSAL_ADD_INF if a["is_causal"] and s > 1 else 0,
            "present": 1 if any(want[1:3]) else 0, "threads": runtime.threads(p),
            "qk_mode": int(a["qk_matmul_output_mode"]) if len(want) > 3 and want[3] else -1}


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
    q, k, v = (arg(p, inputs, i) for i in range(3))
    mask, past_k, past_v = (arg(p, inputs, i) for i in range(3, 6))
    rank = q.ndim
    qh = _heads(q, rank, int(a["q_num_heads"]))
    kh = _heads(k, rank, int(a["kv_num_heads"]))
    vh = _heads(v, rank, int(a["kv_num_heads"]))
    b, n, s, h = qh.shape
    nkv = kh.shape[1]
    if n % nkv:
        raise ValueError(f"Attention: {n} query heads are not a multiple of {nkv} kv heads")
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        kh = np.concatenate((past_k, kh), axis=2)
        vh = np.concatenate((past_v, vh), axis=2)
    t = kh.shape[2]
    bias = None
    if mask is not None:
        bias = bool_mask_bias(mask) if mask.dtype == np.bool_ else mask.astype(np.float32, copy=False)
    if a["is_causal"] and s > 1:  # ORT 1.31: a single query row (decode) sees every key
        c = causal_bias(s, t, past)
        bias = c if bias is None else bias + c
    scale = float(a["scale"]) or 1.0 / math.sqrt(h)
    want = a["outputs"]
    mode = int(a["qk_matmul_output_mode"]) if len(want) > 3 and want[3] else None
    out, scores = attend(qh, kh, vh, scale, bias, float(a["softcap"]), mode, runtime.native(p), runtime.threads(p))
    if rank == 3:
        out = out.transpose(0, 2, 1, 3).reshape(b, s, n * vh.shape[3])
    outs = [out.astype(q.dtype, copy=False)]
    if len(want) > 1:
        outs.append(np.ascontiguousarray(kh))
    if len(want) > 2:
        outs.append(np.ascontiguousarray(vh))
    if mode is not None:
        outs.append(np.broadcast_to(scores, (b, n, s, t)).astype(q.dtype))
    return outs


def _cost(p: Prepared, shapes) -> OpCost:
    a = p.attrs
    qs, ks, vs = shapes[0], shapes[1], shapes[2]
    if len(qs) == 4:
        b, n, s, h = qs
        nkv, t, hv = ks[1], ks[2], vs[3]
    else:
        n, nkv = int(a["q_num_heads"]), int(a["kv_num_heads"])
        b, s, h = qs[0], qs[1], qs[2] // n
        t, hv = ks[1], vs[2] // nkv
    past = shapes[4][2] if len(shapes) > 4 and shapes[4] is not None else 0
    mask = shapes[3] if len(shapes) > 3 else None
    extra = (int(np.prod(mask)) * 4 if mask is not None else 0) + 2 * b * nkv * (past + t) * h * a["itemsize"]
    return attention_cost(p.target, a["dtype"], b, n, nkv, s, past + t, h, hv, extra)


register(KernelDef("", "Attention", _prepare, _run, _cost, _check, bind=_bind))
