"""Round-to-nearest block quantization of a MatMul weight, bit-identical to ORT's MLAS ``BlockwiseQuantizer``.

This is the math behind ``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`` (DEFAULT
algorithm, QOperator format), which calls MLAS ``quantizeAndTranspose`` with column-wise blocks: every block is
``block_size`` consecutive elements along K of one output column n. Everything is float32 arithmetic in the same
order as the C++ code, vectorized with numpy over all blocks at once, so results match bit for bit.

Layouts: weight ``W[K, N]`` (the MatMul's B). Outputs are indexed ``[N, k_blocks, ...]`` (transposed) with
``k_blocks = ceil(K / block_size)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .rounding import round_half_away_from_zero

SUPPORTED_WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
_JUST_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0.0))
_CHUNK_ELEMENTS = 1 << 20  # weight elements per column chunk (4 MiB of float32; 2x faster than one pass)


@dataclasses.dataclass(frozen=True)
class BlockQuantized:
    """Unpacked RTN result.

    q: uint8 ``[N, k_blocks, block_size]``, unsigned 4-bit codes 0..15; positions past K are 0.
    scales: ``[N, k_blocks]`` in the weight's dtype (may be negative for symmetric blocks, as in MLAS).
    zero_points: uint8 ``[N, k_blocks]``; 8 everywhere for symmetric quantization.
    """

    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    K: int
    block_size: int


def k_blocks(K: int, block_size: int) -> int:
    """Number of quantization blocks along K (``ceil(K / block_size)``)."""
    return (K + block_size - 1) // block_size


def check_block_size(block_size: int) -> None:
    """MatMulNBits needs a power-of-two block size >= 16; we also cap it at 256 like ORT's tooling."""
    if block_size < 16 or block_size > 256 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two in [16, 256], got {block_size}")


def quantize_blockwise_rtn(weight: np.ndarray, block_size: int, symmetric: bool, bits: int = 4) -> BlockQuantized:
    """RTN-quantize ``weight[K, N]`` in blocks of ``block_size`` along K, as MLAS does.

    Symmetric: ``m`` = the block's min or max with the larger magnitude (min on ties), ``scale = -m / 8``,
    zero point 8. Asymmetric: range widened to include 0, ``scale = (max - min) / 15``,
    ``zp = roundf(-min / scale)`` clamped to [0, 15]. Codes: ``clamp(roundf(w * (1 / scale) + zp), 0, 15)``
    with ``roundf`` = half away from zero, and ``1 / scale`` taken as 0 when the scale is 0.
    """
    if bits != 4:
        raise ValueError(f"only 4-bit block quantization is supported, got bits={bits}")
    check_block_size(block_size)
    w = np.asarray(weight)
    if w.ndim != 2:
        raise ValueError(f"block quantization needs a 2-D weight [K, N], got shape {w.shape}")
    if w.dtype not in SUPPORTED_WEIGHT_DTYPES:
        raise ValueError(f"weight dtype must be float32 or float16, got {w.dtype}")
    K, N = w.shape
    kb = k_blocks(K, block_size)
    q_t = np.empty((N, kb, block_size), np.uint8)
    scales = np.empty((N, kb), w.dtype)
    zp = np.empty((N, kb), np.uint8)
    # column chunks keep every temporary in cache and make the final [N, kb, bs] transpose a small one
    step = max(1, _CHUNK_ELEMENTS // max(1, kb * block_size))
    for n0 in range(0, N, step):
        n1 = min(N, n0 + step)
        q, s, z = _quantize_columns(w[:, n0:n1], K, kb, block_size, symmetric)
        q_t[n0:n1] = q.transpose(2, 0, 1)
        scales[n0:n1] = s.T
        zp[n0:n1] = z.T
    return BlockQuantized(q=q_t, scales=scales, zero_points=zp, K=K, block_size=block_size)


def _quantize_columns(w: np.ndarray, K: int, kb: int, block_size: int,
                      symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``quantize_blockwise_rtn`` on a column slice ``w[K, n]``: codes ``[kb, bs, n]``, scales and zero points
    ``[kb, n]``."""
    N = w.shape[1]
    qmax = np.float32(15.0)
    wf = w.astype(np.float32)  # a contiguous copy of the slice
    pad = kb * block_size - K
    if pad:
        # pad with the block's own first element so min/max ignore the padding; codes are zeroed below
        wf = np.concatenate([wf, np.broadcast_to(wf[(kb - 1) * block_size], (pad, N))], axis=0)
    blocks = wf.reshape(kb, block_size, N)
    bmax = blocks.max(axis=1)  # [kb, N]
    bmin = blocks.min(axis=1)

    if symmetric:
        m = np.where(np.abs(bmax) > np.abs(bmin), bmax, bmin)
        scale_f = -m / np.float32(8.0)
        zp_f = np.full_like(scale_f, 8.0)
        zp = np.full(scale_f.shape, 8, np.uint8)
    else:
        mn = np.minimum(bmin, np.float32(0.0))
        mx = np.maximum(bmax, np.float32(0.0))
        scale_f = (mx - mn) / qmax
        with np.errstate(divide="ignore", invalid="ignore"):
            zfp = np.where(scale_f != 0, np.float32(0.0) - mn / scale_f, mn).astype(np.float32)
        zp_f = np.clip(round_half_away_from_zero(zfp), 0, 15).astype(np.float32)
        zp = zp_f.astype(np.uint8)

    scales = scale_f.astype(w.dtype)  # ScaleT(scale_f)
    s32 = scales.astype(np.float32)
    with np.errstate(divide="ignore"):
        recip = np.where(s32 != 0, np.float32(1.0) / s32, np.float32(0.0)).astype(np.float32)

    # roundf(x) for x in [0, 16) equals floor(x + nextafter(0.5, 0)); x < 0 ends at 0 after the clamp either way
    v = blocks
    v *= recip[:, None, :]
    v += zp_f[:, None, :]
    v += _JUST_BELOW_HALF
    np.floor(v, out=v)
    np.clip(v, 0, qmax, out=v)
    q = v.astype(np.uint8)  # [kb, bs, N]
    if pad:
        q.reshape(kb * block_size, N)[K:] = 0
    return q, scales, zp
