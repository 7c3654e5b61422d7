"""Differential sweep of the native Sigmoid (kernels/native/conv_tail.cc's sigmoid, bound for float32 Sigmoid
nodes by kernels/ops/elementwise.py), issue 38, against the reference model's ``_sigmoid`` (numpy's exp).

Blocks: 16 lanes per AVX-512 step (masked tail), 8 per AVX2 step (the last 1..7 through one masked vector), the
scalar loop (std::exp); tasks of 2^16 elements. Tolerance: y = 1 / (1 + exp(min(-x, 88))); the lane exp is within
2 ulp (std::exp and numpy's within 1), the addition and the division each add half an ulp: 4 ulp, rtol 2^-21.
Outputs below float32's smallest normal (x < -87) keep fewer bits: atol 2^-126. NaN stays NaN."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3803)
SIZES = around(8, 16, 32)
TASK = 1 << 16


@pytest.fixture(params=host_isas(top="avx512"))
def sig_isa(request):
    yield from cap_isa(request.param)


def _sigmoid(x: np.ndarray, threads: int = 1):
    return check("Sigmoid", [("x", x, False)], "sigmoid", exact=False, rtol=2.0 ** -21, atol=2.0 ** -126,
                 threads=threads)


def test_sizes_and_special_values(sig_isa):
    for n in SIZES:
        x = (RNG.standard_normal(n) * 20).astype(np.float32)
        _sigmoid(with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 88.0, -88.0, 87.5, -104.0, 1e-45,
                                                3e38, -3e38)))


def test_the_whole_range_and_threads(sig_isa):
    x = np.linspace(-110, 110, TASK + 37, dtype=np.float32).reshape(1, -1)  # two tasks: the split
    _sigmoid(x, threads=2)


@pytest.mark.slow
def test_every_size_to_100(sig_isa):
    for n in range(1, 101):
        _sigmoid(with_specials((RNG.standard_normal((2, n)) * 30).astype(np.float32), RNG, fraction=0.05))
