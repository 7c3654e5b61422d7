"""Differential sweep of the native GroupQueryAttention (kernels/native/gqa.cc, gqa_ops.cc), issue 38, against
the reference model (kernels/ops/attention_gqa.py) with test_gqa_native.py's tolerances (output rtol = atol = 2e-5 for
float32: other summation orders and a lane exp within 2 ulp; float16 2e-3, one float16 rounding; presents bit for
bit), on every instruction-set level the kernel has (scalar, AVX2, AVX-512).

gqa.cc's blocks: up to kRows = 4 query rows (the heads of one token, or several tokens when the group G = N / Nkv
is smaller) share one pass over K and V, the microkernels take 1..4 rows; scores over keys one at a time with the
head dim in 16 lanes (AVX-512, a masked tail) or, from 16 rows per task on, over K transposed once with 64 keys
(AVX-512) / 24 keys (AVX2) per step; score rows padded to 16. The grid crosses each: total keys T around 16, 24,
48, 64 and 128 (decode: past length T - 1), head dims around 8, 16 and 32, groups 1..5 and 8 (rows per pass 4 and
the 1..3-row tails), prefill rows per task around 16 (the transposed path), ragged batches, windows."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around
from tests.kernels.test_gqa_native import TOL16, _compare, _model

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's NaN rows (windows)

KEYS = around(16, 24, 48, 64, 128, low=2)
HEAD_DIMS = [8, 15, 16, 17, 31, 33]
GROUPS = [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (8, 2)]  # (N / Nkv, Nkv)


@pytest.fixture(params=host_isas("avx512"))  # the GQA kernel has no VNNI path of its own
def isa(request):
    yield from cap_isa(request.param)


def test_decode_keys_and_head_dims(isa):
    for t in KEYS:
        for h in (HEAD_DIMS if t in (16, 17, 64, 65) else (16, 17)):
            _compare(*_model(b=1, s=1, n=4, nkv=2, h=h, past=t - 1, seed=t * 100 + h))


def test_decode_groups(isa):
    for g, nkv in GROUPS:
        for t in (15, 16, 17, 63, 64, 65):
            _compare(*_model(b=2, s=1, n=g * nkv, nkv=nkv, h=24, past=t - 1, seqlens=[t - 1, t // 2],
                             total=t, seed=g * 1000 + t))


def test_prefill_rows_around_the_transposed_path(isa):
    """Rows per (batch, kv head) task = G * S around 16: below it the scores run key by key, from it over K^T."""
    for g, s in ((1, 15), (1, 16), (1, 17), (2, 7), (2, 8), (2, 9), (4, 4), (5, 3), (3, 6)):
        _compare(*_model(b=1, s=s, n=g * 2, nkv=2, h=17, seed=g * 100 + s))
        _compare(*_model(b=2, s=s, n=g, nkv=1, h=32, past=20, seqlens=[20 + s - 1, 3 + s], total=20 + s,
                         seed=g * 100 + s + 1))


def test_windows_softcap_and_large_scores(isa):
    for t in (16, 17, 65):
        _compare(*_model(b=1, s=1, n=4, nkv=2, h=16, past=t - 1, local_window_size=7, seed=t))
        _compare(*_model(b=1, s=5, n=4, nkv=2, h=16, past=t - 1, softcap=2.0, scale=0.5, seed=t + 1))
        # scale 40: scores of hundreds, exp of their differences far below float32's smallest normal
        _compare(*_model(b=1, s=3, n=4, nkv=1, h=17, past=t - 1, scale=40.0, seed=t + 2))


def test_float16_decode_and_prefill(isa):
    for t in (16, 17, 64, 65):
        _compare(*_model(b=1, s=1, n=4, nkv=2, h=17, past=t - 1, dtype=np.float16, seed=t), tol=TOL16)
    for s in (15, 16, 17):
        _compare(*_model(b=1, s=s, n=2, nkv=2, h=16, dtype=np.float16, seed=s), tol=TOL16)


@pytest.mark.slow
def test_wide_grid(isa):
    for t in KEYS + [129, 255, 256, 257]:
        for h in HEAD_DIMS + [32, 64, 65, 128]:
            for g, nkv in GROUPS:
                _compare(*_model(b=1, s=1, n=g * nkv, nkv=nkv, h=h, past=t - 1, seed=t + h + g))
            for s in (3, 16, 17):
                _compare(*_model(b=1, s=s, n=2, nkv=1, h=h, past=t - 1, seed=t + h + s))
