"""Differential sweep of the native reductions (Sum, Mean, Max, Min, Prod, SumSquare, L1, L2) over one run of axes
(kernels/native/reduce.cc's ``reduce_axis``, issue 40) against the reference model (kernels/ops/reduce.py: numpy's
ufunc reductions, float16 accumulated in float32), on every instruction-set level it dispatches to (the AVX-512 and
AVX2 builds of the same loops, the base one).

x is viewed as [outer, n, inner]. Rows (inner 1): 32 running lanes from the first 32 elements, a tail into the
first lanes, folded in halves; tasks of 32768 / n rows. Columns (inner > 1): blocks of 256 columns, each accumulated
down the n rows from its first. So n crosses 32 and 64, inner crosses 256, outer crosses a task (two threads).

Maxima, minima (float and int32/int64) and column sums (numpy's own order for a non-trailing axis) are exact. Row
sums take another order than numpy's pairwise one: each is within (n / 32 + 5) 2^-24 of the sum of |x| and numpy's
within (log2(n) + 16) 2^-24 (its blocks of 128 in 8 lanes), so atol (n / 16 + 24) 2^-24 sum|x| per output; Mean the
same over n plus half an ulp; float16 results one float16 ulp (rtol 2^-10) where the float32 sums straddle a
rounding midpoint. NaN where the reference has NaN (a NaN, or +inf and -inf in one sum; maxima keep a NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _isa import cap_isa, host_isas
from _sweep import around, assert_native_ran, check, native_vs_reference, with_specials
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.reduce import _trailing_split

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4041)
FLOATS = (np.float32, np.float16)


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)


def _inputs(x: np.ndarray, axes) -> list:
    return [("x", x, False), ("axes", np.array(axes, np.int64), True)]


def _exact(op: str, x: np.ndarray, axes, keepdims: int = 1, threads: int = 1) -> None:
    """An exact case; a float32 ReduceMax over trailing axes runs ``reduce_max_rows`` (test_sweep_reduce.py)."""
    norm = tuple(sorted(a % x.ndim for a in axes))
    rows = op == "ReduceMax" and x.dtype == np.float32 and _trailing_split(x.shape, norm) is not None
    check(op, _inputs(x, axes), "reduce_max_rows" if rows else "reduce_axis", threads=threads, keepdims=keepdims)


def _sum_bound(x: np.ndarray, axes) -> np.ndarray:
    """The per-output tolerance of a float sum over ``axes`` (module docstring), float64."""
    n = x.size // max(np.sum(x, axis=tuple(axes), dtype=np.float64).size, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        mag = np.add.reduce(np.abs(x.astype(np.float64)), axis=tuple(axes), keepdims=True)
    return np.nan_to_num((n / 16 + 24) * 2.0 ** -24 * mag, nan=0.0, posinf=0.0)


SUMS = ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd")


def _terms(op: str, x: np.ndarray) -> np.ndarray:
    """The terms a sum adds, in float64: squares for SumSquare and L2, magnitudes for L1 (Prod: log-magnitudes'
    scale is not additive; its bound is relative, below)."""
    x = x.astype(np.float64)
    return x * x if op in ("ReduceSumSquare", "ReduceL2") else x


def _close(op: str, x: np.ndarray, axes, threads: int = 1) -> None:
    """A float reduction within the module docstring's bound: sums (SumSquare, L1 of their terms) within
    (n / 16 + 24) 2^-24 of the sum of the terms' magnitudes; Mean over n; L2 half of the sum's relative error
    plus an ulp; Prod (another order of n roundings) within (2n + 2) 2^-24 relative."""
    got, want, calls = native_vs_reference(op, _inputs(x, axes), threads=threads, keepdims=1)
    what = f"{op} {x.dtype} {x.shape} {axes}"
    assert_native_ran(calls, "reduce_axis", what)
    g, w = got[0].astype(np.float64), want[0].astype(np.float64)
    assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype, what
    assert np.array_equal(np.isnan(g), np.isnan(w)), what
    n = x.size // max(w.size, 1)
    bound = _sum_bound(_terms(op, x), axes) / (n if op == "ReduceMean" else 1)
    rel = 2.0 ** -10 if x.dtype == np.float16 else 2.0 ** -24
    if op == "ReduceL2":  # sqrt(s (1 + e)) = sqrt(s) (1 + e / 2): the absolute bound over 2 sqrt(s), and one ulp
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.nan_to_num(bound / (2 * np.abs(w)), nan=0.0, posinf=0.0)
        rel += 2.0 ** -23
    if op == "ReduceProd":
        bound, rel = 0.0, rel + (2 * n + 2) * 2.0 ** -24
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity
        ok = np.isnan(w) | (g == w) | (np.abs(g - w) <= bound + rel * np.abs(w) + 2.0 ** -24)
    assert ok.all(), f"{what}: worst {np.max(np.abs(g - w)[~ok])}"


@pytest.mark.parametrize("dtype", FLOATS)
def test_rows_around_the_lanes_and_tasks(isa, dtype):
    for n in around(32, 64, 128):
        for rows in (1, 3, 17):
            x = (RNG.standard_normal((rows, n)) * 10).astype(dtype)
            for op in ("ReduceSum", "ReduceMean"):
                _close(op, x, [-1], threads=2)
            _exact("ReduceMax", x, [-1])
    x = (RNG.standard_normal((70, 1000)) * 3).astype(np.float32)  # 32 rows per task: three tasks on two threads
    _close("ReduceSum", x, [1], threads=2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_columns_around_the_block(isa, dtype):
    for inner in around(16, 256):
        for n in (1, 2, 17):
            x = (RNG.standard_normal((3, n, inner)) * 10).astype(dtype)
            for op in ("ReduceSum", "ReduceMean"):
                _close(op, x, [1], threads=2)
            _exact("ReduceMax", x, [1], threads=2)


def test_column_sums_of_float32_are_numpys_bits(isa):
    """A non-trailing axis: accumulated down the rows in order from the first, as numpy's reduction."""
    x = (RNG.standard_normal((4, 37, 300)) * 100).astype(np.float32)
    for axes in ([1], [0], [0, 1]):
        _exact("ReduceSum", x, axes)
        _exact("ReduceMean", x, axes, keepdims=0)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_maxima_exact(isa, dtype):
    info = np.iinfo(dtype)
    for shape, axes in (((5, 33), [1]), ((3, 17, 259), [1]), ((2, 3, 4, 5), [1, 2]), ((2, 3, 4, 5), [0])):
        x = RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        x.reshape(-1)[::7] = info.min
        x.reshape(-1)[3::11] = info.max
        _exact("ReduceMax", x, axes, keepdims=0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_min_prod_squares_and_norms(isa, dtype):
    """ReduceMin (exact), ReduceProd, ReduceSumSquare, ReduceL1, ReduceL2 over rows around the lanes, columns
    around the block and a leading run; Prod of values near 1 (no overflow), norms of signed values."""
    for shape, axes in (((5, 31), [1]), ((5, 65), [1]), ((3, 7, 257), [1]), ((6, 4, 3), [0, 1]), ((2, 3, 4), [0])):
        x = (RNG.standard_normal(shape) * 3).astype(dtype)
        _exact("ReduceMin", x, axes, threads=2)
        for op in ("ReduceSumSquare", "ReduceL1", "ReduceL2"):
            _close(op, x, axes, threads=2)
        _close("ReduceProd", (1 + RNG.standard_normal(shape) / 8).astype(dtype), axes)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_minima_exact(isa, dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (3, 17, 259), dtype=dtype, endpoint=True)
    x.reshape(-1)[::7] = info.min
    for axes in ([1], [2], [0, 1]):
        _exact("ReduceMin", x, axes, keepdims=0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_any_run_of_axes(isa, dtype):
    """Leading, middle, trailing runs, runs through axes of one element, everything; keepdims both ways."""
    x = (RNG.standard_normal((2, 3, 1, 5, 7)) * 4).astype(dtype)
    for axes in ([0], [1], [1, 2], [1, 2, 3], [3, 4], [2], [0, 1, 2, 3, 4], [-1], [1, 3]):
        for op in ("ReduceSum", "ReduceMean"):
            _close(op, x, axes)
        _exact("ReduceMax", x, axes, keepdims=0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_special_values(isa, dtype):
    """NaN and +-inf (a NaN sum where they meet), -0.0, subnormals in sums; maxima also with the largest finite."""
    big = float(np.finfo(dtype).max)
    for shape, axes in (((9, 37), [1]), ((3, 19, 40), [1]), ((19, 300), [0])):
        x = (RNG.standard_normal(shape) * 10).astype(dtype)
        sums = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 1e-45 if dtype == np.float32 else 6e-8),
                             fraction=0.01)
        for op in ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2"):
            _close(op, sums, axes)
        maxima = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, big, -big), fraction=0.01)
        maxima.reshape(-1)[: shape[-1]] = -np.inf
        _exact("ReduceMax", maxima, axes)
        _exact("ReduceMin", maxima, axes)


@pytest.mark.parametrize("dtype", FLOATS)
def test_long_rows_over_any_axes(isa, dtype):
    """Rows of 32 and more (the AVX-512 lanes) from trailing runs, everything (empty axes) and a run through an axis
    of one element, keepdims both ways; noop_with_empty_axes keeps x; a leading axis stays columns."""
    x = with_specials((RNG.standard_normal((3, 5, 1, 40)) * 4).astype(dtype), RNG,
                      values=(np.inf, -np.inf, -0.0), fraction=0.01)
    for axes in ([3], [2, 3], [1, 2, 3], [0, 1, 2, 3], [], [0]):
        for keep in (0, 1):
            for op in ("ReduceMax", "ReduceMin"):
                check(op, _inputs(x, axes), "reduce_axis" if op == "ReduceMin" or axes == [0] else
                      ("reduce_max_rows" if dtype == np.float32 else "reduce_axis"), threads=2, keepdims=keep)
            for op in ("ReduceSum", "ReduceMean", "ReduceL2"):
                got, want, calls = native_vs_reference(op, _inputs(x, axes), threads=2, keepdims=keep)
                assert_native_ran(calls, "reduce_axis", f"{op} {axes}")
                assert got[0].shape == want[0].shape
                with np.errstate(invalid="ignore"):  # the bound's float64 sum of +inf and -inf
                    _close(op, x, axes, threads=2)
    got, want, calls = native_vs_reference("ReduceSum", _inputs(x, []), noop_with_empty_axes=1)
    assert "reduce_axis" not in calls and got[0].tobytes() == x.tobytes() == want[0].tobytes()


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same bytes, NaN where the other has NaN (a NaN's payload follows the operand order the compiler picks)."""
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(nan, np.isnan(got.astype(np.float32))), what
    assert got[~nan].tobytes() == want[~nan].tobytes(), what


@pytest.mark.parametrize("dtype", FLOATS)
def test_avx512_rows_are_the_base_loops_bits(dtype):
    """Rows of 32 or more on AVX-512 (two vectors of 16 lanes, float16 widened in the load, masked tails, folds in
    halves) give the scalar build's bits for every op, with specials anywhere (maxima and minima with a NaN take
    the scalar lanes), -0.0 against +0.0, on one and two threads."""
    nat = runtime.native_module()
    if "avx512" not in host_isas():
        pytest.skip("no AVX-512 on this host")
    big = float(np.finfo(dtype).max)
    for n in (*around(32, 48, 64, 96), 384, 1000):
        for rows in (1, 3, 17):
            x = (RNG.standard_normal((rows, n)) * 4).astype(dtype)
            plain = x.copy()
            plain[0, ::3] = 0.0
            plain[0, 1::3] = -0.0
            special = with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, big, -big), fraction=0.01)
            tail = x.copy()
            tail[:, -1] = np.nan  # a NaN in the masked tail (or the last full block) only
            prod = (1 + RNG.standard_normal((rows, n)) / 16).astype(dtype)
            for op in range(8):
                for case in (plain, special, tail, prod if op == 4 else x):
                    for threads in (1, 2):
                        want = None
                        for level in ("scalar", "avx2", "avx512"):
                            gen = cap_isa(level)
                            next(gen)
                            try:
                                with np.errstate(all="ignore"):
                                    got = nat.reduce_axis(case, op, rows, n, 1, threads)
                            finally:
                                gen.close()
                            if want is None:
                                want = got
                            else:
                                _same_bits(got, want, f"op {op} {dtype.__name__} [{rows}, {n}] {level}")
    big_rows = (RNG.standard_normal((40, 30000)) * 3).astype(dtype)  # over 2^20 elements: two threads take tasks
    for op in (0, 2, 3):
        one, two = nat.reduce_axis(big_rows, op, 40, 30000, 1, 1), nat.reduce_axis(big_rows, op, 40, 30000, 1, 2)
        assert one.tobytes() == two.tobytes(), op


def test_non_run_axes_stay_on_the_reference():
    """Axes with a kept axis of more than one element between them: no [outer, n, inner] walk, the reference runs."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    got, want, calls = native_vs_reference("ReduceSum", _inputs(x, [0, 2]), keepdims=1)
    assert "reduce_axis" not in calls
    np.testing.assert_array_equal(got[0], want[0])


SESSION_CASES = [(op, dtype) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare",
                                         "ReduceL1", "ReduceL2", "ReduceProd") for dtype in (*FLOATS, np.int64)
                 if dtype != np.int64 or op in ("ReduceMax", "ReduceMin")]  # integer sums: reduce_sum_int


@pytest.mark.parametrize("op, dtype", SESSION_CASES)
@pytest.mark.parametrize("axes, const_axes", [([-1], True), ([1], True), ([2, 3], True), ([1, 2], False)])
def test_session_as_the_cpu_ep(op, dtype, axes, const_axes):
    """NpuEP sessions (graph assignment: NpuEP ran the node) equal ORT's CPU EP within its float tolerance (float16:
    ``check_on_ep``'s float16 default), exact for integers; constant axes, or a runtime axes input (the bound step
    holds it) at opset 18."""
    x = (RNG.standard_normal((2, 6, 9, 20)) * 5).astype(dtype)
    if op == "ReduceProd":  # values near 1: products of up to 120 of them stay finite
        x = (1 + RNG.standard_normal(x.shape) / 16).astype(dtype)
    inputs = [("x", x, False), ("axes", np.array(axes, np.int64), const_axes)]
    edge = op in ("ReduceSum", "ReduceMean", "ReduceMax")  # npu-edge lists only these
    check_on_ep(op, inputs, [("y", dtype)], {"keepdims": 1}, opset=18,
                targets=("npu-ref", "npu-edge") if edge else ("npu-ref",))


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2"])
@pytest.mark.parametrize("axes", [[1], [0], []])
def test_new_reductions_over_empty_axes_as_the_cpu_ep(op, axes):
    """An empty reduced axis gives the identity as ORT (Min +inf, Prod 1, the sums 0), an empty kept axis an empty
    result, no axes everything (the reference: the reduction has no native call for an empty x)."""
    x = np.zeros((2, 0, 3), np.float32)
    check_on_ep(op, [("x", x, False), ("axes", np.array(axes, np.int64), True)], [("y", np.float32)],
                {"keepdims": 1}, opset=18)
