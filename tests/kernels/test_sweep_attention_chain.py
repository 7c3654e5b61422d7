"""Differential sweep of the native npu::AttentionChain (kernels/native/attention_chain.cc, on GQA's inner loops
in gqa_ops.cc), issue 38, against the reference model (kernels/ops/attention_chain.reference: the unfused chain's
numpy calls), with test_attention_chain.py's tolerance (rtol 2e-5, atol 2e-6 of the output's scale: other
summation orders and a lane exp within 2 ulp) and the same bits at one and two threads.

The chain's blocks: kRows = 4 query rows per pass over K and V (1..3-row tails); from S = 16 query rows on, K is
transposed once per head (scores over 64 keys per AVX-512 step, 24 per AVX2 step), below it key by key with the
head dim in 16 / 8 lanes; the scale-mask-max prologue 16 lanes at a time (masked tail) on AVX-512; score rows
padded to 16. The grid crosses each: S around 4 and 16, T around 16, 24 and 64, H and Hv around 8 and 16. Special
values: rows masked with -inf everywhere (NaN, zeros under the exporters' guard or ORT's masked-row rule), an
infinite maximum, float32's lowest as the mask, NaN in Q, huge scores whose exp underflows."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.attention_chain import reference

NAT = runtime.native_module()
pytestmark = pytest.mark.skipif(NAT is None, reason="native extension not built")

RNG = np.random.default_rng(3809)
LOWEST = float(np.finfo(np.float32).min)
ROWS = [1, 2, 3, 4, 5, 15, 16, 17]  # 4-row passes and their tails; K transposed from 16 rows on
KEYS = [1, 15, 16, 17, 23, 24, 25, 63, 64, 65]
DIMS = [7, 8, 9, 15, 16, 17, 33]


@pytest.fixture(params=host_isas("avx512"))  # the chain has no VNNI path of its own
def chain_isa(request):
    yield from cap_isa(request.param)


def _operands(s, t, h, hv, b=1, n=2, mask=True, k_view=True):
    q = (RNG.standard_normal((b, n, s, h)) / np.sqrt(h)).astype(np.float32)
    k = RNG.standard_normal((b, n, t, h)).astype(np.float32)
    kt = k.transpose(0, 1, 3, 2) if k_view else np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    v = RNG.standard_normal((b, n, t, hv)).astype(np.float32)
    m = np.where(RNG.random((b, 1, s, t)) < 0.3, np.float32(LOWEST), np.float32(0)) if mask else None
    return q, kt, v, m


def _check(q, kt, v, mask, scale_kind=1, scale=0.3, zero_nan_rows=False):
    with np.errstate(all="ignore"):
        want = reference(q, kt, v, mask, scale_kind, scale, zero_nan_rows=zero_nan_rows)
    got = NAT.attention_chain(q, kt, v, mask, scale_kind, scale, 1, zero_nan_rows)
    what = f"q {q.shape} kt {kt.shape} v {v.shape} scale_kind {scale_kind} guard {zero_nan_rows}"
    assert got.shape == want.shape, what
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    ok = ~np.isnan(want)
    scale_of = float(np.abs(want[ok]).max()) if ok.any() else 1.0
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=2e-6 * scale_of, err_msg=what)
    two = NAT.attention_chain(q, kt, v, mask, scale_kind, scale, 2, zero_nan_rows)
    assert np.array_equal(two, got, equal_nan=True), f"{what}: bits differ on two threads"


def test_rows_by_keys(chain_isa):
    for s in ROWS:
        for t in KEYS:
            _check(*_operands(s, t, 16, 16), scale_kind=(s + t) % 3)


def test_head_dims(chain_isa):
    for h in DIMS:
        for hv in (1, 15, 16, 17):
            for s, t in ((1, 33), (17, 17)):  # key by key, and over K^T
                _check(*_operands(s, t, h, hv, k_view=h % 2 == 0))


@pytest.mark.parametrize("zero_nan_rows", [False, True])
def test_special_rows(chain_isa, zero_nan_rows):
    for s, t in ((5, 17), (17, 24), (20, 65)):
        q, kt, v, mask = _operands(s, t, 16, 8)
        mask[0, 0, 0] = -np.inf           # every key masked: NaN, or zeros under the guard
        mask[0, 0, 1, t // 2] = np.inf    # an infinite maximum
        mask[0, 0, 2] = LOWEST            # every key at float32's lowest: a uniform row
        q[0, 1, 3, 0] = np.nan            # a NaN query: its row NaN (0 under the guard)
        q[0, 0, 4] *= 1e4                 # huge scores: exp of their differences underflows to 0
        _check(q, kt, v, mask, zero_nan_rows=zero_nan_rows)


@pytest.mark.slow
def test_wide_grid(chain_isa):
    for s in ROWS + [31, 32, 33]:
        for t in KEYS + [127, 128, 129]:
            for h in (8, 17, 64):
                _check(*_operands(s, t, h, h + 1, k_view=(s + t) % 2 == 0), scale_kind=(s + t + h) % 3)


def test_query_rows_of_any_layout_give_the_same_bits(chain_isa):
    """Query rows are copied whole where their channels are contiguous, element by element otherwise: the same
    bits either way (rows around the 4-row pass and the 16-row K transpose)."""
    for s in (3, 8, 17):
        q, kt, v, mask = _operands(s, 24, 16, 8)
        strided = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # channels at a pitch of s
        assert strided.strides[3] != 4
        want = NAT.attention_chain(q, kt, v, mask, 1, 0.3, 1, False)
        assert NAT.attention_chain(strided, kt, v, mask, 1, 0.3, 1, False).tobytes() == want.tobytes()


def test_key_rows_in_register_tiles_give_the_same_bits(chain_isa):
    """From 16 query rows on, K given as rows (a view of K^T) is transposed 16 keys by 16 channels at a time in
    registers on AVX-512 (head dims a multiple of 16; the last keys one by one), and the scores kernel applies the
    multiply and the mask in its epilogue: the same bits as a contiguous K^T, and the reference's values (keys
    around the 16-key tiles and 64-key score blocks; a divide keeps the separate prologue)."""
    for h in (16, 32, 64):
        for t in (16, 17, 31, 64, 65, 129):
            for kind in (0, 1, 2):
                q, kt, v, mask = _operands(17 + t % 3, t, h, 16, mask=t % 2 == 1, k_view=True)
                _check(q, kt, v, mask, scale_kind=kind)
                want = NAT.attention_chain(q, np.ascontiguousarray(kt), v, mask, kind, 0.3, 1, False)
                assert NAT.attention_chain(q, kt, v, mask, kind, 0.3, 1, False).tobytes() == want.tobytes()


@pytest.mark.parametrize("zero_nan_rows", [False, True])
def test_passes_over_key_panels(chain_isa, zero_nan_rows):
    """With the fused scores (AVX-512, 16+ query rows, no divide) up to 64 query rows share a pass over K and V in
    4-row groups (fewer when their scores would pass 1 MB), K transposed in 64-key panels and P V summed panel by
    panel: rows around the groups and passes, keys around the panels, head dims with a value tail, a mask broadcast
    over the rows, special rows in a later pass with their cause past the first panel, 4100 keys (60-row passes);
    the reference's values and the same bits at two threads, K as rows or as a contiguous K^T."""
    for h, hv in ((16, 16), (80, 40), (128, 128)):
        for s, t in ((16, 63), (63, 64), (65, 65), (130, 129), (67, 200)):
            q, kt, v, mask = _operands(s, t, h, hv, mask=t % 2 == 1, k_view=True)
            _check(q, kt, v, mask, scale_kind=(s + t) % 2, zero_nan_rows=zero_nan_rows)
            want = NAT.attention_chain(q, kt, v, mask, 1, 0.3, 1, zero_nan_rows)
            got = NAT.attention_chain(q, np.ascontiguousarray(kt), v, mask, 1, 0.3, 1, zero_nan_rows)
            assert got.tobytes() == want.tobytes()
    q, kt, v, _ = _operands(70, 150, 32, 32)
    _check(q, kt, v, RNG.standard_normal((1, 1, 1, 150)).astype(np.float32), zero_nan_rows=zero_nan_rows)
    mask = np.where(RNG.random((1, 1, 70, 150)) < 0.3, np.float32(LOWEST), np.float32(0))
    mask[0, 0, 66] = -np.inf            # every key masked, in the second pass
    mask[0, 0, 67, 140] = np.inf        # an infinite maximum in the third panel
    mask[0, 0, 68, 64:] = -np.inf       # only the first panel's keys count
    q[0, 1, 69, 0] = np.nan             # a NaN query in the second pass
    _check(q, kt, v, mask, zero_nan_rows=zero_nan_rows)
    q, kt, v, mask = _operands(130, 4100, 16, 16, k_view=True)
    _check(q, kt, v, mask, zero_nan_rows=zero_nan_rows)
    for masked_rows_zero in (False, True):  # ORT's masked-row rule: a row whose every score is -inf gives zeros
        q, kt, v, _ = _operands(70, 100, 16, 16)
        mask = np.zeros((1, 1, 70, 100), np.float32)
        mask[0, 0, 66] = -np.inf
        got = NAT.attention_chain(q, kt, v, mask, 1, 0.3, 1, False, False, 1, 1, masked_rows_zero)
        assert (got[0, :, 66] == 0).all() if masked_rows_zero else np.isnan(got[0, :, 66]).all()
        assert not np.isnan(got[0, :, 65]).any()
