"""QuantizeLinear rounding/saturation must equal ORT's CPU QuantizeLinear for every supported type."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.quantization import (dequantize_linear, qrange, quantize_linear, round_half_away_from_zero,
                                 round_half_to_even, saturate)

from ._ort import run_single_node

ONNX_TYPES = {
    "int4": TensorProto.INT4, "uint4": TensorProto.UINT4, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16, "uint16": TensorProto.UINT16,
}


def test_half_to_even_on_ties():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997], np.float32)
    assert round_half_to_even(x).tolist() == [0, 2, 2, -0, -2, -2, 0]


def test_half_away_from_zero_on_ties_and_near_ties():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, np.nextafter(np.float32(0.5), np.float32(0)), 7.0], np.float32)
    assert round_half_away_from_zero(x).tolist() == [1, 2, 3, -1, -3, 0, 7]


@pytest.mark.parametrize("qtype", sorted(ONNX_TYPES))
def test_quantize_linear_matches_ort(qtype):
    lo, hi = qrange(qtype)
    rng = np.random.default_rng(7)
    scale = np.float32(0.37)
    zp_value = (lo + hi + 1) // 2 if lo == 0 else -1
    # ties (k + 0.5) * scale, values far out of range on both sides, and random values
    ties = (np.arange(lo - 4, hi + 4, max(1, (hi - lo) // 64)) + 0.5).astype(np.float32) * scale
    x = np.concatenate([ties, np.float32([1e9, -1e9, 0.0]),
                        rng.uniform((lo - 10) * 0.37, (hi + 10) * 0.37, 2000).astype(np.float32)]).astype(np.float32)
    ours = quantize_linear(x, scale, zp_value, qtype)

    zp_t = helper.make_tensor("zp", ONNX_TYPES[qtype], [], [zp_value])
    sc_t = numpy_helper.from_array(np.array(scale, np.float32), "scale")
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"])]
    out_type = ONNX_TYPES[qtype]
    if qtype.endswith("int4"):  # ORT cannot hand int4 to numpy: read it back through an exact DequantizeLinear
        one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
        zero = helper.make_tensor("zero", ONNX_TYPES[qtype], [], [0])
        nodes.append(helper.make_node("DequantizeLinear", ["y", "one", "zero"], ["yf"]))
        sc_t, zp_t, extra = sc_t, zp_t, [one, zero]
        out_type = TensorProto.FLOAT
    else:
        extra = []
    ref = run_single_node(nodes, {"x": x}, [sc_t, zp_t, *extra], out_type)
    np.testing.assert_array_equal(ours.astype(np.int64), np.asarray(ref).astype(np.int64))


def test_saturate_clips_to_type_range():
    assert saturate(np.array([-100, 100]), "int4").tolist() == [-8, 7]
    assert saturate(np.array([-100, 100]), "uint4").tolist() == [0, 15]
    assert saturate(np.array([-1e6, 1e6]), "uint16").tolist() == [0, 65535]


def test_unknown_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown quantized type 'int3'"):
        quantize_linear(np.zeros(2, np.float32), 1.0, 0, "int3")


def test_per_channel_round_trip():
    x = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
    scale = np.array([0.5, 0.25], np.float32)
    q = quantize_linear(x, scale, 0, "int8", axis=1)
    assert q.tolist() == [[2, 8], [6, -16]]
    np.testing.assert_array_equal(dequantize_linear(q, scale, 0, axis=1), x)
