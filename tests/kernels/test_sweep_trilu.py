"""Differential sweep of Trilu (issue 40): ``trilu`` (kernels/native/trilu.cc) against the reference model
(kernels/ops/generate.py: numpy's triu/tril), byte for byte (kept elements are moved, never computed: NaN, -0.0 and
float16 kept; the others are zero bits, numpy's 0 of every dtype), for every element size (bool, int8, float16,
float32, int64), upper and lower, every diagonal k that crosses the matrix (and far beyond it both ways, where
i + k must not overflow), square, wide and tall matrices under batch axes.

trilu.cc's structure: each row is one memcpy of the kept columns and one memset of the others, the split column
clamped to the row; rows are split over threads in tasks of at least 128 KiB. So the cases cross every split column
of each row, and a large case runs on one thread and two with the same bytes. The bound step is checked against
the kernel by ``_sweep``; sessions show NpuEP ran the node as its bound native step with the CPU EP's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import assert_session_runs_natively, kernel_and_bound_step, native_vs_reference, with_specials
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4044)
DTYPES = [np.bool_, np.int8, np.float16, np.float32, np.int64]
INT64_MAX = np.iinfo(np.int64).max


def _values(shape, dt) -> np.ndarray:
    dt = np.dtype(dt)
    if dt == np.bool_:
        return np.asarray(RNG.random(shape) > 0.5)
    if dt.kind == "f":
        return with_specials(np.asarray(RNG.standard_normal(shape) * 10).astype(dt), RNG,
                             values=(np.nan, np.inf, -np.inf, -0.0, 6.0e4))
    info = np.iinfo(dt)
    return np.asarray(RNG.integers(info.min, info.max, shape, dtype=dt, endpoint=True))


def _same_bytes(x: np.ndarray, k: int | None, upper: int, threads: int = 1, const_k: bool = True) -> np.ndarray:
    inputs = [("x", x, False)] + ([] if k is None else [("k", np.array(k, np.int64), const_k)])
    got, want, calls = native_vs_reference("Trilu", inputs, threads=threads, upper=upper)
    what = f"Trilu upper={upper} k={k} {x.dtype}{x.shape} threads={threads}"
    assert "trilu" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), f"{what}: bytes differ"
    return g


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("upper", [1, 0])
def test_every_diagonal_of_square_wide_and_tall_matrices(dt, upper):
    for shape in [(5, 5), (3, 7), (7, 3), (2, 3, 4, 6), (1, 1)]:
        h, w = shape[-2:]
        x = _values(shape, dt)
        for k in range(-h - 1, w + 2):
            _same_bytes(x, k, upper)
        _same_bytes(x, None, upper)  # k omitted: the main diagonal


def test_far_diagonals_runtime_k_and_empty_matrices():
    x = _values((4, 6), np.float32)
    for k in (2**62, -(2**62), 10**12, -(10**12)):
        for upper in (1, 0):
            _same_bytes(x, k, upper)
    nat = runtime.native_module()  # numpy itself overflows at the int64 ends; the kernel clamps k first
    assert nat.trilu(x, INT64_MAX, True).tobytes() == np.zeros_like(x).tobytes()
    assert nat.trilu(x, -INT64_MAX - 1, True).tobytes() == x.tobytes()
    assert nat.trilu(x, -INT64_MAX - 1, False).tobytes() == np.zeros_like(x).tobytes()
    _same_bytes(x, 2, 1, const_k=False)  # a runtime k: the step holds its bound value
    _same_bytes(_values((2, 0, 3), np.float32), 0, 1)
    _same_bytes(_values((3, 0), np.int8), 1, 0)


def test_threads_split_rows_with_the_same_bytes():
    x = _values((3, 500, 700), np.float32)  # over the one-thread floor (2^20 elements)
    for upper in (1, 0):
        assert _same_bytes(x, 5, upper, threads=1).tobytes() == _same_bytes(x, 5, upper, threads=2).tobytes()


def test_stacked_small_matrices_across_task_starts():
    """The row within its matrix is counted on from each task's first row (131072 // 41 = 3196 rows a task, not a
    multiple of 2 or 3: tasks start inside a matrix), for matrices of 1, 2 and 3 rows and far diagonals."""
    for h in (1, 2, 3):
        x = _values((12000 // h, h, 41), np.bool_)
        for k in (-1, 0, 1, 40):
            for upper in (1, 0):
                _same_bytes(x, k, upper)


def test_bound_step_and_rank_errors():
    x = _values((3, 4), np.int64)
    for const in (True, False):
        got, bound = kernel_and_bound_step("Trilu", [("x", x, False), ("k", np.array(-1, np.int64), const)], upper=0)
        assert bound and bound[0].tobytes() == got[0].tobytes() == np.tril(x, -1).tobytes()
    with pytest.raises(ValueError, match=r"trilu: input of shape \[4\] has rank < 2"):
        runtime.native_module().trilu(_values((4,), np.float32), 0, True)


@pytest.mark.parametrize("case", ["causal_mask_bool", "upper_f16_k1", "lower_i64"])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """A decoder's causal mask, a float16 strict upper triangle and an int64 lower one under a batch axis: the CPU
    EP's bytes, NpuEP ran the node, and ran it as its bound native step (no Python step)."""
    shape, k, upper, elem, dt = {"causal_mask_bool": ((64, 64), 0, 0, TensorProto.BOOL, np.bool_),
                                 "upper_f16_k1": ((2, 33, 40), 1, 1, TensorProto.FLOAT16, np.float16),
                                 "lower_i64": ((3, 9, 7), -2, 0, TensorProto.INT64, np.int64)}[case]
    node = helper.make_node("Trilu", ["x", "k"], ["y"], name="the_op", upper=upper)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, list(shape))],
                       [helper.make_tensor_value_info("y", elem, list(shape))], {"k": np.array(k, np.int64)},
                       opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, {"x": _values(shape, dt)}, bits=True)
