"""Differential sweep of the native Softmax over the last axis (kernels/native/softmax.cc), issue 38, against
the reference model (kernels/ops/softmax.py: numpy's exp, pairwise sum, division), on every instruction-set level.

softmax.cc's row blocks: on AVX-512, two 16-lane vectors a step and a masked tail of up to two (the maximum, exp
with fused multiply-adds and two running sums per lane, the product with 1 / sum); below it the maximum over 4-lane
SSE2 vectors then a scalar tail, exp and the sum over 8 elements (eight running sums) then a scalar tail, the
division over 4 lanes; tasks of 32 rows. Row lengths cross 4, 8, 16, 32 and their multiples, row counts cross 32
(two threads). Tolerance: each output is
exp(x - max) / sum; the native exp is within 2 ulp and numpy's within 1, the two sums (another order) each within
n * 2^-24 relative of the exact one, the scaling half an ulp (AVX-512's reciprocal and product: one more):
rtol = (6 + 2n) * 2^-24. An exp below float32's smallest normal is 0 natively (the reference may keep a subnormal):
atol 2^-126. NaN rows (a NaN, or an infinite maximum) are NaN in both."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3802)
LENGTHS = around(4, 8, 16, 32, 48, 64)


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)
ROWS = [1, 31, 32, 33, 65]


def _softmax(x: np.ndarray, threads: int = 1):
    n = x.shape[-1]
    return check("Softmax", [("x", x, False)], "softmax_last_axis", exact=False, rtol=(6 + 2 * n) * 2.0 ** -24,
                 atol=2.0 ** -126, threads=threads, axis=-1)


def test_lengths_and_rows(isa):
    for n in LENGTHS:
        for rows in ROWS:
            _softmax((RNG.standard_normal((rows, n)) * 8).astype(np.float32), threads=2)


def test_special_values(isa):
    """NaN and +Inf make a row NaN; -Inf elements are 0; huge spreads underflow to 0; -0.0 and subnormals are 0's."""
    for n in LENGTHS:
        x = (RNG.standard_normal((40, n)) * 30).astype(np.float32)
        x = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e38, -3e38), fraction=0.02)
        x[-1] = -np.inf  # a row of -inf: its maximum is infinite, NaN as the reference's -inf - -inf
        x[-2] = -0.0
        x[-3, ::2] = -np.inf
        x[-4] = np.linspace(-200, 0, n, dtype=np.float32)  # exp down to e^-200: the subnormal range and 0
        _softmax(x)


def test_rank_3_and_4(isa):
    for shape in ((2, 3, 17), (1, 2, 33, 9), (3, 1, 1, 8)):
        _softmax(RNG.standard_normal(shape).astype(np.float32) * 5)


@pytest.mark.slow
def test_every_length_to_130(isa):
    for n in range(1, 131):
        x = with_specials((RNG.standard_normal((34, n)) * 10).astype(np.float32), RNG, fraction=0.01)
        _softmax(x, threads=2)


def test_one_special_anywhere(isa):
    """A single NaN or +inf at any place of a row (either vector of a step, the masked tail) makes it NaN; a single
    -inf is 0 there."""
    for n in (31, 33, 47, 64, 70):
        for at in range(n):
            for value in (np.nan, np.inf, -np.inf):
                x = RNG.standard_normal((2, n)).astype(np.float32)
                x[0, at] = value
                _softmax(x)


def test_into_out():
    """out (ORT's buffer) is written and returned; another dtype or size is refused."""
    nat = runtime.native_module()
    x = (RNG.standard_normal((33, 70)) * 4).astype(np.float32)
    out = np.empty_like(x)
    assert nat.softmax_last_axis(x, 2, out) is out
    assert out.tobytes() == nat.softmax_last_axis(x, 2).tobytes()
    y = nat.softmax_axis(x, 33, 70, 1, True, 1, None)
    assert nat.softmax_axis(x, 33, 70, 1, True, 1, out) is out and out.tobytes() == y.tobytes()
    for bad in (np.empty((33, 70), np.float16), np.empty((33, 69), np.float32)):
        with pytest.raises(ValueError):
            nat.softmax_last_axis(x, 1, bad)
        with pytest.raises(ValueError):
            nat.softmax_axis(x, 33, 70, 1, False, 1, bad)
