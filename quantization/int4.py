"""ONNX int4/uint4 packing: two elements per byte, the first element in the low nibble.

Tensors are flattened in C order before packing; an odd element count leaves the last high nibble zero.
"""

from __future__ import annotations

import numpy as np


def pack_int4(values: np.ndarray) -> np.ndarray:
    """Pack int4 (-8..7) or uint4 (0..15) values into a flat uint8 array of ``ceil(size / 2)`` bytes."""
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise TypeError(f"pack_int4 needs integer values, got dtype {v.dtype}")
    flat = (v.reshape(-1).astype(np.int16) & 0x0F).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return flat[0::2] | (flat[1::2] << 4)


def unpack_int4(packed: np.ndarray, count: int, signed: bool) -> np.ndarray:
    """Unpack ``count`` 4-bit elements from bytes (low nibble first); int8 with sign extension if ``signed``."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)
    if count > 2 * b.size:
        raise ValueError(f"cannot unpack {count} int4 elements from {b.size} bytes")
    out = np.empty(2 * b.size, np.uint8)
    out[0::2] = b & 0x0F
    out[1::2] = b >> 4
    out = out[:count]
    if signed:
        return ((out.astype(np.int8) << 4) >> 4).astype(np.int8)
    return out
