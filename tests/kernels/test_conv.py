"""Conv (fp32 rtol/atol 1e-4, fp16 2e-2) and QLinearConv (bit-exact) vs ORT CPU: strides, pads, auto_pad,
dilations, groups (incl. depthwise), per-channel weight scales, bias, odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from _single_op import both

RNG = np.random.default_rng(4)
CASES = [  # x shape, w shape, attrs
    ((1, 3, 11, 9), (8, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 4, 10, 10), (6, 2, 3, 2), dict(group=2, strides=[2, 1], dilations=[1, 2])),
    ((1, 6, 7, 8), (6, 1, 3, 3), dict(group=6, auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 5, 9, 6), (7, 5, 1, 1), dict()),
    ((1, 3, 8, 8), (4, 3, 4, 4), dict(auto_pad="SAME_LOWER")),
]


@pytest.mark.parametrize("xs,ws,attrs", CASES)
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_conv_matches_cpu(xs, ws, attrs, dt):
    x, w = RNG.standard_normal(xs).astype(dt), RNG.standard_normal(ws).astype(dt)
    bias = RNG.standard_normal(ws[0]).astype(dt)
    ours, ref, _, cost = both("Conv", [("x", x, False), ("w", w, True), ("b", bias, True)], **attrs)
    tol = 1e-4 if dt == np.float32 else 2e-2
    assert ours[0].shape == ref[0].shape and ours[0].dtype == ref[0].dtype
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), rtol=tol, atol=tol * 4)
    assert cost.macs > 0


@pytest.mark.parametrize("xs,ws,attrs", CASES)
@pytest.mark.parametrize("dtx,dtw", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("target", ["npu-ref", "npu-edge"])
def test_qlinearconv_bit_exact(xs, ws, attrs, dtx, dtw, per_channel, target):
    ix, iw = np.iinfo(dtx), np.iinfo(dtw)
    x = RNG.integers(ix.min, ix.max + 1, xs).astype(dtx)
    wlo, whi = (-64, 63) if (dtx, dtw) == (np.uint8, np.int8) else (iw.min, iw.max)  # ORT AVX2 u8s8: see matmul_int
    w = RNG.integers(wlo, whi + 1, ws).astype(dtw)
    m = ws[0]
    wsc = (RNG.uniform(0.002, 0.01, m) if per_channel else np.array(0.005)).astype(np.float32)
    wzp = np.zeros(m, dtw) if per_channel else np.array(0 if dtw == np.int8 else 120, dtw)
    inputs = [("x", x, False), ("xs", np.array(0.03, np.float32), True),
              ("xz", np.array(128 if dtx == np.uint8 else -3, dtx), True), ("w", w, True), ("ws", wsc, True),
              ("wz", wzp, True), ("ys", np.array(0.05 * np.sqrt(ws[1] * ws[2] * ws[3]), np.float32), True),
              ("yz", np.array(5, dtx), True), ("b", RNG.integers(-3000, 3000, m).astype(np.int32), True)]
    ours, ref, _, _ = both("QLinearConv", inputs, target, **attrs)
    assert ours[0].dtype == ref[0].dtype
    np.testing.assert_array_equal(ours[0], ref[0])


# --- 1-D and depthwise Conv through NpuEP sessions (issue 13) ---------------------------------------------------
from _ep_single import check_on_ep

CASES_1D_DW = [
    ((2, 4, 17), (6, 4, 3), dict(pads=[1, 1])),
    ((1, 8, 20), (8, 1, 5), dict(group=8, strides=[2], pads=[2, 2])),  # depthwise 1-D (speech front ends)
    ((1, 3, 16), (5, 3, 4), dict(auto_pad="SAME_UPPER", strides=[2])),
    ((1, 3, 16), (5, 3, 4), dict(dilations=[3], pads=[0, 2])),
    ((1, 4, 11), (4, 2, 3), dict(group=2, auto_pad="VALID", strides=[3])),
    ((1, 16, 9, 9), (16, 1, 3, 3), dict(group=16, pads=[1, 1, 1, 1])),  # depthwise 2-D (MobileNet)
    ((1, 16, 9, 9), (32, 1, 3, 3), dict(group=16, strides=[2, 2], pads=[0, 1, 1, 0])),  # depth multiplier 2
    ((1, 6, 11, 10), (12, 1, 3, 3), dict(group=6, dilations=[2, 1], strides=[1, 2], pads=[2, 1, 2, 1])),
    ((2, 8, 7, 7), (8, 1, 5, 5), dict(group=8, auto_pad="SAME_LOWER")),
    ((2, 5, 6, 7), (9, 5, 1, 1), dict()),  # pointwise: one GEMM in NCHW
    ((1, 5, 13), (7, 5, 1), dict()),  # pointwise 1-D
    ((1, 4, 6, 7), (6, 4, 1, 1), dict(pads=[1, 0, 0, 1])),  # 1x1 with pads: the patch path
    ((1, 4, 6, 7), (6, 2, 1, 1), dict(group=2)),  # grouped 1x1: the patch path
]


@pytest.mark.parametrize("xs,ws,attrs", CASES_1D_DW)
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_conv_1d_depthwise_and_pointwise_on_npu(xs, ws, attrs, dt):
    x, w = RNG.standard_normal(xs).astype(dt), RNG.standard_normal(ws).astype(dt)
    bias = RNG.standard_normal(ws[0]).astype(dt)
    tol = (1e-4, 4e-4) if dt == np.float32 else (2e-2, 8e-2)
    check_on_ep("Conv", [("x", x, False), ("w", w, True), ("b", bias, True)], [("y", dt)], attrs, tol=tol)


def test_qlinearconv_1d_bit_exact():
    x = RNG.integers(0, 256, (1, 4, 15)).astype(np.uint8)
    w = RNG.integers(-60, 60, (6, 4, 3)).astype(np.int8)
    inputs = [("x", x, False), ("xs", np.array(0.03, np.float32), True), ("xz", np.array(128, np.uint8), True),
              ("w", w, True), ("ws", np.array(0.005, np.float32), True), ("wz", np.array(0, np.int8), True),
              ("ys", np.array(0.2, np.float32), True), ("yz", np.array(5, np.uint8), True)]
    ours, ref, _, _ = both("QLinearConv", inputs, "npu-edge", pads=[1, 1], strides=[2])
    np.testing.assert_array_equal(ours[0], ref[0])
