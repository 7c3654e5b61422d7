"""Scaled dot-product attention shared by ONNX Attention (opset 23) and com.microsoft MultiHeadAttention/Attention:
QK^T and PV on the matrix unit (float32 accumulation), scale, additive bias/mask, softcap and softmax on the vector
unit in float32 (float16 inputs widen once; one rounding on store).

``attend(q [B, N, S, H], k [B, Nkv, T, H], v [B, Nkv, T, Hv], ...)``: N is a multiple of Nkv and query head n
reads kv head n // (N / Nkv) (GQA; Nkv == N is plain multi-head). The G query heads of one kv head are stacked as
G*S rows of one matmul, so K/V are never repeated. Masked scores are -inf before the softmax; a row with every key
masked gives 0 (not NaN), as ORT's CPU kernels. With the session's native kernels, float32 attention without softcap
or intermediate scores runs ``kernels.attention_chain`` (npu::AttentionChain's kernel, ORT's masked-row rule).

The three attention ops' native path is ``kernels.sdpa`` (kernels/native/sdpa.cc), called with the op's raw inputs
(masks, past, bias, projection) so it is their bound step; ``SDPA_PARAMS`` and ``bind_sdpa`` are its Python side,
and ``attend`` with the ops' masks is what it is swept against (tests/kernels/test_sweep_sdpa.py).

Cost (``attention_cost``): both matmuls through the planner (``plan_matmul`` + ``cost.matmul_cost``: batch B*Nkv,
m = G*S rows), the softmax over B*N*S*T scores through ``cost.vector_cost`` (scale, bias, max, subtract, sum,
divide plus one exp per score); the three are summed (no overlap claimed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cost import matmul_cost, vector_cost
from ..planner import plan_matmul
from ..registry import OpCost, Prepared
from ..target import Target
from .. import runtime
from ._vector import transcendental

_F32 = np.float32


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, bias: np.ndarray | None = None,
           softcap: float = 0.0, want_scores: int | None = None, native: Any = None,
           threads: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """(output [B, N, S, Hv] float32, the requested intermediate scores [B, N, S, T] or None).

    Order as ORT 1.31's CPU kernels: scores = Q K^T * scale; softcap c > 0: c * tanh(x / c); + ``bias`` (float32,
    -inf masks, broadcastable to [B, N, S, T]); softmax. ``want_scores`` picks ORT's qk_matmul_output stage:
    0 scaled Q K^T, 1 after softcap, 2 after the mask (masked entries as float32's lowest value, as ORT), 3 softmax.
    ``native`` (the session's native kernels, on ``threads``): float32 without softcap or intermediate scores runs
    ``kernels.attention_chain`` (the same order of roundings; within float tolerance of this reference).
    """
    nat = _native_attend(native, q, k, v, bias, softcap, want_scores)
    if nat is not None:
        g = q.shape[1] // k.shape[1]
        return nat.attention_chain(q, k, v, bias, 1, scale, threads, False, True, g, g, True), None
    b, n, s, h = q.shape
    nkv, t, hv = k.shape[1], k.shape[2], v.shape[3]
    g = n // nkv
    qf, kf, vf = (x.astype(_F32, copy=False) for x in (q, k, v))
    scores = np.matmul(qf.reshape(b, nkv, g * s, h), np.swapaxes(kf, -1, -2)).reshape(b, n, s, t)
    scores *= _F32(scale)
    stage = scores.copy() if want_scores == 0 else None
    if softcap > 0.0:
        scores = np.tanh(scores / _F32(softcap)) * _F32(softcap)
    if want_scores == 1:
        stage = scores.copy()
    if bias is not None:
        scores = scores + bias.astype(_F32, copy=False)
    if want_scores == 2:
        stage = np.maximum(scores, np.finfo(_F32).min)
    peak = scores.max(axis=-1, keepdims=True)
    peak[~np.isfinite(peak)] = 0.0
    e = np.exp(scores - peak)
    total = e.sum(axis=-1, keepdims=True)
    total[total == 0] = 1.0
    e /= total
    if want_scores == 3:
        stage = e.copy()
    out = np.matmul(e.reshape(b, nkv, g * s, t), vf).reshape(b, n, s, hv)
    return out, stage


def _native_attend(native: Any, q, k, v, bias, softcap: float, want_scores: int | None) -> Any:
    """``native`` when it computes this attention: float32 operands of rank 4, heads a multiple of K's, T > 0, a
    float32 bias of rank 2..4 no wider than the scores; no softcap, no intermediate scores."""
    if native is None or softcap > 0.0 or want_scores is not None:
        return None
    if any(x.dtype != _F32 or x.ndim != 4 for x in (q, k, v)) or q.shape[1] % k.shape[1] or k.shape[2] == 0:
        return None
    if bias is not None and (bias.dtype != _F32 or not 2 <= bias.ndim <= 4 or bias.shape[-2] not in (1, q.shape[2])
                             or bias.shape[-1] not in (1, k.shape[2])):
        return None
    return native


# ``kernels.sdpa``'s parameters (kernels/native/sdpa.cc), in order: a call is a dict of them, absent ones None.
SDPA_PARAMS = ("q", "k", "v", "past_k", "past_v", "heads", "kv_heads", "scale", "softcap", "mask", "mask_kind",
               "attention_bias", "causal", "fill", "qkv_bias", "present", "qk_mode", "out", "projection", "threads")
_DEFAULTS = {"softcap": 0.0, "mask_kind": 0, "causal": 0, "fill": 0.0, "present": 0, "qk_mode": -1, "threads": 1}
_OUT_ARG = SDPA_PARAMS.index("out")
MASK_BOOL, MASK_FLOAT, MASK_LENGTHS, MASK_END_START, MASK_POSITIVE, MASK_NONZERO = 1, 2, 3, 4, 5, 6
CAUSAL_ADD_INF, CAUSAL_LOWEST, CAUSAL_ADD_FILL = 1, 2, 3


def sdpa_args(call: dict) -> tuple:
    """``call`` (parameter name -> value) as ``kernels.sdpa``'s positional arguments."""
    return tuple(call.get(name, _DEFAULTS.get(name)) for name in SDPA_PARAMS)


def run_sdpa(native: Any, call: dict) -> tuple:
    """(y, present_k, present_v, qk) of the native core for ``call``."""
    return native.sdpa(*sdpa_args(call))


def bind_sdpa(p: Prepared, native: Any, call: dict, slots: dict[str, int], inputs, outs, results: list[int]) -> Any:
    """``kernels.sdpa`` as the bound step of an attention op for these input shapes: the parameters named in
    ``slots`` take the node's runtime input of that index, the rest are held (constants, attributes); the node's
    outputs are the result's entries ``results``; y goes into ORT's buffer when it is a partition output."""
    args = list(sdpa_args(call))
    live = []
    for name, i in slots.items():
        x = inputs[i]
        args[SDPA_PARAMS.index(name)] = None
        live.append((SDPA_PARAMS.index(name), i, x.dtype, x.shape, None))
    where = p.runtime.partition_outputs
    into = [(_OUT_ARG, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, native.sdpa, tuple(args), live, [(r, None) for r in results], None, into)


def runtime_slots(inputs, names: dict[str, int]) -> dict[str, int]:
    """The parameters of ``names`` (parameter -> node input index) whose input is given at run time."""
    return {name: i for name, i in names.items() if i < len(inputs) and inputs[i] is not None}


def plain(x: np.ndarray | None, *dtypes) -> bool:
    """Whether ``x`` is None or a C-order array of one of ``dtypes`` (what the native core reads in place)."""
    return x is None or (isinstance(x, np.ndarray) and x.dtype in dtypes and x.flags.c_contiguous)


def broadcasts_to(x: np.ndarray | None, shape: tuple[int, ...]) -> bool:
    """Whether ``x`` (right-aligned, extents 1 or equal) broadcasts to ``shape`` without growing it."""
    if x is None:
        return True
    return x.ndim <= len(shape) and all(d in (1, w) for d, w in zip(x.shape[::-1], shape[::-1]))


def bool_mask_bias(mask: np.ndarray) -> np.ndarray:
    """A boolean mask (True = attend) as a float32 0/-inf bias."""
    return np.where(mask, _F32(0.0), _F32(-np.inf)).astype(_F32)


def causal_bias(s: int, t: int, offset: int) -> np.ndarray:
    """[S, T] 0/-inf bias: query i sees keys j <= i + offset."""
    return bool_mask_bias(np.arange(t)[None, :] <= np.arange(s)[:, None] + offset)


def attention_cost(target: Target, dtype: str, b: int, n: int, nkv: int, s: int, t: int, h: int, hv: int,
                   extra_bytes: int = 0) -> OpCost:
    """Cost of ``attend`` for these sizes (module docstring); ``extra_bytes``: other DMA (mask, presents)."""
    g = n // nkv
    qk = matmul_cost(plan_matmul(g * s, t, h, dtype, dtype, target, batch=b * nkv, out_dtype="float32"), target)
    pv = matmul_cost(plan_matmul(g * s, hv, t, "float32", dtype, target, batch=b * nkv, out_dtype=dtype), target)
    scores = b * n * s * t
    soft = vector_cost(target, scores, extra_bytes, 0, 6.0 + transcendental(target))
    total = OpCost(compute_cycles=qk.compute_cycles + pv.compute_cycles + soft.compute_cycles,
                   dma_cycles=qk.dma_cycles + pv.dma_cycles + soft.dma_cycles,
                   cycles=qk.cycles + pv.cycles + soft.cycles, dma_bytes=qk.dma_bytes + pv.dma_bytes + soft.dma_bytes,
                   sram_peak=max(qk.sram_peak, pv.sram_peak, soft.sram_peak), macs=qk.macs + pv.macs, unit="matrix")
    rate = target.mac_rate(qk_mode(target, dtype))
    total.utilization = total.macs / (total.cycles * rate) if total.cycles else 0.0
    return total


def qk_mode(target: Target, dtype: str) -> str:
    return target.float_mode(dtype) or "float32"


def float_mode_reason(target: Target, dtype: np.dtype | None, what: str) -> str | None:
    if dtype is None or not np.issubdtype(dtype, np.floating):
        return f"{what} needs float query/key/value"
    if target.float_mode(np.dtype(dtype).name) is None:
        return f"target {target.name} has no float matrix mode for {np.dtype(dtype).name} (QK^T and PV need one)"
    return None
