"""Differential sweep of the native MaxPool / AveragePool (kernels/native/pool.cc) against the reference model
(kernels/ops/pool.py), issue 38: every path the kernel dispatches to, over widths and heights just below, at and
above its vector widths, with NaN, +-Inf, -0.0, huge and tiny values, on every instruction-set level it has.

pool.cc's paths and their blocks:
- the 2x2 / stride-2 register kernels (no pads, windows inside the plane, AVX-512): 16 float / 32 byte outputs per
  step (MaxPool; AveragePool float32);
- float32 MaxPool and AveragePool of unit strides on AVX-512: separably, each input row's window-row maxima or sums
  (16 per step) into a buffer, then each output the maximum or the sum of its window's rows there; vmaxps alone on a
  plane without NaN, the NaN fix-up on one with;
- float32 on AVX-512, every other window (issue 40): 16 outputs of a row per step; where 16 outputs' windows span
  at most 48 input columns (15 sw + (kw - 1) dw + 1), that span in three registers per window row (masked loads:
  pads and ceil_mode's overhang hold the pad value), maxima folding the rows first, sums tap by tap; wider spans
  (strides >= 3, wide dilations) load each tap (a gather) and take the edge outputs scalar;
- float32 on AVX2: the 2x2 / stride-2 kernel (8 outputs per step, MaxPool and AveragePool); MaxPool of unit strides
  separably (masked loads padded with -FLT_MAX at the rows' edges); other MaxPools' row pass into a buffer padded
  with -FLT_MAX, then 8 outputs' columns per step (a load at stride 1, two loads and a shuffle at 2, a gather
  otherwise); AveragePool's separable pass with 8 row sums per step (masked loads or gathers at the row's edges) and
  8 column sums, every input row's sums first where sh <= kh, else each row's when first needed; so the 8-lane tails
  (1-7 lanes) are crossed as well as the 16-lane ones;
- bytes from AVX2 on: the 2x2 / stride-2 kernel (32 outputs per step; AVX-512's with masks), every other window's
  row pass (the window's rows folded in registers, 32 bytes per step) into a buffer padded with the lowest value,
  then 32 outputs' columns per step (stride 1: loads; stride 2: even and odd bytes split once; others one by one);
  partial blocks redo the last whole one, rows under 32 take overlapping 16s or 8s (test_byte_lane_tails);
- the portable level: the row pass's scalar form, then scalar columns; AveragePool scalar.
MaxPool is exact (a maximum rounds nothing: the same value, NaN where the reference has NaN); AveragePool is
bit-exact too, by its contract (pool.h): the same float32 additions in the same order, then the same division."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_testing import assignment, cpu_run, make_model, npu_session
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(38)
POOL_ISAS = host_isas(top="avx512")  # pool.cc has no path above AVX-512


@pytest.fixture(params=POOL_ISAS)
def pool_isa(request):
    yield from cap_isa(request.param)


def _image(shape, dt) -> np.ndarray:
    if dt == np.float32:
        return with_specials(RNG.standard_normal(shape).astype(np.float32) * 10, RNG)
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dt)
    x.reshape(-1)[:: 7] = info.min  # the type's lowest value: padding's value, and the byte kernels' start
    x.reshape(-1)[3:: 11] = info.max
    return x


def _max(x, threads=1, **attrs):
    return check("MaxPool", [("x", x, False)], "max_pool", exact=True, threads=threads, **attrs)


def _avg(x, threads=1, **attrs):
    return check("AveragePool", [("x", x, False)], "avg_pool", exact=True, threads=threads, **attrs)


# 2x2 / stride 2 register kernel: OW around 16 (float) and 32 (bytes) outputs per step; an odd W / H leaves a column /
# row outside every window (2 * OW < W).
TWO_BY_TWO_OW = around(8, 16, 32)


@pytest.mark.parametrize("dt", [np.float32, np.uint8, np.int8])
def test_max_2x2_register_kernel(pool_isa, dt):
    for ow in TWO_BY_TWO_OW:
        for w in (2 * ow, 2 * ow + 1):
            x = _image((1, 2, 5, w), dt)  # H = 5: two output rows and a row no window reads
            _max(x, kernel_shape=[2, 2], strides=[2, 2])


# Column pairs (kw = 2, sw = 2, no left pad) where the rows do not fit the register kernel: a 3-tall window, a top
# pad, a row dilation, ceil_mode's last window past the bottom.
PAIR_ROWS = [dict(kernel_shape=[3, 2], strides=[1, 2]), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 1, 0]),
             dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 1]),
             dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)]


@pytest.mark.parametrize("attrs", PAIR_ROWS)
@pytest.mark.parametrize("dt", [np.float32, np.uint8, np.int8])
def test_max_column_pairs(pool_isa, dt, attrs):
    for ow in around(8, 16, 32):
        x = _image((1, 1, 5, 2 * ow + 1), dt)
        _max(x, **attrs)


# Unit-stride column pass: OW around 16 outputs per step, windows 1..5 wide, pads on either side (SPPF's 5x5 / 1,
# pads 2), SAME padding.
SLIDE = [dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]), dict(kernel_shape=[1, 3], pads=[0, 1, 0, 0]),
         dict(kernel_shape=[3, 4], strides=[2, 1], pads=[1, 0, 0, 3]), dict(kernel_shape=[2, 1]),
         dict(kernel_shape=[3, 3], strides=[1, 1], auto_pad="SAME_LOWER")]


@pytest.mark.parametrize("attrs", SLIDE)
@pytest.mark.parametrize("dt", [np.float32, np.int8])
def test_max_unit_stride(pool_isa, dt, attrs):
    for w in around(8, 16, 32):
        _max(_image((1, 2, 6, w), dt), **attrs)


# The scalar column pass: strides and dilations no vector pass takes, ceil_mode, negative SAME pads (kernel <
# stride); widths around the row pass's 16 floats / 64 bytes.
SCALAR = [dict(kernel_shape=[3, 3], strides=[2, 3], pads=[1, 1, 1, 1], ceil_mode=1),
          dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[0, 2, 1, 1]),
          dict(kernel_shape=[2, 1], strides=[3, 3], auto_pad="SAME_UPPER"),
          dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 1, 0, 1])]  # pairs, but a left pad


@pytest.mark.parametrize("attrs", SCALAR)
@pytest.mark.parametrize("dt", [np.float32, np.uint8, np.int8])
def test_max_scalar_geometries(pool_isa, dt, attrs):
    for w in around(8, 16, 64):
        _max(_image((1, 1, 7, w), dt), **attrs)


def test_max_windows_of_negative_infinity(pool_isa):
    """A window of -inf inside the plane gives -inf; one reaching the padding gives -FLT_MAX (the padding's value)."""
    for attrs in (dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_shape=[3, 2], strides=[1, 2]),
                  dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), dict(kernel_shape=[2, 3], strides=[3, 3])):
        for w in (15, 17, 33):
            x = np.full((1, 1, 4, w), -np.inf, np.float32)
            x[0, 0, 0, ::5] = np.nan
            _max(x, **attrs)


# The separable unit-stride pass: YOLO's SPPF windows (5, 9, 13 on 10x10 and 13x13 maps), windows wider than the
# plane, dilations, ceil_mode's overhang, one-sided pads, 1-D.
SEPARABLE = [dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), dict(kernel_shape=[9, 9], pads=[4, 4, 4, 4]),
             dict(kernel_shape=[13, 13], pads=[6, 6, 6, 6]),
             dict(kernel_shape=[3, 5], dilations=[2, 3], pads=[2, 1, 0, 4]),
             dict(kernel_shape=[4, 3], pads=[0, 2, 3, 0], ceil_mode=1), dict(kernel_shape=[1, 17], pads=[0, 8, 0, 8])]


@pytest.mark.parametrize("attrs", SEPARABLE)
def test_separable_unit_stride(pool_isa, attrs):
    """Planes without NaN (the vmaxps-only pass: +-Inf, -0.0, huge and tiny values, -FLT_MAX, a plane of -inf next to
    the padding) and planes with one NaN, in one tensor, at widths around 16 and 32 and heights around the window;
    AveragePool over the same (its separable pass: the reference's row sums, then their sum, then the division),
    with and without the padding counted."""
    specials = (np.inf, -np.inf, -0.0, 0.0, 3.0e38, -3.0e38, 1.0e-45, -1.0e-38, float(np.finfo(np.float32).min))
    (kh, kw), (dh, dw) = attrs["kernel_shape"], attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs["pads"]
    for w in sorted({*around(8, 16, 32), 1, 10, 13}):
        for h in (1, 6, 13):
            if h + pt + pb < (kh - 1) * dh + 1 or w + pl + pr < (kw - 1) * dw + 1:  # smaller than the window
                continue
            x = with_specials(RNG.standard_normal((2, 3, h, w)).astype(np.float32) * 10, RNG, values=specials)
            x[0, 1] = -np.inf
            x[1, 2].reshape(-1)[RNG.integers(h * w)] = np.nan
            _max(x, **attrs)
            _max(x, threads=2, **attrs)
            _avg(x, **attrs)
            _avg(x, threads=2, count_include_pad=1, **attrs)


def test_max_1d_and_threads(pool_isa):
    for w in around(8, 16, 32):
        x = _image((2, 3, w), np.float32)
        _max(x, threads=2, kernel_shape=[2], strides=[2])
        _max(x, threads=2, kernel_shape=[3], pads=[1, 1])


@pytest.mark.parametrize("shape,attrs", [
    ((2, 70, 30, 34), {"kernel_shape": [2, 2], "strides": [2, 2]}),  # 142,800 taps: tasks of 2^15 taps
    ((1, 67, 31, 29), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # a short last task
    ((1, 9, 120, 122), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # few planes, each a task
])
def test_max_planes_split_over_two_threads(pool_isa, shape, attrs):
    """Float32 MaxPool's planes in tasks of about 2^15 taps from 128K taps on (ForFloatPlanes): every plane in
    exactly one task, the bits of one thread."""
    _max(_image(shape, np.float32), threads=2, **attrs)


AVG = [dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
       dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
       dict(kernel_shape=[3, 2], strides=[2, 3], pads=[0, 1, 2, 0], ceil_mode=1),
       dict(kernel_shape=[2, 3], dilations=[2, 1], auto_pad="SAME_UPPER"),
       dict(kernel_shape=[2, 1], strides=[3, 3], auto_pad="SAME_LOWER", count_include_pad=1)]


@pytest.mark.parametrize("attrs", AVG)
def test_average(pool_isa, attrs):
    for w in around(8, 16, 32):
        _avg(_image((1, 2, 5, w), np.float32), threads=2, **attrs)


def test_average_2x2_register_kernel(pool_isa):
    """AveragePool's 2x2 / stride 2 register kernel (float32, and float16 through its widened planes): OW around 16
    and 32, an odd W / H outside every window, planes across tasks of 2^15 taps on two threads."""
    for ow in TWO_BY_TWO_OW:
        for w in (2 * ow, 2 * ow + 1):
            x = _image((1, 2, 5, w), np.float32)
            _avg(x, kernel_shape=[2, 2], strides=[2, 2])
            with np.errstate(over="ignore"):  # the huge specials round to +-inf
                half = x.astype(np.float16)
            check("AveragePool", [("x", half, False)], "avg_pool_half", exact=True, kernel_shape=[2, 2], strides=[2, 2])
    _avg(_image((2, 70, 30, 34), np.float32), threads=2, kernel_shape=[2, 2], strides=[2, 2])


def test_average_negative_zero_and_infinities(pool_isa):
    """-0.0 windows stay -0.0 only where no padded tap adds +0.0; Inf - Inf is NaN, as in the reference."""
    x = np.full((1, 1, 4, 17), -0.0, np.float32)
    x[0, 0, 1, ::3] = np.inf
    x[0, 0, 2, 1::3] = -np.inf
    for attrs in AVG:
        got = _avg(x, **attrs)[0]
        assert got.dtype == np.float32


# The float32 window kernels (issue 40): spans of 16 outputs' windows around 32 and 48 columns (the register
# kernel's second and third register, and past it the tap-by-tap kernel), the ResNet stem's 3x3 / 2 pad 1,
# Inception's 3x3 / 1, pads on each side alone, ceil_mode, negative SAME pads, strides 3 and 4 (gathers).
WINDOWS = [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
           dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
           dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 0, 0]),
           dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 2], ceil_mode=1),
           dict(kernel_shape=[3, 3], strides=[2, 2], pads=[2, 0, 1, 0], ceil_mode=1),
           dict(kernel_shape=[1, 17], pads=[0, 8, 0, 8]),  # span 32
           dict(kernel_shape=[2, 18], pads=[0, 3, 1, 9]),  # span 33
           dict(kernel_shape=[3, 3], strides=[1, 2], dilations=[2, 8], pads=[1, 9, 1, 9]),  # span 47
           dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[1, 9], pads=[1, 2, 0, 3]),  # span 48
           dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[1, 10], pads=[0, 4, 0, 4]),  # span 51: tap by tap
           dict(kernel_shape=[3, 4], strides=[3, 3], pads=[1, 1, 1, 2], ceil_mode=1),  # span 52
           dict(kernel_shape=[3, 2], strides=[2, 4], auto_pad="SAME_UPPER"),  # a negative left pad
           dict(kernel_shape=[2, 3], strides=[3, 4], pads=[1, 2, 1, 2])]


def _fits(attrs: dict, h: int, w: int) -> bool:
    """Whether an h x w plane holds one window (explicit pads, or auto_pad)."""
    (kh, kw), (dh, dw) = attrs["kernel_shape"], attrs.get("dilations", [1, 1])
    t, left, b, r = attrs.get("pads", [0, 0, 0, 0])
    return "auto_pad" in attrs or (h + t + b > (kh - 1) * dh and w + left + r > (kw - 1) * dw)


@pytest.mark.parametrize("attrs", WINDOWS)
def test_float_windows(pool_isa, attrs):
    for w in sorted({*around(8, 16, 32, 48), 3, 5}):
        for h in (3, 4, 5, 7):
            if not _fits(attrs, h, w):
                continue
            x = _image((1, 2, h, w), np.float32)
            _max(x, threads=2, **attrs)
            _avg(x, threads=2, **attrs)
            _avg(x, count_include_pad=1, **attrs)


def test_float_windows_of_specials(pool_isa):
    """Windows of -inf, -0.0 or NaN alone, and planes of one value: -inf inside, -FLT_MAX where a window reaches
    the padding; -0.0 sums; NaN wins from any tap, the first or the last."""
    for fill in (-np.inf, -0.0, np.inf, np.nan):
        for attrs in WINDOWS[:3] + WINDOWS[9:11]:
            x = np.full((1, 1, 6, 35), fill, np.float32)
            x[0, 0, 2, ::7] = np.nan
            x[0, 0, 4, 3::5] = -0.0
            _max(x, **attrs)
            _avg(x, **attrs)


@pytest.mark.slow
@pytest.mark.parametrize("dt", [np.float32, np.uint8, np.int8])
def test_max_wide_grid(pool_isa, dt):
    """Every window 1..4 x 1..4, strides 1..3, pads 0..1, ceil_mode, widths around 16/32/64."""
    for kh in range(1, 4):
        for kw in range(1, 5):
            for s in range(1, 4):
                for pad in (0, 1):
                    if pad >= max(kh, kw):
                        continue
                    for ceil in (0, 1):
                        for w in (7, 8, 9, 15, 16, 17, 31, 33, 63, 65):
                            x = _image((1, 1, 6, w), dt)
                            _max(x, kernel_shape=[kh, kw], strides=[s, s], pads=[0, pad, pad, 0] if pad < kh
                                 else [0, 0, 0, 0], ceil_mode=ceil)


@pytest.mark.slow
def test_average_wide_grid(pool_isa):
    for kh in range(1, 4):
        for kw in range(1, 4):
            for s in range(1, 3):
                for include in (0, 1):
                    for w in (7, 9, 15, 16, 17, 33):
                        x = _image((1, 1, 6, w), np.float32)
                        _avg(x, kernel_shape=[kh, kw], strides=[s, s], pads=[kh // 2, kw // 2, kh // 2, kw // 2],
                             count_include_pad=include)


# AveragePool's order (pool.h: window-row sums, then their sum) on the window kernels (AVX-512) and the separable
# pass below it (each input row's window-row sums once, interior columns and edges apart, then per output row its
# rows' sums): row strides 1-3 (rows shared, or skipped), column dilations, pads on each side, ceil_mode, SAME.
SEPARABLE = [dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), dict(kernel_shape=[3, 3], strides=[2, 1], pads=[1, 0, 1, 2]),
             dict(kernel_shape=[2, 5], strides=[3, 1], dilations=[2, 3], pads=[0, 4, 2, 1], ceil_mode=1),
             dict(kernel_shape=[5, 1], strides=[1, 1], pads=[2, 0, 2, 0]),
             dict(kernel_shape=[3, 4], strides=[2, 1], auto_pad="SAME_LOWER"),
             dict(kernel_shape=[1, 2], strides=[3, 1], auto_pad="SAME_UPPER")]


@pytest.mark.parametrize("attrs", SEPARABLE)
def test_average_separable_rows(pool_isa, attrs):
    for w in sorted({*around(8, 16, 32), 2, 5}):
        for h in (1, 4, 7):
            if not _fits(attrs, h, w):
                continue
            x = _image((1, 2, h, w), np.float32)
            _avg(x, threads=2, **attrs)
            _avg(x, count_include_pad=1, **attrs)


@pytest.mark.parametrize("pixels", [*around(8, 16, 128, 136, 256), 1, 2, 3136, *around(1024, 2048)])
def test_float32_global_average_pool(pixels):
    """GlobalAveragePool float32 (pool.cc's GlobalAvgFloat): numpy's pairwise sum order and the float32 division,
    exact; channels across tasks of 16384 pixels (two threads), specials (a NaN or +-inf channel, -0.0)."""
    for shape in ((2, 3, pixels), (1, 40, pixels, 1)):
        x = with_specials((RNG.standard_normal(shape) * 100).astype(np.float32), RNG, fraction=0.01)
        check("GlobalAveragePool", [("x", x, False)], "global_average_pool", exact=True, threads=2)
    zeros = np.full((1, 3, pixels), -0.0, np.float32)
    check("GlobalAveragePool", [("x", zeros, False)], "global_average_pool", exact=True)


# Every output tail of the 8-lane (AVX2) and 16-lane blocks: OW 1-17 and 23-25 on the 2x2 / 2 kernel, the 3x3 / 2
# stem pool (stride-2 taps: two loads and a shuffle), unit strides, stride 3 (gathers) and a column dilation, windows
# reaching the padding on both sides.
TAILS = [dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), dict(kernel_shape=[3, 2], strides=[3, 3], pads=[1, 1, 0, 1]),
         dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[1, 2], pads=[0, 2, 1, 2], ceil_mode=1)]


@pytest.mark.parametrize("attrs", TAILS)
def test_every_lane_tail(pool_isa, attrs):
    (kh, kw), (sh, sw) = attrs["kernel_shape"], attrs.get("strides", [1, 1])
    for ow in (*range(1, 18), 23, 24, 25):
        w = max(sw * (ow - 1) + kw - sum(attrs.get("pads", [0] * 4)[1::2]), 1)
        x = _image((1, 2, 2 * sh + kh, w), np.float32)
        _max(x, **attrs)
        _avg(x, **attrs)
        _avg(x, count_include_pad=1, **attrs)


@pytest.mark.parametrize("op,attrs", [("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                                      ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
                                      ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                                      ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
                                      ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))])
def test_session_matches_cpu_ep(pool_isa, op, attrs):
    """A session at each ISA level (the cap reaches the native step the session binds): NpuEP ran the node, its
    output is the CPU EP's (MaxPool exactly)."""
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 23, 37])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], opset=17)
    x = RNG.standard_normal((1, 8, 23, 37)).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"pool": "NpuEP"}
    for _ in range(2):  # the observing call, then the bound native step
        got, ref = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
        if op == "MaxPool":
            np.testing.assert_array_equal(got, ref)
        else:
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


# The byte kernels below the 2x2 / 2 AVX-512 kernel (AVX2 and up): 32 outputs and 32 row bytes per step, a row's
# partial last block redoing the last whole 32; rows and outputs under 32 as two overlapping blocks of 16 or 8, under
# 8 one by one (or through a stack buffer). OW 1-17 and around 32 and 64 on the 2x2 / 2 kernel (an odd W: a column
# no window reads), the stem's 3x3 / 2 pad 1, unit strides (SPPF's 5x5 pad 2), stride 3, stride 2 with a column
# dilation (taps at odd and even offsets), ceil_mode past the right and bottom edges, a row dilation.
BYTE_TAILS = [dict(kernel_shape=[2, 2], strides=[2, 2]), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
              dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
              dict(kernel_shape=[3, 2], strides=[3, 3], pads=[1, 1, 0, 1]),
              dict(kernel_shape=[2, 3], strides=[2, 2], dilations=[2, 3], pads=[1, 2, 0, 3]),
              dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), dict(kernel_shape=[3, 2], strides=[1, 2])]


@pytest.mark.parametrize("attrs", BYTE_TAILS)
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_byte_lane_tails(pool_isa, dt, attrs):
    (kh, kw), (sh, sw) = attrs["kernel_shape"], attrs.get("strides", [1, 1])
    dw, pads = attrs.get("dilations", [1, 1])[1], attrs.get("pads", [0] * 4)
    for ow in (*range(1, 18), 31, 32, 33, 63, 64, 65):
        w = max(sw * (ow - 1) + (kw - 1) * dw + 1 - pads[1] - pads[3], 1)
        for width, threads in ((w, 1), (w + 1, 2)):
            _max(_image((2, 2, 2 * sh + kh, width), dt), threads=threads, **attrs)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_byte_2x2_small_planes(pool_isa, dt):
    """The 2x2 / 2 kernel's rows under 8 outputs (W = 2 OW: the row pairs' maxima end to end, then their column pairs
    over the whole plane): planes of OH OW outputs around 32 and 64, an odd H (a row no window reads)."""
    for ow in range(1, 8):
        for oh in sorted({1, *around(32 // ow, 64 // ow, low=1)}):
            for h in (2 * oh, 2 * oh + 1):
                _max(_image((2, 3, h, 2 * ow), dt), kernel_shape=[2, 2], strides=[2, 2])


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_byte_windows_in_the_padding(pool_isa, dt):
    """A window whose rows all lie in the padding (H = 1, a row dilation) takes the type's lowest value; the lowest
    and highest values alone, and planes of one value."""
    for w in (1, 7, 8, 9, 16, 31, 33, 64, 65):
        _max(_image((1, 3, 1, w), dt), kernel_shape=[2, 3], dilations=[2, 1], pads=[1, 1, 1, 1])
        info = np.iinfo(dt)
        for fill in (info.min, info.max, 0):
            _max(np.full((1, 1, 5, w), fill, dt), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[2, 2], strides=[2, 2]),
                                   dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])])
def test_byte_session_matches_cpu_ep(pool_isa, dt, attrs):
    """A uint8 / int8 MaxPool session at each ISA level: NpuEP ran the node, its output is the CPU EP's exactly."""
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    shape = [2, 8, 23, 70]
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, shape)],
                       [helper.make_tensor_value_info("y", elem, [None] * 4)], opset=17)
    x = _image(shape, dt)
    sess = npu_session(model)
    assert assignment(sess) == {"pool": "NpuEP"}
    for _ in range(2):  # the observing call, then the bound native step
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])
