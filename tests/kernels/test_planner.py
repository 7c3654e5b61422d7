"""Tile planner properties over random shapes x targets: SRAM budget holds and every output is computed once."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_ep.kernels.cost import plan_cycles, roofline_cycles
from npu_ep.kernels.planner import PlanError, compulsory_dma_bytes, plan_matmul
from npu_ep.kernels.tile_plan import TilePlan
from npu_ep.kernels.target import Target

TARGETS = {n: Target.load(n) for n in ("npu-ref", "npu-edge")}
DTYPES = {"npu-ref": [("float32", "float32", None), ("float16", "float16", None), ("int8", "int8", None),
                      ("uint8", "int8", None), ("float32", "int4", 16), ("float16", "int4", 32),
                      ("float32", "int4", 128), ("float32", "int4", 256)],
          "npu-edge": [("int8", "int8", None), ("uint8", "uint8", None)]}


@st.composite
def problems(draw):
    name = draw(st.sampled_from(sorted(TARGETS)))
    a, b, bs = draw(st.sampled_from(DTYPES[name]))
    dim = st.integers(1, 700)
    return name, draw(dim), draw(dim), draw(st.integers(1, 3000)), a, b, bs, draw(st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_plan_fits_sram_and_covers_every_output_once(prob):
    name, m, n, k, a, b, bs, batch = prob
    t = TARGETS[name]
    p = plan_matmul(m, n, k, a, b, t, block_size=bs, batch=batch)
    assert p.sram_bytes <= t.sram_bytes
    hm, hn, hk = t.tile
    assert p.tm % hm == 0 and p.tn % hn == 0 and p.tk % hk == 0
    if bs:
        assert p.tk % bs == 0, "K tiles must hold whole quantization blocks"
    cover = np.zeros((batch, m, n), np.int32)
    for bi, m0, m1, n0, n1 in p.output_tiles():
        assert 0 <= m0 < m1 <= m and 0 <= n0 < n1 <= n
        cover[bi, m0:m1, n0:n1] += 1
    assert (cover == 1).all()
    kcov = np.zeros(k, np.int32)
    for k0, k1 in p.k_tiles():
        kcov[k0:k1] += 1
    assert (kcov == 1).all()
    assert plan_cycles(p, t) >= roofline_cycles(p.macs, compulsory_dma_bytes(p), p.mode, t) * 0.999


def test_plan_round_trips_through_json():
    p = plan_matmul(100, 300, 520, "float32", "int4", TARGETS["npu-ref"], block_size=32)
    assert TilePlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_int4_k_tile_aligns_with_large_blocks():
    p = plan_matmul(4, 64, 1000, "float32", "int4", TARGETS["npu-ref"], block_size=256)
    assert p.tk % 256 == 0 and p.k_tiles()[-1] == (p.tk * (len(p.k_tiles()) - 1), 1000)


@pytest.mark.parametrize("name,shape,dt", [("npu-ref", (128, 1024, 1024), "float32"),
                                           ("npu-ref", (2048, 2048, 2048), "int8"),
                                           ("npu-edge", (2048, 2048, 2048), "int8")])
def test_large_gemm_plans_reach_80_percent_of_roofline(name, shape, dt):
    t = TARGETS[name]
    p = plan_matmul(*shape, dt, dt, t, out_dtype=dt)
    assert roofline_cycles(p.macs, compulsory_dma_bytes(p), p.mode, t) / plan_cycles(p, t) >= 0.8


def test_smallest_plan_too_big_is_declined_with_sizes():
    raw = dict(TARGETS["npu-edge"].raw)
    raw["sram_bytes"] = 4096
    tiny = Target.from_dict(raw)
    with pytest.raises(PlanError, match=r"exceeds SRAM: needs \d+ B > 4096 B"):
        plan_matmul(64, 64, 64, "int8", "int8", tiny)


def test_edge_target_has_no_float_mode():
    with pytest.raises(PlanError, match="no matrix mode for float32"):
        plan_matmul(8, 8, 8, "float32", "float32", TARGETS["npu-edge"])
