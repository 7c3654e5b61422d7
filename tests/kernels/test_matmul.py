"""Float MatMul/Gemm vs ORT CPU. Tolerances: fp32 rtol 1e-5/atol 1e-5 (same fp32 math, other summation order);
fp16 rtol 1e-2/atol 1e-2 (fp16 inputs, fp32 accumulation, one rounding to fp16)."""

from __future__ import annotations

import numpy as np
import pytest

from _single_op import both, declined

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float16: dict(rtol=1e-2, atol=1e-2)}


def _r(shape, dt):
    return RNG.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("a_shape,b_shape,b_const", [
    ((5, 37), (37, 70), True),            # tails in every dim
    ((2, 3, 33, 129), (129, 65), True),   # batch folded into M, B shared
    ((2, 1, 17, 40), (3, 40, 9), False),  # broadcast batch dims, runtime B
    ((40,), (40, 7), True),               # 1-D A
])
def test_matmul_matches_cpu(dt, a_shape, b_shape, b_const):
    a, b = _r(a_shape, dt), _r(b_shape, dt)
    ours, ref, p, cost = both("MatMul", [("a", a, False), ("b", b, b_const)])
    assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), **TOL[dt])
    assert cost.macs > 0 and cost.cycles > 0 and 0 < cost.utilization <= 1
    assert p.attrs["mode"] == ("float32" if dt == np.float32 else "float16")


@pytest.mark.parametrize("ta,tb,alpha,beta,c_shape,c_const", [
    (0, 0, 1.0, 1.0, (70,), True), (1, 1, 0.5, 2.0, (5, 70), True), (0, 1, 1.0, 0.3, (1, 70), False),
    (1, 0, 2.0, 1.0, None, True)])
def test_gemm_matches_cpu(ta, tb, alpha, beta, c_shape, c_const):
    a = _r((37, 5) if ta else (5, 37), np.float32)
    b = _r((70, 37) if tb else (37, 70), np.float32)
    c = _r(c_shape, np.float32) if c_shape else None
    ours, ref, p, _ = both("Gemm", [("a", a, False), ("b", b, True), ("c", c, c_const)], transA=ta, transB=tb,
                           alpha=alpha, beta=beta)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)
    assert "plan" in p.attrs and p.attrs["plan"]["mode"] == "float32"


def test_float_matmul_declined_on_int8_only_target():
    reason = declined("MatMul", [("a", _r((4, 8), np.float32), False), ("b", _r((8, 8), np.float32), True)],
                      "npu-edge")
    assert "npu-edge" in reason and "MatMul" in reason
