"""ONNX int4 packing must match onnx's own packer and ORT's DequantizeLinear reading of the bytes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.quantization import pack_int4, unpack_int4

from ._ort import run_single_node


def test_low_nibble_first():
    assert pack_int4(np.array([1, 2, 3], np.int8)).tolist() == [0x21, 0x03]
    assert pack_int4(np.array([-1, -8], np.int8)).tolist() == [0x8F]


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("count", [1, 2, 7, 64])
def test_round_trip(signed, count):
    rng = np.random.default_rng(count)
    v = rng.integers(-8, 8, count).astype(np.int8) if signed else rng.integers(0, 16, count).astype(np.uint8)
    np.testing.assert_array_equal(unpack_int4(pack_int4(v), count, signed), v)


@pytest.mark.parametrize("signed", [True, False])
def test_packed_bytes_read_by_ort_dequantize_linear(signed):
    rng = np.random.default_rng(3)
    shape = (5, 3)
    v = rng.integers(-8, 8, shape) if signed else rng.integers(0, 16, shape)
    dt = TensorProto.INT4 if signed else TensorProto.UINT4
    raw = pack_int4(v).tobytes()
    data = helper.make_tensor("q", dt, shape, raw, raw=True)
    # onnx's own reader agrees with our layout
    np.testing.assert_array_equal(numpy_helper.to_array(data).astype(np.int64), v)
    scale = numpy_helper.from_array(np.array(1.0, np.float32), "s")
    node = helper.make_node("DequantizeLinear", ["q", "s"], ["y"])
    out = run_single_node(node, {}, [data, scale], TensorProto.FLOAT)
    np.testing.assert_array_equal(out, v.astype(np.float32))


def test_unpack_rejects_short_buffer():
    with pytest.raises(ValueError, match="cannot unpack 5 int4 elements from 2 bytes"):
        unpack_int4(np.zeros(2, np.uint8), 5, signed=True)


def test_pack_rejects_float():
    with pytest.raises(TypeError, match="integer values"):
        pack_int4(np.zeros(2, np.float32))
