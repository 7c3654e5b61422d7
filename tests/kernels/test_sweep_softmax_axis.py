"""Differential sweep of the native Softmax over any axis and LogSoftmax (kernels/native/softmax.cc's
``softmax_axis``, issue 40) against the reference model (kernels/ops/softmax.py), on every instruction-set level.

x is viewed as [outer, n, inner]. inner 1 (the last axis: LogSoftmax's rows) takes the row kernels: 16 lanes with a
masked tail on AVX-512, else 4-lane SSE2 blocks and a scalar tail. inner > 1 takes the column kernels: blocks of 16
columns (masked tails) on AVX-512, one column at a time below it; tasks of 64 columns of one outer index. So inner
sweeps around 16 and 64, n around 8 and 16, outer across two tasks (two threads).

Tolerances. Softmax: each output is exp(x - max) / sum; the native exp is within 2 ulp and numpy's within 1, the two
sums (other orders) each within n 2^-24 relative of the exact one, the scaling half an ulp (AVX-512: a product with
1 / sum, one more): rtol (6 + 2n) 2^-24; an exp below float32's smallest normal is 0 natively: atol 2^-126.
LogSoftmax: (x - max) has the reference's bits, log(sum) differs by the sums' relative error plus the logs' own
ulps: atol (8 + 2n) 2^-24 (1 + ln(n + 1)), rtol 2^-22 for the final subtraction's rounding. A NaN or an infinite
maximum makes the whole softmax NaN in both."""

from __future__ import annotations

import math

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4003)


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)


def _softmax(x: np.ndarray, axis: int, threads: int = 1):
    """Softmax over ``axis``: the last axis takes softmax_last_axis (the same row kernels), the others softmax_axis."""
    n = x.shape[axis]
    kernel = "softmax_last_axis" if axis % x.ndim == x.ndim - 1 else "softmax_axis"
    return check("Softmax", [("x", x, False)], kernel, exact=False, rtol=(6 + 2 * n) * 2.0 ** -24,
                 atol=2.0 ** -126, threads=threads, axis=axis)


def _log_softmax(x: np.ndarray, axis: int, threads: int = 1):
    n = x.shape[axis]
    return check("LogSoftmax", [("x", x, False)], "softmax_axis", exact=False, rtol=2.0 ** -22,
                 atol=(8 + 2 * n) * 2.0 ** -24 * (1 + math.log(n + 1)), threads=threads, axis=axis)


def test_columns_around_the_blocks(isa):
    for inner in around(16, 64):
        for n in (1, 2, 7, 8, 9, 17):
            x = (RNG.standard_normal((3, n, inner)) * 8).astype(np.float32)
            _softmax(x, 1, threads=2)
            _log_softmax(x, 1, threads=2)


def test_log_softmax_rows_around_the_lanes(isa):
    for n in around(4, 8, 16, 32, 48, 64):
        for rows in (1, 31, 33):
            x = (RNG.standard_normal((rows, n)) * 8).astype(np.float32)
            _log_softmax(x, -1, threads=2)
            _log_softmax(x, 1)


def test_every_axis_of_rank_4(isa):
    x = (RNG.standard_normal((2, 5, 17, 19)) * 6).astype(np.float32)
    for axis in range(-4, 4):
        _softmax(x, axis)
        _log_softmax(x, axis)


def test_network_shapes(isa):
    """A classifier's [1, 1000, 49] over its classes, attention scores [1, 8, 128, 128] over the keys' axis 2, a
    decoder's 32000-wide LogSoftmax row."""
    _softmax((RNG.standard_normal((1, 1000, 49)) * 4).astype(np.float32), 1)
    _softmax((RNG.standard_normal((1, 8, 128, 128)) * 4).astype(np.float32), 2, threads=2)
    _log_softmax((RNG.standard_normal((1, 32000)) * 4).astype(np.float32), -1)


def test_special_values(isa):
    """NaN or +Inf make a softmax NaN (any axis); -Inf elements give 0 (LogSoftmax: -inf); a softmax of -inf alone is
    NaN; spreads past e^-87 underflow to 0; -0.0 and subnormals are zeros."""
    for shape, axis in (((40, 37), -1), ((3, 23, 37), 1), ((2, 9, 70), 1), ((5, 19), 0)):
        x = (RNG.standard_normal(shape) * 30).astype(np.float32)
        x = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e38, -3e38), fraction=0.01)
        lead = np.moveaxis(x, axis, -1).copy()
        rows = lead.reshape(-1, lead.shape[-1])  # each row one softmax
        rows[-1] = -np.inf
        rows[-2] = -0.0
        rows[-3, ::2] = -np.inf
        rows[-4] = np.linspace(-200, 0, rows.shape[-1], dtype=np.float32)
        x = np.ascontiguousarray(np.moveaxis(lead, -1, axis))
        _softmax(x, axis)
        _log_softmax(x, axis)
