"""com.microsoft QLinearSigmoid, QLinearConcat, QLinearGlobalAveragePool, QGemm and ONNX DynamicQuantizeLinear vs
ORT's CPU EP, through the kernel and NpuEP sessions on both targets (ORT's assignment shows NpuEP ran the node).

Numerics:
- bit-exact: QLinearConcat, QLinearGlobalAveragePool, QGemm (int32 accumulation, MLAS requantization; float output
  equal to the last bit) and DynamicQuantizeLinear: ORT computes these with exact integer math plus the same
  float32 operation sequence as the kernel.
- within one quantum: QLinearSigmoid. ORT's MLAS logistic is an approximation a few float32 ulps from the exact
  sigmoid; a table entry on a rounding boundary may land one step away. The test also bounds how many do.
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import feeds_of, make_model, rand, run_npu, run_ort
from npu_testing import assignment, npu_session

BOTH = ("npu-ref", "npu-edge")
MS = "com.microsoft"


def _q(name, x, scale, zp, const=True):
    return [(name, x, False), (f"{name}_s", np.array(scale, np.float32), const),
            (f"{name}_z", np.array(zp, x.dtype), const)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("params", [(0.05, 0, 1 / 256, 0), (0.1, 7, 0.004, 3), (0.02, -5, 0.01, 100)])
def test_qlinear_sigmoid_within_one_quantum(dtype, params):
    sx, zx, sy, zy = params
    if dtype == np.uint8:
        zx, zy = zx + 128, min(255, abs(zy))
    x = np.arange(256, dtype=np.uint8).view(dtype).reshape(4, 64)  # every input value once
    inputs = _q("x", x, sx, zx) + [("y_s", np.array(sy, np.float32), True), ("y_z", np.array(zy, dtype), True)]
    model = make_model("QLinearSigmoid", inputs, [("y", dtype)], domain=MS)
    feeds = feeds_of(inputs)
    want = run_ort(model, feeds)[0].astype(int)
    got_kernel = run_npu(model, feeds)[0][0]
    for target in BOTH:
        sess = npu_session(model, {"target": target}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        got = sess.run(None, feeds)[0]
        assert got.dtype == dtype and np.array_equal(got, got_kernel)
        diff = np.abs(got.astype(int) - want)
        assert diff.max() <= 1, diff.max()
        assert np.count_nonzero(diff) <= 4, np.count_nonzero(diff)  # boundary entries only


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_qlinear_concat_requantizes_each_input(dtype, axis):
    zy = 128 if dtype == np.uint8 else 0
    a = rand((2, 3, 8), dtype, seed=1, lo=-12, hi=25)
    b = rand((2, 3, 8), dtype, seed=2, lo=-12, hi=25)
    c = rand((2, 3, 8), dtype, seed=3, lo=-12, hi=25)
    inputs = ([("y_s", np.array(0.05, np.float32), True), ("y_z", np.array(zy, dtype), True)]
              + _q("a", a, 0.05, zy)            # same parameters as the output: copied
              + _q("b", b, 0.031, zy + 3)       # requantized
              + _q("c", c, 0.2, zy - 2, const=False))  # runtime parameters
    check_on_ep("QLinearConcat", inputs, [("y", dtype)], {"axis": axis}, domain=MS, targets=BOTH)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape,channels_last", [((2, 5, 7, 9), 0), ((2, 7, 9, 5), 1), ((3, 4, 33), 0),
                                                 ((1, 1, 3, 3), 0)])
def test_qlinear_global_average_pool(dtype, shape, channels_last):
    zx, zy = (128, 120) if dtype == np.uint8 else (-3, 5)
    x = rand(shape, dtype, seed=4, lo=-13, hi=26)
    inputs = _q("x", x, 0.07, zx) + [("y_s", np.array(0.03, np.float32), True), ("y_z", np.array(zy, dtype), True)]
    check_on_ep("QLinearGlobalAveragePool", inputs, [("y", dtype)], {"channels_last": channels_last}, domain=MS,
                targets=BOTH)


def _qgemm_inputs(a_dt, b_dt, trans_a, trans_b, per_column, bias, quantized, m=5, k=70, n=12):
    a = rand((k, m) if trans_a else (m, k), a_dt, seed=5, lo=-13, hi=26)
    b = rand((n, k) if trans_b else (k, n), b_dt, seed=6, lo=-13, hi=26)
    za = 130 if a_dt == np.uint8 else -4
    zb = np.array([1, -2, 0, 3] * (n // 4)) if per_column else np.array(2)
    zb = (zb + (128 if b_dt == np.uint8 else 0)).astype(b_dt)
    sb = np.linspace(0.01, 0.03, n).astype(np.float32) if per_column else np.array(0.02, np.float32)
    inputs = [("a", a, False), ("a_s", np.array(0.05, np.float32), True), ("a_z", np.array(za, a_dt), True),
              ("b", b, True), ("b_s", sb, True), ("b_z", zb, True),
              ("c", rand((n,), np.int32, seed=7, lo=-300, hi=300), True) if bias else None]
    if quantized:
        inputs += [("y_s", np.array(0.9, np.float32), True), ("y_z", np.array(3 if a_dt == np.int8 else 128, a_dt),
                                                                   True)]
    return inputs


@pytest.mark.parametrize("a_dt,b_dt", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm_exact(a_dt, b_dt, quantized, per_column):
    inputs = _qgemm_inputs(a_dt, b_dt, 0, 1, per_column, True, quantized)
    out = a_dt if quantized else np.float32
    check_on_ep("QGemm", inputs, [("y", out)], {"transB": 1}, domain=MS, tol=(0.0, 0.0), targets=BOTH)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (1, 1)])
@pytest.mark.parametrize("alpha", [1.0, 0.37])
def test_qgemm_transposes_alpha_no_bias(trans_a, trans_b, alpha):
    inputs = _qgemm_inputs(np.uint8, np.int8, trans_a, trans_b, False, False, True)
    check_on_ep("QGemm", inputs, [("y", np.uint8)], {"transA": trans_a, "transB": trans_b, "alpha": alpha},
                domain=MS, targets=BOTH)


@pytest.mark.parametrize("lo,hi", [(-3.0, 5.0), (0.5, 4.0), (-6.0, -1.0), (0.0, 0.0)])
def test_dynamic_quantize_linear(lo, hi):
    x = rand((3, 41), np.float32, seed=8, lo=lo, hi=hi)
    check_on_ep("DynamicQuantizeLinear", [("x", x, False)],
                [("y", np.uint8), ("y_scale", np.float32), ("y_zp", np.uint8)], tol=(0.0, 0.0), targets=BOTH)
