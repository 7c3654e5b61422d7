"""MatMulNBits packing: bit-identical to ORT's quantizer kernel and numerically what ORT's MatMulNBits computes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

from npu_ep.quantization import (MatMulNBitsWeights, dequantize_b, from_int8_tiles, int8_tiles, pack_int4,
                                 quantize_matmul_nbits, repack_blocked_int4, unpack_b)

from ._ort import run_single_node


def _ort_quantize(w: np.ndarray, bs: int, sym: bool):
    """What MatMulNBitsQuantizer.qbits_block_quant does (same call, same buffers)."""
    K, N = w.shape
    kb = (K + bs - 1) // bs
    wp = np.pad(w, ((0, kb * bs - K), (0, 0)))
    packed = np.zeros((N, kb, bs // 2), np.uint8)
    zp = np.zeros((N, (kb + 1) // 2), np.uint8)
    sc = np.zeros((N, kb), w.dtype)
    quantize_matmul_4bits(packed, wp, sc, zp, bs, N, K, sym)
    return packed, sc, zp


SHAPES = [(64, 8), (100, 5), (35, 3), (257, 4), (16, 1), (300, 7)]


@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("bs", [16, 32, 128])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bit_identical_to_ort_kernel(K, N, bs, sym, dtype):
    rng = np.random.default_rng(K * 1000 + N + bs)
    w = (rng.standard_normal((K, N)) * 3).astype(dtype)
    w[: min(bs, K), 0] = 0.0  # an all-zero block (scale 0)
    w[-1, -1] = 0.5 * 3  # an exact tie somewhere
    ref_b, ref_s, ref_zp = _ort_quantize(w, bs, sym)
    ours = quantize_matmul_nbits(w, bs, sym)
    assert ours.B.tobytes() == ref_b.tobytes()
    assert ours.scales.tobytes() == ref_s.tobytes()
    if sym:
        assert ours.zero_points is None
    else:
        assert ours.zero_points.tobytes() == ref_zp.tobytes()


def _run_matmul_nbits(a: np.ndarray, w: MatMulNBitsWeights) -> np.ndarray:
    inits = [numpy_helper.from_array(w.B, "B"), numpy_helper.from_array(w.scales, "scales")]
    inputs = ["a", "B", "scales"]
    if w.zero_points is not None:
        inits.append(numpy_helper.from_array(w.zero_points, "zp"))
        inputs.append("zp")
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=w.K, N=w.N, bits=4,
                            block_size=w.block_size)
    return run_single_node(node, {"a": a}, inits, TensorProto.FLOAT)


@pytest.mark.parametrize("sym", [True, False])
def test_dequantize_b_is_what_ort_multiplies_by(sym):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((96, 6)).astype(np.float32)
    q = quantize_matmul_nbits(w, 32, sym)
    a = rng.standard_normal((4, 96)).astype(np.float32)
    np.testing.assert_allclose(_run_matmul_nbits(a, q), a @ dequantize_b(q), rtol=1e-5, atol=1e-5)
    # and the quantization error stays within half a step per element
    step = np.abs(np.repeat(q.scales.T, 32, axis=0)[:96])
    assert np.all(np.abs(dequantize_b(q) - w) <= step * (0.5 if not sym else 1.0) + 1e-6)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("with_zp", [True, False])
def test_repack_matches_ort_blocked_dequantize_linear(signed, with_zp):
    rng = np.random.default_rng(5)
    K, N, bs = 80, 6, 32
    kb = 3
    codes = rng.integers(-8, 8, (K, N)) if signed else rng.integers(0, 16, (K, N))
    scales = rng.uniform(0.01, 0.1, (kb, N)).astype(np.float32)
    zps = (rng.integers(-8, 8, (kb, N)) if signed else rng.integers(0, 16, (kb, N))) if with_zp else None
    dt = TensorProto.INT4 if signed else TensorProto.UINT4
    inits = [helper.make_tensor("q", dt, (K, N), pack_int4(codes).tobytes(), raw=True),
             numpy_helper.from_array(scales, "s")]
    inputs = ["q", "s"]
    if with_zp:
        inits.append(helper.make_tensor("z", dt, (kb, N), pack_int4(zps).tobytes(), raw=True))
        inputs.append("z")
    node = helper.make_node("DequantizeLinear", inputs, ["y"], axis=0, block_size=bs)
    ref_w = run_single_node(node, {}, inits, TensorProto.FLOAT)

    data = codes.astype(np.int8 if signed else np.uint8)
    zp_arr = None if zps is None else zps.astype(np.int8 if signed else np.uint8)
    packed = repack_blocked_int4(data, scales, zp_arr, signed, bs)
    np.testing.assert_array_equal(dequantize_b(packed), ref_w)
    a = rng.standard_normal((3, K)).astype(np.float32)
    np.testing.assert_allclose(_run_matmul_nbits(a, packed), a @ ref_w, rtol=1e-5, atol=1e-5)


def test_unpack_b_inverts_pack():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((50, 3)).astype(np.float32)
    q = quantize_matmul_nbits(w, 16, False)
    codes = unpack_b(q.B, 50)
    assert codes.shape == (3, 50) and codes.max() <= 15


@pytest.mark.parametrize("bs", [8, 24, 512])
def test_bad_block_size_is_rejected(bs):
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        quantize_matmul_nbits(np.zeros((32, 2), np.float32), bs, True)


def test_repack_shape_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"scales shape \(2, 3\) does not match weight \[80, 3\]"):
        repack_blocked_int4(np.zeros((80, 3), np.int8), np.ones((2, 3), np.float32), None, True, 32)


@pytest.mark.parametrize("K,N,bs", [(64, 32, 16), (100, 5, 32), (257, 70, 128), (512, 96, 256)])
@pytest.mark.parametrize("sym", [True, False])
def test_int8_tiles_hold_each_code_where_the_layout_says(K, N, bs, sym):
    q = quantize_matmul_nbits(np.random.default_rng(K + N).standard_normal((K, N)).astype(np.float32), bs, sym)
    tiles, scales, zp = int8_tiles(q)
    kb = -(-K // bs)
    codes = unpack_b(q.B, kb * bs)
    zb = (kb + 1) // 2
    assert tiles.shape == (-(-N // 32), kb * bs // 4, 64) and scales.shape == (kb * N,)
    zp_rows = q.zero_points.reshape(N, zb) if not sym else None
    for n in range(-(-N // 32) * 32):
        g, lane = divmod(n, 32)
        byte = tiles[g, :, 4 * (lane % 16):4 * (lane % 16) + 4].reshape(-1)
        got = (byte >> 4) if lane >= 16 else (byte & 0x0F)
        np.testing.assert_array_equal(got, codes[n] if n < N else 0, err_msg=f"column {n}")
        if n >= N:
            continue
        w = min(32, N - 32 * g)  # the group's width: its block rows are w apart
        np.testing.assert_array_equal(scales[32 * g * kb + lane::w][:kb], q.scales.reshape(N, kb)[n])
        if not sym:
            np.testing.assert_array_equal(zp[32 * g * zb + lane::w][:zb], zp_rows[n])
    assert zp is None if sym else zp.shape == (zb * N,)


@pytest.mark.parametrize("K,N,bs", [(35, 3, 16), (300, 33, 32), (2048, 64, 64)])
@pytest.mark.parametrize("sym", [True, False])
def test_from_int8_tiles_gives_ort_arrays_back_bit_for_bit(K, N, bs, sym):
    q = quantize_matmul_nbits(np.random.default_rng(K).standard_normal((K, N)).astype(np.float32), bs, sym)
    back = from_int8_tiles(*int8_tiles(q), K, N, bs)
    np.testing.assert_array_equal(back.B, q.B.reshape(back.B.shape))  # odd K's pad nibble included
    np.testing.assert_array_equal(back.scales, q.scales.reshape(N, -1))
    if sym:
        assert back.zero_points is None
    else:
        np.testing.assert_array_equal(back.zero_points, q.zero_points.reshape(N, -1))
