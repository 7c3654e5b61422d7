"""Differential sweep of the native MatMulNBits kernels (kernels/native/matmul_nbits*.cc) against the reference model
(kernels/ops/matmul_nbits.py) over shapes that cross every block, chunk, tile and row-pass boundary, at
accuracy_level 0 and 4, with special values, on every instruction-set level the host runs; a sample against ORT's
CPU EP, the spec (issue 38).

The kernels' blocks: the quantization block (16..256) and the packed row's 64-byte chunk of 128 elements (the fp32
levels' perm layout, kc = K rounded up to 128); fp32 levels: one column per dot product in tasks of 16 columns
(below AVX-512, M < 16), the AVX-512 GEMV (M = 1, block >= 32), the AVX-512 outer products over 16-column groups
in 32-column tasks (M >= 2), the BLAS panels (below AVX-512, M >= 16); level 4: tile groups of 32 columns (two
16-lane nibble halves), passes of 4, 2 or 1 rows (two groups at once below 4 rows), A quantized in 16-element
chunks per block. So: K around 16, 32, 64, 128, 256 (and one more chunk), N around 16 and 32, M = 1..5 (the 4-row
pass and one more), 15..17 (the BLAS threshold).

Tolerances: level 0 dequantizes W as the reference does ((q - zp) * scale rounded once) and sums in another
order: both within K eps sum|a w| of the exact product, so 2 K eps sum|a w| apart. Level 4 sums integer products
exactly per block and scales them (one rounding of sa * sw, one per block's fused add) where the reference rounds
each dequantized element and sums in float32: held to 2 (K + 4) eps sum|qa w| (qa: A as quantized); a bias adds
2 eps |bias| (its add rounds on each side). Special
values (NaN, +-Inf, -0, huge, tiny in A; infinite and NaN weight scales): NaN exactly where the reference has NaN,
infinities equal, the finite rest within the bound; level 4 follows ORT's CompInt8 NaN rules (matmul_nbits), which
the CPU EP comparisons check.

The default run takes a sample of the grid; ``-m slow`` runs all of it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from _single_op import run_ort
from _sweep import around, native_calls, node_model, run_kernel
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.matmul_nbits import quantize_a_blockwise
from npu_ep.quantization import quantize_matmul_nbits
from npu_ep.quantization.matmul_nbits import dequantize_b, unpack_b

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

EPS = np.finfo(np.float32).eps


def _node(a, w, K, N, bs, level, scales=None, bias=None, g_idx=None):
    inputs = [("a", a, False), ("B", w.B, True), ("scales", w.scales if scales is None else scales, True),
              ("zp", w.zero_points, True), ("g_idx", g_idx, True), ("bias", bias, True)]
    return inputs, node_model("MatMulNBits", inputs, domain="com.microsoft", K=K, N=N, bits=4, block_size=bs,
                              accuracy_level=level)


def _bound(a, w, K, bs, level, scales, g_idx=None) -> np.ndarray:
    """The module docstring's bound: 2 (K + 4) eps sum|a w| with A as the level quantizes it (an act-order g_idx:
    each row's scale that of its group, at level 0)."""
    wf = w if scales is None else type(w)(B=w.B, scales=scales, zero_points=w.zero_points, K=K, N=w.N,
                                          block_size=bs)
    with np.errstate(all="ignore"):
        aq = quantize_a_blockwise(a, bs) if level == 4 else a
        if g_idx is None:
            wd = dequantize_b(wf)
        else:  # |code - 8| * |scale of the row's group|
            codes = unpack_b(np.asarray(w.B).reshape(w.N, -1, bs // 2), K).astype(np.float32)
            wd = (np.abs(codes - 8) * np.abs(np.asarray(wf.scales, np.float32).reshape(w.N, -1)[:, g_idx])).T
        return 2 * (K + 4) * EPS * (np.abs(aq).astype(np.float64) @ np.abs(wd).astype(np.float64))


def _check(a, w, K, N, bs, level, *, scales=None, bias=None, threads=1, cpu: bool = False,
           g_idx=None) -> np.ndarray:
    """Native vs reference (and the CPU EP with ``cpu``) for one node; the native matmul_nbits must have run."""
    inputs, m = _node(a, w, K, N, bs, level, scales, bias, g_idx)
    with native_calls() as calls:
        (got,) = run_kernel(m, {"a": a}, "native", threads)
    assert "matmul_nbits" in calls, f"the native matmul_nbits did not run ({calls})"
    (want,) = run_kernel(m, {"a": a}, "reference")
    label = f"MatMulNBits M={a.shape[0]} K={K} N={N} bs={bs} level={level}"
    bound = _bound(a, w, K, bs, 0 if g_idx is not None else level, scales, g_idx)
    if bias is not None:  # each side's last add of the bias rounds once more
        bound = bound + 2 * EPS * np.abs(bias)
    _pattern_and_bound(got, want, bound, label)
    if cpu:
        (ort,) = run_ort(m, inputs)
        finite = np.isfinite(ort)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ort), label + " vs CPU EP")
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ort), label + " vs CPU EP")
        np.testing.assert_allclose(got[finite], ort[finite], rtol=1e-4,
                                   atol=(1e-4 if level == 0 else 2e-3) * np.sqrt(K), err_msg=label + " vs CPU EP")
    return got


def _pattern_and_bound(got, want, bound, label):
    assert got.shape == want.shape and got.dtype == want.dtype, label
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), label)
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), label)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), label)
    finite = np.isfinite(want) & np.isfinite(bound)
    excess = np.abs(got[finite].astype(np.float64) - want[finite]) - bound[finite]
    assert (excess <= 1e-30).all(), f"{label}: {excess.max()} over the bound"


def _weights(K, N, bs, symmetric, rng):
    return quantize_matmul_nbits(rng.standard_normal((K, N)).astype(np.float32), bs, symmetric)


def _sample(cases: list, n: int, seed: int) -> list:
    """A fixed sample of ``n`` cases (the default run); the slow run takes them all."""
    if len(cases) <= n:
        return cases
    idx = np.random.default_rng(seed).choice(len(cases), size=n, replace=False)
    return [cases[i] for i in sorted(idx)]


BLOCKS = [16, 32, 64, 128, 256]


def _ks(bs: int) -> list[int]:
    """K of one element, just below, at and above one block, two blocks and the 128-element chunk, a chunk past."""
    return sorted({k for k in (1, *around(bs, 2 * bs), *around(128), 128 + bs + 1) if k >= 1})


GRID = [(m, k, n, bs, level, sym) for bs in BLOCKS for k in _ks(bs) for n in (1, *around(16, 32))
        for m in (1, 2, 3, 4, 5, 16, 17) for level in (0, 4) for sym in (True, False)]


def _grid_case(m, k, n, bs, level, sym):
    rng = np.random.default_rng(abs(hash((m, k, n, bs, level, sym))) % 2**32)
    w = _weights(k, n, bs, sym, rng)
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    _check(rng.standard_normal((m, k)).astype(np.float32), w, k, n, bs, level, bias=bias)


@pytest.mark.parametrize("case", _sample(GRID, 32, 11))
def test_shapes_around_blocks_chunks_tiles_and_row_passes(isa, case):
    _grid_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("bs", BLOCKS)
def test_shapes_around_blocks_chunks_tiles_and_row_passes_wide(isa, bs):
    for case in GRID:  # one test per block size: collecting thousands of cases cost the default run seconds
        if case[3] == bs:
            _grid_case(*case)


def _specials_in_a(a: np.ndarray, rng) -> np.ndarray:
    """A with NaN, +-Inf, -0, huge and tiny values planted in a few rows (others left plain)."""
    a = a.copy()
    rows = a.shape[0]
    for r, v in zip(range(rows), (np.nan, np.inf, -np.inf, -0.0, 1e30, 1e-40, np.nan)):
        if r % 2 == 0 or rows == 1:
            a[r, rng.integers(0, a.shape[1])] = v
    return a


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("bs", BLOCKS)
@pytest.mark.parametrize("m", [1, 5, 17])
def test_special_values_in_a(isa, level, bs, m):
    rng = np.random.default_rng(bs * 10 + m + level)
    k, n = 2 * bs + 16 + 1, 33
    w = _weights(k, n, bs, False, rng)
    _check(_specials_in_a(rng.standard_normal((m, k)).astype(np.float32), rng), w, k, n, bs, level)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("bs", [16, 64])
def test_non_finite_weight_scales(isa, level, bs):
    """An infinite or NaN block scale: level 0 multiplies it (IEEE), level 4 makes its column NaN (ORT's rule)."""
    rng = np.random.default_rng(bs + level)
    k, n = 3 * bs, 40
    w = _weights(k, n, bs, False, rng)
    scales = w.scales.copy().reshape(n, -1)
    scales[3, 0], scales[20, 1], scales[35, 2] = np.inf, -np.inf, np.nan
    _check(rng.standard_normal((5, k)).astype(np.float32), w, k, n, bs, level, scales=scales.reshape(w.scales.shape))


@pytest.mark.parametrize("m", [1, 2, 4, 5, 17])
@pytest.mark.parametrize("level", [0, 4])
def test_same_bits_at_any_thread_count(isa, m, level):
    rng = np.random.default_rng(m)
    k, n = 300, 97
    w = _weights(k, n, 32, False, rng)
    a = rng.standard_normal((m, k)).astype(np.float32)
    one = _check(a, w, k, n, 32, level)
    assert _check(a, w, k, n, 32, level, threads=3).tobytes() == one.tobytes()


CPU_GRID = [(m, k, n, bs, level) for (m, k, n, bs), level in
            itertools.product([(1, 65, 17, 16), (3, 127, 33, 32), (5, 129, 31, 64), (16, 255, 16, 128),
                               (2, 513, 32, 256), (17, 200, 15, 32)], (0, 4))]


@pytest.mark.parametrize("case", CPU_GRID)
def test_against_the_cpu_ep(isa, case):
    """ORT's CPU EP is the spec: plain values, and at level 4 special values in A and non-finite scales (its
    CompInt8 NaN rules)."""
    m, k, n, bs, level = case
    rng = np.random.default_rng(k)
    w = _weights(k, n, bs, m % 2 == 0, rng)
    a = rng.standard_normal((m, k)).astype(np.float32)
    _check(a, w, k, n, bs, level, cpu=True)
    if level == 4:
        scales = w.scales.copy().reshape(n, -1)
        scales[n // 2, -1] = np.inf
        a = a.copy()
        a[0, min(3, k - 1)] = np.nan
        a[-1, k // 2] = -np.inf
        _check(a, w, k, n, bs, level, scales=scales.reshape(w.scales.shape), cpu=True)


# Act-order g_idx (each group block_size rows in any order): K around one and two blocks (a partial last group),
# N around 16 and 32, M over the row passes; both levels (run at level 0, as ORT's CPU kernel runs them).
ACT_ORDER = [(m, k, n, bs) for bs in (16, 32, 128) for k in around(2 * bs) for n in (15, 33) for m in (1, 2, 5)]


@pytest.mark.parametrize("case", _sample(ACT_ORDER, 8, 12))
@pytest.mark.parametrize("level", [0, 4])
def test_act_order_g_idx(isa, case, level):
    m, k, n, bs = case
    rng = np.random.default_rng(k * n + m)
    w = _weights(k, n, bs, True, rng)
    g_idx = rng.permutation(np.arange(k) // bs).astype(np.int32)
    _check(rng.standard_normal((m, k)).astype(np.float32), w, k, n, bs, level, g_idx=g_idx, cpu=True)
