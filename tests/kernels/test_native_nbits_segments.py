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
from npu_ep.quantization import quantize_matmul_nbits

NK = _native.kernels
RNG = np.random.default_rng(5)



def _members(K, widths, bs, symmetric):
    return [quantize_matmul_nbits(RNG.standard_normal((K, n)).astype(np.float32), bs, symmetric) for n in widths]


def _split(ws, K, bs):
    kb = -(-K // bs)
    b = [np.ascontiguousarray(w.B).reshape(w.N, kb * bs // 2) for w in ws]
    s = [np.ascontiguousarray(w.scales).reshape(w.N, kb) for w in ws]
    z = None if ws[0].zero_points is None else [np.ascontiguousarray(w.zero_points).reshape(w.N, -1) for w in ws]
    return b, s, z


@pytest.mark.parametrize("K,bs", [(96, 32), (2048, 128), (200, 16)])
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("symmetric", [False, True])
def test_segments_equal_the_concatenated_matrix(isa, K, bs, m, level, symmetric):
    widths = (40, 24, 57)
    b, s, z = _split(_members(K, widths, bs, symmetric), K, bs)
    a = RNG.standard_normal((m, K)).astype(np.float32)
    bias = RNG.standard_normal(sum(widths)).astype(np.float32)
    sgemm = host_blas.sgemm_address() or 0
    for threads in (1, 2):
        got = NK.matmul_nbits(a, b, s, z, bias, K, sum(widths), bs, level, threads, None, False, sgemm)
        want = NK.matmul_nbits(a, np.concatenate(b), np.concatenate(s), None if z is None else np.concatenate(z),
                               bias, K, sum(widths), bs, level, threads, None, False, sgemm)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("swiglu", [False, True])
def test_fused_norm_call_reads_segments(swiglu):
    K, bs, widths = 256, 32, (48, 48)
    b, s, z = _split(_members(K, widths, bs, False), K, bs)
    x = RNG.standard_normal((2, K)).astype(np.float32)
    gamma = RNG.standard_normal(K).astype(np.float32)
    args = (x, None, None, gamma, 1e-6, False)
    tail = (None, K, sum(widths), bs, 0, swiglu, 1)
    got, _ = NK.norm_matmul_nbits(*args, b, s, z, *tail)
    want, _ = NK.norm_matmul_nbits(*args, np.concatenate(b), np.concatenate(s), np.concatenate(z), *tail)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case,match", [
    ("count", "must list the same members"),
    ("rows", "columns, N is"),
    ("dtype", "must be a C-contiguous float32 array"),
])
def test_bad_segments_are_clear_errors(case, match):
    K, bs = 64, 32
    b, s, z = _split(_members(K, (16, 8), bs, False), K, bs)
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
