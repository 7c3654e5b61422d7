"""MatMulInteger, QLinearMatMul (bit-exact vs ORT CPU) and MatMulIntegerToFloat (float32 rtol 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest

from _single_op import both

RNG = np.random.default_rng(1)


def _q(shape, dt, lo=None, hi=None):
    """Random codes over the dtype's range; int8 weights against uint8 activations use 7 bits ([-64, 63]): ORT's
    AVX2 U8S8 kernel (pmaddubsw) saturates pair sums above 2^15, an ORT artifact that ORT's quantizer avoids with
    reduce_range. The NPU's int32 accumulation has no such saturation."""
    info = np.iinfo(dt)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dt)


def _w(shape, dta, dtb):
    return _q(shape, dtb, -64, 63) if (dta, dtb) == (np.uint8, np.int8) else _q(shape, dtb)


SHAPES = [((7, 45), (45, 33)), ((2, 3, 19, 130), (130, 70)), ((2, 5, 64), (2, 64, 9)), ((3, 2100), (2100, 5))]


@pytest.mark.parametrize("dta,dtb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
@pytest.mark.parametrize("per_col", [False, True])
def test_matmulinteger_bit_exact(dta, dtb, a_shape, b_shape, per_col):
    a, b = _q(a_shape, dta), _w(b_shape, dta, dtb)
    azp = np.array(_q((), dta), dta)
    bzp = _q((b_shape[-1],), dtb) if per_col and len(b_shape) == 2 else np.array(_q((), dtb), dtb)
    ours, ref, _, _ = both("MatMulInteger", [("a", a, False), ("b", b, True), ("azp", azp, True),
                                             ("bzp", bzp, True)])
    assert ours[0].dtype == np.int32
    np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.parametrize("dta,dtb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
@pytest.mark.parametrize("per_col", [False, True])
@pytest.mark.parametrize("target", ["npu-ref", "npu-edge"])
def test_qlinearmatmul_bit_exact(dta, dtb, a_shape, b_shape, per_col, target):
    if target == "npu-edge" and len(a_shape) > 3:
        a_shape = a_shape[1:]  # npu-edge runs rank <= 3 (max_rank in its [ops] table)
    a, b = _q(a_shape, dta), _w(b_shape, dta, dtb)
    n = b_shape[-1]
    bscale = (RNG.uniform(0.001, 0.02, n) if per_col and len(b_shape) == 2 else np.array(0.01)).astype(np.float32)
    bzp = (_q((n,), dtb, 0 if dtb == np.uint8 else -3, 3) if per_col and len(b_shape) == 2
           else np.array(_q((), dtb, 0 if dtb == np.uint8 else -3, 3), dtb))
    k = a_shape[-1]
    inputs = [("a", a, False), ("as", np.array(0.02, np.float32), True),
              ("azp", np.array(128 if dta == np.uint8 else 0, dta), True),
              ("b", b, True), ("bs", bscale, True), ("bzp", bzp, True),
              ("ys", np.array(0.02 * 0.01 * np.sqrt(k) * 40, np.float32), True),
              ("yzp", np.array(3, dta), True)]
    ours, ref, _, cost = both("QLinearMatMul", inputs, target)
    assert ours[0].dtype == ref[0].dtype
    np.testing.assert_array_equal(ours[0], ref[0])
    assert 0 < cost.utilization <= 1


def test_qlinearmatmul_runtime_b_and_scales_bit_exact():
    a, b = _q((9, 300), np.uint8), _q((300, 40), np.uint8)
    inputs = [("a", a, False), ("as", np.array(0.03, np.float32), False), ("azp", np.array(120, np.uint8), False),
              ("b", b, False), ("bs", np.array(0.02, np.float32), False), ("bzp", np.array(130, np.uint8), False),
              ("ys", np.array(1.5, np.float32), False), ("yzp", np.array(100, np.uint8), False)]
    ours, ref, _, _ = both("QLinearMatMul", inputs)
    np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.parametrize("dta,dtb", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmulintegertofloat_matches_cpu(dta, dtb, with_bias):
    a, b = _q((2, 11, 200), dta), _w((200, 48), dta, dtb)
    inputs = [("a", a, False), ("b", b, True), ("as", np.array(0.05, np.float32), True),
              ("bs", RNG.uniform(0.01, 0.02, 48).astype(np.float32), True),
              ("azp", np.array(7, dta), True), ("bzp", _q((48,), dtb, 0, 5), True),
              ("bias", RNG.standard_normal(48).astype(np.float32) if with_bias else None, True)]
    ours, ref, _, _ = both("MatMulIntegerToFloat", inputs, domain="com.microsoft")
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-3)


def test_edge_rank_limit_is_a_named_rule():
    from _single_op import declined
    a, b = _q((2, 2, 4, 8), np.int8), _q((8, 8), np.int8)
    inputs = [("a", a, False), ("as", np.array(0.1, np.float32), True), ("azp", np.array(0, np.int8), True),
              ("b", b, True), ("bs", np.array(0.1, np.float32), True), ("bzp", np.array(0, np.int8), True),
              ("ys", np.array(0.5, np.float32), True), ("yzp", np.array(0, np.int8), True)]
    assert "max_rank 3 of target npu-edge" in declined("QLinearMatMul", inputs, "npu-edge")
    assert declined("QLinearMatMul", inputs, "npu-ref") is None
