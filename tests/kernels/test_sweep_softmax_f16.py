"""Differential sweep of the native float16 Softmax and LogSoftmax (kernels/native/softmax.cc's ``softmax_axis``,
issue 40) against the reference model (kernels/ops/softmax.py: float32 numpy math on the widened input, one
astype), on every instruction-set level.

Each task widens its rows (inner 1) or its block of 64 columns (inner > 1) to float32, runs the float32 row or
column kernels (16 lanes on AVX-512, 4-lane SSE2 and scalar below) and rounds once to float16. So n crosses 4, 8,
16 and 64, rows cross the 32-row task, inner crosses 16 and 64.

Tolerance: the float32 results differ as test_sweep_softmax_axis.py states (far below a float16 ulp), so the one
rounding to float16 lands on the reference's value or, where the float32 values straddle a rounding midpoint, on
its neighbour: rtol 2^-10 (one float16 ulp relative), atol 2^-24 (float16's subnormal spacing) plus the float32
LogSoftmax bound. NaN exactly where the reference has NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest

from _ep_single import check_on_ep
from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4040)
F16 = np.float16


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)


def _both(x: np.ndarray, axis: int, threads: int = 1) -> None:
    n = x.shape[axis]
    log_atol = (8 + 2 * n) * 2.0 ** -24 * (1 + math.log(n + 1))
    for op, atol in (("Softmax", 2.0 ** -24), ("LogSoftmax", 2.0 ** -24 + log_atol)):
        check(op, [("x", x, False)], "softmax_axis", exact=False, rtol=2.0 ** -10, atol=atol, threads=threads,
              axis=axis)


def test_rows_around_the_lanes_and_tasks(isa):
    for n in around(4, 8, 16, 64):
        for rows in (1, 31, 33):
            _both((RNG.standard_normal((rows, n)) * 6).astype(F16), -1, threads=2)


def test_columns_around_the_blocks(isa):
    for inner in around(16, 64):
        for n in (1, 2, 9, 17):
            _both((RNG.standard_normal((3, n, inner)) * 6).astype(F16), 1, threads=2)


def test_every_axis_and_network_shapes(isa):
    """Every axis of a rank-4 tensor; fp16 attention scores [1, 8, 128, 128] over the keys; a 32000-wide row."""
    x = (RNG.standard_normal((2, 5, 17, 19)) * 4).astype(F16)
    for axis in range(-4, 4):
        _both(x, axis)
    _both((RNG.standard_normal((1, 8, 128, 128)) * 4).astype(F16), -1, threads=2)
    _both((RNG.standard_normal((1, 32000)) * 4).astype(F16), -1)


def test_special_values(isa):
    """NaN or +Inf make a softmax NaN; -Inf gives 0 (LogSoftmax -inf); a softmax of -inf alone is NaN; float16's
    largest finite values, subnormals and -0.0; spreads whose exp underflows float16 to 0."""
    for shape, axis in (((40, 37), -1), ((3, 23, 37), 1), ((5, 19), 0)):
        x = (RNG.standard_normal(shape) * 8).astype(F16)
        x = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 6e-8, 65504.0, -65504.0), fraction=0.01)
        lead = np.moveaxis(x, axis, -1).copy()
        rows = lead.reshape(-1, lead.shape[-1])
        rows[-1] = -np.inf
        rows[-2] = -0.0
        rows[-3, ::2] = -np.inf
        rows[-4] = np.linspace(-30, 0, rows.shape[-1]).astype(F16)
        _both(np.ascontiguousarray(np.moveaxis(lead, -1, axis)), axis)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis", [((2, 8, 33, 40), -1), ((3, 9, 70), 1), ((1, 1000, 49), 1)])
def test_session_as_the_cpu_ep(op, shape, axis):
    """A float16 Softmax/LogSoftmax in an NpuEP session (graph assignment: NpuEP ran it) equals ORT's CPU EP within
    float16 tolerance (``check_on_ep``'s float16 default)."""
    x = (np.random.default_rng(41).standard_normal(shape) * 4).astype(F16)
    check_on_ep(op, [("x", x, False)], [("y", F16)], {"axis": axis}, opset=13, targets=("npu-ref", "npu-edge"))
