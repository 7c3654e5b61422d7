"""MatMulNBits over member matrices side by side (npu::MatMulGroup's weights read where ORT keeps them): the native
kernel given lists of B / scales / zero points equals the same kernel on the members concatenated along N, bit for
bit, on every instruction-set path, both accuracy levels, GEMV and GEMM shapes, member widths that are not
multiples of the kernels' column blocks (so column passes straddle member boundaries), and the fused norm call.
"""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.ep import _native
from npu_ep.kernels import host_blas
from npu_ep.kernels.ops.matmul_nbits import level_layout
from npu_ep.quantization import MatMulNBitsWeights, quantize_matmul_nbits

NK = _native.kernels
RNG = np.random.default_rng(5)



def _members(K, widths, bs, symmetric):
    return [quantize_matmul_nbits(RNG.standard_normal((K, n)).astype(np.float32), bs, symmetric) for n in widths]


def _split(ws, level=0):
    """The members' B, scales and zero points in the level's layout (accuracy_level 4: int8 tiles)."""
    b, s, z = zip(*(level_layout(w, level) for w in ws))
    return list(b), list(s), None if z[0] is None else list(z)


def _joined(ws, level):
    """The members concatenated along N, in the level's layout."""
    kb = -(-ws[0].K // ws[0].block_size)
    cat = MatMulNBitsWeights(
        B=np.concatenate([w.B.reshape(w.N, -1) for w in ws]), scales=np.concatenate([w.scales.reshape(w.N, kb)
                                                                                    for w in ws]),
        zero_points=None if ws[0].zero_points is None else np.concatenate([w.zero_points.reshape(w.N, -1)
                                                                           for w in ws]),
        K=ws[0].K, N=sum(w.N for w in ws), block_size=ws[0].block_size)
    return level_layout(cat, level)


@pytest.mark.parametrize("K,bs", [(96, 32), (2048, 128), (200, 16)])
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("symmetric", [False, True])
def test_segments_equal_the_concatenated_matrix(isa, K, bs, m, level, symmetric):
    widths = (40, 24, 57)
    ws = _members(K, widths, bs, symmetric)
    b, s, z = _split(ws, level)
    a = RNG.standard_normal((m, K)).astype(np.float32)
    bias = RNG.standard_normal(sum(widths)).astype(np.float32)
    sgemm = host_blas.sgemm_address() or 0
    for threads in (1, 2):
        got = NK.matmul_nbits(a, b, s, z, bias, K, sum(widths), bs, level, threads, None, False, sgemm)
        want = NK.matmul_nbits(a, *_joined(ws, level), bias, K, sum(widths), bs, level, threads, None, False, sgemm)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("level", [0, 4])
def test_fused_norm_call_reads_segments(swiglu, level):
    K, bs, widths = 256, 32, (48, 48)
    ws = _members(K, widths, bs, False)
    x = RNG.standard_normal((2, K)).astype(np.float32)
    gamma = RNG.standard_normal(K).astype(np.float32)
    args = (x, None, None, gamma, 1e-6, False)
    tail = (None, K, sum(widths), bs, level, swiglu, 1)
    got, _ = NK.norm_matmul_nbits(*args, *_split(ws, level), *tail)
    want, _ = NK.norm_matmul_nbits(*args, *_joined(ws, level), *tail)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case,match", [
    ("count", "must list the same members"),
    ("rows", "columns, N is"),
    ("dtype", "must be a C-contiguous float32 array"),
])
def test_bad_segments_are_clear_errors(case, match):
    K, bs = 64, 32
    b, s, z = _split(_members(K, (16, 8), bs, False))
    a = np.ones((1, K), np.float32)
    n = 24
    if case == "count":
        s = s[:1]
    elif case == "rows":
        n = 30
    else:
        s = [x.astype(np.float64) for x in s]
    with pytest.raises(ValueError, match=match):
        NK.matmul_nbits(a, b, s, z, None, K, n, bs, 0, 1)
