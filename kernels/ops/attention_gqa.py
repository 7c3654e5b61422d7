"""com.microsoft GroupQueryAttention: QK^T and PV on the matrix unit, masking + softmax on the vector unit.

Layouts (B batch, S new tokens, P past buffer length, T total/present length, N heads, Nkv kv heads,
G = N / Nkv query heads per kv head, H head dim):
  query [B, S, N*H], key/value [B, S, Nkv*H]   or packed query [B, S, (N + 2 Nkv) * H] with key/value omitted
  past_key/past_value [B, Nkv, P, H] (right-padded per batch), seqlens_k [B] int32 = total_b - 1,
  total_sequence_length: scalar int32, cos_cache/sin_cache [max_pos, R/2] (do_rotary=1)
  output [B, S, N*H], present_key/present_value [B, Nkv, T, H] with T = max(total_sequence_length, P), as ORT's
  CPU EP: a static past buffer (T = P) grows by S when the step overflows it (total = P + S); ORT's shape inference
  declares T = P there and ORT only warns. Any other total > P is refused, with ORT's message.

ORT CPU semantics reproduced here:
  * first prompt (S == total_sequence_length): past_b = 0; otherwise past_b = seqlens_k[b] + 1 - S.
  * present[b, :, :past_b] = past[b, :, :past_b]; present[b, :, past_b:past_b+S] = new K/V; the rest is zero
    (ORT's non-shared-buffer path memsets present).
  * query s of batch b sees keys t with t <= past_b + s and t < total_b (causal), and, when
    local_window_size > 0, t > past_b + s - local_window_size (the window counts the query's own key, as ORT 1.31).
  * rotary positions past_b + s (also for the padding rows of a right-padded first prompt, as ORT 1.31's CPU
    kernel does), unless position_ids are given; Q and the new K rotate, V does not.
  * scale = 1/sqrt(H) unless given; softcap > 0 applies softcap * tanh(x / softcap) before masking.

No repeated KV: the G query heads of one kv head are stacked as G*S rows of one matmul,
Q [B, Nkv, G*S, H] @ K^T [B, Nkv, H, T] -> [B, Nkv, G*S, T] (== Q [B, Nkv, G, S, H] against K [B, Nkv, 1, T, H]),
so the matrix unit sees m = G*S rows even in decode (S = 1) and K/V are read once per kv head.

Host: the native kernel (``_gqa_native``, kernels/native/gqa.cc; float32 and float16) runs unless the session
chose kernels=reference or it records why not (float64, lengths outside the buffers, a KV cache format other than
float32); this numpy code is the reference model it is tested against.

KV cache format (the target's ``kv_cache_dtype``, ``_kv_format``): every path stores the new K/V rows it writes
into the present in the format (quantize, keep the dequantized value) before any score reads them, so attention
reads the past and the new rows as the format holds them; the cost model moves past and present K/V at the
format's size.
Host (numpy) implementation: a decode step is ~15 small numpy calls, so calls, not FLOPs, are its cost.
  * Q|K are copied once into a contiguous compute-dtype scratch; rotary (wide cos / signed sin tables built once
    per node for constant caches) and the Q scale run in place on it.
  * both presents are views of one [2, B, Nkv, T, H] buffer from a per-node pool (``_kv_pool``), reused once
    ORT has copied and dropped the previous outputs; a reused buffer only re-zeroes the rows its last use left
    nonzero past the new valid length.
  * only keys [lo, hi) some query can see are read, so a decode step needs no mask; other shapes add a cached
    0/-inf bias where needed. One new token of one sequence (every decode step of a batch-1 generation) runs a
    flat copy of the whole op (_one_token); a batch-1 first prompt with no past to carry (every prefill of a
    batch-1 generation) runs _first_prompt, whose presents are views of its head-major Q|K|V scratch and whose
    scores are key-major (short softmax reductions vectorized across query rows); everything else runs _general.

Cost (per execution; mode = target.float_mode(dtype), tiles padded to the native tile_m x tile_n x tile_k):
  matrix = B * Nkv * (ceil(GS/tm) ceil(T/tn) ceil(H/tk) + ceil(GS/tm) ceil(H/tn) ceil(T/tk)) * tm tn tk / macs_per_cycle
  vector = ceil(B N S T / lanes) * (5 + transcendental_cycles)      (scale/mask/max/sum/divide + exp)
  dma    = Q, K, V, past K/V in; present K/V and output out
  cycles = max(max(matrix, vector), dma) + one DMA latency (heads are pipelined: softmax of head i overlaps the
  matmuls of head i+1, and double-buffered loads overlap both).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..cost import dma_cycles
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from . import _gqa_native, _kv_format, _kv_traffic
from ._kv_pool import present_buffer
from ._kv_state import KvState, check_continues
from ._util import arg, stash_constants
from ._vector import itemsize_of, transcendental
from .rotary import rotate_inplace, signed_sin, wide_cos

_ATTRS = (("num_heads", 0), ("kv_num_heads", 0), ("scale", 0.0), ("softcap", 0.0), ("local_window_size", -1),
          ("do_rotary", 0), ("rotary_interleaved", 0))


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {k: node.attr(k, d) for k, d in _ATTRS}
    attrs["itemsize"] = itemsize_of(node.inputs[0])
    attrs["kv_format"] = target.kv_cache_dtype  # part of the compiled program (the target's digest keys the cache)
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    q = node.input(0)
    if q is None or q.dtype is None or not np.issubdtype(q.dtype, np.floating):
        return f"{op}: GroupQueryAttention needs a float query"
    if target.float_mode(q.dtype.name) is None:
        return f"{op}: target {target.name} has no float matrix mode for {q.dtype.name} (QK^T/PV need one)"
    n, nkv = int(node.attr("num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if n <= 0 or nkv <= 0 or n % nkv:
        return f"{op}: num_heads={n} must be a positive multiple of kv_num_heads={nkv}"
    for attr in ("smooth_softmax", "qk_output"):  # ORT's defaults are -1 ("off"); 0 is off too
        if int(node.attr(attr, -1)) > 0:
            return f"{op}: {attr}={node.attr(attr)} not supported"
    for i, what in ((10, "attention_bias"), (11, "head_sink")):
        if node.input(i) is not None:
            return f"{op}: optional input {what} not supported"
    if any(not o.missing for o in node.outputs[3:]):
        return f"{op}: output_qk not supported"
    return None


_ARG_KEYS = tuple(f"in{i}" for i in range(7))


def _args(p: Prepared, inputs) -> list[np.ndarray | None]:
    """Inputs 0..6 (query .. total_sequence_length) in one pass: the runtime array, else the constant."""
    consts = p.consts
    return [x if x is not None else consts.get(k) for x, k in zip(inputs, _ARG_KEYS)]


def _lengths(seqlens_k: np.ndarray, total: int, s: int) -> tuple[list[int], list[int]]:
    """(past_b, total_b) per ORT's rules (module docstring) as Python ints: a first prompt (S == total) has no past."""
    total_b = [x + 1 for x in seqlens_k.ravel().tolist()]
    past_b = [0] * len(total_b) if s == total else [x - s for x in total_b]
    if min(past_b) < 0:
        raise ValueError(f"GroupQueryAttention: seqlens_k {[x - 1 for x in total_b]} shorter than the {s} new tokens")
    return past_b, total_b


def _qk_v(query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None, n: int, nkv: int, cdt: type
          ) -> tuple[np.ndarray, np.ndarray]:
    """(qk, v): a fresh contiguous Q|K [B, S, N + Nkv, H] in the compute dtype, and the new V [B, S, Nkv, H] (a view).

    Rotary and the Q scale work in place on qk; contiguous, because the broadcasting rotary ops run several times
    faster on it than on every other head of a Q|K|V block.
    """
    b, s, d = query.shape
    if key is None:  # packed QKV
        qkv = query.reshape(b, s, n + 2 * nkv, d // (n + 2 * nkv))
        return qkv[:, :, :n + nkv].astype(cdt), qkv[:, :, n + nkv:]
    h = d // n
    return (np.concatenate((query.reshape(b, s, n, h), key.reshape(b, s, nkv, h)), axis=2, dtype=cdt),
            value.reshape(b, s, nkv, h))


def _cos_sin(p: Prepared, inputs, idx: int | slice | np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """Wide cos and signed sin rows (rotary.wide_cos / signed_sin) at positions ``idx`` (an int or a slice: views).

    Constant caches get both tables built once per node (kernel_cache), stacked as one [2, max_pos, R] array so that an
    array of positions is one gather (``take``) for both; runtime caches only the gathered rows.
    """
    tables = p.kernel_cache.get("rope")
    if tables is None:
        if len(inputs) > 8 and (inputs[7] is not None or inputs[8] is not None):  # runtime caches
            return wide_cos(arg(p, inputs, 7)[idx], interleaved), signed_sin(arg(p, inputs, 8)[idx], interleaved)
        tables = p.kernel_cache["rope"] = _rope_tables(p.consts["in7"], p.consts["in8"], interleaved)
    if isinstance(idx, np.ndarray):
        rows = tables[2].take(idx, axis=1)
        return rows[0], rows[1].reshape(idx.shape + tables[1].shape[1:])
    return tables[0][idx], tables[1][idx]


def _rope_tables(cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wide cos [P, R], signed sin [P, 2, R/2] or [P, R/2, 2], both stacked as [2, P, R]); the first two are views
    of the third."""
    ssin = signed_sin(sin, interleaved)
    both = np.stack((wide_cos(cos, interleaved), ssin.reshape(ssin.shape[0], -1)))
    return both[0], both[1].reshape(ssin.shape), both


def _rope(p: Prepared, inputs, qk: np.ndarray, past_b: list[int]) -> None:
    """Rotate Q and the new K in place, as one [B, S, N + Nkv, H] array (V does not rotate)."""
    b, s = qk.shape[:2]
    pos_in = arg(p, inputs, 9)
    if pos_in is not None:
        pos = np.asarray(pos_in, dtype=np.int64).reshape(b, s)
    else:  # padding rows of a first prompt keep s (ORT 1.31 CPU)
        pos = np.asarray(past_b, dtype=np.int64)[:, None] + np.arange(s)[None, :]
    interleaved = bool(p.attrs["rotary_interleaved"])
    cos, ssin = _cos_sin(p, inputs, pos, interleaved)
    rotate_inplace(qk, cos[:, :, None], ssin[:, :, None], interleaved)  # rows broadcast over heads


def _presents(p: Prepared, past_k: np.ndarray | None, past_v: np.ndarray | None, k_new: np.ndarray,
              v_new: np.ndarray, past_b: list[int], t_buf: int, dtype: np.dtype,
              into: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """present_key/present_value [B, Nkv, T, H] from the new rows k_new, v_new [B, S, Nkv, H]: each batch's valid
    past prefix, its S new rows, zeros after; or, with ``into`` (presents that are the past buffers themselves),
    only the S new rows written at each batch's past length, every other row left as it is.

    Both are views of one [2, B, Nkv, T, H] buffer (so one call zeroes both tails) from the node's pool: only the
    rows the buffer's previous use left nonzero past the new valid length are zeroed, so a decode step writes the
    prefix and one new row, not the whole zero tail.
    """
    b, s, nkv, h = v_new.shape
    start = past_b[0]
    spans = ((slice(None), start),) if b == 1 or past_b.count(start) == b else \
        [(slice(i, i + 1), x) for i, x in enumerate(past_b)]
    if into is not None:
        for rows, start in spans:
            into[0][rows, :, start:start + s] = k_new[rows].transpose(0, 2, 1, 3)
            into[1][rows, :, start:start + s] = v_new[rows].transpose(0, 2, 1, 3)
            _kv_format.store(p.attrs["kv_format"], into[0][rows, :, start:start + s])
            _kv_format.store(p.attrs["kv_format"], into[1][rows, :, start:start + s])
        return into
    kv, slot = present_buffer(p, (2, b, nkv, t_buf, h), dtype)
    dirty = slot[1]
    for rows, start in spans:  # ragged batches: one slice copy per batch row (B rows, not tiles)
        if start:
            kv[0, rows, :, :start] = 0 if past_k is None else past_k[rows, :, :start]
            kv[1, rows, :, :start] = 0 if past_v is None else past_v[rows, :, :start]
        kv[0, rows, :, start:start + s] = k_new[rows].transpose(0, 2, 1, 3)
        kv[1, rows, :, start:start + s] = v_new[rows].transpose(0, 2, 1, 3)
        _kv_format.store(p.attrs["kv_format"], kv[:, rows, :, start:start + s])  # K and V, each its own scales
        if start + s < dirty:
            kv[:, rows, :, start + s:dirty] = 0
    slot[1] = max(past_b) + s
    return kv[0], kv[1]


def _key_range(past_b: list[int], total_b: list[int], s: int, t_buf: int, window: int) -> tuple[int, int]:
    """[lo, hi): the keys some query can see; every attention matmul reads only these present rows."""
    lo = max(0, min(past_b) - window + 1) if window > 0 else 0  # t > past_b + s - window, smallest at s = 0
    return lo, min(max(total_b), t_buf)


def _needs_mask(past_b: list[int], total_b: list[int], s0: int, s1: int, lo: int, hi: int, window: int) -> bool:
    """Whether some query row in [s0, s1) must not see some key in [lo, hi) (decode with one length: never)."""
    last_seen = min(min(pb + s0, tb - 1) for pb, tb in zip(past_b, total_b))  # causal + length limit, tightest row
    return hi - 1 > last_seen or (window > 0 and lo < max(past_b) + s1 - window)


def _mask(past_b: list[int], total_b: list[int], s0: int, s1: int, lo: int, hi: int, window: int,
          cdt: type) -> np.ndarray | None:
    """The additive mask of query rows [s0, s1) against keys [lo, hi), or None when every key there is visible."""
    if _needs_mask(past_b, total_b, s0, s1, lo, hi, window):
        return _bias(tuple(past_b), tuple(total_b), s0, s1, lo, hi, window, cdt)
    return None


@functools.lru_cache(maxsize=32)
def _bias(past_b: tuple[int, ...], total_b: tuple[int, ...], s0: int, s1: int, lo: int, hi: int, window: int,
          dtype: type) -> np.ndarray:
    """Additive mask [B, 1, 1, s1-s0, hi-lo] (0 visible, -inf hidden) for query rows s0..s1 and keys lo..hi.

    Cached (read-only): the layers of one forward pass, and repeated prompt shapes, share it.
    """
    key = np.arange(lo, hi)[None, None, :]
    last = np.asarray(past_b)[:, None, None] + np.arange(s0, s1)[None, :, None]  # [B, s, 1]: the query's own position
    vis = (key <= last) & (key < np.asarray(total_b)[:, None, None])
    if window > 0:
        vis &= key > last - window
    bias = np.where(vis, dtype(0), dtype(-np.inf))[:, None, None]
    bias.flags.writeable = False
    return bias


_SCORES_BUDGET = 64 << 20  # bytes of attention scores materialized at once (long prefills run in row blocks)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, softcap: float, bias: np.ndarray | None = None,
            view: tuple[int, ...] | None = None) -> np.ndarray:
    """softmax(bias + softcap(Q K^T)) V for pre-scaled q [..., M, H] against k, v [..., T, H] -> [..., M, H].

    The M rows of one kv head are its G query heads stacked (G*s rows): one matmul per kv head, no repeated K/V.
    ``bias`` is added to the scores reshaped to ``view`` ([B, Nkv, G, s, T], so a [B, 1, 1, s, T] mask broadcasts
    over heads). In-place softmax; the 1/sum is applied to the [M, H] output rather than the [M, T] probabilities.
    """
    scores = np.matmul(q, k.swapaxes(-1, -2))  # [..., M, T]
    if softcap > 0:
        scores /= softcap
        np.tanh(scores, out=scores)
        scores *= softcap
    if bias is not None:
        masked = scores.reshape(view)
        masked += bias
    scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    denom = np.add.reduce(scores, axis=-1, keepdims=True)
    out = np.matmul(scores, v)
    out /= denom
    return out


def _scaled_q(qk: np.ndarray, n: int, scale: float) -> np.ndarray:
    """Q * scale as [B, N, S, H] (a free reshape to [B, Nkv, G, S, H]); in place in the scratch ``qk`` for S = 1,
    where [B, 1, N, H] already is [B, N, 1, H]."""
    b, s, _, h = qk.shape
    q = qk[:, :, :n]
    if s == 1:
        q *= scale
        return q.reshape(b, n, 1, h)
    return np.multiply(q.transpose(0, 2, 1, 3), scale, out=np.empty((b, n, s, h), dtype=qk.dtype))


def _one_token(p: Prepared, inputs, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
               past_k: np.ndarray | None, past_v: np.ndarray | None, pb: int, t_buf: int) -> list[np.ndarray]:
    """The whole op for one new token (B = S = 1) after pb past keys: every decode step of a batch-1 generation.

    Same results as _general (the tests drive both against ORT), written flat on 2-D/3-D views: a decode step is
    ~15 tiny numpy calls, and helper calls and extra views around them cost about as much again. The token sees
    exactly keys [lo, pb] (no mask); Q|K|V share one scratch, so the new K and V rows reach the presents in one copy.
    """
    a = p.attrs
    n, nkv = a["num_heads"], a["kv_num_heads"]
    cdt = np.float64 if a["itemsize"] == 8 else np.float32
    x = query.reshape(n + 2 * nkv, -1).astype(cdt) if key is None else np.concatenate(
        (query.reshape(n, -1), key.reshape(nkv, -1), value.reshape(nkv, -1)), dtype=cdt)  # [N + 2 Nkv, H] scratch
    h = x.shape[1]
    if a["do_rotary"]:
        pos = arg(p, inputs, 9)
        interleaved = bool(a["rotary_interleaved"])
        cos, ssin = _cos_sin(p, inputs, pb if pos is None else int(pos.item()), interleaved)
        rotate_inplace(x[:n + nkv], cos, ssin, interleaved)
    kv, slot = present_buffer(p, (2, 1, nkv, t_buf, h), query.dtype)
    if pb:
        kv[0, 0, :, :pb] = 0 if past_k is None else past_k[0, :, :pb]
        kv[1, 0, :, :pb] = 0 if past_v is None else past_v[0, :, :pb]
    kv[:, 0, :, pb] = x[n:].reshape(2, nkv, h)
    _kv_format.store(a["kv_format"], kv[:, 0, :, pb:pb + 1])
    if pb + 1 < slot[1]:
        kv[:, 0, :, pb + 1:slot[1]] = 0
    slot[1] = pb + 1
    window = a["local_window_size"]
    lo = pb - window + 1 if 0 < window <= pb else 0
    k, v = kv[0, 0, :, lo:pb + 1], kv[1, 0, :, lo:pb + 1]  # [Nkv, T, H]
    if k.dtype != cdt:
        k, v = k.astype(cdt), v.astype(cdt)
    q = x[:n]
    q *= cdt(a["scale"] or 1.0 / math.sqrt(h))
    out = _attend(q.reshape(nkv, -1, h), k, v, a["softcap"])  # [Nkv, G, H] is [1, 1, N*H]
    return [out.reshape(1, 1, n * h).astype(query.dtype, copy=False), kv[0], kv[1]]


def _first_prompt(p: Prepared, inputs, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
                  hi: int) -> list[np.ndarray]:
    """The whole op for a batch-1 first prompt whose presents are exactly its S new rows (no past, T = S): every
    prefill of a batch-1 generation with a growing cache. Queries see keys t <= s (and t < hi, the valid length).

    Same results as _general (the tests drive both against ORT) in about 2/3 of its numpy calls:
      * Q|K|V go head-major into one scratch [N + 2 Nkv, S, H]: Q needs no transposed copy, and its K and V parts
        already are present_key/present_value (no pool buffer, no copies);
      * scores are key-major [Nkv, hi, G*S], so the softmax reductions run over the short key axis vectorized
        across query rows (2-3x faster than row-wise reductions of hi ~ 17..128 keys), and the mask is a slice of
        one cached [S, 1, S] causal bias;
      * P V writes the output in its [1, S, N*H] layout (no transposed copy): one small GEMM per query head,
        cheaper than a transposing copy or a strided divide.
    """
    a = p.attrs
    n, nkv = a["num_heads"], a["kv_num_heads"]
    cdt = np.float64 if a["itemsize"] == 8 else np.float32
    x = _heads_major(query, key, value, n, nkv, cdt)
    h, s = x.shape[2], x.shape[1]
    if a["do_rotary"]:
        pos = arg(p, inputs, 9)
        interleaved = bool(a["rotary_interleaved"])
        cos, ssin = _cos_sin(p, inputs, slice(0, s) if pos is None else pos.reshape(s), interleaved)
        rotate_inplace(x[:n + nkv], cos, ssin, interleaved)  # [S, R] rows broadcast over heads
    _kv_format.store(a["kv_format"], x[n:].reshape(2, nkv, s, h))  # the presents, read back by the scores below
    q = x[:n]
    q *= cdt(a["scale"] or 1.0 / math.sqrt(h))
    g = n // nkv
    scores = np.matmul(x[n:n + nkv, :hi], q.reshape(nkv, g * s, h).swapaxes(1, 2))  # [Nkv, hi, G*S]
    softcap = a["softcap"]
    if softcap > 0:
        scores /= softcap
        np.tanh(scores, out=scores)
        scores *= softcap
    masked = scores.reshape(nkv, hi, g, s)
    masked += _causal_bias(s, int(a["local_window_size"]), cdt)[:hi]
    scores -= np.maximum.reduce(scores, axis=1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= np.add.reduce(scores, axis=1, keepdims=True)
    out = np.empty((1, s, n * h), cdt)  # P V per (kv head, query head) straight into [S, Nkv, G, H]
    np.matmul(scores.swapaxes(1, 2).reshape(nkv, g, s, hi), x[n + nkv:, None, :hi],
              out=out.reshape(s, nkv, g, h).transpose(1, 2, 0, 3))
    dt = query.dtype
    return [out.astype(dt, copy=False), x[None, n:n + nkv].astype(dt, copy=False),
            x[None, n + nkv:].astype(dt, copy=False)]


def _heads_major(query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None, n: int, nkv: int,
                 cdt: type) -> np.ndarray:
    """Q|K|V of one sequence as a fresh contiguous [N + 2 Nkv, S, H] in the compute dtype (one transposing copy)."""
    _, s, d = query.shape
    if key is None:  # packed QKV
        h = d // (n + 2 * nkv)
        return np.array(query.reshape(s, n + 2 * nkv, h).transpose(1, 0, 2), dtype=cdt, order="C")
    h = d // n
    x = np.empty((n + 2 * nkv, s, h), cdt)
    np.concatenate((query.reshape(s, n, h), key.reshape(s, nkv, h), value.reshape(s, nkv, h)), axis=1,
                   out=x.transpose(1, 0, 2))
    return x


@functools.lru_cache(maxsize=16)
def _causal_bias(s: int, window: int, dtype: type) -> np.ndarray:
    """Key-major causal mask [S, 1, S] of a first prompt: 0 where query q sees key t (t <= q and, with a window,
    t > q - window), else -inf. Cached (read-only); slicing [:hi] drops keys past the valid length."""
    key = np.arange(s)[:, None, None]
    query = np.arange(s)[None, None, :]
    vis = key <= query
    if window > 0:
        vis &= key > query - window
    bias = np.where(vis, dtype(0), dtype(-np.inf))
    bias.flags.writeable = False
    return bias


def _general(p: Prepared, inputs, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
             past_k: np.ndarray | None, past_v: np.ndarray | None, past_b: list[int], total_b: list[int],
             t_buf: int, into: tuple[np.ndarray, np.ndarray] | None = None) -> list[np.ndarray]:
    """Any batch and lengths: prefill, chunks, batched and ragged decode (masked where needed); ``into``: presents
    updated in place (``_presents``)."""
    a = p.attrs
    n, nkv = a["num_heads"], a["kv_num_heads"]
    cdt = np.float64 if a["itemsize"] == 8 else np.float32
    qk, v_new = _qk_v(query, key, value, n, nkv, cdt)
    b, s, _, h = qk.shape
    if a["do_rotary"]:
        _rope(p, inputs, qk, past_b)
    present_k, present_v = _presents(p, past_k, past_v, qk[:, :, n:], v_new, past_b, t_buf, query.dtype, into)

    window = int(a["local_window_size"])
    lo, hi = _key_range(past_b, total_b, s, t_buf, window)  # keys outside are never visible: not read at all
    k, v = present_k[:, :, lo:hi], present_v[:, :, lo:hi]
    if k.dtype != cdt:
        k, v = k.astype(cdt), v.astype(cdt)
    # head n = kv * G + g, as ORT maps head n to kv head n // G: [B, N, S, H] is [B, Nkv, G, S, H]
    g = n // nkv
    q5 = _scaled_q(qk, n, cdt(float(a["scale"]) or 1.0 / math.sqrt(h))).reshape(b, nkv, g, s, h)
    softcap = float(a["softcap"])
    rows = max(1, _SCORES_BUDGET // (b * n * (hi - lo) * np.dtype(cdt).itemsize))  # query rows per score block
    blocks = []
    for s0 in range(0, s, rows):  # one block unless the [B, N, S, T] scores would exceed the budget
        s1 = min(s, s0 + rows)
        view = (b, nkv, g, s1 - s0, hi - lo)
        out = _attend(q5[:, :, :, s0:s1].reshape(b, nkv, g * (s1 - s0), h), k, v, softcap,
                      _mask(past_b, total_b, s0, s1, lo, hi, window, cdt), view)
        blocks.append(out.reshape(b, nkv, g, s1 - s0, h))
    out = blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=3)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, s, n * h)
    return [out.astype(query.dtype, copy=False), present_k, present_v]


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    query, key, value, past_k, past_v, seqlens_k, total = _args(p, inputs)
    total = int(total.item())
    s = query.shape[1]
    state = p.runtime.kv_state
    if state is not None and past_k is not None and past_k.shape[2] == 0:
        return _stateful(p, state, inputs, query, key, value, past_k.shape[3], seqlens_k, total)
    past_len = 0 if past_k is None else past_k.shape[2]
    if total != past_len + s and total > past_len:  # ORT's rule, and its message
        raise ValueError(f"GroupQueryAttention: total_sequence_length must equal past_sequence_length + "
                         f"kv_sequence_length for a dynamic cache, or be no greater than past_sequence_length for a "
                         f"static cache. Got total_sequence_length={total}, past_sequence_length={past_len}, "
                         f"kv_sequence_length={s}")
    past_b, total_b = _lengths(seqlens_k, total, s)
    t_buf = max(total, past_len)
    if max(past_b) + s > t_buf:  # checked before any write (numpy would raise from inside a partial copy)
        raise ValueError(f"GroupQueryAttention: {s} new tokens after a past of {max(past_b)} (seqlens_k "
                         f"{seqlens_k.ravel().tolist()}) need {max(past_b) + s} slots; the present holds {t_buf} "
                         "(the KV capacity); nothing was written")
    into = _aliased_presents(p, past_k, past_v, t_buf, query.dtype)
    return _compute(p, inputs, query, key, value, past_k, past_v, past_b, total_b, t_buf, into, s == total)


def _aliased_presents(p: Prepared, past_k: np.ndarray | None, past_v: np.ndarray | None, t_buf: int,
                      dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """ORT's present buffers when they are the past buffers themselves (one OrtValue bound to both by IOBinding:
    the shared-buffer mode of ORT's GroupQueryAttention, where present T equals the past length), else None."""
    if past_k is None or past_v is None or past_k.shape[2] != t_buf:
        return None
    pk = runtime.ort_output(p, 1, past_k.shape, dtype)
    if pk is None or pk.__array_interface__["data"][0] != past_k.__array_interface__["data"][0]:
        return None
    pv = runtime.ort_output(p, 2, past_v.shape, dtype)
    if pv is None or pv.__array_interface__["data"][0] != past_v.__array_interface__["data"][0]:
        return None
    return pk, pv


def _compute(p: Prepared, inputs, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
             past_k: np.ndarray | None, past_v: np.ndarray | None, past_b: list[int], total_b: list[int], t_buf: int,
             into: tuple[np.ndarray, np.ndarray] | None, first: bool) -> list[np.ndarray]:
    """The op for resolved lengths: the native kernel unless it records why the reference must run
    (_gqa_native.FALLBACK), else the reference; ``into``: presents that are the past buffers, updated in place;
    ``first``: a first prompt (S == total_sequence_length)."""
    nat = runtime.native(p) if _native_keeps_format(p) else None
    if nat is not None:
        done = _gqa_native.run(nat, p, inputs, query, key, value, past_k, past_v, past_b, total_b, t_buf, into)
        if done is not None:
            return done
    b, s = query.shape[:2]
    pb = past_b[0]
    if into is not None:
        done = _general(p, inputs, query, key, value, past_k, past_v, past_b, total_b, t_buf, into)
    elif b == 1 and first and s == t_buf and s > 1 and p.attrs["num_heads"] * s * s * 8 <= _SCORES_BUDGET:
        done = _first_prompt(p, inputs, query, key, value, min(total_b[0], s))  # its [N, S, S] scores: one block
    elif b == s == 1 and total_b[0] == pb + 1 <= t_buf:
        done = _one_token(p, inputs, query, key, value, past_k, past_v, pb, t_buf)
    else:
        done = _general(p, inputs, query, key, value, past_k, past_v, past_b, total_b, t_buf)
    copied = sum(past_b) if past_k is not None and into is None else 0
    _kv_traffic.count(p, into is not None, 2 * done[1].shape[1] * done[1].shape[3] * done[1].itemsize, b * s, copied)
    return done


def _stateful(p: Prepared, state: KvState, inputs, query: np.ndarray, key: np.ndarray | None,
              value: np.ndarray | None, h: int, seqlens_k: np.ndarray, total: int) -> list[np.ndarray]:
    """A run of the stateful KV (``_kv_state``): the current sequence's buffers are the past and, in place, the
    presents; ORT gets empty presents."""
    b, s = query.shape[:2]
    first = s == total
    past_b, total_b = _lengths(seqlens_k, total, s)
    nkv = int(p.attrs["kv_num_heads"])
    seq = state.buffers(id(p), (b, nkv, h), query.dtype, first)
    check_continues(seq, state.current(), past_b, s, state.capacity, first)
    pk, pv = seq.kv[0], seq.kv[1]
    out = _compute(p, inputs, query, key, value, pk, pv, past_b, total_b, state.capacity, (pk, pv), first)[0]
    seq.lengths = list(total_b)
    empty = np.empty((b, nkv, 0, h), query.dtype)
    return [out, empty, empty]


def _native_keeps_format(p: Prepared) -> bool:
    """The native kernel stores float32 K/V: another KV format runs the reference (the reason is recorded where the
    native kernel's own fallbacks are, which also keeps the step from being bound natively)."""
    fmt = p.attrs.get("kv_format", _kv_format.DEFAULT)
    if fmt == _kv_format.DEFAULT:
        return True
    p.kernel_cache[_gqa_native.FALLBACK] = (f"KV cache format {fmt} runs on the reference kernel (quantize on write, "
                                    "dequantize on read); the native kernel stores float32 K/V")
    return False


def _cost(p: Prepared, shapes) -> OpCost:
    a, tgt = p.attrs, p.target
    n, nkv = int(a["num_heads"]), int(a["kv_num_heads"])
    g = n // nkv
    b, s, d = shapes[0]
    h = d // (n + 2 * nkv) if shapes[1] is None else d // n
    past = shapes[3][2] if shapes[3] is not None else 0
    t = past + s if past else s
    item = a["itemsize"]
    mode = tgt.float_mode({2: "float16", 4: "float32"}.get(item, "float32")) or "float16"
    tm, tn, tk = tgt.tile
    rows = math.ceil(g * s / tm)
    native = rows * math.ceil(t / tn) * math.ceil(h / tk) + rows * math.ceil(h / tn) * math.ceil(t / tk)
    matrix = b * nkv * native * tm * tn * tk / tgt.mac_rate(mode)
    vector = math.ceil(b * n * s * t / int(tgt.vector["lanes"])) * (5.0 + transcendental(tgt))
    kv_row = _kv_format.row_bytes(a.get("kv_format", _kv_format.DEFAULT), nkv, h, item)  # one token's K (or V)
    moved = int(item * (b * s * (n + 2 * nkv) * h + b * s * n * h) + 2 * b * (past + t) * kv_row)
    dma = dma_cycles(tgt, moved, transfers=6)
    compute = max(matrix, vector)
    cycles = max(compute, dma) + float(tgt.dma["latency_cycles"])
    macs = 2 * b * n * s * t * h
    sram = item * (2 * t * h + g * s * (h + t)) * 2  # one kv head's K, V, Q rows and scores, double-buffered
    return OpCost(compute_cycles=compute, dma_cycles=dma, cycles=cycles, dma_bytes=moved, sram_peak=sram, macs=macs,
                  utilization=macs / (cycles * tgt.mac_rate(mode)) if cycles else 0.0, unit="matrix")


register(KernelDef("com.microsoft", "GroupQueryAttention", _prepare, _run, _cost, _check, bind=_gqa_native.bind))

