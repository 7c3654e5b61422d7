"""ReduceSum/Mean/Max and Softmax vs ORT CPU.

Axes as attribute (old opsets) and as constant or runtime input (new opsets), keepdims, noop_with_empty_axes.
Tolerances: float32 1e-5 (sums of up to ~1000 terms: rtol 1e-5, atol 1e-4), float16 2e-3 relative; ints exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from _vector_ortref import check_against_ort, make_model, rand, run_npu
from npu_ep.kernels.registry import kernel_for

AXES = [[-1], [0], [1, 2], [0, 2], [0, 1, 2]]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reduce_axes_as_input(op, axes, keepdims, dtype):
    x = rand((3, 17, 40), dtype, seed=1)
    check_against_ort(op, [("x", x, False), ("axes", np.array(axes, np.int64), True)], [("y", dtype)],
                      {"keepdims": keepdims}, opset=18, tol=(1e-5, 1e-4) if dtype == np.float32 else (2e-3, 2e-2))


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
def test_reduce_axes_as_attribute_opset13(op):
    x = rand((4, 6, 9), np.float32, seed=2)
    check_against_ort(op, [("x", x, False)], [("y", np.float32)], {"axes": [1], "keepdims": 0}, opset=13)


def test_reduce_sum_axes_as_runtime_input():
    x = rand((5, 8, 3), np.float32, seed=3)
    check_against_ort("ReduceSum", [("x", x, False), ("axes", np.array([0, -1], np.int64), False)],
                      [("y", np.float32)], opset=13, tol=(1e-5, 1e-4))


@pytest.mark.parametrize("noop", [0, 1])
def test_empty_axes_reduce_all_or_noop(noop):
    x = rand((4, 7), np.float32, seed=4)
    check_against_ort("ReduceSum", [("x", x, False), ("axes", np.array([], np.int64), True)], [("y", np.float32)],
                      {"noop_with_empty_axes": noop}, opset=13, tol=(1e-5, 1e-4))
    check_against_ort("ReduceMean", [("x", x, False)], [("y", np.float32)],
                      {"noop_with_empty_axes": noop, "keepdims": 0}, opset=18)


@pytest.mark.parametrize("op,dtype", [("ReduceSum", np.int32), ("ReduceSum", np.int64), ("ReduceMax", np.int32)])
def test_integer_reductions_exact(op, dtype):
    x = rand((6, 33), dtype, seed=5)
    check_against_ort(op, [("x", x, False), ("axes", np.array([1], np.int64), True)], [("y", dtype)], opset=18)


def test_int64_sum_over_attention_mask_and_second_call_other_length():
    """The decode step's seqlens: ReduceSum(attention_mask [1, L], axes=[1], keepdims=0); the normalized axes are
    reused (kernel_cache) when L grows."""
    mask = np.ones((1, 513), np.int64)
    inputs = [("m", mask, False), ("axes", np.array([1], np.int64), True)]
    check_against_ort("ReduceSum", inputs, [("y", np.int64)], {"keepdims": 0}, opset=18)
    _, prepared, _ = run_npu(make_model("ReduceSum", inputs, [("y", np.int64)], {"keepdims": 0}, opset=18), {"m": mask})
    (y,) = kernel_for("", "ReduceSum").run(prepared, [np.ones((1, 514), np.int64), None])
    assert y.dtype == np.int64 and y.tolist() == [514]


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in ("ReduceSum", "ReduceMean", "ReduceMax")
                                      for dt in (np.float32, np.float16, np.int64)
                                      if not (op == "ReduceMean" and dt == np.int64)])  # declined by check
def test_reduce_all_to_a_0d_array(op, dtype):
    x = rand((3, 5), dtype, seed=8)
    model = make_model(op, [("x", x, False)], [("y", dtype)], {"keepdims": 0}, opset=18)
    _, prepared, _ = run_npu(model, {"x": x})
    (y,) = kernel_for("", op).run(prepared, [x])
    assert type(y) is np.ndarray and y.shape == () and y.dtype == dtype
    check_against_ort(op, [("x", x, False)], [("y", dtype)], {"keepdims": 0}, opset=18,
                      tol=(1e-5, 1e-5) if dtype == np.float32 else (2e-3, 2e-2))


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_any_axis(axis, dtype):
    x = rand((3, 9, 130), dtype, seed=6, lo=-10, hi=10)
    check_against_ort("Softmax", [("x", x, False)], [("y", dtype)], {"axis": axis}, opset=13)


def test_softmax_large_logits_stable():
    x = np.array([[1000.0, 999.0, -1000.0], [-5e4, -5e4, -5e4]], np.float32)
    check_against_ort("Softmax", [("x", x, False)], [("y", np.float32)], opset=13)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_opset11_coerces_to_2d(axis):
    x = rand((2, 3, 5), np.float32, seed=7)
    check_against_ort("Softmax", [("x", x, False)], [("y", np.float32)], {"axis": axis}, opset=11)
