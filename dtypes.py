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

# Every ONNX element type by name (onnx.TensorProto.DataType, lower case; numpy's names where numpy has the type),
# so that a decline names the type it refuses, e.g. bfloat16 or string, not "None".
_ONNX_NAMES = {
    0: "undefined", 1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64",
    15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
    20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2",
    27: "float6e2m3", 28: "float6e3m2",
}


def numpy_dtype(elem_type: int) -> np.dtype | None:
    """numpy dtype for an ONNX element type; None for types the NPU path cannot carry (int4, bf16, strings...)."""
    return _ONNX_TO_NUMPY.get(int(elem_type))


def onnx_elem_type(dtype: np.dtype) -> int:
    return _NUMPY_TO_ONNX[np.dtype(dtype)]


def type_name(elem_type: int) -> str:
    """The ONNX element type's name (``bfloat16``, ``string``, ...) for messages; unknown numbers as ``type <n>``."""
    return _ONNX_NAMES.get(int(elem_type), f"type {int(elem_type)}")


def crosses_boundary(elem_type: int) -> bool:
    """Whether a tensor of this element type may enter or leave an NPU partition: the runtime hands partition
    inputs and outputs over as numpy arrays, so only types with a numpy dtype cross. The one rule: capability
    declines the nodes whose boundary tensors do not, and the shim's Compile refuses them by asking this function
    (ep/native/execution_provider.cc ``CrossesBoundary``)."""
    return int(elem_type) in _ONNX_TO_NUMPY
