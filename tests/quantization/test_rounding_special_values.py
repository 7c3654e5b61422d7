"""The offline QuantizeLinear (``quantization.rounding``, shared with the kernels) equals ORT's CPU kernel on NaN,
+-inf and values far beyond the type's range: NaN gives the type's lowest value, whatever the zero point."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.quantization import qrange, quantize_linear, saturate

from ._ort import run_single_node

SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9, -3e9, 2.5, -2.5, 0.0, -0.0, 300, -300], np.float32)
ONNX_TYPES = {"int4": (TensorProto.INT4, [0, 3, -8]), "uint4": (TensorProto.UINT4, [0, 15]),
              "int8": (TensorProto.INT8, [0, -7]), "uint8": (TensorProto.UINT8, [0, 255]),
              "int16": (TensorProto.INT16, [0, 100]), "uint16": (TensorProto.UINT16, [0, 30000])}


def _ort_quantize(x: np.ndarray, scale: float, zp: int, qtype: str) -> np.ndarray:
    onnx_type = ONNX_TYPES[qtype][0]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"), helper.make_tensor("z", onnx_type, [], [zp])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])]
    if qtype.endswith("int4"):  # ORT cannot hand int4 to numpy: read it back through an exact DequantizeLinear
        inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                  helper.make_tensor("zero", onnx_type, [], [0])]
        nodes.append(helper.make_node("DequantizeLinear", ["q", "one", "zero"], ["qf"]))
        return run_single_node(nodes, {"x": x}, inits, TensorProto.FLOAT).astype(np.int64)
    return run_single_node(nodes, {"x": x}, inits, onnx_type).astype(np.int64)


@pytest.mark.parametrize("qtype,zp", [(q, z) for q, (_, zps) in ONNX_TYPES.items() for z in zps])
def test_quantize_linear_of_special_values_matches_ort(qtype, zp):
    want = _ort_quantize(SPECIAL, 0.5, zp, qtype)
    assert want[0] == qrange(qtype)[0]  # ORT: NaN -> the type's lowest value
    np.testing.assert_array_equal(quantize_linear(SPECIAL, 0.5, zp, qtype).astype(np.int64), want)


def test_saturate_sends_nan_to_the_lowest_value():
    for qtype in ONNX_TYPES:
        lo, hi = qrange(qtype)
        assert saturate(np.array([np.nan, np.inf, -np.inf]), qtype).tolist() == [lo, hi, lo]
