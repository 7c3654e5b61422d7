"""Softmax family and reductions over empty tensors and empty axes, vs ORT's CPU EP through NpuEP sessions (graph
assignment proves NpuEP ran them) and the kernel alone (issue 38 item 9).

ORT returns an empty Softmax for an empty input whatever the axis; numpy's maximum over an empty axis raised "zero-size
array to reduction operation maximum". Reductions over an empty axis give the identity (0, -inf), keepdims and
noop_with_empty_axes as ORT. An exported attention with zero keys (T=0) gives zeros."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _ep_single import check_on_ep
from npu_testing import assignment, cpu_run, make_model, npu_session

BOTH = ("npu-ref", "npu-edge")
EMPTY = [((2, 0, 3), 1), ((2, 0, 3), 0), ((2, 0, 3), -1), ((0, 3), -1), ((0, 3), 0), ((2, 3, 0), 1), ((2, 3, 0), -1)]


@pytest.mark.parametrize("shape, axis", EMPTY)
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_of_an_empty_tensor_is_empty(shape, axis, opset, dtype):
    x = np.zeros(shape, dtype)
    (want,) = check_on_ep("Softmax", [("x", x, False)], [("y", dtype)], {"axis": axis}, opset=opset, targets=BOTH)
    assert want.shape == shape


AXES = [(axes, const) for axes in ([1], [0], [1, 2], []) for const in (True, False)] + [(None, True)]


REDUCTIONS = [(op, dtype) for op in ("ReduceMax", "ReduceSum", "ReduceMean") for dtype in (np.float32, np.float16)]
REDUCTIONS += [(op, np.int64) for op in ("ReduceMax", "ReduceSum")]  # integer ReduceMean is not an NPU op


@pytest.mark.parametrize("op, dtype", REDUCTIONS)
@pytest.mark.parametrize("axes, const_axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("noop", [0, 1])
def test_reductions_over_empty_axes(op, dtype, axes, const_axes, keepdims, noop):
    """The identity where an empty axis is reduced (int64 ReduceMax: the type's lowest), an empty result where a
    kept axis is empty, the input itself for empty axes with noop_with_empty_axes, all of it with constant and
    runtime axes (None: no axes input)."""
    x = np.zeros((2, 0, 3), dtype)
    inputs = [("x", x, False)] + ([("axes", np.array(axes, np.int64), const_axes)] if axes is not None else [])
    check_on_ep(op, inputs, [("y", dtype)], {"keepdims": keepdims, "noop_with_empty_axes": noop}, opset=18)


def _attention(t_name: str = "T"):
    """softmax(q @ k^T * c + mask) @ v as exporters write it (NpuEP fuses it into one AttentionChain)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="k_t"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Mul", ["s", "c"], ["s2"], name="scale"),
             helper.make_node("Add", ["s2", "mask"], ["s3"], name="mask_add"),
             helper.make_node("Softmax", ["s3"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    inputs = [helper.make_tensor_value_info("q", f, [1, 2, 3, 4]),
              helper.make_tensor_value_info("k", f, [1, 2, t_name, 4]),
              helper.make_tensor_value_info("v", f, [1, 2, t_name, 4]),
              helper.make_tensor_value_info("mask", f, [1, 1, 3, t_name])]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", f, [1, 2, 3, 4])],
                      {"c": np.array(0.5, np.float32)})


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_exported_attention_with_zero_keys_gives_zeros(kernels):
    model = _attention()
    rng = np.random.default_rng(3)
    sess = npu_session(model, {"target": "npu-ref", "kernels": kernels}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for t in (0, 5, 0):  # zero keys, then some, then none again on the same session
        feeds = {"q": rng.standard_normal((1, 2, 3, 4), np.float32),
                 "k": rng.standard_normal((1, 2, t, 4), np.float32),
                 "v": rng.standard_normal((1, 2, t, 4), np.float32), "mask": np.zeros((1, 1, 3, t), np.float32)}
        (want,) = cpu_run(model, feeds)
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if t == 0:
            assert not got.any()


def _special_rows(dtype) -> np.ndarray:
    big = float(np.finfo(dtype).max) / 2
    return np.array([[1, 2, 3, 4], [-np.inf, 0, 1, 2], [-np.inf] * 4, [np.nan, 1, 2, 3], [1, np.nan, 2, 3],
                     [np.inf, 1, 2, 3], [-np.inf, -np.inf, 0, 0], [big, -big, 0, 5], [-50, 60, 0, 0]], dtype)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_log_softmax_any_axis(axis, dtype):
    x = np.random.default_rng(4).uniform(-10, 10, (3, 9, 70)).astype(dtype)
    check_on_ep("LogSoftmax", [("x", x, False)], [("y", dtype)], {"axis": axis}, opset=13, targets=BOTH)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_log_softmax_opset11_coerces_to_2d(axis):
    x = np.random.default_rng(5).uniform(-3, 3, (2, 3, 5)).astype(np.float32)
    check_on_ep("LogSoftmax", [("x", x, False)], [("y", np.float32)], {"axis": axis}, opset=11)


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_log_softmax_special_values_as_ort(axis, dtype):
    """-inf inputs give -inf; a row of -inf, or holding +inf or NaN, is NaN throughout (ORT's MLAS kernel: x - max
    is NaN there); large magnitudes stay finite. The same places as ORT, values within float tolerance."""
    x = _special_rows(dtype)
    want = check_on_ep("LogSoftmax", [("x", x, False)], [("y", dtype)], {"axis": axis}, opset=13, targets=BOTH)
    if axis == -1:
        assert np.isnan(want[0][2:6]).all() and np.isneginf(want[0][1, 0])


@pytest.mark.parametrize("shape, axis", EMPTY)
def test_log_softmax_of_an_empty_tensor_is_empty(shape, axis):
    check_on_ep("LogSoftmax", [("x", np.zeros(shape, np.float32), False)], [("y", np.float32)], {"axis": axis})


@pytest.mark.parametrize("shape, axis", [((3, 9, 70), 0), ((3, 9, 70), 1), ((1, 8, 33, 40), 2), ((1, 1000, 49), 1)])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_any_axis_as_ort(shape, axis, opset):
    """Softmax over a non-last axis (opset 13: that axis, native columns; opset 11: the trailing axes from it, native
    rows) on NpuEP, as ORT's CPU EP within float tolerance (issue 40)."""
    x = np.random.default_rng(6).uniform(-10, 10, shape).astype(np.float32)
    check_on_ep("Softmax", [("x", x, False)], [("y", np.float32)], {"axis": axis}, opset=opset)
