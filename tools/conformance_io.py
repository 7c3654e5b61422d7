"""Feeding conformance cases to ORT's Python API and reading its outputs back (``npu_ep.tools.conformance``).

ORT's numpy bridge knows numpy's own dtypes only. The cases also hold TensorProtos, numpy scalars and ml_dtypes
arrays (bfloat16, the float8 family, and the sub-byte int4, uint4, int2, uint2, float4e2m1): those go in as
OrtValues of their ONNX element type and come back from their raw bytes. Sub-byte values are packed as ONNX and ORT
store them (the first element in the lowest bits of a byte); ml_dtypes keeps one per byte, in the low bits.
"""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

_T = onnx.TensorProto
# ml_dtypes name -> (ONNX element type, bits per element)
_EXOTIC = {"bfloat16": (_T.BFLOAT16, 16), "float8_e4m3fn": (_T.FLOAT8E4M3FN, 8),
           "float8_e4m3fnuz": (_T.FLOAT8E4M3FNUZ, 8), "float8_e5m2": (_T.FLOAT8E5M2, 8),
           "float8_e5m2fnuz": (_T.FLOAT8E5M2FNUZ, 8), "int4": (_T.INT4, 4), "uint4": (_T.UINT4, 4),
           "int2": (_T.INT2, 2), "uint2": (_T.UINT2, 2), "float4_e2m1fn": (_T.FLOAT4E2M1, 4)}
_BY_ORT_TYPE = {f"tensor({_T.DataType.Name(elem).lower()})": name
                for name, (elem, _) in _EXOTIC.items()}  # ORT's type string -> ml_dtypes name


def as_value(value: Any) -> Any:
    """A numpy value: TensorProtos (some generated cases store values so) and scalars become arrays."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [as_value(v) for v in value]
    return value if value is None or isinstance(value, np.ndarray) else np.asarray(value)


def run(sess, inputs: list[Any]) -> list[Any]:
    """``sess`` on ``inputs`` fed by position to the graph's first inputs (onnx's runner convention); inputs given
    as None are left out (ORT reads a missing optional input as none)."""
    names = [i.name for i in sess.get_inputs()]
    feeds = {name: as_value(value) for name, value in zip(names, inputs) if value is not None}
    exotic_in = any(isinstance(v, np.ndarray) and v.dtype.name in _EXOTIC for v in feeds.values())
    exotic_out = any(o.type in _BY_ORT_TYPE for o in sess.get_outputs())
    if not (exotic_in or exotic_out):
        return sess.run(None, feeds)
    values = {k: _ort_value(v) for k, v in feeds.items()}
    outputs = sess.run_with_ort_values([o.name for o in sess.get_outputs()], values)
    return [_from_ort_value(v) for v in outputs]


def _ort_value(value: Any):
    import onnxruntime as ort

    if not isinstance(value, np.ndarray):
        raise TypeError(f"a {type(value).__name__} input next to an ml_dtypes tensor is not convertible here")
    if value.dtype.name not in _EXOTIC:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
    elem, bits = _EXOTIC[value.dtype.name]
    if bits >= 8:
        storage = np.ascontiguousarray(value).view(np.uint16 if bits == 16 else np.uint8)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(storage, elem)
    packed = _pack(value, bits)
    out = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), elem)
    if packed.nbytes != out.tensor_size_in_bytes():
        raise ValueError(f"{value.dtype.name} {value.shape}: {packed.nbytes} packed bytes, ORT holds "
                         f"{out.tensor_size_in_bytes()}")
    if packed.nbytes:
        ctypes.memmove(out.data_ptr(), packed.ctypes.data, packed.nbytes)
    return out


def _from_ort_value(value) -> Any:
    if not value.is_tensor():
        raise TypeError(f"a {value.data_type()} output next to an ml_dtypes tensor is not readable here")
    name = _BY_ORT_TYPE.get(value.data_type())
    if name is None:
        return value.numpy()
    size = value.tensor_size_in_bytes()
    raw = np.frombuffer(ctypes.string_at(value.data_ptr(), size) if size else b"", np.uint8)
    shape, bits = value.shape(), _EXOTIC[name][1]
    codes = raw if bits >= 8 else _unpack(raw, int(np.prod(shape, dtype=np.int64)), bits)
    return codes.view(getattr(ml_dtypes, name)).reshape(shape).copy()


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Sub-byte codes packed ``8 // bits`` to a byte, the first in the lowest bits (the last byte zero-padded)."""
    per = 8 // bits
    codes = np.ascontiguousarray(values).view(np.uint8).reshape(-1) & ((1 << bits) - 1)
    codes = np.concatenate([codes, np.zeros(-len(codes) % per, np.uint8)]).reshape(-1, per)
    return np.bitwise_or.reduce(codes << (np.arange(per, dtype=np.uint8) * bits), axis=1).astype(np.uint8)


def _unpack(raw: np.ndarray, count: int, bits: int) -> np.ndarray:
    per = 8 // bits
    codes = (raw[:, None] >> (np.arange(per, dtype=np.uint8) * bits)) & ((1 << bits) - 1)
    return np.ascontiguousarray(codes.reshape(-1)[:count]).astype(np.uint8)
