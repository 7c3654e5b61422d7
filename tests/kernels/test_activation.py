"""Clip, HardSigmoid, HardSwish, LeakyRelu, PRelu, Elu, Selu, Softplus, Softsign and IsInf vs ORT CPU, through the
kernel and through NpuEP sessions on both targets (ORT's assignment shows NpuEP ran the node).

Tolerances: float32 rtol=atol=1e-5, float16 2e-3 (``_vector_ortref.TOL``); Clip, PRelu signs and IsInf exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep, declined_by
from _vector_ortref import rand

BOTH = ("npu-ref", "npu-edge")
F = [np.float32, np.float16]


@pytest.mark.parametrize("bounds", ["both", "min_only", "max_only", "none", "inverted"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8])
def test_clip_optional_bounds_as_inputs(bounds, dtype):
    x = rand((2, 5, 33), dtype, seed=1, lo=-6, hi=6)
    lo, hi = np.array(-2 if dtype != np.uint8 else 12, dtype), np.array(3 if dtype != np.uint8 else 40, dtype)
    if bounds == "inverted":
        lo, hi = hi, lo  # min > max: every element becomes max, as ORT
    inputs = [("x", x, False),
              ("lo", lo, True) if bounds in ("both", "min_only", "inverted") else None,
              ("hi", hi, True) if bounds in ("both", "max_only", "inverted") else None]
    check_on_ep("Clip", inputs, [("y", dtype)], targets=BOTH)


def test_clip_runtime_bounds_and_relu6():
    x = rand((4, 64), np.float32, seed=2, lo=-10, hi=10)
    check_on_ep("Clip", [("x", x, False), ("lo", np.array(0.0, np.float32), False),
                         ("hi", np.array(6.0, np.float32), False)], [("y", np.float32)])


@pytest.mark.parametrize("attrs", [{"min": -1.5, "max": 2.0}, {"min": 0.0}, {"max": 1.0}, {}])
def test_clip_opset6_attributes(attrs):
    x = rand((3, 40), np.float32, seed=3)
    check_on_ep("Clip", [("x", x, False)], [("y", np.float32)], attrs, opset=6, targets=BOTH)


ACTIVATIONS = [
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.1666667, "beta": 0.5}), ("HardSwish", {}),
    ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Elu", {}), ("Elu", {"alpha": 0.5}), ("Selu", {}),
    ("Selu", {"alpha": 2.0, "gamma": 3.0}), ("Softplus", {}), ("Softsign", {}),
]


@pytest.mark.parametrize("op,attrs", ACTIVATIONS)
@pytest.mark.parametrize("dtype", F)
def test_activation_with_attributes(op, attrs, dtype):
    x = rand((2, 3, 65), dtype, seed=4, lo=-8, hi=8)
    x.reshape(-1)[:4] = [0.0, -0.0, 3.0, -3.0]  # HardSigmoid/HardSwish corners, Elu/LeakyRelu at 0
    check_on_ep(op, [("x", x, False)], [("y", dtype)], attrs, targets=BOTH)


def test_softplus_and_elu_extremes_do_not_overflow():
    x = np.array([-1000.0, -90.0, -1e-7, 0.0, 1e-7, 20.0, 90.0, 1000.0], np.float32)
    with np.errstate(over="raise", divide="raise", invalid="raise"):  # numpy's default warnings, as errors
        check_on_ep("Softplus", [("x", x, False)], [("y", np.float32)])
        check_on_ep("Elu", [("x", x, False)], [("y", np.float32)])


@pytest.mark.parametrize("slope_shape", [(1,), (16, 1, 1), (7,), ()])
@pytest.mark.parametrize("dtype", F)
def test_prelu_slope_broadcast(slope_shape, dtype):
    x = rand((2, 16, 5, 7), dtype, seed=5)
    slope = rand(slope_shape, dtype, seed=6, lo=0.0, hi=0.5)
    check_on_ep("PRelu", [("x", x, False), ("s", slope, True)], [("y", dtype)], targets=BOTH)


@pytest.mark.parametrize("neg,pos", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf_detect_flags(neg, pos):
    x = np.array([[np.inf, -np.inf, np.nan, 0.0, 1e38, -3.0]], np.float32)
    check_on_ep("IsInf", [("x", x, False)], [("y", np.bool_)], {"detect_negative": neg, "detect_positive": pos},
                targets=BOTH)


def test_integer_activation_is_declined_with_reason():
    x = np.arange(6, dtype=np.int32)
    reason = declined_by("LeakyRelu", [("x", x, False)], [("y", np.int32)], target="npu-ref")
    assert reason is not None and "dtype int32" in reason


def test_cost_counts_transcendentals():
    from _vector_ortref import make_model, run_npu
    x = rand((64, 1024), np.float32)
    costs = {op: run_npu(make_model(op, [("x", x, False)], [("y", np.float32)]), {"x": x})[2]
             for op in ("LeakyRelu", "Softplus")}
    assert costs["Softplus"].compute_cycles > costs["LeakyRelu"].compute_cycles > 0
    assert costs["LeakyRelu"].dma_bytes == 2 * x.nbytes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_and_clip_zero_signs_and_nan_as_ort(dtype):
    """The float path (numpy's clip ufunc) keeps -0.0 where it is in range and propagates NaN, bit for bit as ORT's
    CPU EP (np.maximum would give +0.0 for max(-0.0, +0.0))."""
    from _vector_ortref import make_model, run_npu, run_ort

    x = np.array([[-0.0, 0.0, np.nan, -np.inf, np.inf, -2.5, 2.5, 7.0]], dtype)
    cases = [("Relu", [("x", x, False)]),
             ("Clip", [("x", x, False), ("lo", np.array(0.0, dtype), True), ("hi", np.array(6.0, dtype), True)]),
             ("Clip", [("x", x, False), ("lo", np.array(-1.0, dtype), True), None]),
             ("Clip", [("x", x, False), None, ("hi", np.array(1.0, dtype), True)])]
    for op, inputs in cases:
        model = make_model(op, inputs, [("y", dtype)])
        (got,), _, _ = run_npu(model, {"x": x})
        (want,) = run_ort(model, {"x": x})
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want)), f"{op}: {got} vs ORT {want}"
