"""GroupQueryAttention on the native kernel (``kernels/native/gqa.cc``): float32, or float16 in/out with float32
math as the reference's; one task per (batch, kv head).

``attention_gqa._run`` resolves lengths (past_b, total_b) and the present length T as ORT does, then calls ``run``
here first. Both presents are views of one [2, B, Nkv, T, H] buffer from the node's pool (``_kv_pool``); the
native kernel fills it (past prefix, rotated new K, new V, stale rows re-zeroed) and attends in the same pass.
What it does not implement returns None with the reason stored in ``p.kernel_cache[FALLBACK]`` and the numpy reference
runs instead: float64 inputs, and lengths the reference itself refuses (its error is the one raised).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from ..registry import Prepared
from ..shape_memo import memo_per_shape
from .. import runtime
from . import _kv_traffic
from ._kv_pool import present_buffer
from ._util import arg

FALLBACK = "gqa_native_fallback"  # Prepared.kernel_cache key: why the last call ran the reference, or None
_NATIVE_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def _refusal(query: np.ndarray, past_k: np.ndarray | None, past_b: list[int], s: int, t_buf: int) -> str | None:
    if query.dtype not in _NATIVE_DTYPES:
        return f"native GroupQueryAttention takes float32 or float16 (query is {query.dtype.name})"
    top = max(past_b)
    if top + s > t_buf or (past_k is not None and top > past_k.shape[2]):
        return f"rows [{top}, {top + s}) do not fit the present/past buffers (the reference reports it)"
    return None


def _caches(p: Prepared, inputs) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches as contiguous float32 (exact for float16 caches; constant caches converted once per node)."""
    cached = p.kernel_cache.get("native_rope")
    if cached is not None:
        return cached
    cos, sin = (np.ascontiguousarray(arg(p, inputs, i), dtype=np.float32) for i in (7, 8))
    if inputs[7] is None and inputs[8] is None:  # both constants
        p.kernel_cache["native_rope"] = (cos, sin)
    return cos, sin


def _static(p: Prepared, h: int) -> tuple:
    """The call's per-node scalars (heads, scale, softcap, window, interleaved), converted once per head size
    (``shape_memo``)."""
    return memo_per_shape(p, "native_static", h, _static_made, p.attrs, h)


def _static_made(a: dict, h: int) -> tuple:
    return (int(a["num_heads"]), int(a["kv_num_heads"]), float(a["scale"]) or 1.0 / math.sqrt(h), float(a["softcap"]),
            int(a["local_window_size"]), bool(a["rotary_interleaved"]))


def run(nat: ModuleType, p: Prepared, inputs, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
        past_k: np.ndarray | None, past_v: np.ndarray | None, past_b: list[int], total_b: list[int],
        t_buf: int, into: tuple[np.ndarray, np.ndarray] | None = None) -> list[np.ndarray] | None:
    """[output, present_key, present_value] from the native kernel, or None (reason in ``p.kernel_cache[FALLBACK]``).

    The presents are ``into`` when given (the past buffers themselves: the kernel appends the new rows in place and
    leaves every other row), else ORT's own output buffers when they are outputs of the partition (written in
    place, every row past the new valid length zeroed), else views of the node's pooled buffer."""
    b, s, d = query.shape
    why = _refusal(query, past_k, past_b, s, t_buf)
    p.kernel_cache[FALLBACK] = why
    if why is not None:
        return None
    a = p.attrs
    n, nkv = a["num_heads"], a["kv_num_heads"]
    h = d // n if key is not None else d // (n + 2 * nkv)
    n, nkv, scale, softcap, window, interleaved = _static(p, h)
    shape = (b, nkv, t_buf, h)
    pk, pv = into if into is not None else (runtime.ort_output(p, 1, shape, query.dtype), None)
    if into is None and pk is not None:
        pv = runtime.ort_output(p, 2, shape, query.dtype)
    slot = None
    if pv is None:
        kv, slot = present_buffer(p, (2, *shape), query.dtype)
        pk, pv, dirty = kv[0], kv[1], slot[1]
    else:
        dirty = t_buf  # ORT's buffer holds anything: the kernel zeroes every row it does not write
    cos = sin = pos = None
    if a["do_rotary"]:
        cos, sin = _caches(p, inputs)
        pos = arg(p, inputs, 9)
        if pos is not None:
            pos = np.ascontiguousarray(pos, dtype=np.int64).reshape(-1)
    if not query.flags.c_contiguous:
        query = np.ascontiguousarray(query)
    key, value, past_k, past_v = (x if x is None or x.flags.c_contiguous else np.ascontiguousarray(x)
                                  for x in (key, value, past_k, past_v))
    out = nat.gqa(query, key, value, past_k, past_v, pk, pv, dirty, past_b, total_b, n, nkv, scale, softcap, window,
                  cos, sin, interleaved, pos, runtime.threads(p))
    if slot is not None:
        slot[1] = max(past_b) + s
    in_place = past_k is not None and _same_data(past_k, pk) and _same_data(past_v, pv)  # as the kernel decides
    _kv_traffic.count(p, in_place, 2 * nkv * h * pk.itemsize, b * s,
                      sum(past_b) if past_k is not None and not in_place else 0)
    return [out, pk, pv]


def _same_data(a: np.ndarray, b: np.ndarray) -> bool:
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def bind(p: Prepared, inputs, outs) -> Any:
    """The native path as a step the program's loop runs itself (``ep/native/gqa_step.cc``), for a decoder's node
    whose presents are outputs of the partition; None otherwise (the kernel keeps running). The step resolves the
    lengths from seqlens_k and total_sequence_length on every call as ``attention_gqa._run`` does, and declines what
    it was not bound for. Not bound while the session keeps a stateful KV (``_kv_state``): enabling one changes
    the step's runtime record, so a step bound before declines from then on."""
    where = p.runtime.partition_outputs
    ext = runtime.extension()
    if (ext is None or runtime.native(p) is None or p.kernel_cache.get(FALLBACK) is not None or not where
            or p.runtime.kv_state is not None
            or 1 not in where or 2 not in where or len(inputs) < 7 or any(x is not None for x in inputs[10:])):
        return None
    if any(inputs[i] is None and arg(p, inputs, i) is not None for i in range(7)):
        return None  # a constant query/key/value/past/length: not a decoder's step
    query, key, value, past_k, past_v, seqlens, total = inputs[:7]
    pos = inputs[9] if len(inputs) > 9 else None
    i32 = np.dtype(np.int32)
    if (query is None or query.dtype not in _NATIVE_DTYPES or (key is None) != (value is None)
            or (past_k is None) != (past_v is None) or seqlens is None or seqlens.dtype != i32 or total is None
            or total.dtype != i32 or (pos is not None and pos.dtype != np.int64)):
        return None
    a = p.attrs
    cos = sin = None
    if a["do_rotary"]:
        if inputs[7] is not None or inputs[8] is not None:
            return None
        cos, sin = _caches(p, inputs)
    elif any(x is not None for x in inputs[7:9]):
        return None
    n, nkv = a["num_heads"], a["kv_num_heads"]
    d = query.shape[-1]
    h = d // n if key is not None else d // (n + 2 * nkv)
    n, nkv, scale, softcap, window, interleaved = _static(p, h)
    shape = lambda x: None if x is None else x.shape
    return ext.GqaStep(query.dtype, query.shape, shape(key), shape(past_k), seqlens.shape, total.shape, shape(pos),
                       cos, sin, (where[1], where[2]), n, nkv, scale, softcap, window, interleaved,
                       runtime.threads(p), [runtime.guard(p)],
                       _kv_traffic.counters(p))
