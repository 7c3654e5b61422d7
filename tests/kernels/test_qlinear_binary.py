"""com.microsoft QLinearAdd and QLinearMul vs ORT's CPU EP, through the kernel and NpuEP sessions on both targets:
int8 and uint8, with and without zero points, broadcasting (scalar operands, a constant innermost dim, a
broadcast leading dim), saturation at both ends.

Numerics: bit-exact. ORT's MLAS kernels are float32 arithmetic, and the kernel reproduces their exact sequence
(fma on x86-64 with FMA for QLinearAdd, multiply then add for QLinearMul), so every output integer must match.
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import rand

BOTH = ("npu-ref", "npu-edge")
MS = "com.microsoft"


def _qin(name, x, scale, zp, const_zp=True):
    return [(name, x, False), (f"{name}_s", np.array(scale, np.float32), True),
            (f"{name}_z", np.array(zp, x.dtype), const_zp) if zp is not None else None]


CASES = [((2, 3, 40), (2, 3, 40)), ((2, 3, 40), (40,)), ((2, 3, 40), (2, 3, 1)), ((1,), (4, 33)),
         ((4, 33), ()), ((3, 1, 17), (1, 5, 17)), ((5, 1), (1, 7))]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("a_shape,b_shape", CASES)
def test_qlinear_binary_broadcast(op, dtype, a_shape, b_shape):
    lo, hi = (0, 25) if dtype == np.uint8 else (-12, 12)
    a, b = rand(a_shape, dtype, seed=1, lo=lo, hi=hi), rand(b_shape, dtype, seed=2, lo=lo, hi=hi)
    za, zb, zc = (128, 120, 131) if dtype == np.uint8 else (3, -5, 1)
    sa, sb, sc = (0.0213, 0.0371, 0.0517) if op == "QLinearAdd" else (0.0213, 0.0371, 0.613)
    inputs = _qin("a", a, sa, za) + _qin("b", b, sb, zb) + [("c_s", np.array(sc, np.float32), True),
                                                             ("c_z", np.array(zc, dtype), True)]
    check_on_ep(op, inputs, [("y", dtype)], domain=MS, targets=BOTH)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("seed", range(6))
def test_qlinear_binary_random_scales_exact(op, seed):
    """Many scale ratios (including > 1 and tiny): exact integers on every element."""
    rng = np.random.default_rng(seed)
    dtype = np.uint8 if seed % 2 else np.int8
    a, b = rand((3, 64), dtype, seed=seed, lo=-13, hi=26), rand((3, 64), dtype, seed=seed + 9, lo=-13, hi=26)
    info = np.iinfo(dtype)
    za, zb, zc = (int(rng.integers(info.min, info.max)) for _ in range(3))
    sa, sb, sc = (float(10 ** rng.uniform(-3, 0)) for _ in range(3))
    inputs = _qin("a", a, sa, za) + _qin("b", b, sb, zb) + [("c_s", np.array(sc, np.float32), True),
                                                             ("c_z", np.array(zc, dtype), True)]
    check_on_ep(op, inputs, [("y", dtype)], domain=MS)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_omitted_output_zero_point_and_runtime_quant_params(op):
    """C's zero point omitted (0); B's scale and zero point fed at run time. (ORT 1.31's type inference rejects an
    omitted A or B zero point, so only C's is left out.)"""
    a, b = rand((2, 50), np.int8, seed=3), rand((2, 50), np.int8, seed=4)
    inputs = _qin("a", a, 0.05, 2) + [("b", b, False), ("b_s", np.array(0.07, np.float32), False),
                                      ("b_z", np.array(-3, np.int8), False), ("c_s", np.array(0.09, np.float32), True)]
    check_on_ep(op, inputs, [("y", np.int8)], domain=MS)


@pytest.mark.parametrize("x,r,c,fused", [(122, "0.56381035", "-1.1932272e-16", "68.78486"),
                                         (40, "0.7551516", "-8.1873706e-19", "30.206064"),
                                         (244, "0.67469215", "2.788854e-19", "164.6249")])
def test_reference_fma_rounds_once_where_the_float64_sum_lands_on_a_float32_tie(x, r, c, fused):
    """QLinearAdd's reference fma is the fused one (MLAS's and the native kernel's): the float64 sum of x * r and a
    tiny c rounds onto a float32 midpoint, so rounding it again to float32 (the former emulation) misses by 1 ulp."""
    from npu_ep.kernels.ops.qlinear_binary import fma_f32
    r32, c32, want = np.float32(r), np.float32(c), np.float32(fused)
    twice = np.float32(np.float64(x) * np.float64(r32) + np.float64(c32))
    assert twice != want  # the case is a double-rounding one
    assert fma_f32(np.array([x], np.float64), r32, np.array([c32]))[0] == want
