"""Feeding conformance cases to ORT's Python API and reading its outputs back (``npu_ep.tools.conformance``).

ORT's numpy bridge knows numpy's own dtypes only. The cases also hold TensorProtos, numpy scalars and ml_dtypes
arrays (bfloat16, the float8 family): those go in as OrtValues of their ONNX element type and come back from their
raw bytes. Sub-byte types (int4, uint4, int2, uint2, float4e2m1) are packed differently in ORT and ml_dtypes and
are not converted: such a case fails on both sessions with ORT's own message.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - onnx depends on it
    ml_dtypes = None

_BYTE_SIZED = {}  # ml_dtypes dtype name -> (ONNX element type, numpy storage dtype)
if ml_dtypes is not None:
    for _name, _elem in (("bfloat16", onnx.TensorProto.BFLOAT16), ("float8_e4m3fn", onnx.TensorProto.FLOAT8E4M3FN),
                         ("float8_e4m3fnuz", onnx.TensorProto.FLOAT8E4M3FNUZ),
                         ("float8_e5m2", onnx.TensorProto.FLOAT8E5M2),
                         ("float8_e5m2fnuz", onnx.TensorProto.FLOAT8E5M2FNUZ)):
        _BYTE_SIZED[_name] = (_elem, np.uint16 if _name == "bfloat16" else np.uint8)
_BY_ORT_TYPE = {f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})": name
                for name, (elem, _) in _BYTE_SIZED.items()}  # ORT's type string -> ml_dtypes name


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
    exotic_in = any(isinstance(v, np.ndarray) and v.dtype.name in _BYTE_SIZED for v in feeds.values())
    exotic_out = any(o.type in _BY_ORT_TYPE for o in sess.get_outputs())
    if not (exotic_in or exotic_out):
        return sess.run(None, feeds)
    values = {k: _ort_value(v) for k, v in feeds.items()}
    outputs = sess.run_with_ort_values([o.name for o in sess.get_outputs()], values)
    return [_from_ort_value(v) for v in outputs]


def _ort_value(value: Any):
    import onnxruntime as ort

    if isinstance(value, np.ndarray) and value.dtype.name in _BYTE_SIZED:
        elem, storage = _BYTE_SIZED[value.dtype.name]
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(value).view(storage), elem)
    if isinstance(value, np.ndarray):
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
    raise TypeError(f"a {type(value).__name__} input next to an ml_dtypes tensor is not convertible here")


def _from_ort_value(value) -> Any:
    if not value.is_tensor():
        raise TypeError(f"a {value.data_type()} output next to an ml_dtypes tensor is not readable here")
    name = _BY_ORT_TYPE.get(value.data_type())
    if name is None:
        return value.numpy()
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return np.frombuffer(raw, dtype=getattr(ml_dtypes, name)).reshape(value.shape()).copy()
