"""Differential sweep of the layout region's NHWC pools (kernels/native/pool_nhwc.cc, npu::PoolNhwc in
kernels/ops/pool_nhwc.py) against the reference model: pool.py's MaxPool / AveragePool in NCHW, x transposed to
NCHW and the result back.

The kernel puts the channels in the lanes: chunks of up to four vectors (64 channels on AVX-512, 32 on AVX2, the last
vector masked), channel by channel on the portable path. It pools directly (every window tap per output) or, where
output rows share input rows (stride-1 rows), separably: each input row's window-row results once, then each
output's column of them; a task's first rows recompute what the task before shares. The grid crosses the channel
tails (1, 7-9, 15-17, 31-33, 48, 63-65, 100), kernels 1-5, strides 1-3, dilations, symmetric, asymmetric and no
pads, ceil_mode, auto_pad VALID / SAME_UPPER / SAME_LOWER (negative SAME pads where the kernel is smaller than the
stride), count_include_pad, maps whose windows hang over every edge (down to 1x1), special values (NaN, +-inf, -0,
huge, denormals), every ISA level the host has, one and two threads, float32 and float16, and the bound step.
Bit-exact: a maximum rounds nothing (NaN exactly where the reference has one; a maximum of -0 and +0 may be either,
as in numpy); an AveragePool adds the same float32 values in the same order and divides by the same divisor, signs of
zeros included."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import bound_step_outputs, native_calls, node_model, with_specials
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.ops import pool
from npu_ep.kernels.target import Target

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")


@pytest.fixture(params=host_isas(top="avx512"))  # pool_nhwc.cc: AVX-512, AVX2 and portable rows
def pool_isa(request):
    yield from cap_isa(request.param)


def _prepared(op, x_nchw, **attrs):
    (node,) = nodes_from_model(node_model(op, [("x", x_nchw, False)], **attrs))

    def nhwc(v):
        s = v.shape
        return dataclasses.replace(v, shape=(s[0], s[2], s[3], s[1]))

    node = dataclasses.replace(node, op_type="PoolNhwc", domain="npu", inputs=(nhwc(node.inputs[0]),),
                               outputs=(nhwc(node.outputs[0]),), attrs={**node.attrs, "pool_op": op})
    k = kernel_for("npu", "PoolNhwc")
    assert k.check(node, REF) is None
    return k, k.prepare(node, REF)


def _case(op, x_nchw, threads=1, **attrs):
    """The native NHWC pool of x (given NCHW) equals the reference bit for bit, and so does its bound step."""
    label = f"{op} {list(x_nchw.shape)} {x_nchw.dtype} {attrs} threads={threads}"
    k, p = _prepared(op, x_nchw, **attrs)
    x = np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))
    runtime.configure([p], "native", threads)
    with native_calls() as calls, np.errstate(all="ignore"):
        got = k.run(p, [x])[0]
        bound = bound_step_outputs(k, p, [x], [got])
    runtime.configure([p], "reference", 1)
    with np.errstate(all="ignore"):
        want = k.run(p, [x])[0]
    assert got.shape == want.shape and got.dtype == want.dtype == x.dtype, label
    if got.size:
        assert ("max_pool_nhwc" if op == "MaxPool" else "avg_pool_nhwc") in calls, label
        assert len(bound) == 1 and bound[0].tobytes() == got.tobytes(), label
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), label)
    np.testing.assert_array_equal(got, want, label)
    if op == "AveragePool":
        real = ~np.isnan(want)  # a NaN's sign is not the reference's business
        np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(want[real]), label)
    return got


def _image(shape, rng, dt=np.float32):
    x = with_specials(rng.standard_normal(shape).astype(np.float32) * 10, rng,
                      values=(np.nan, np.inf, -np.inf, -0.0, 3.0e38, -3.0e38, 1.0e-45, -1.0e-38))
    with np.errstate(over="ignore"):  # float16: the huge values become inf
        return x.astype(dt)


CHANNELS = (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100)
MAPS = ((1, 1), (3, 4), (5, 7), (2, 9), (8, 6), (11, 5))
WINDOWS = [  # (kernel, strides, dilations, pads, ceil_mode, auto_pad)
    ((1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 0, "NOTSET"),
    ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 0, "NOTSET"),
    ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 1, "NOTSET"),
    ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 0, "NOTSET"),
    ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, "NOTSET"),
    ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0, "NOTSET"),
    ((5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 0, "NOTSET"),
    ((3, 4), (1, 1), (1, 1), (1, 1, 1, 2), 0, "NOTSET"),
    ((5, 2), (1, 1), (1, 1), (0, 1, 4, 0), 0, "NOTSET"),
    ((3, 3), (3, 3), (1, 1), (0, 2, 1, 0), 1, "NOTSET"),
    ((2, 3), (1, 2), (2, 1), (1, 0, 0, 1), 0, "NOTSET"),
    ((3, 2), (2, 3), (2, 2), (2, 1, 1, 2), 1, "NOTSET"),
    ((4, 1), (1, 3), (1, 1), (3, 0, 0, 0), 0, "NOTSET"),
    ((1, 5), (3, 1), (1, 2), (0, 4, 0, 4), 0, "NOTSET"),
    ((3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 0, "VALID"),
    ((3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 0, "SAME_UPPER"),
    ((2, 3), (3, 2), (1, 1), (0, 0, 0, 0), 0, "SAME_LOWER"),
    ((1, 1), (3, 2), (1, 1), (0, 0, 0, 0), 0, "SAME_UPPER"),  # kernel below the stride: a negative pad
    ((4, 4), (1, 1), (2, 1), (0, 0, 0, 0), 0, "SAME_LOWER"),
]
GRID = [(c, hw, w) for c in CHANNELS for hw in MAPS for w in range(len(WINDOWS))]


def _attrs(op, w, include_pad=0):
    k, s, d, pads, ceil, auto = WINDOWS[w]
    attrs = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), ceil_mode=ceil)
    if auto == "NOTSET":
        attrs["pads"] = list(pads)
    else:
        attrs["auto_pad"] = auto
    if op == "AveragePool":
        attrs["count_include_pad"] = include_pad
    return attrs


def _fits(hw, w) -> bool:
    """Whether the window fits the padded map (else the reference raises: nothing to compare)."""
    k, s, d, pads, ceil, auto = WINDOWS[w]
    return all(pool._axis(size, k[a], s[a], d[a], pads[a], pads[a + 2], ceil, auto)[0] >= 0 for a, size in
               enumerate(hw))


def _sample(cases, n, seed):
    idx = np.random.default_rng(seed).choice(len(cases), size=min(n, len(cases)), replace=False)
    return [cases[i] for i in sorted(idx)]


FITTING = [c for c in GRID if _fits(c[1], c[2])]


@pytest.mark.parametrize("case", _sample(FITTING, 90, 40))
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_channels_windows_maps(pool_isa, op, case):
    c, hw, w = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x = _image((2, c, *hw), rng)
    _case(op, x, **_attrs(op, w, include_pad=hash(case) % 2))


@pytest.mark.parametrize("w", range(len(WINDOWS)))
@pytest.mark.parametrize("include_pad", [0, 1])
def test_every_window_at_the_lane_tails(pool_isa, w, include_pad):
    rng = np.random.default_rng(w)
    for c in (17, 65):
        x = _image((1, c, 7, 6), rng)
        _case("MaxPool", x, **_attrs("MaxPool", w))
        _case("AveragePool", x, **_attrs("AveragePool", w, include_pad))


def test_all_padding_windows_and_infinities(pool_isa):
    """Windows wholly in the padding (MaxPool: the pad value -FLT_MAX; AveragePool: 0/0 or 0/count), a map of -inf
    (MaxPool: -inf, or -FLT_MAX where the window reaches the padding), -0 everywhere (AveragePool: -0 only where no
    padded 0.0 is added), denormals."""
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[2, 2, 2, 2], ceil_mode=1)
    for fill in (-np.inf, np.inf, -0.0, 1e-45, -1e-38, np.nan):
        x = np.full((1, 20, 3, 4), fill, np.float32)
        _case("MaxPool", x, **attrs)
        for include_pad in (0, 1):
            _case("AveragePool", x, count_include_pad=include_pad, **attrs)
    x = np.full((1, 33, 6, 6), -0.0, np.float32)
    _case("AveragePool", x, kernel_shape=[3, 3], strides=[1, 1])
    _case("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_split_rows_not_bits(pool_isa, threads):
    """Above the parallel threshold the output rows split into tasks (a separable task per thread and image): the
    bits equal the reference's on one thread and two."""
    rng = np.random.default_rng(41)
    x = _image((2, 64, 40, 38), rng)
    for attrs in (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                  dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]),
                  dict(kernel_shape=[3, 3], strides=[1, 1], dilations=[2, 2], pads=[2, 1, 2, 3], ceil_mode=1)):
        _case("MaxPool", x, threads=threads, **attrs)
        _case("AveragePool", x, threads=threads, **attrs)


@pytest.mark.parametrize("w", [3, 6, 11, 16])
def test_float16(pool_isa, w):
    """Float16: widened (exact), pooled in float32, rounded once, as the reference's astype."""
    rng = np.random.default_rng(42 + w)
    for c in (9, 33):
        x = _image((2, c, 9, 7), rng, np.float16)
        _case("MaxPool", x, **_attrs("MaxPool", w))
        _case("AveragePool", x, **_attrs("AveragePool", w, include_pad=1))

