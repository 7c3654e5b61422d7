"""Differential sweep of Range (issue 40): ``range_fill`` (kernels/native/range.cc) against the reference model
(kernels/ops/generate.py), exact: float32/float64 accumulating value += delta (fractional and negative steps,
counts whose last step rounds up), int16/int32/int64 wrapping at the type's limits, empty ranges (limit behind
start), one-element [1] inputs; delta 0 and counts beyond reach stay on the reference, which raises or answers. The
bound step equals the kernel (``_sweep``); a session shows NpuEP ran the node, as its bound native step (no Python
step), with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

FLOAT_CASES = [(0.0, 10.0, 1.0), (0.0, 1.0, 0.1), (5.0, -3.0, -0.7), (1e7, 1e7 + 300.0, 0.3), (2.0, 2.0, 1.0),
               (3.0, 1.0, 1.0), (-1.5, 1000.0, 0.37)]
INT_CASES = [(0, 10, 1), (10, -7, -3), (0, 100, 7), (5, 5, 1), (9, 1, 2), (-1000, 1000, 13)]


def _check(start, limit, delta, dt, shape=()) -> np.ndarray:
    inputs = [(n, np.array(v, dt).reshape(shape), False) for n, v in zip(("s", "l", "d"), (start, limit, delta))]
    got, want, calls = native_vs_reference("Range", inputs)
    what = f"Range({start}, {limit}, {delta}) {np.dtype(dt)}"
    assert "range_fill" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == np.dtype(dt) and g.shape == w.shape, f"{what}: {g.shape} vs {w.shape}"
    assert g.tobytes() == w.tobytes(), f"{what}: values differ"
    return g


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_float_ranges_exact(dt):
    for case in FLOAT_CASES:
        _check(*case, dt)
    _check(0.0, 5.0, 0.5, dt, shape=(1,))


@pytest.mark.parametrize("dt", [np.int16, np.int32, np.int64])
def test_integer_ranges_exact_and_wrapping(dt):
    for case in INT_CASES:
        _check(*case, dt)
    info = np.iinfo(dt)
    _check(info.max - 5, info.max, 2, dt)
    _check(info.min + 6, info.min, -2, dt)
    _check(info.min, info.max, info.max // 3, dt)  # the difference wraps in the dtype, as the reference's


def test_what_stays_on_the_reference():
    nat = runtime.native_module()
    assert nat.range_fill(np.array(0, np.int64), np.array(5, np.int64), np.array(0, np.int64)) is None
    assert nat.range_fill(np.array(0.0, np.float32), np.array(np.inf, np.float32), np.array(1.0, np.float32)) is None
    with pytest.raises(ValueError, match="delta is 0"):
        _check(0, 5, 0, np.int64)


def test_session_matches_cpu_ep_and_runs_on_npu_ep():
    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info(n, TensorProto.INT64, []) for n in ("s", "l", "d")],
                       [helper.make_tensor_value_info("y", TensorProto.INT64, ["n"])], opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    for limit in (100, 37, 100):  # the bound step follows the values: its output's length changes
        feeds = {"s": np.array(3, np.int64), "l": np.array(limit, np.int64), "d": np.array(2, np.int64)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
