"""Differential sweep of the native reductions (kernels/native/reduce.cc's integer ReduceSum and float
ReduceMean, pool.cc's GlobalAveragePool global_average_pool), issue 38: each runs as a bound native step (the
program's C++ loop), so the sweep binds it after the kernel's own run (the reference model) and compares the two
bit for bit, counting that the native step ran (or declined where it must). reduce.cc's float32 row maxima
(ReduceMax over trailing axes, GlobalMaxPool; issue 40: 32 values per step and a masked tail on AVX-512, scalar
below, tasks of 16 rows) run in the kernel too: they are checked exact against the reference on every ISA level.
A float32 ReduceMean now runs and binds reduce_axis (issue 40): here its bound step is checked against the kernel's
own native run bit for bit; test_sweep_reduce_axis.py holds it to the reference within the stated tolerance.

Boundaries: integer sums at the type's limits (int32 saturation, both signs), a row's sum of |x| just below and at
2^53 (above it float64 could round: the step must decline and the reference run), int64 extremes; float means with
NaN, +-Inf, -0.0, huge and subnormal values, rows around numpy's pairwise block of 128, leading and trailing axes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.ep import _native as extension
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.reduce import _saturating_sum
from tests.kernels.test_bound_native_calls import assert_same, one_step_loop, prepared, reduce_model
from tests.npu_testing import make_model

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3804)
EXACT = 2 ** 53


def _bound_equals_reference(op, x, axes, keepdims, native_runs=True):
    kernel, p = prepared(reduce_model(x.dtype, x.shape, axes, keepdims, op=op), op)
    with np.errstate(all="ignore"):  # IEEE results without warnings, as in a session
        outs, step, loop = one_step_loop(kernel, p, [x, None])
        assert isinstance(step, extension.CallStep), f"{op} {x.shape} {axes}: not bound"
        assert_same(loop((x, None)), outs)
    assert loop.native_counts == ((1, 0) if native_runs else (0, 1)), (op, x.shape, axes, loop.native_counts)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_sums_around_saturation(dtype):
    info = np.iinfo(dtype)
    for cols in (1, 2, 3, 127, 128, 129):
        x = RNG.integers(info.min // cols, info.max // cols, (4, cols), dtype=np.int64).astype(dtype) \
            if dtype == np.int32 else RNG.integers(-1000, 1000, (4, cols)).astype(dtype)
        if dtype == np.int32:
            x[1] = info.max  # the sum saturates at the top (from 2 columns on)
            x[2] = info.min  # and at the bottom
            x[3, ::2], x[3, 1::2] = info.max, info.min  # cancels: exact in int64
        _bound_equals_reference("ReduceSum", x, [1], 0)
        _bound_equals_reference("ReduceSum", x.reshape(2, 2, cols), [-2, -1], 1)


def test_int64_rows_just_below_and_at_2_53():
    below = np.array([[EXACT // 2, EXACT // 2 - 1], [-(EXACT // 2), -(EXACT // 2) + 1]], np.int64)
    _bound_equals_reference("ReduceSum", below, [1], 0)
    at = np.array([[EXACT // 2, EXACT // 2]], np.int64)  # sum of |x| reaches 2^53: the reference runs
    _bound_equals_reference("ReduceSum", at, [1], 0, native_runs=False)
    extremes = np.array([[np.iinfo(np.int64).min, 1]], np.int64)
    _bound_equals_reference("ReduceSum", extremes, [1], 1, native_runs=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_means_with_special_values(dtype):
    for cols in (1, 7, 127, 128, 129, 300):
        x = (RNG.standard_normal((3, 2, cols)) * 10).astype(dtype)
        flat = x.reshape(-1)
        flat[::17] = np.nan
        flat[3::19] = np.inf
        flat[5::23] = -np.inf
        flat[7::13] = -0.0
        flat[11::29] = np.finfo(dtype).max
        flat[2::31] = np.finfo(dtype).smallest_subnormal
        for axes in ([2], [0, 2], [1]):
            _bound_equals_reference("ReduceMean", x, axes, 1)
            _bound_equals_reference("ReduceMean", x, axes, 0)


def _gap_model(shape):
    return make_model([helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
                      [helper.make_tensor_value_info("x", 1, list(shape))],
                      [helper.make_tensor_value_info("y", 1, [*shape[:2]] + [1] * (len(shape) - 2))])


def test_global_average_pool():
    for shape in ((1, 3, 1, 1), (2, 5, 7, 3), (1, 17, 128, 1), (1, 2, 129), (1, 1, 2, 3, 5)):
        x = with_specials((RNG.standard_normal(shape) * 5).astype(np.float32), RNG, fraction=0.02)
        kernel, p = prepared(_gap_model(shape), "GlobalAveragePool")
        with np.errstate(all="ignore"):
            outs, step, loop = one_step_loop(kernel, p, [x])
            assert isinstance(step, extension.CallStep)
            assert_same(loop((x,)), outs)
        assert loop.native_counts == (1, 0)


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)


def test_float_max_over_trailing_axes(isa):
    for cols in around(16, 32, 64):
        for rows in (1, 15, 17, 33):
            x = with_specials((RNG.standard_normal((rows, cols)) * 10).astype(np.float32), RNG, fraction=0.01)
            x[0] = -np.inf
            x[-1] = -0.0
            for keep in (0, 1):
                check("ReduceMax", [("x", x, False), ("axes", np.array([-1], np.int64), True)], "reduce_max_rows",
                      threads=2, keepdims=keep)
    x = with_specials(RNG.standard_normal((2, 3, 5, 7)).astype(np.float32), RNG, fraction=0.02)
    for axes in ([3], [2, 3], [1, 2, 3], [0, 1, 2, 3]):
        check("ReduceMax", [("x", x, False), ("axes", np.array(axes, np.int64), True)], "reduce_max_rows", keepdims=1)


def test_global_max_pool(isa):
    for pixels in (1, 15, 16, 17, 31, 32, 33, 49, 64, 65):
        x = with_specials(RNG.standard_normal((2, 19, pixels)).astype(np.float32), RNG, fraction=0.03)
        check("GlobalMaxPool", [("x", x, False)], "reduce_max_rows", threads=2)
        check("GlobalMaxPool", [("x", x.reshape(2, 19, 1, pixels), False)], "reduce_max_rows")


def _sum_int_expected(x: np.ndarray):
    """The reference's row sums of x [rows, cols], or None where a row's sum of |x| reaches 2^53 (the native sum
    declines the call: float64 could round there)."""
    if any(sum(abs(int(v)) for v in row) >= EXACT for row in x.astype(object)):
        return None
    return _saturating_sum(x, (1,), False)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_sums_around_chunks_and_tasks(isa, dtype):
    """Row sums around the magnitude chunk (1024) and the vector widths, rows split over tasks of 32768 elements,
    1 and 2 threads, with the type's extremes; int64 rows reaching 2^53 in a later chunk decline."""
    info = np.iinfo(dtype)
    nat = runtime.native_module()
    for cols in (*around(16, 32, 64), *around(1024, 2048), 32768, 32769):
        rows = max(3, 70000 // cols)
        if dtype == np.int32:
            x = RNG.integers(info.min, info.max, (rows, cols), dtype=dtype, endpoint=True)
            x[0] = info.max
            x[1] = info.min
            x[2, ::2], x[2, 1::2] = info.min, info.max
        else:
            x = RNG.integers(-(EXACT // (2 * cols)), EXACT // (2 * cols), (rows, cols), dtype=dtype)
            x[0] = 2 ** 52 // cols  # a sum of |x| just below 2^53
            x[1, -1] = info.min
            x[2, cols // 2] = EXACT - 1 if cols > 1 else 7
        body = x[3:] if dtype == np.int64 else x  # int64: the declining rows alone below
        want = _sum_int_expected(body)
        for threads in (1, 2):
            got = nat.reduce_sum_int(body, threads)
            assert (got is None) == (want is None), (cols, threads)
            if want is not None:
                np.testing.assert_array_equal(got, want, err_msg=f"{cols} {threads}")
        if dtype == np.int64:
            for r in range(3):
                got, want = nat.reduce_sum_int(x[r:r + 1], 2), _sum_int_expected(x[r:r + 1])
                assert (got is None) == (want is None) and (got is None or np.array_equal(got, want)), (cols, r)


def test_int_sums_split_over_two_threads_as_one():
    """Over the parallel threshold (2^20 elements) the bound step's rows run on two threads: the reference's bits."""
    x = RNG.integers(-(2 ** 31), 2 ** 31, (48, 24576), dtype=np.int64).astype(np.int32)
    x[5] = np.iinfo(np.int32).max
    x[47] = np.iinfo(np.int32).min
    _bound_equals_reference("ReduceSum", x, [1], 0)
    _bound_equals_reference("ReduceSum", x.reshape(2, 24, 3, 8192), [2, 3], 1)
    y = x.astype(np.int64) << 5  # rows of |x| up to 2^36: sums of |x| below 2^53
    _bound_equals_reference("ReduceSum", y, [-1], 1)
    y[30, 100] = EXACT  # one magnitude at 2^53: the whole call declines and the reference runs
    _bound_equals_reference("ReduceSum", y, [-1], 1, native_runs=False)


def test_int32_rows_of_2_22_check_their_magnitude():
    """int32 rows shorter than 2^22 cannot reach 2^53 and sum unchecked; from 2^22 on the magnitude is checked."""
    nat = runtime.native_module()
    low = np.full((1, (1 << 22) - 1), np.iinfo(np.int32).min, np.int32)
    np.testing.assert_array_equal(nat.reduce_sum_int(low, 2), [np.iinfo(np.int32).min])
    at = np.full((1, 1 << 22), np.iinfo(np.int32).min, np.int32)  # sum of |x| = 2^53
    assert nat.reduce_sum_int(at, 2) is None
    at[0, 0] = 0
    np.testing.assert_array_equal(nat.reduce_sum_int(at, 1), [np.iinfo(np.int32).min])
