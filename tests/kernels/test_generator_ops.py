"""Range, ConstantOfShape and Trilu vs ORT CPU through the kernel and NpuEP sessions (exact, except Range's float
accumulation, which matches ORT's sequential loop bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from _ep_single import check_on_ep
from _vector_ortref import rand

I64 = np.int64


@pytest.mark.parametrize("start,limit,delta", [(0, 10, 1), (10, -3, -3), (5, 5, 1), (3, 1, 2), (-7, 20, 4)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_range(start, limit, delta, dtype):
    inputs = [(n, np.array(v, dtype), False) for n, v in (("s", start), ("l", limit), ("d", delta))]
    check_on_ep("Range", inputs, [("y", dtype)])


def test_range_float_accumulates_like_ort():
    inputs = [("s", np.array(0.1, np.float32), False), ("l", np.array(30.0, np.float32), False),
              ("d", np.array(0.1, np.float32), False)]
    check_on_ep("Range", inputs, [("y", np.float32)], tol=(0.0, 0.0))


def test_range_runtime_length_declined_on_static_target():
    inputs = [(n, np.array(v, I64), False) for n, v in (("s", 0), ("l", 4), ("d", 1))]
    from _vector_ortref import make_model
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.support import why_not
    from npu_ep.kernels.target import Target
    model = make_model("Range", inputs, [("y", I64, ["n"])])
    (node,) = nodes_from_model(model)
    reason = why_not(node, Target.load("npu-edge"))
    assert reason is not None and "requires static shapes" in reason


@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], I64), np.array([1], np.int32)])
@pytest.mark.parametrize("shape", [[2, 3, 4], [5], [3, 0]])
def test_constant_of_shape(value, shape):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    out = np.float32 if value is None else value.dtype
    check_on_ep("ConstantOfShape", [("s", np.array(shape, I64), False)], [("y", out)], attrs)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -5, 9])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_trilu_upper_lower_with_k(upper, k, dtype):
    x = rand((2, 4, 6), dtype, seed=1)
    inputs = [("x", x, False)] + ([("k", np.array(k, I64), True)] if k is not None else [])
    check_on_ep("Trilu", inputs, [("y", dtype)], {"upper": upper}, targets=("npu-ref", "npu-edge"))


def test_trilu_runtime_k_and_tall_matrix():
    x = rand((7, 3), np.float32, seed=2)
    check_on_ep("Trilu", [("x", x, False), ("k", np.array(-2, I64), False)], [("y", np.float32)], {"upper": 0})
