"""com.microsoft MatMulNBits (bits=4) tensor layouts: packing, unpacking and repacking from ONNX blocked int4.

MatMulNBits inputs (K, N from ``A[..., K] @ W[K, N]``, ``kb = ceil(K / block_size)``):
- B: uint8 ``[N, kb, block_size / 2]``; row n is output channel n (the transposed weight); within a block,
  element 2j is the low nibble and 2j+1 the high nibble of byte j. Codes are unsigned 0..15.
- scales: ``[N, kb]`` (flattened ``[N * kb]`` is also accepted by ORT) in A's dtype.
- zero_points (optional): uint8 ``[N, ceil(kb / 2)]``, block 2i in the low nibble and 2i+1 in the high nibble;
  absent means 8. The pad nibble of an odd ``kb`` is 8, as MLAS writes it.
Dequantized weight: ``W[k, n] = (code - zp) * scale``.

accuracy_level 4 runs on an int8 x int4 unit that streams its own layout, chosen at compile time
(``int8_tiles``): one 64-byte word per 32 columns and 4 elements of K, scales and zero points in the same groups of
32 columns, block by block. The native kernels (``kernels/native/matmul_nbits.h``) read it as stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .blockwise import BlockQuantized, check_block_size, k_blocks, quantize_blockwise_rtn
from .int4 import unpack_int4


@dataclasses.dataclass(frozen=True)
class MatMulNBitsWeights:
    """Initializers for one MatMulNBits node; ``zero_points`` is None when the default (8) applies."""

    B: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    K: int
    N: int
    block_size: int


def pack_b(q: np.ndarray) -> np.ndarray:
    """Pack codes ``q[N, kb, block_size]`` (uint8 0..15) into B ``[N, kb, block_size / 2]``."""
    q = np.asarray(q, dtype=np.uint8)
    return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))


def unpack_b(B: np.ndarray, K: int) -> np.ndarray:
    """Unpack B ``[N, kb, block_size / 2]`` into codes ``[N, K]`` (uint8 0..15)."""
    B = np.asarray(B, dtype=np.uint8)
    N, kb, half = B.shape
    q = np.empty((N, kb, 2 * half), np.uint8)
    q[..., 0::2] = B & 0x0F
    q[..., 1::2] = B >> 4
    return q.reshape(N, kb * 2 * half)[:, :K]


def pack_zero_points(zp: np.ndarray) -> np.ndarray:
    """Pack zero points ``zp[N, kb]`` (0..15) into ``[N, ceil(kb / 2)]``; an odd kb's pad nibble is 8."""
    zp = np.asarray(zp, dtype=np.uint8)
    N, kb = zp.shape
    if kb % 2:
        zp = np.concatenate([zp, np.full((N, 1), 8, np.uint8)], axis=1)
    return np.ascontiguousarray(zp[:, 0::2] | (zp[:, 1::2] << 4))


def unpack_zero_points(zp_packed: np.ndarray | None, N: int, kb: int) -> np.ndarray:
    """Unpack ``[N, ceil(kb / 2)]`` zero points into ``[N, kb]``; None gives the default 8."""
    if zp_packed is None:
        return np.full((N, kb), 8, np.uint8)
    return unpack_int4(np.asarray(zp_packed).reshape(N, -1), N * 2 * ((kb + 1) // 2), signed=False).reshape(
        N, -1)[:, :kb]


def dequantize_b(w: MatMulNBitsWeights) -> np.ndarray:
    """Float32 weight ``[K, N]`` that a MatMulNBits node with these initializers multiplies by."""
    kb = k_blocks(w.K, w.block_size)
    q = unpack_b(w.B, kb * w.block_size).reshape(w.N, kb, w.block_size).astype(np.float32)
    zp = unpack_zero_points(w.zero_points, w.N, kb).astype(np.float32)
    s = np.asarray(w.scales, dtype=np.float32).reshape(w.N, kb)
    deq = (q - zp[..., None]) * s[..., None]
    return np.ascontiguousarray(deq.reshape(w.N, -1)[:, : w.K].T)


TILE_COLS = 32  # accuracy_level 4's columns per tile group: two 16-lane vectors, one per nibble


def int8_tiles(w: MatMulNBitsWeights, tile_b: Callable[[np.ndarray, int, int], np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """accuracy_level 4's layout of ``w``: (tiles, scales, zero points). ``tile_b(B [N, row_bytes], N, row_bytes)``
    may build the tiles faster (the native ``tile_int4``); the numpy below is the definition.

    - tiles: uint8 ``[ceil(N / 32), kb * block_size / 4, 64]``. For column group g and step t, byte ``4j + i``
      holds element ``4t + i`` of column ``32g + j`` in its low nibble and of column ``32g + 16 + j`` in its high
      nibble (columns past N: code 0). Masking the nibbles of one word gives the two 16-column operands of an
      int8 dot-product instruction (VPDPBUSD), A's 4 codes broadcast.
    - scales: float32 ``[kb * N]`` and zero points uint8 ``[ceil(kb / 2) * N]`` (ORT's packed bytes) or None, in
      the same column groups: per group its ``[kb, w]`` (``[ceil(kb / 2), w]``) block of ORT's arrays transposed,
      ``w`` = 32 or what is left of N, so a pass over a group reads one run of tiles and one run of scales.
    """
    kb = k_blocks(w.K, w.block_size)
    b = np.ascontiguousarray(np.asarray(w.B, np.uint8).reshape(w.N, kb * w.block_size // 2))
    if tile_b is not None:
        tiles = tile_b(b, w.N, b.shape[1])
    else:
        codes = unpack_b(b.reshape(w.N, kb, w.block_size // 2), kb * w.block_size)
        groups = -(-w.N // TILE_COLS)
        padded = np.zeros((groups * TILE_COLS, kb * w.block_size), np.uint8)
        padded[: w.N] = codes
        t = padded.reshape(groups, 2, 16, -1, 4).transpose(0, 3, 1, 2, 4)  # [group, step, nibble, column, element]
        tiles = np.ascontiguousarray((t[:, :, 0] | (t[:, :, 1] << 4)).reshape(groups, -1, 64))
    scales = _by_column_group(np.asarray(w.scales, np.float32).reshape(w.N, kb))
    zp = None if w.zero_points is None else _by_column_group(
        np.asarray(w.zero_points, np.uint8).reshape(w.N, (kb + 1) // 2))
    return tiles, scales, zp


def _by_column_group(x: np.ndarray) -> np.ndarray:
    """``x [N, n]`` as its column groups' ``[n, w]`` blocks, one after the other (``int8_tiles``)."""
    N, n = x.shape
    full = N // TILE_COLS * TILE_COLS
    out = np.empty(N * n, x.dtype)
    out[:full * n].reshape(-1, n, TILE_COLS)[...] = x[:full].reshape(-1, TILE_COLS, n).transpose(0, 2, 1)
    out[full * n:].reshape(n, N - full)[...] = x[full:].T
    return out


def _from_column_groups(flat: np.ndarray, N: int, n: int) -> np.ndarray:
    """The inverse of ``_by_column_group``: ``[N, n]``."""
    full = N // TILE_COLS * TILE_COLS
    out = np.empty((N, n), flat.dtype)
    out[:full].reshape(-1, TILE_COLS, n)[...] = flat[:full * n].reshape(-1, n, TILE_COLS).transpose(0, 2, 1)
    out[full:] = flat[full * n:N * n].reshape(n, N - full).T
    return out


def from_int8_tiles(tiles: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, K: int, N: int,
                    block_size: int) -> MatMulNBitsWeights:
    """The inverse of ``int8_tiles``: ORT's arrays again, bit for bit."""
    kb = k_blocks(K, block_size)
    t = np.asarray(tiles, np.uint8).reshape(-1, kb * block_size // 4, 16, 4)
    codes = np.stack([t & 0x0F, t >> 4], axis=2).transpose(0, 2, 3, 1, 4).reshape(-1, kb * block_size)[:N]
    zp = None if zero_points is None else _from_column_groups(np.asarray(zero_points, np.uint8).ravel(), N,
                                                              (kb + 1) // 2)
    return MatMulNBitsWeights(B=pack_b(codes.reshape(N, kb, block_size)),
                              scales=_from_column_groups(np.asarray(scales, np.float32).ravel(), N, kb),
                              zero_points=zp, K=K, N=N, block_size=block_size)


def _apply_odd_k_tail(bq: BlockQuantized, B: np.ndarray) -> None:
    """Mirror an MLAS artifact so B is bit-identical: for odd K the pad nibble after the last element repeats
    the code of element K-2 (a stale register in ``quantizeAndTranspose``), unless element K-1 starts a new
    pair of blocks. MatMulNBits never reads that nibble."""
    K, bs = bq.K, bq.block_size
    if K % 2 == 0 or (K - 1) % (2 * bs) == 0:
        return
    last = K - 1
    b, j = divmod(last, bs)
    B[:, b, j // 2] |= bq.q.reshape(bq.q.shape[0], -1)[:, K - 2] << 4


def quantize_matmul_nbits(weight: np.ndarray, block_size: int = 32, symmetric: bool = True) -> MatMulNBitsWeights:
    """Quantize a float weight ``[K, N]`` into MatMulNBits initializers, bit-identical to MatMulNBitsQuantizer
    (DEFAULT algorithm, QOperator, bits=4). Symmetric weights carry no zero_points (default 8), like ORT's."""
    bq = quantize_blockwise_rtn(weight, block_size, symmetric)
    B = pack_b(bq.q)
    _apply_odd_k_tail(bq, B)
    N = bq.q.shape[0]
    zp = None if symmetric else pack_zero_points(bq.zero_points)
    return MatMulNBitsWeights(B=B, scales=bq.scales, zero_points=zp, K=bq.K, N=N, block_size=block_size)


def repack_blocked_int4(
    data: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    signed: bool,
    block_size: int,
) -> MatMulNBitsWeights:
    """Repack a blocked DequantizeLinear (axis 0) weight into MatMulNBits layout, exactly (no requantization).

    data: unpacked int4 (int8 -8..7) or uint4 (uint8 0..15) codes ``[K, N]``.
    scales: ``[kb, N]``; zero_points: ``[kb, N]`` in data's type or None (ONNX default 0).
    Signed codes are shifted by +8 (and their zero points too), so ``code - zp`` is unchanged.
    """
    check_block_size(block_size)
    data = np.asarray(data)
    K, N = data.shape
    kb = k_blocks(K, block_size)
    scales = np.asarray(scales)
    if scales.shape != (kb, N):
        raise ValueError(f"scales shape {scales.shape} does not match weight [{K}, {N}] with block {block_size}")
    shift = 8 if signed else 0
    codes = (data.astype(np.int16) + shift).astype(np.uint8)
    padded = np.zeros((kb * block_size, N), np.uint8)
    padded[:K] = codes
    q = np.ascontiguousarray(padded.reshape(kb, block_size, N).transpose(2, 0, 1))
    B = pack_b(q)
    if zero_points is None:
        zp_u = None if signed else pack_zero_points(np.zeros((N, kb), np.uint8))
    else:
        zp = np.asarray(zero_points)
        if zp.shape != (kb, N):
            raise ValueError(f"zero_points shape {zp.shape} does not match scales shape {scales.shape}")
        zp_codes = (zp.astype(np.int16) + shift).astype(np.uint8).T
        zp_u = None if (signed and not zp.any()) else pack_zero_points(zp_codes)
    return MatMulNBitsWeights(B=B, scales=np.ascontiguousarray(scales.T), zero_points=zp_u, K=K, N=N,
                              block_size=block_size)
