"""Differential sweep of the native selection kernels (issue 40) against the reference model (kernels/ops/select.py), on
every instruction-set level they dispatch to.

ArgMax/ArgMin (kernels/native/reduce.cc's ``arg_extreme``): x viewed as [outer, n, inner]. Rows (inner 1): float and
int32 rows of 16 or more and int64 rows of 8 or more on AVX-512 in one pass (two sets of 16 or 8 lanes, each keeping its
extreme and index; a NaN in the row hands it to the scan), other rows the extreme by reduce_axis's 32-lane folds (AVX2
and base builds), then the first (last) index holding it; a NaN extreme takes ORT's scan. Columns (inner > 1): the scan
in blocks of 256 columns. So n crosses 16, 32, 48 and 64, inner crosses 256; ties (first index, last with
select_last_index), -0.0 against +0.0, NaN first / later / rank 1, +-inf, the integer types' limits. Exact: the same
index as the reference.

TopK (kernels/native/select.cc's ``topk``): each row (a column gathered into one when inner > 1) selected by a sorted
insertion list up to k 32 (blocks of 16 compared with its last at once: one AVX-512 mask per block, a scalar one below;
only the beaters inserted), a heap (partial_sort) above it, a full sort at k = n; rows in tasks of 32768 / n. So k
crosses 0, 1, 32, n - 1, n, n crosses 16; inner 1 and > 1; many ties (lower index first), NaN (after every number, lower
index first among NaN), -0.0 with +0.0, +-inf, the integer limits. Exact: the same values' bits and indices as the
reference's stable argsort."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4042)
ARG_DTYPES = (np.float32, np.float16, np.int32, np.int64, np.int8, np.uint8)


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)


def _values(shape, dtype, rng=RNG) -> np.ndarray:
    """Values with many ties: small integers for the integer types, a few float levels for the floats."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(-4 if info.min < 0 else 0, 5, shape).astype(dtype)
        x.reshape(-1)[::13] = info.max
        x.reshape(-1)[5::17] = info.min
        return x
    return (rng.integers(-6, 7, shape) / 2).astype(dtype)


def _args(x: np.ndarray, axis: int, threads: int = 1) -> None:
    for op in ("ArgMax", "ArgMin"):
        for last in (0, 1):
            for keepdims in (0, 1):
                check(op, [("x", x, False)], "arg_extreme", threads=threads, axis=axis, keepdims=keepdims,
                      select_last_index=last)


@pytest.mark.parametrize("dtype", ARG_DTYPES)
def test_rows_around_the_lanes(isa, dtype):
    for n in around(32, 64):
        _args(_values((5, n), dtype), -1, threads=2)
    _args(_values((70, 1000), dtype), 1, threads=2)  # 32 rows per task: three tasks


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_one_pass_rows(isa, dtype):
    """The one-pass rows: n around its sets of 16 lanes, the extreme (and its ties) in set 0, set 1 and the tail
    lanes, a NaN first, in either set or in the tail, rows of one value, -0.0 against +0.0."""
    for n in around(16, 32, 48, 64, 384, low=15):
        rows = n + 6
        x = (RNG.integers(-20, 21, (rows, n)) / 4).astype(dtype)
        for r in range(min(rows, n)):  # the extreme at every position, tied with a later one in some rows
            x[r, r] = 9.0
            x[r, (r * 7 + 3) % n] = 9.0 if r % 3 == 0 else x[r, (r * 7 + 3) % n]
            x[r, (r * 5 + 1) % n] = -9.0
        x[-1] = 2.5
        x[-2] = -0.0
        x[-2, 1::5] = 0.0
        x[-3, n - 1] = np.nan
        x[-4, 0] = np.nan
        x[-5, n // 2] = np.nan
        x[-6, :] = -np.inf
        x[-6, n - 1] = np.inf
        _args(x, 1)
        _args(x[: min(rows, n)].reshape(-1), 0)
        for r in (-5, -4, -3):  # rank 1: the first NaN without select_last_index
            _args(np.ascontiguousarray(x[r]), 0)
    _args((RNG.standard_normal((128, 384)) * 100).astype(dtype), -1, threads=2)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_one_pass_integer_rows(isa, dtype):
    """The one-pass rows of int32 (two sets of 16 lanes) and int64 (two sets of 8): n around the lanes and sets, the
    extreme (and its ties) at every position, the type's limits, rows of one value."""
    info = np.iinfo(dtype)
    for n in around(8, 16, 24, 32, 48, 64, 384, low=7):
        rows = n + 4
        x = RNG.integers(-20, 21, (rows, n)).astype(dtype)
        for r in range(min(rows, n)):
            x[r, r] = info.max if r % 2 else 50
            x[r, (r * 7 + 3) % n] = x[r, r] if r % 3 == 0 else x[r, (r * 7 + 3) % n]
            x[r, (r * 5 + 1) % n] = info.min if r % 2 else -50
        x[-1] = 7
        x[-2] = info.min
        x[-3] = info.max
        x[-4, ::2] = info.min
        _args(x, 1)
    _args(RNG.integers(info.min, info.max, (128, 384), dtype=dtype, endpoint=True), -1, threads=2)


@pytest.mark.parametrize("dtype", ARG_DTYPES)
def test_columns_around_the_block(isa, dtype):
    for inner in around(256):
        for n in (1, 2, 17):
            _args(_values((2, n, inner), dtype), 1, threads=2)
    x = _values((2, 3, 4, 5), dtype)
    for axis in range(-4, 4):
        _args(x, axis)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_special_values(isa, dtype):
    """NaN as a row's first element (wins), later (never picked, but rank 1 without select_last_index: the first
    NaN), +-inf, -0.0 with +0.0, the largest finite."""
    big = float(np.finfo(dtype).max)
    for shape, axis in (((9, 37), 1), ((9, 37), 0), ((3, 19, 40), 1), ((70,), 0), ((1,), 0)):
        x = with_specials(_values(shape, dtype), RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0, big, -big),
                          fraction=0.03)
        lead = np.moveaxis(x, axis, -1).copy()
        rows = lead.reshape(-1, lead.shape[-1])
        rows[0, 0] = np.nan
        rows[-1] = -0.0
        rows[-1, ::3] = 0.0
        _args(np.ascontiguousarray(np.moveaxis(lead, -1, axis)), axis)
    _args(np.array([1, np.nan, 3, np.nan], dtype), 0)  # rank 1: the first NaN without select_last_index


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", ARG_DTYPES)
@pytest.mark.parametrize("axis, last", [(-1, 0), (1, 1), (0, 0)])
def test_session_as_the_cpu_ep(op, dtype, axis, last):
    """NpuEP sessions (graph assignment: NpuEP ran the node) give the CPU EP's indices exactly."""
    x = _values((3, 40, 33), dtype, np.random.default_rng(43))
    check_on_ep(op, [("x", x, False)], [("y", np.int64)], {"axis": axis, "keepdims": 1, "select_last_index": last},
                opset=13, targets=("npu-ref", "npu-edge"))


def _topk(x: np.ndarray, axis: int, k: int, threads: int = 1) -> None:
    for largest in (0, 1):
        check("TopK", [("x", x, False), ("k", np.array([k], np.int64), True)], "topk", threads=threads, n_out=2,
              axis=axis, largest=largest, sorted=1)


@pytest.mark.parametrize("dtype", ARG_DTYPES)
def test_topk_around_k_and_the_axis(isa, dtype):
    for n in (1, 2, 9, 16, 17, 64):
        x = _values((3, n, 5), dtype)
        for k in sorted({0, 1, n - 1, n} | ({32, 33} if n > 33 else set())):
            _topk(x, 1, k)
            _topk(np.ascontiguousarray(np.swapaxes(x, 1, 2)), -1, k)
    _topk(_values((70, 1000), dtype), 1, 8, threads=2)  # 32 rows per task: three tasks on two threads
    wide = _values((4, 1000), dtype)
    wide[1] = np.sort(wide[1])  # ascending: every element beats the list's last (largest), no block passed over
    wide[2] = wide[2].max()  # all ties
    _topk(wide, 1, 32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_topk_special_values(isa, dtype):
    """NaN after every number either way (several NaN: lower index first), +-inf, -0.0 tied with +0.0."""
    big = float(np.finfo(dtype).max)
    for shape, axis in (((9, 37), 1), ((9, 37), 0), ((3, 19, 40), 1)):
        x = with_specials(_values(shape, dtype), RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0, big, -big),
                          fraction=0.05)
        for k in (1, 5, x.shape[axis]):
            _topk(x, axis, k)


@pytest.mark.parametrize("dtype", ARG_DTYPES)
def test_topk_block_masks(isa, dtype):
    """Rows around the 16-element blocks with few ties (random values over the dtype's range), k up to 32; rows
    whose list starts with NaN (the list's last not a number: no mask) then numbers; rising and falling rows (every
    element or none beats the list's last); the integer limits in every place of a block."""
    rng = np.random.default_rng(4043)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, (6, 100), endpoint=True).astype(dtype)
    else:
        x = rng.standard_normal((6, 100)).astype(dtype)
    x[1] = np.sort(x[1])
    x[2] = np.sort(x[2])[::-1]
    if np.dtype(dtype).kind == "f":
        x[3, :10] = np.nan
        x[4, 20:40:3] = np.nan
    else:
        x[3, ::5] = np.iinfo(dtype).max
        x[4, 3::7] = np.iinfo(dtype).min
    for n in (15, 16, 17, 31, 32, 33, 47, 48, 100):
        for k in sorted({1, 2, 8, min(n, 31), min(n, 32)}):
            _topk(np.ascontiguousarray(x[:, :n]), 1, k)


@pytest.mark.parametrize("dtype", ARG_DTYPES)
@pytest.mark.parametrize("axis, k, largest, const_k", [(-1, 8, 1, True), (1, 3, 0, True), (0, 3, 1, False)])
def test_topk_session_as_the_cpu_ep(dtype, axis, k, largest, const_k):
    """NpuEP sessions (graph assignment: NpuEP ran the node) give the CPU EP's values and indices exactly (ties:
    the lower index first, as ORT); K constant or a runtime input (the bound step holds it; npu-edge takes only a
    constant K)."""
    x = _values((3, 40, 33), dtype, np.random.default_rng(44))
    check_on_ep("TopK", [("x", x, False), ("k", np.array([k], np.int64), const_k)], [("v", dtype), ("i", np.int64)],
                {"axis": axis, "largest": largest, "sorted": 1}, opset=11,
                targets=("npu-ref", "npu-edge") if const_k else ("npu-ref",))


CUMSUM_DTYPES = (np.float32, np.float16, np.int32, np.int64)


def _cumsum(x: np.ndarray, axis: int, threads: int = 1) -> None:
    for exclusive in (0, 1):
        for reverse in (0, 1):
            check("CumSum", [("x", x, False), ("axis", np.array(axis, np.int64), True)], "cumsum", threads=threads,
                  exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("dtype", CUMSUM_DTYPES)
def test_cumsum_rows_and_columns(dtype):
    """Rows (inner 1, tasks of 32768 / n rows) and column blocks of 256, every axis; exact (the same sequential sums;
    float16 rounded once per output)."""
    for n in (1, 2, 33):
        _cumsum(_values((3, n), dtype), -1)
    for inner in around(256):
        _cumsum(_values((2, 5, inner), dtype), 1, threads=2)
    x = _values((2, 3, 4, 5), dtype)
    for axis in range(-4, 4):
        _cumsum(x, axis)
    _cumsum(_values((70, 1000), dtype), 1, threads=2)
    if np.dtype(dtype).kind == "f":  # sums that round at every step
        _cumsum((RNG.standard_normal((4, 300, 3)) * 3).astype(dtype), 1)
        _cumsum((RNG.standard_normal((4, 300)) * 3).astype(dtype), 1)


def test_cumsum_wraps_and_special_values():
    """Integer sums wrap (as numpy and ORT); float NaN, +-inf (NaN from where they meet), -0.0 first, huge values
    that overflow to inf part way."""
    for dtype in (np.int32, np.int64):
        info = np.iinfo(dtype)
        x = np.array([[info.max, 1, 1, info.min, -1, -1]], dtype)
        _cumsum(x, -1)
    for dtype in (np.float32, np.float16):
        big = float(np.finfo(dtype).max)
        x = with_specials(_values((9, 37), dtype), RNG, values=(np.nan, np.inf, -np.inf, -0.0, big, -big),
                          fraction=0.03)
        x[0, 0] = -0.0
        _cumsum(x, 1)
        _cumsum(x, 0)


@pytest.mark.parametrize("dtype", CUMSUM_DTYPES)
@pytest.mark.parametrize("axis, exclusive, reverse", [(-1, 0, 0), (1, 1, 0), (0, 1, 1), (2, 0, 1)])
def test_cumsum_session_as_the_cpu_ep(dtype, axis, exclusive, reverse):
    """NpuEP sessions (graph assignment: NpuEP ran the node) equal the CPU EP: integers exactly, floats within its
    tolerance (``check_on_ep``'s per-dtype default; ORT's sums run in the same order)."""
    x = _values((3, 40, 33), dtype, np.random.default_rng(45))
    check_on_ep("CumSum", [("x", x, False), ("axis", np.array(axis, np.int64), True)], [("y", dtype)],
                {"exclusive": exclusive, "reverse": reverse}, opset=14, targets=("npu-ref", "npu-edge"))
