"""Rounding and saturation rules of ONNX QuantizeLinear and of ORT's MLAS block quantizer.

Two rounding modes matter and they differ on ties:
- ONNX QuantizeLinear rounds half to even (``np.rint``), then saturates to the target range.
- MLAS's block quantizer (MatMulNBits packing) uses C ``roundf``: half away from zero.

Saturation is ORT's: NaN gives the type's lowest value (MLAS clamps with fmax/fmin, which drop the NaN), +-inf the
type's limits. The NPU kernels (``kernels/ops/_matrix.py``) and the offline tools share these functions.
"""

from __future__ import annotations

import numpy as np

# (min, max) of every integer type QuantizeLinear can produce here
QUANT_RANGES: dict[str, tuple[int, int]] = {
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
}

# numpy container for each type; int4/uint4 are held unpacked, one element per int8/uint8
_CONTAINER = {
    "int4": np.int8,
    "uint4": np.uint8,
    "int8": np.int8,
    "uint8": np.uint8,
    "int16": np.int16,
    "uint16": np.uint16,
}


def qrange(qtype: str) -> tuple[int, int]:
    """Return ``(qmin, qmax)`` of ``qtype`` (one of ``QUANT_RANGES``); ValueError names unknown types."""
    try:
        return QUANT_RANGES[qtype]
    except KeyError:
        raise ValueError(f"unknown quantized type {qtype!r}; expected one of {sorted(QUANT_RANGES)}") from None


def container_dtype(qtype: str) -> np.dtype:
    """The numpy dtype holding unpacked values of ``qtype`` (int4 -> int8, uint4 -> uint8)."""
    qrange(qtype)
    return np.dtype(_CONTAINER[qtype])


def round_half_to_even(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even (IEEE default; what QuantizeLinear specifies)."""
    return np.rint(x)


def round_half_away_from_zero(x: np.ndarray) -> np.ndarray:
    """C ``roundf`` semantics, exact for every float (no ``floor(x + 0.5)`` precision trap)."""
    x = np.asarray(x)
    t = np.trunc(x)
    frac = x - t  # exact: x and t share the exponent range
    return t + np.where(np.abs(frac) >= 0.5, np.sign(x), 0).astype(x.dtype)


def saturate(x: np.ndarray, qtype: str) -> np.ndarray:
    """Clip rounded values to ``qtype``'s range (NaN to its lowest value, as ORT) and cast to its container dtype."""
    lo, hi = qrange(qtype)
    return np.fmin(np.fmax(x, lo), hi).astype(_CONTAINER[qtype])


def quantize_float(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qtype: str) -> np.ndarray:
    """QuantizeLinear as ORT computes it, all in float32: ``saturate(rint(x / scale) + zero_point)``.

    ``scale`` and ``zero_point`` already broadcast against ``x`` (``quantize_linear`` shapes per-channel ones).
    """
    lo, hi = qrange(qtype)
    q = np.asarray(np.asarray(x).astype(np.float32) / np.asarray(scale, np.float32))  # 0-d stays an array
    np.rint(q, out=q)
    q += np.asarray(zero_point, np.float32)
    np.fmax(q, np.float32(lo), out=q)  # fmax/fmin drop the NaN: NaN -> lo
    np.fmin(q, np.float32(hi), out=q)
    return q.astype(_CONTAINER[qtype])


def _broadcastable(scale, zero_point, axis: int | None, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 scale and int64 zero point shaped to broadcast against a rank-``ndim`` tensor (per-channel on axis)."""
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.asarray(zero_point).astype(np.int64)
    if scale.ndim == 1 and scale.size > 1:
        if axis is None:
            raise ValueError(f"per-channel scale of shape {scale.shape} needs an axis")
        shape = [1] * ndim
        shape[axis] = scale.size
        scale = scale.reshape(shape)
        zp = zp.reshape(shape) if zp.size > 1 else zp
    return scale, zp


def quantize_linear(
    x: np.ndarray,
    scale: np.ndarray | float,
    zero_point: np.ndarray | int = 0,
    qtype: str = "uint8",
    axis: int | None = None,
) -> np.ndarray:
    """ONNX QuantizeLinear: ``saturate(round_half_to_even(x / scale) + zero_point)`` (``quantize_float``).

    Computed in float32 like ORT's CPU kernel. ``scale``/``zero_point`` are scalars, or 1-D per-channel
    arrays along ``axis``. The result holds unpacked values in the container dtype (int4 -> int8); use
    ``npu_ep.quantization.int4.pack_int4`` to get ONNX's packed int4 bytes.
    """
    qrange(qtype)  # unknown types fail before any work
    x = np.asarray(x, dtype=np.float32)
    scale, zp = _broadcastable(scale, zero_point, axis, x.ndim)
    return quantize_float(x, scale, zp, qtype)


def dequantize_linear(q: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | int = 0,
                      axis: int | None = None) -> np.ndarray:
    """ONNX DequantizeLinear ``(q - zero_point) * scale`` in float32 (per-tensor or per-channel on ``axis``)."""
    q = np.asarray(q).astype(np.int64)
    scale, zp = _broadcastable(scale, zero_point, axis, q.ndim)
    return ((q - zp).astype(np.float32) * scale).astype(np.float32)
