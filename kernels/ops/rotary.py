"""com.microsoft RotaryEmbedding on the vector unit, and the rotary core GroupQueryAttention reuses.

Layouts: input [B, S, N*H] (3-D) or [B, N, S, H] (4-D); position_ids [B, S] (int64) or a 1-element offset p0
(positions p0 + s); cos_cache/sin_cache [max_pos, R/2] with R = rotary_embedding_dim (default 2 * cache width,
i.e. the whole head). Only the first R channels of each head rotate; channels R..H pass through.
  half (interleaved=0):  out[i]     = x[i] cos[i] - x[i+R/2] sin[i],  out[i+R/2] = x[i+R/2] cos[i] + x[i] sin[i]
  interleaved=1:         out[2i]    = x[2i] cos[i] - x[2i+1] sin[i],  out[2i+1]  = x[2i+1] cos[i] + x[2i] sin[i]
The cos/sin rows are gathered once per (b, s) and broadcast over heads: no per-head or per-token Python loop.
On the host both halves come from one view of the pairs: out = x * cos + swap(x) * (-sin, sin) (3 numpy calls,
bit-identical to the formulas above).

On the native kernels the op is ``rotary_embedding`` (kernels/native/rotary.cc, the same float32 operations per
row, bit for bit), bound as the step for its input shapes; it reads x in any layout (a column slice of a fused
QKV product in place), so a prefill's strided query/key never runs the reference.

Cost per rotated element: 2 multiplies + 1 add (3 vector ops); DMA reads x, the gathered cache rows, writes out.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen
from .movement import ort_buffer


def signed_sin(sin_rows: np.ndarray, interleaved: bool) -> np.ndarray:
    """(-sin, sin) laid out like a head's channel pairs: [..., 2, R/2] (half) or [..., R/2, 2] (interleaved).

    With it a rotation is ``x * cos + swap(x) * signed_sin``, where swap exchanges the two members of each pair:
    three vector ops, no concatenation. Built once per cache when the cache is a constant (GroupQueryAttention).
    """
    s = widen(sin_rows)
    return np.stack((-s, s), axis=-1 if interleaved else -2)


def rotate_signed(x: np.ndarray, cos_rows: np.ndarray, ssin_rows: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotate the first R = 2 * cos_rows.shape[-1] channels of ``x`` [..., H] (new array in ``x``'s dtype).

    ``cos_rows`` [..., R/2] and ``ssin_rows`` (``signed_sin`` of the sin rows) broadcast against ``x.shape[:-1]``.
    Bit-identical to x0 c - x1 s, x1 c + x0 s: adding x1 * (-s) is subtracting x1 * s in IEEE arithmetic.
    """
    xf = widen(x)
    half = cos_rows.shape[-1]
    rot = 2 * half
    if rot < xf.shape[-1]:  # partial rotary: channels R..H pass through
        head = rotate_signed(xf[..., :rot], cos_rows, ssin_rows, interleaved)
        return np.concatenate([head, xf[..., rot:]], axis=-1).astype(x.dtype, copy=False)
    c = widen(cos_rows)
    if interleaved:  # pairs (2i, 2i+1): [..., R/2, 2], swap = reverse the last axis
        pairs = xf.reshape(*xf.shape[:-1], half, 2)
        out = pairs * c[..., None]
        out += pairs[..., ::-1] * ssin_rows
    else:  # pairs (i, i + R/2): [..., 2, R/2], swap = reverse the pair axis
        pairs = xf.reshape(*xf.shape[:-1], 2, half)
        out = pairs * c[..., None, :]
        out += pairs[..., ::-1, :] * ssin_rows
    return out.reshape(xf.shape).astype(x.dtype, copy=False)


def wide_cos(cos_rows: np.ndarray, interleaved: bool) -> np.ndarray:
    """cos per rotated channel, [..., R]: (c, c) (half) or (c0, c0, c1, c1, ...) (interleaved), in compute dtype.

    Multiplying whole heads by it is one broadcast over R channels instead of over R/2-channel pairs (2x faster
    for many tokens); built once per cache when the cache is a constant (GroupQueryAttention).
    """
    c = widen(cos_rows)
    return np.repeat(c, 2, axis=-1) if interleaved else np.concatenate((c, c), axis=-1)


def rotate_inplace(x: np.ndarray, cos_wide: np.ndarray, ssin_rows: np.ndarray, interleaved: bool) -> None:
    """Rotate the first R = cos_wide.shape[-1] channels of ``x`` [..., H] in place (``rotate_signed``'s result).

    ``cos_wide`` is ``wide_cos`` of the cos rows, ``ssin_rows`` ``signed_sin`` of the sin rows, both broadcasting
    against ``x.shape[:-1]``. For a caller that owns a scratch copy in the compute dtype anyway
    (GroupQueryAttention's Q|K): no output allocation. ``x`` must have unit-stride channels: then splitting them
    into pairs is a view (numpy reshapes without copying whenever it can), so the in-place ops land in ``x``.
    """
    rot = cos_wide.shape[-1]
    head = x[..., :rot]
    pairs = head.reshape(*head.shape[:-1], *((rot // 2, 2) if interleaved else (2, rot // 2)))
    t = (pairs[..., ::-1] if interleaved else pairs[..., ::-1, :]) * ssin_rows
    head *= cos_wide
    pairs += t


def rotate(x_bsnh: np.ndarray, cos_bs: np.ndarray, sin_bs: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotate the first R = 2 * cos_bs.shape[-1] channels of ``x_bsnh`` [B, S, N, H].

    ``cos_bs``/``sin_bs`` [B, S, R/2] are the cache rows for each token's position. Computed in float32 for fp16
    inputs; returns a new array in ``x_bsnh``'s dtype.
    """
    ssin = signed_sin(sin_bs, interleaved)[:, :, None]  # broadcast over heads
    return rotate_signed(x_bsnh, cos_bs[:, :, None, :], ssin, interleaved)


def positions(position_ids: np.ndarray, batch: int, seq: int) -> np.ndarray:
    """[B, S] (or broadcastable [1, S]) int positions from ORT's two formats: [B, S] ids, or one offset p0 meaning
    p0 + s."""
    pos = np.asarray(position_ids, dtype=np.int64)
    if pos.size == 1:  # [1, S]: broadcasts over the batch wherever it is used
        return pos.reshape(1, 1) + np.arange(seq, dtype=np.int64)[None, :]
    return pos.reshape(batch, seq)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"interleaved": int(node.attr("interleaved", 0)), "num_heads": int(node.attr("num_heads", 0)),
             "rotary_embedding_dim": int(node.attr("rotary_embedding_dim", 0)),
             "itemsize": itemsize_of(node.inputs[0])}
    return Prepared(attrs, stash_constants(node), target)


def _geometry(p: Prepared, x: np.ndarray, cos: np.ndarray) -> tuple[int, int, int]:
    """(heads, head size, rotated pairs per head) of ``x`` [B, N, S, H] or [B, S, N*H] (ORT's rule for the 3-D head
    size: hidden / num_heads with rotary_embedding_dim, else twice the cache width)."""
    rdim, n_heads = p.attrs["rotary_embedding_dim"], p.attrs["num_heads"]
    if x.ndim == 4:
        n, h = x.shape[1], x.shape[3]
    else:
        h = x.shape[2] // n_heads if rdim > 0 else 2 * cos.shape[1]
        n = x.shape[2] // h
    return n, h, rdim // 2 if rdim > 0 else cos.shape[1]


def _native(p: Prepared, x, pos_ids, cos, sin) -> tuple | None:
    """(native kernels, geometry) when ``rotary_embedding`` takes these operands, else None (the reference runs)."""
    nat = runtime.native(p)
    arrays = all(isinstance(v, np.ndarray) for v in (x, pos_ids, cos, sin))
    if nat is None or not arrays or x.dtype not in (np.float32, np.float16) or x.ndim not in (3, 4) \
            or cos.dtype != x.dtype or sin.dtype != x.dtype or cos.ndim != 2 or pos_ids.dtype != np.int64:
        return None
    n, h, half = _geometry(p, x, cos) if x.shape[-1] and cos.shape[1] else (0, 0, 0)
    if not h or (x.ndim == 3 and n * h != x.shape[2]) or half > cos.shape[1] or 2 * half > h:
        return None
    return nat, (n, h, half, bool(p.attrs["interleaved"]))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x, pos_ids, cos, sin = (arg(p, inputs, i) for i in range(4))
    fast = _native(p, x, pos_ids, cos, sin)
    if fast is not None and all(v.flags.c_contiguous for v in (pos_ids, cos, sin)):  # x: any layout
        nat, geometry = fast
        return [nat.rotary_embedding(x, pos_ids, cos, sin, *geometry, runtime.threads(p))]
    rdim, n_heads = p.attrs["rotary_embedding_dim"], p.attrs["num_heads"]
    if x.ndim == 4:  # [B, N, S, H]
        b, n, s, h = x.shape
        x_bsnh = x.transpose(0, 2, 1, 3)
    else:  # [B, S, N*H]
        b, s, hidden = x.shape
        h = hidden // n_heads if rdim > 0 else 2 * cos.shape[1]  # ORT's rule
        n = hidden // h
        x_bsnh = x.reshape(b, s, n, h)
    half = rdim // 2 if rdim > 0 else cos.shape[1]
    pos = positions(pos_ids, b, s)
    if pos.max(initial=0) >= cos.shape[0] or pos.min(initial=0) < 0:
        raise IndexError(f"RotaryEmbedding: position ids outside the cos/sin cache [0, {cos.shape[0]})")
    out = rotate(x_bsnh, cos[pos, :half], sin[pos, :half], bool(p.attrs["interleaved"]))
    return [out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)]


def _bind(p: Prepared, inputs, outs):
    """RotaryEmbedding as one ``rotary_embedding`` call for these input shapes, constant caches held in place, into
    ORT's buffer when the result is a partition output."""
    values = [arg(p, inputs, i) for i in range(4)]
    fast = _native(p, *values)
    if fast is None:
        return None
    nat, geometry = fast
    given = [i < len(inputs) and inputs[i] is not None for i in range(4)]
    # x in any layout (the kernel reads rows of unit-stride channels in place: a prefill's column slice of a fused
    # QKV product), the others C-order
    live = [(i, i, v.dtype, v.shape, None, i == 0) for i, v in enumerate(values) if given[i]]
    held = [None if given[i] else np.ascontiguousarray(v) for i, v in enumerate(values)]
    return runtime.call_step(p, nat.rotary_embedding, (*held, *geometry, runtime.threads(p), None), live,
                             [(-1, None)], None, ort_buffer(p, outs, 9))


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    size = p.attrs["itemsize"]
    tokens = n // max(shapes[0][-1], 1)
    cache = 2 * tokens * (shapes[2][-1] if shapes[2] else 0) * size
    return stream_cost(p, n, nbytes(shapes[0], size) + cache, nbytes(shapes[0], size), 3.0)


def _check(node: NodeInfo, target: Target) -> str | None:
    if node.attr("is_packed_batching", 0):
        return f"{node.describe()}: is_packed_batching=1 not supported"
    if node.attr("rotary_embedding_dim", 0) and not node.attr("num_heads", 0):
        return f"{node.describe()}: rotary_embedding_dim needs num_heads"
    return None


register(KernelDef("com.microsoft", "RotaryEmbedding", _prepare, _run, _cost, _check, bind=_bind))
