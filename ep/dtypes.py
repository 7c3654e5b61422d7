"""ONNX tensor element types <-> numpy dtypes (the shim passes ONNX enum values).

The enum values are ONNX's ``TensorProto.DataType`` (fixed by the IR spec; a test checks them against onnx). They
are spelled out here so that a session's start does not import onnx (~0.9 s with ml_dtypes).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class TensorProto(IntEnum):
    """The subset of ``onnx.TensorProto.DataType`` the shim hands over."""

    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    UINT4 = 21
    INT4 = 22

_ONNX_TO_NUMPY = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.BOOL: np.dtype(np.bool_),
}
_NUMPY_TO_ONNX = {v: k for k, v in _ONNX_TO_NUMPY.items()}


def numpy_dtype(elem_type: int) -> np.dtype | None:
    """numpy dtype for an ONNX element type; None for types the NPU path cannot carry (int4, bf16, strings...)."""
    return _ONNX_TO_NUMPY.get(int(elem_type))


def onnx_elem_type(dtype: np.dtype) -> int:
    return _NUMPY_TO_ONNX[np.dtype(dtype)]
