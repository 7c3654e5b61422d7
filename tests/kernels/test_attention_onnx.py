"""ONNX Attention (opset 23) vs ORT's CPU EP, through the kernel and an NpuEP session on npu-ref (ORT's assignment
shows NpuEP ran it): 3-D and 4-D inputs, GQA head groups, past key/value with presents, is_causal (query i sees keys
up to i + past; a single query row sees every key, as ORT 1.31), bool and float masks, a fully masked row, scale,
softcap (ORT applies it before the mask), every qk_matmul_output_mode, float16. npu-edge declines it (no float
matrix mode).

Tolerances: float32 rtol=atol=1e-5, float16 2e-3 (``_vector_ortref.TOL``).
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep, declined_by
from _vector_ortref import rand

F = np.float32


def _inputs(*, rank=4, b=2, n=4, nkv=2, s=5, t=5, h=8, hv=8, past=0, mask=None, dtype=F):
    if rank == 4:
        q, k, v = rand((b, n, s, h), dtype, 1), rand((b, nkv, t, h), dtype, 2), rand((b, nkv, t, hv), dtype, 3)
    else:
        q, k, v = rand((b, s, n * h), dtype, 1), rand((b, t, nkv * h), dtype, 2), rand((b, t, nkv * hv), dtype, 3)
    pk = ("pk", rand((b, nkv, past, h), dtype, 4), False) if past else None
    pv = ("pv", rand((b, nkv, past, hv), dtype, 5), False) if past else None
    return [("q", q, False), ("k", k, False), ("v", v, False), mask, pk, pv]


def _outs(dtype=F, presents=False, qk=False):
    outs = [("y", dtype)]
    if presents or qk:
        outs += [("present_k", dtype), ("present_v", dtype)] if presents else [("", None), ("", None)]
    if qk:
        outs.append(("qk", dtype))
    return outs


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("n,nkv", [(4, 4), (4, 2), (6, 1)])
def test_attention_heads_and_gqa(rank, n, nkv):
    attrs = {"q_num_heads": n, "kv_num_heads": nkv} if rank == 3 else {}
    check_on_ep("Attention", _inputs(rank=rank, n=n, nkv=nkv, hv=6), _outs(), attrs, opset=23)


@pytest.mark.parametrize("s,t,past", [(5, 5, 0), (5, 5, 3), (1, 1, 6), (1, 3, 2), (2, 4, 3), (4, 2, 3)])
def test_attention_causal_with_past_and_presents(s, t, past):
    check_on_ep("Attention", _inputs(s=s, t=t, past=past), _outs(presents=True), {"is_causal": 1}, opset=23)


@pytest.mark.parametrize("mask_kind", ["bool_2d", "bool_4d", "float_4d_heads", "float_2d"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask_kind, causal):
    s, total = 5, 8
    shape = {"bool_2d": (s, total), "bool_4d": (2, 1, s, total), "float_4d_heads": (1, 4, s, total),
             "float_2d": (s, total)}[mask_kind]
    m = rand(shape, np.bool_ if mask_kind.startswith("bool") else F, seed=7)
    if m.dtype == np.bool_:
        m[..., 0] = True  # every row attends somewhere (a fully masked row is tested below)
    check_on_ep("Attention", _inputs(s=s, t=5, past=3, mask=("m", m, False)), _outs(presents=True),
                {"is_causal": causal}, opset=23)


def test_attention_fully_masked_row():
    m = np.ones((5, 5), np.bool_)
    m[2] = False
    check_on_ep("Attention", _inputs(mask=("m", m, True)), _outs(), opset=23)


@pytest.mark.parametrize("attrs", [{"scale": 0.3}, {"softcap": 1.5}, {"softcap": 2.0, "scale": 0.9, "is_causal": 1}])
def test_attention_scale_and_softcap(attrs):
    m = rand((5, 5), F, seed=8)
    check_on_ep("Attention", _inputs(mask=("m", m, False)), _outs(), attrs, opset=23)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(mode):
    m = rand((5, 5), F, seed=9)
    check_on_ep("Attention", _inputs(mask=("m", m, False)), _outs(qk=True),
                {"qk_matmul_output_mode": mode, "softcap": 1.5, "is_causal": 1}, opset=23)


def test_attention_float16():
    check_on_ep("Attention", _inputs(dtype=np.float16, past=2), _outs(np.float16, presents=True), {"is_causal": 1},
                opset=23)


def test_attention_declined_by_npu_edge():
    reason = declined_by("Attention", _inputs(), _outs(), opset=23)
    assert reason is not None and "not listed" in reason
