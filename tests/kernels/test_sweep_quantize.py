"""Differential sweep of the native per-tensor Q/DQ (ep/native/kernels/quantize.cc) behind QuantizeLinear,
DequantizeLinear and DynamicQuantizeLinear, issue 38: bit-exact against the reference model (the same float32
steps: a division, round half to even, + zero point, clip; NaN to the lowest code), on every level it dispatches to.

quantize.cc's blocks: 16 lanes per AVX-512 step (the tail masked), tasks of 2^18 elements (two threads split a
tensor only above that). Values: ties (x / scale exactly k + 0.5, both parities), saturation at both ends, NaN,
+-Inf, -0.0, huge and subnormal values."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels.ops import _native

pytestmark = pytest.mark.skipif(_native.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3801)
SIZES = around(16, 32, 64) + [1000]  # the 16-lane step and its masked tail
CHUNK = 1 << 18                      # quantize.cc's task size


@pytest.fixture(params=host_isas(top="avx512"))
def q_isa(request):
    yield from cap_isa(request.param)


def _values(n: int, scale: float) -> np.ndarray:
    """Random values over the codes' range and past it, ties k + 0.5 (times scale) and the special values."""
    x = (RNG.uniform(-300, 300, n) * scale).astype(np.float32)
    ties = ((RNG.integers(-200, 200, n) + 0.5) * scale).astype(np.float32)  # scale a power of two: exact
    x[::3] = ties[::3]
    return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 3e38, -3e38, 1e-45, -1e-45))


@pytest.mark.parametrize("qtype,zp", [(np.uint8, 0), (np.uint8, 131), (np.int8, 0), (np.int8, -7)])
def test_quantize_linear(q_isa, qtype, zp):
    for n in SIZES:
        for scale in (np.float32(0.125), np.float32(0.0371)):
            inputs = [("x", _values(n, float(scale)), False), ("s", np.array(scale, np.float32), True),
                      ("z", np.array(zp, qtype), True)]
            check("QuantizeLinear", inputs, "quantize_tensor", exact=True)


@pytest.mark.parametrize("qtype,zp", [(np.uint8, 0), (np.uint8, 255), (np.int8, -128), (np.int8, 5)])
def test_dequantize_linear(q_isa, qtype, zp):
    info = np.iinfo(qtype)
    for n in SIZES:
        x = RNG.integers(info.min, info.max + 1, n).astype(qtype)
        x[::5] = info.min
        x[1::5] = info.max
        for scale in (np.float32(0.02), np.float32(3e38)):  # 3e38 * 255: +-Inf, as the reference's float32
            inputs = [("x", x, False), ("s", np.array(scale, np.float32), True), ("z", np.array(zp, qtype), True)]
            check("DequantizeLinear", inputs, "dequantize_tensor", exact=True)


def test_dynamic_quantize_linear(q_isa):
    """DynamicQuantizeLinear: ORT's range (widened to 0), then the same quantization; tiny, constant, one-sided."""
    for n in SIZES:
        x = RNG.standard_normal(n).astype(np.float32) * 4
        for case in (x, np.abs(x), -np.abs(x), x * 1e-30, np.full(n, 2.5, np.float32), np.where(x > 1, x, -0.0)):
            check("DynamicQuantizeLinear", [("x", case.astype(np.float32), False)], "quantize_tensor", exact=True,
                  n_out=3)


def test_quantize_across_task_chunks(q_isa):
    x = _values(CHUNK + 17, 0.0625)
    inputs = [("x", x, False), ("s", np.array(0.0625, np.float32), True), ("z", np.array(3, np.int8), True)]
    check("QuantizeLinear", inputs, "quantize_tensor", exact=True, threads=2)
    check("DynamicQuantizeLinear", [("x", np.nan_to_num(x, nan=1.0, posinf=5.0, neginf=-5.0), False)],
          "quantize_tensor", exact=True, threads=2, n_out=3)


@pytest.mark.slow
def test_quantize_every_size_to_200(q_isa):
    for n in range(1, 200):
        inputs = [("x", _values(n, 0.5), False), ("s", np.array(0.5, np.float32), True),
                  ("z", np.array(n % 256, np.uint8), True)]
        check("QuantizeLinear", inputs, "quantize_tensor", exact=True)
