"""The native MatMulNBits kernel (kernels/native/matmul_nbits.cc) equals the numpy reference model.

Reference: ``quantize_a_blockwise(A) @ dequantize_b(W)`` for accuracy_level 4 (ORT CompInt8: int8 codes of A per
block), ``A @ dequantize_b(W)`` otherwise, evaluated in float64. Tolerance: 1e-5 of the output's largest magnitude
(the native kernel sums the integer products exactly and differs only in float32 summation order; measured
<= 4e-7). Every instruction-set path this host runs is checked (scalar, AVX2, AVX-512, AVX-512 VNNI).
"""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.ep import _native
from _isa import cap_isa, host_isas
from npu_ep.kernels.ops.matmul_nbits import level_layout, quantize_a_blockwise
from npu_ep.quantization import quantize_matmul_nbits
from npu_ep.quantization.matmul_nbits import dequantize_b, int8_tiles

NK = _native.kernels
RNG = np.random.default_rng(11)



def _weights(K, N, bs, symmetric):
    return quantize_matmul_nbits(RNG.standard_normal((K, N)).astype(np.float32), bs, symmetric)


def _reference(a, w, level):
    aq = quantize_a_blockwise(a, w.block_size) if level == 4 else a
    return aq.astype(np.float64) @ dequantize_b(w).astype(np.float64)


def _native(a, w, level, threads=1, bias=None):
    return NK.matmul_nbits(a, *level_layout(w, level), bias, w.K, w.N, w.block_size, level, threads)


def _close(y, ref):
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("m,K,N", [(1, 1000, 47), (3, 200, 33), (17, 130, 5)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("level", [0, 4])
def test_matches_reference_odd_sizes(isa, bs, m, K, N, symmetric, level):
    w = _weights(K, N, bs, symmetric)
    a = RNG.standard_normal((m, K)).astype(np.float32)
    y = _native(a, w, level)
    assert y.shape == (m, N) and y.dtype == np.float32
    _close(y, _reference(a, w, level))


@pytest.mark.parametrize("level", [0, 4])
def test_realistic_width(level):
    K, N = 2048, 5632
    w = _weights(K, N, 32, symmetric=level == 0)
    a = RNG.standard_normal((3, K)).astype(np.float32)
    _close(_native(a, w, level, threads=2), _reference(a, w, level))


def test_bias_and_edge_rows():
    K, N = 96, 20
    w = _weights(K, N, 32, symmetric=False)
    a = RNG.standard_normal((4, K)).astype(np.float32)
    a[1] = 0.0  # all-zero blocks: scale 0, codes 0
    a[2, :32] = 1e-30  # tiny but nonzero block
    a[3, 5] = 1e4  # one dominating element
    bias = RNG.standard_normal(N).astype(np.float32)
    for level in (0, 4):
        y = _native(a, w, level, bias=bias)
        _close(y, _reference(a, w, level) + bias)
        np.testing.assert_array_equal(y[1], bias)


@pytest.mark.parametrize("level", [0, 4])
def test_same_bits_at_any_thread_count(level):
    K, N = 520, 301  # many column tasks, a tail chunk
    w = _weights(K, N, 16, symmetric=False)
    a = RNG.standard_normal((17, K)).astype(np.float32)
    y1 = _native(a, w, level, threads=1)
    for t in (2, 3):
        np.testing.assert_array_equal(_native(a, w, level, threads=t), y1)


def test_bad_arguments_raise_clear_errors():
    w = _weights(64, 8, 32, True)
    a = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="scales has 2 elements, expected 16"):
        NK.matmul_nbits(a, w.B, w.scales[:1], None, None, 64, 8, 32, 0, 1)
    with pytest.raises(ValueError, match="block_size 48"):
        NK.matmul_nbits(a, w.B, w.scales, None, None, 64, 8, 48, 0, 1)
    with pytest.raises(ValueError, match=r"A must be \[M, K=64\]"):
        NK.matmul_nbits(np.zeros((1, 63), np.float32), w.B, w.scales, None, None, 64, 8, 32, 0, 1)


@pytest.mark.parametrize("bs", [16, 64, 256])
@pytest.mark.parametrize("level", [0, 4])
def test_prefill_rows_equal_decode_bits(isa, bs, level):
    """A row computed inside a prefill tile has the bits of the same row computed alone (decode), in passes of 4,
    2 and 1 rows (level 4: 6 = 4 + 2, 10 = 4 + 4 + 2). Except the fp32 levels on AVX-512, which sum as MLAS does
    (ORT's bits, test_native_nbits_session.py): there a lone row takes the GEMV, whose order is its own as MLAS's
    M = 1 kernel's is, and a row has the same bits in any call of two rows or more."""
    K, N = 700, 37
    w = _weights(K, N, bs, symmetric=False)
    outer = level == 0 and isa.startswith(("avx512", "amx"))
    for m in (6, 10):
        a = RNG.standard_normal((m, K)).astype(np.float32)
        y = _native(a, w, level)
        for r in range(m):
            alone = np.repeat(a[r:r + 1], 2, axis=0) if outer else a[r:r + 1]
            np.testing.assert_array_equal(y[r], _native(alone, w, level)[0])


@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("m", [1, 9])
def test_level_4_paths_have_the_scalar_paths_bits(bs, symmetric, m):
    """accuracy_level 4 has one definition on the scalar, AVX2 and both AVX-512 paths (each block summed exactly in
    int32, the blocks accumulated in order with one FMA each), so their bits agree: at M = 1 (decode) and M = 9
    (passes of 4, 4 and 1 rows), with a short last group of columns (45 = 32 + 13)."""
    K, N = 1000, 45
    w = _weights(K, N, bs, symmetric)
    a = RNG.standard_normal((m, K)).astype(np.float32)
    a[0, :bs] *= 100.0  # a block far larger than the rest
    runs = {}
    for name in host_isas():
        capped = cap_isa(name)
        next(capped)
        try:
            runs[name] = _native(a, w, 4, threads=2)
        finally:
            capped.close()
    assert set(runs) >= {"scalar"}
    for name, y in runs.items():
        np.testing.assert_array_equal(y, runs["scalar"], err_msg=name)


def test_nan_and_inf_rows_propagate_like_the_reference(isa):
    """A NaN in a row of A makes that row NaN at level 0. At level 4 the row follows ORT's CompInt8 quantization
    (matmul_nbits.quantize_a_codes): a NaN at element 7 of a 32-block is dropped from the block's maximum (its lane
    reads element 23 after it) and quantizes to code 0, so the row is finite (as on the CPU EP,
    test_sweep_matmul_nbits.py checks it there); an Inf makes its block's scale Inf and the row NaN. Native as the
    numpy reference; other rows untouched."""
    K, N = 200, 24
    w = _weights(K, N, 32, symmetric=False)
    a = RNG.standard_normal((3, K)).astype(np.float32)
    a[0, 7] = np.nan
    a[2, 150] = np.inf
    for level in (0, 4):
        y = _native(a, w, level)
        with np.errstate(invalid="ignore"):  # the reference's Inf * 0 and NaN products
            ref = _reference(a, w, level)
        if level == 0:
            assert np.isnan(y[0]).all() and np.isnan(ref[0]).all()
        else:
            assert np.isfinite(y[0]).all()
            _close(y[0], ref[0])
        _close(y[1], ref[1])
        if level == 4:
            assert np.isnan(y[2]).all() and np.isnan(ref[2]).all()


@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("level", [0, 4])
def test_decode_gemv_at_width_has_prefill_bits(isa, bs, symmetric, level):
    """The decode (M = 1, one pass over the packed weights) gives a row the bits the prefill gives it, at a 1B
    decoder's width, with a partial last chunk (K = 2080) and on 1 or 2 threads. The fp32 levels on AVX-512 are the
    exception: their prefill has ORT's bits (test_native_nbits_session.py) and their decode its own order, as
    MLAS's M = 1 kernel has, so there the two agree to float rounding."""
    K, N = 2080, 130
    w = _weights(K, N, bs, symmetric)
    a = RNG.standard_normal((9, K)).astype(np.float32)
    bias = RNG.standard_normal(N).astype(np.float32)
    y = _native(a, w, level, bias=bias)
    _close(y, _reference(a, w, level) + bias)
    same_bits = not (level == 0 and isa.startswith(("avx512", "amx")))
    for r in (0, 5, 8):
        for t in (1, 2):
            row = _native(a[r:r + 1], w, level, threads=t, bias=bias)[0]
            if same_bits:
                np.testing.assert_array_equal(row, y[r])
            else:
                _close(row, y[r])


@pytest.mark.parametrize("bs", [16, 32, 128])
# rows and columns that leave partial blocks in the AVX-512 outer-product kernel's 8-row x 32-column tiles:
# (19, 300, 23) 3 rows and one short group, (100, 130, 37) 4 rows and a group of 5 columns
@pytest.mark.parametrize("m,K,N", [(16, 130, 5), (19, 300, 23), (31, 520, 18), (33, 1000, 47), (64, 256, 300),
                                   (100, 130, 37), (129, 2048, 40)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_fp32_levels_on_the_blas_match_the_reference_at_any_thread_count(isa, bs, m, K, N, symmetric):
    """From M >= 16 the fp32 levels dequantize column panels and multiply them on numpy's own BLAS (sgemm); on
    AVX-512 from M >= 2 our own outer-product kernel multiplies k-major dequantized columns."""
    from npu_ep.kernels import host_blas

    sgemm = host_blas.sgemm_address()
    if sgemm is None:
        pytest.skip("numpy's BLAS has no cblas_sgemm64 symbol")
    w = _weights(K, N, bs, symmetric)
    a = RNG.standard_normal((m, K)).astype(np.float32)
    bias = RNG.standard_normal(N).astype(np.float32)
    runs = [NK.matmul_nbits(a, w.B, w.scales, w.zero_points, bias, K, N, bs, 0, threads, sgemm=sgemm)
            for threads in (1, 2, 3)]
    _close(runs[0], _reference(a, w, 0) + bias)
    for y in runs[1:]:
        np.testing.assert_array_equal(y, runs[0])  # columns split by shape only
    _close(runs[0], _native(a, w, 0, bias=bias))  # the kernel's own loops agree with the BLAS path


def test_scratch_reused_across_calls_never_leaks_into_a_result():
    """A and the dequantized panels live in per-thread scratch that is never cleared: a product after one of
    another K (and with NaN in A) still equals a fresh one, the pads beyond K being written zero on every call."""
    w = _weights(130, 24, 32, False)
    a = RNG.standard_normal((20, 130)).astype(np.float32)
    fresh = _native(a, w, 0, threads=2)
    wide = _weights(1000, 24, 32, False)
    _native(np.full((40, 1000), np.nan, np.float32), wide, 0, threads=2)
    np.testing.assert_array_equal(_native(a, w, 0, threads=2), fresh)
    _close(fresh, _reference(a, w, 0))


@pytest.mark.parametrize("m", [1, 20])
def test_bound_call_keeps_its_weights_and_equals_the_per_call_binding(m):
    """BoundNBits (a program's bound step) converts the weights once and holds them: built from arrays nothing
    else keeps, it still gives matmul_nbits' bits."""
    import gc

    w = _weights(200, 33, 32, False)
    a = RNG.standard_normal((m, 200)).astype(np.float32)
    bias = RNG.standard_normal(33).astype(np.float32)
    want = NK.matmul_nbits(a, w.B, w.scales, w.zero_points, bias, 200, 33, 32, 0, 2)
    bound = NK.BoundNBits(w.B.copy(), w.scales.copy(), w.zero_points.copy(), bias.copy(), 200, 33, 32, 0, 2, 0, None)
    gc.collect()
    np.testing.assert_array_equal(bound(a), want)
    with pytest.raises(ValueError, match=r"x must be \[..., K=200\]"):
        bound(a[:, :100])
    # x of any rank [..., K]: y [..., N]; `into` (ORT's buffer) is written and returned when it fits, else ignored
    np.testing.assert_array_equal(bound(a.reshape(1, m, 200)), want.reshape(1, m, 33))
    into = np.full((1, m, 33), np.nan, np.float32)
    assert bound(a.reshape(1, m, 200), None, into) is into
    np.testing.assert_array_equal(into, want.reshape(1, m, 33))
    for wrong in (np.zeros((m, 34), np.float32), np.zeros((m, 33), np.float64), np.zeros((m, 66), np.float32)[:, ::2]):
        got = bound(a, None, wrong)
        assert got is not wrong and not wrong.any()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("K,N,bs", [(64, 1, 16), (1000, 47, 32), (130, 64, 128), (2048, 96, 256),
                                    (48, 33, 16), (16, 5, 16)])  # rows of 24 and 8 bytes: past the 16-byte runs
def test_native_tiling_equals_the_layouts_definition(K, N, bs):
    """The native ``tile_int4`` (what sessions use) builds level 4's tiles (``quantization.matmul_nbits.int8_tiles``,
    numpy) byte for byte."""
    w = _weights(K, N, bs, symmetric=False)
    for got, want in zip(level_layout(w, 4), int8_tiles(w)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="B has 10 elements, expected 12"):
        NK.tile_int4(np.zeros(10, np.uint8), 3, 4, np.zeros((1, 2, 64), np.uint8))
    with pytest.raises(ValueError, match="out has 64 elements, expected 128"):
        NK.tile_int4(np.zeros(12, np.uint8), 3, 4, np.zeros((1, 1, 64), np.uint8))
    with pytest.raises(TypeError):  # never a converted copy that the tiles would silently go to
        NK.tile_int4(np.zeros(12, np.uint8), 3, 4, np.zeros((1, 2, 64), np.int16))
