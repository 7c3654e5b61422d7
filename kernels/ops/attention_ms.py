"""com.microsoft Attention (packed QKV projection + attention) on the matrix and vector units: the op ORT's
transformer optimizer fuses BERT/GPT-2 self-attention into. On the native kernels of an AVX-512 host (constant
weights and bias) the bound step and the kernel run ``kernels.sdpa`` (kernels/native/sdpa.cc): the projection on
the packed GEMM, then the attention core.

Semantics are ORT 1.31's CPU kernel (the reference; it is float32-only):
- input [B, S, Din] times weights [Din, Dq + Dk + Dv] plus bias [Dq + Dk + Dv] (bias is required, as ORT's kernel
  reads it unconditionally) gives Q, K, V; ``qkv_hidden_sizes`` = (Dq, Dk, Dv) with Dq == Dk, default D, D, D with
  D = weights' columns / 3. Head sizes are Dq / N and Dv / N.
- past [2, B, N, P, H] (key then value) is prepended to the new K/V; present [2, B, N, P + S, H] is the result.
- mask_index int32: [B] key lengths (key j of batch b kept when j < mask[b]), [2B] end then start positions
  (kept when start <= j < end), [B, T] or [B, S, T] raw 0/1 masks; masked keys get ``mask_filter_value`` (default
  -10000) ADDED, so a fully masked row averages the values as ORT's does. A [B, 1] or [1, 1] 2-D mask is ORT's
  "dummy" form and masks nothing.
- unidirectional (only when S > 1, as ORT): query i sees keys j <= P + i; later keys are set to float32's lowest
  value (replacing any mask value), as ORT's PrepareMask.
- attention_bias [B or 1, N or 1, S, T] is added to the scaled scores.
Declined with reasons: 4-D (Megatron) masks and do_rotary (ORT's CPU kernel implements neither, so there is no
reference to match), past_present_share_buffer / past_sequence_length, Dq != Dk, float16.

Cost: the projection as one [B*S, Din] x [Din, Dq+Dk+Dv] matmul through the planner, plus ``_sdpa.attention_cost``
with the mask and present DMA.
"""

from __future__ import annotations

import math

import numpy as np

from ..cost import matmul_cost
from ..node import NodeInfo
from ..planner import PlanError, plan_matmul
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._sdpa import (CAUSAL_LOWEST, MASK_END_START, MASK_LENGTHS, MASK_POSITIVE, attend, attention_cost, bind_sdpa,
                    broadcasts_to, float_mode_reason, plain, run_sdpa, runtime_slots)
from .matmul import packed_panels
from ._util import arg, stash_constants

_F32 = np.float32
_LOWEST = np.finfo(np.float32).min


def _sizes(node: NodeInfo) -> tuple[int, int, int] | None:
    """(Dq, Dk, Dv) from qkv_hidden_sizes or the weights' static column count; None when unknown."""
    sizes = node.attr("qkv_hidden_sizes", None)
    if sizes:
        return tuple(int(s) for s in sizes)
    w = node.input(1)
    if w is not None and w.shape is not None and len(w.shape) == 2 and isinstance(w.shape[1], int):
        d = w.shape[1] // 3
        return d, d, d
    return None


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    x = node.input(0)
    reason = float_mode_reason(target, x.dtype if x is not None else None, "Attention")
    if reason:
        return f"{op}: {reason}"
    if x.dtype != np.float32:
        return f"{op}: {x.dtype} not supported (ORT's CPU kernel, the reference, is float32-only)"
    n = int(node.attr("num_heads", 0))
    if n <= 0:
        return f"{op}: num_heads must be positive"
    if int(node.attr("do_rotary", 0)):
        return (f"{op}: do_rotary not supported (ORT's CPU kernel does not implement it either; fuse as "
                "MultiHeadAttention + RotaryEmbedding)")
    if int(node.attr("past_present_share_buffer", 0)) or node.input(6) is not None:
        return f"{op}: past_present_share_buffer / past_sequence_length not supported (use a concatenating past)"
    if x.shape is not None and len(x.shape) != 3:
        return f"{op}: input {x.describe()} must be [batch, sequence, hidden]"
    w = node.input(1)
    if w is None or w.shape is None or len(w.shape) != 2:
        return f"{op}: weights must be 2-D [input_hidden, Dq + Dk + Dv], got {w.describe() if w else 'none'}"
    if node.input(2) is None:
        return f"{op}: bias is required (ORT's CPU kernel reads it unconditionally)"
    sizes = _sizes(node)
    if sizes is None:
        return f"{op}: weights {w.describe()} need a static column count (or qkv_hidden_sizes)"
    dq, dk, dv = sizes
    if dq != dk or any(s <= 0 or s % n for s in sizes):
        return f"{op}: qkv_hidden_sizes {list(sizes)} need Dq == Dk and each a positive multiple of num_heads {n}"
    if isinstance(w.shape[1], int) and w.shape[1] != dq + dk + dv:
        return f"{op}: weights {w.describe()} do not have Dq + Dk + Dv = {dq + dk + dv} columns"
    past = node.input(4)
    if past is not None and dq != dv:
        return f"{op}: past with Dq {dq} != Dv {dv} not supported (the past holds one head size)"
    mask = node.input(3)
    if mask is not None:
        if mask.dtype != np.int32:
            return f"{op}: mask_index {mask.describe()} must be int32"
        if mask.shape is not None and len(mask.shape) == 4:
            return (f"{op}: 4-D (Megatron) mask_index {mask.describe()} not supported (ORT's CPU kernel does not "
                    "implement it, so there is no reference to match)")
        if mask.shape is not None and len(mask.shape) == 1 and x.shape is not None:
            b, m = x.shape[0], mask.shape[0]
            if isinstance(b, int) and isinstance(m, int) and m not in (b, 2 * b):
                return f"{op}: 1-D mask_index {mask.describe()} must be [batch] or [2 * batch] (batch {b})"
    din = w.shape[0] if isinstance(w.shape[0], int) else 1
    try:
        plan_matmul(1, dq + dk + dv, din, "float32", "float32", target)
    except PlanError as exc:
        return f"{op}: QKV projection: {exc}"
    return None


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    dq, dk, dv = _sizes(node)
    attrs = {"num_heads": int(node.attr("num_heads", 0)), "scale": float(node.attr("scale", 0.0)),
             "mask_filter_value": float(node.attr("mask_filter_value", -10000.0)),
             "unidirectional": int(node.attr("unidirectional", 0)), "sizes": [dq, dk, dv],
             "present": len(node.outputs) > 1 and not node.outputs[1].missing}
    return Prepared(attrs, stash_constants(node), target)


def _keep(mask: np.ndarray, b: int, s: int, t: int) -> np.ndarray | None:
    """mask_index as a boolean keep mask broadcastable to [B, 1, S, T] (None: the dummy form, nothing masked)."""
    if mask.ndim == 1:
        j = np.arange(t)[None, :]
        keep = j < mask[:b, None]
        if mask.shape[0] == 2 * b:
            keep &= j >= np.minimum(mask[b:, None], t)
        elif mask.shape[0] != b:
            raise ValueError(f"Attention: 1-D mask_index has {mask.shape[0]} entries; expected {b} or {2 * b}")
        return keep[:, None, None, :]
    if mask.ndim == 2:
        if mask.shape[1] == 1:
            return None
        if mask.shape != (b, t):
            raise ValueError(f"Attention: 2-D mask_index {list(mask.shape)} must be [{b}, {t}] (batch, total)")
        return (mask > 0)[:, None, None, :]
    if mask.shape != (b, s, t):
        raise ValueError(f"Attention: 3-D mask_index {list(mask.shape)} must be [{b}, {s}, {t}]")
    return (mask > 0)[:, None, :, :]


def _additive_mask(p: Prepared, mask: np.ndarray | None, b: int, s: int, t: int, past: int) -> np.ndarray | None:
    """ORT's PrepareMask: padding keys get mask_filter_value, causal-future keys float32's lowest value."""
    keep = _keep(mask, b, s, t) if mask is not None else None
    causal = p.attrs["unidirectional"] and s > 1
    if keep is None and not causal:
        return None
    add = np.zeros((b, 1, s, t), _F32)
    if keep is not None:
        add = np.where(keep, add, _F32(p.attrs["mask_filter_value"]))
    if causal:
        future = np.arange(t)[None, :] > np.arange(s)[:, None] + past
        add = np.where(future, _LOWEST, add)
    return add


_SLOTS = {"q": 0, "mask": 3, "past_k": 4, "attention_bias": 5}
_INT32 = np.dtype(np.int32)


def _mask_kind(mask: np.ndarray | None, b: int, s: int, t: int) -> int | None:
    """mask_index's kind for the native core (0: none or the [B, 1] dummy form), None where it declines (the
    reference runs or names the bad shape)."""
    if mask is None:
        return 0
    if not plain(mask, _INT32):
        return None
    if mask.ndim == 1:
        return MASK_LENGTHS if mask.shape == (b,) else MASK_END_START if mask.shape == (2 * b,) else None
    if mask.ndim == 2 and mask.shape[1] == 1:
        return 0
    return MASK_POSITIVE if mask.shape in ((b, t), (b, s, t)) else None


def _native_call(p: Prepared, inputs) -> dict | None:
    """``kernels.sdpa``'s call for these inputs, the projection on the packed GEMM (constant weights and bias, an
    AVX-512 host: ``matmul.packed_panels``), or None where it declines (the reference runs)."""
    a = p.attrs
    n = a["num_heads"]
    dq, dk, dv = a["sizes"]
    x, w, bias, mask, past, ab = (arg(p, inputs, i) for i in range(6))
    if (x is None or x.ndim != 3 or not plain(x, _F32) or not plain(past, _F32) or not plain(ab, _F32)
            or any(i < len(inputs) and inputs[i] is not None for i in (1, 2)) or not plain(bias, _F32)
            or bias is None or bias.shape != (dq + dk + dv,) or w is None or w.shape != (x.shape[2], dq + dk + dv)):
        return None
    packed = packed_panels(p, x, w)
    b, s, _ = x.shape
    p_len = 0 if past is None else past.shape[3]
    t = p_len + s
    if (packed is None or (past is not None and past.shape != (2, b, n, p_len, dq // n))
            or ((past is not None or a["present"]) and dq != dv) or not broadcasts_to(ab, (b, n, s, t))):
        return None
    kind = _mask_kind(mask, b, s, t)
    if kind is None:
        return None
    return {"q": x, "past_k": past, "heads": n, "kv_heads": n, "scale": a["scale"] or 1.0 / math.sqrt(dq // n),
            "softcap": 0.0, "mask": mask if kind else None, "mask_kind": kind, "attention_bias": ab,
            "causal": CAUSAL_LOWEST if a["unidirectional"] and s > 1 else 0, "fill": a["mask_filter_value"],
            "present": 2 if a["present"] else 0, "projection": (packed, bias, dq, dk),
            "threads": runtime.threads(p)}


def _bind(p: Prepared, inputs, outs):
    """The native core as this node's step for these input shapes (``_native_call``); a [B, 1] mask_index is no
    argument (the dummy form masks nothing)."""
    call = _native_call(p, inputs)
    if call is None:
        return None
    slots = runtime_slots(inputs, _SLOTS)
    if call["mask"] is None:
        slots.pop("mask", None)
    return bind_sdpa(p, runtime.native(p), call, slots, inputs, outs, [0, 1][:len(outs)])


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    a = p.attrs
    call = _native_call(p, inputs)
    if call is not None:
        y, present = run_sdpa(runtime.native(p), call)[:2]
        return [y, present] if a["present"] else [y]
    n = a["num_heads"]
    dq, dk, dv = a["sizes"]
    x, w, bias, mask, past, ab = (arg(p, inputs, i) for i in range(6))
    b, s, _ = x.shape
    qkv = np.matmul(x.astype(_F32, copy=False), w.astype(_F32, copy=False)) + bias.astype(_F32, copy=False)
    q, k, v = qkv[..., :dq], qkv[..., dq:dq + dk], qkv[..., dq + dk:]
    qh, kh, vh = (t.reshape(b, s, n, t.shape[-1] // n).transpose(0, 2, 1, 3) for t in (q, k, v))
    p_len = 0
    if past is not None:
        p_len = past.shape[3]
        kh = np.concatenate((past[0].astype(_F32, copy=False), kh), axis=2)
        vh = np.concatenate((past[1].astype(_F32, copy=False), vh), axis=2)
    t = kh.shape[2]
    add = _additive_mask(p, None if mask is None else np.asarray(mask), b, s, t, p_len)
    if ab is not None:
        add = ab.astype(_F32) if add is None else add + ab.astype(_F32)
    scale = a["scale"] or 1.0 / math.sqrt(dq // n)
    out, _ = attend(qh, kh, vh, scale, add, native=runtime.native(p), threads=runtime.threads(p))
    outs = [out.transpose(0, 2, 1, 3).reshape(b, s, dv).astype(x.dtype, copy=False)]
    if a["present"]:
        outs.append(np.stack((kh, vh)).astype(x.dtype, copy=False))
    return outs


def _cost(p: Prepared, shapes) -> OpCost:
    a = p.attrs
    n = a["num_heads"]
    dq, dk, dv = a["sizes"]
    b, s, din = shapes[0]
    past = shapes[4][3] if len(shapes) > 4 and shapes[4] is not None else 0
    proj = matmul_cost(plan_matmul(b * s, dq + dk + dv, din, "float32", "float32", p.target), p.target)
    extra = sum(int(np.prod(shapes[i])) * 4 for i in (3, 5) if len(shapes) > i and shapes[i] is not None)
    if a["present"]:
        extra += 2 * b * (past + s) * dq * 4
    att = attention_cost(p.target, "float32", b, n, n, s, past + s, dq // n, dv // n, extra)
    total = OpCost(compute_cycles=proj.compute_cycles + att.compute_cycles, dma_cycles=proj.dma_cycles + att.dma_cycles,
                   cycles=proj.cycles + att.cycles, dma_bytes=proj.dma_bytes + att.dma_bytes,
                   sram_peak=max(proj.sram_peak, att.sram_peak), macs=proj.macs + att.macs, unit="matrix")
    rate = p.target.mac_rate("float32")
    total.utilization = total.macs / (total.cycles * rate) if total.cycles else 0.0
    return total


register(KernelDef("com.microsoft", "Attention", _prepare, _run, _cost, _check, bind=_bind))
