"""Differential sweep of ConstantOfShape (issue 40): ``fill_value`` (kernels/native/constant_of_shape.cc) against
the reference model (kernels/ops/generate.py: numpy's full), byte for byte (the value's bits are repeated: NaN
payloads, -0.0, float16 and bool kept), for values of every dtype size, shapes of rank 0..4 with size-0 axes, sizes
around the 65536-element task split and the 4 KB pattern a task's run is copied from, one thread and two. The bound
step is checked against the kernel by ``_sweep``; sessions show NpuEP ran the node as its bound native step (no
Python step) with the CPU EP's bytes, and a new shape value after binding falls back to the kernel with the right
result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from _sweep import around, assert_session_runs_natively, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

TASK = 1 << 16  # constant_of_shape.cc's kTaskElems
NAN_PAYLOAD = np.array([0x7FC12345], np.uint32).view(np.float32)
VALUES = [np.array([True]), np.array([-7], np.int8), np.array([-0.0], np.float16), np.array([np.inf], np.float16),
          NAN_PAYLOAD, np.array([-0.0], np.float32), np.array([2.5], np.float32), np.array([-123456789], np.int32),
          np.array([2 ** 40 + 3], np.int64), np.array([np.nan], np.float64), np.array([2 ** 64 - 1], np.uint64)]
SHAPES = [[], [0], [1], [5], [2, 3, 4], [3, 0, 2], [1, 1, 7, 1], [2, 3, 4, 5]]


def _bytes_equal(shape, value, threads: int = 1) -> np.ndarray:
    attrs = {"value": numpy_helper.from_array(value)}
    got, want, calls = native_vs_reference("ConstantOfShape", [("s", np.array(shape, np.int64), False)],
                                           threads=threads, **attrs)
    what = f"ConstantOfShape {shape} {value.dtype} {value.tobytes().hex()} threads={threads}"
    assert "fill_value" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == value.dtype and g.shape == w.shape == tuple(shape), what
    assert g.tobytes() == w.tobytes(), f"{what}: bytes differ"
    return g


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{v.dtype}")
def test_values_and_shapes_byte_for_byte(value):
    for shape in SHAPES:
        _bytes_equal(shape, value)


@pytest.mark.parametrize("value", [VALUES[1], VALUES[2], NAN_PAYLOAD, VALUES[8]], ids=lambda v: f"{v.dtype}")
def test_task_split_byte_for_byte(value):
    for n in around(TASK, 2 * TASK):
        _bytes_equal([n], value)
    shape = [3, TASK + 9]
    assert _bytes_equal(shape, value, threads=1).tobytes() == _bytes_equal(shape, value, threads=2).tobytes()
    _bytes_equal([64, TASK], value, threads=2)  # 2^22 elements: two threads from 8-byte values


PATTERN_BYTES = 4096  # constant_of_shape.cc fills this many bytes by a loop, the rest of a task by copies of them


@pytest.mark.parametrize("value", [VALUES[2], NAN_PAYLOAD, VALUES[8]], ids=lambda v: f"{v.dtype}")
def test_pattern_copies_byte_for_byte(value):
    """Runs around the pattern, its multiples and a task's last partial copy, in one task and across tasks."""
    p = PATTERN_BYTES // value.itemsize
    for n in (*around(p, 2 * p, 3 * p), TASK - p + 1, TASK + p - 1, TASK + 2 * p + 3):
        _bytes_equal([n], value)
    _bytes_equal([3, 2 * p + 1], value)


def test_bad_arguments_name_them():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"negative dimension in \[2,-1\]"):
        nat.fill_value([2, -1], np.zeros(1, np.float32), None, 1)
    with pytest.raises(ValueError, match=r"one element of a dtype of 1, 2, 4 or 8 bytes, got float32\[2\]"):
        nat.fill_value([2], np.zeros(2, np.float32), None, 1)
    with pytest.raises(ValueError, match="out must be a writeable C-order float32 array of 6 elements"):
        nat.fill_value([2, 3], np.zeros(1, np.float32), np.zeros(5, np.float32), 1)


def _session(value: np.ndarray, rank: int):
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="the_op", value=numpy_helper.from_array(value))
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    model = make_model([node], [helper.make_tensor_value_info("s", TensorProto.INT64, [rank])],
                       [helper.make_tensor_value_info("y", elem, [f"d{i}" for i in range(rank)])], opset=17)
    so = session_options()
    tag_session_options(so)  # so python_steps finds the session's programs
    return model, npu_session(model, so=so)


@pytest.mark.parametrize("value", [NAN_PAYLOAD, np.array([-0.0], np.float16), np.array([7], np.int64),
                                   np.array([True])], ids=lambda v: f"{v.dtype}")
def test_session_matches_cpu_ep_and_runs_on_npu_ep(value):
    """A runtime shape: the CPU EP's bytes (the NaN payload kept), the bound step after the first call; a new shape
    value declines the step (it is bound for the shape's value) and the kernel answers it."""
    model, sess = _session(value, 3)
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, {"s": np.array([2, 3, 700], np.int64)}, bits=True)
    feeds = {"s": np.array([1, 5, 9], np.int64)}
    got, want = sess.run(None, feeds)[0], cpu_run(model, feeds)[0]
    assert got.shape == want.shape == (1, 5, 9) and got.tobytes() == want.tobytes()
