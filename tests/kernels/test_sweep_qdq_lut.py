"""Differential sweep of the native npu::QdqLut table reads (kernels/native/qdq_lut.cc), issue 38, against the
reference model's numpy indexing (kernels/ops/qdq_lut.reference), byte for byte: one input (256 entries), two of
one shape (65536 entries) and a per-channel operand (one 256-entry row per run of ``inner`` elements, either
operand the small one), uint8 and int8 inputs and tables, every byte value in every position.

qdq_lut.cc's blocks: 64 bytes per AVX-512 VBMI step (its tail masked; the table's two halves chosen by bit 7), the
scalar loop elsewhere; tasks of 2^18 elements, a per-channel run cut where a task ends. Sizes cross 64 and its
multiples, runs cross the task boundary."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around, check
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3807)
SIZES = around(64, 128, 256)
CHUNK = 1 << 18


@pytest.fixture(params=host_isas(top="avx512"))
def lut_isa(request):
    yield from cap_isa(request.param)


def _bytes(shape, dt) -> np.ndarray:
    """Every byte value first (bit 7 set and clear), then random ones."""
    n = int(np.prod(shape))
    v = np.concatenate([np.arange(256), RNG.integers(0, 256, max(0, n - 256))])[:n]
    return v.astype(np.uint8).view(dt).reshape(shape)


def _table(entries, dt) -> np.ndarray:
    return RNG.integers(0, 256, entries).astype(np.uint8).view(dt)


def _lut(*inputs, table, threads=1):
    specs = [(f"x{i}", v, False) for i, v in enumerate(inputs)] + [("table", table, True)]
    check("QdqLut", specs, "qdq_lut_rows" if len(inputs) == 2 and inputs[0].shape != inputs[1].shape else "qdq_lut",
          exact=True, domain="npu", threads=threads)


@pytest.mark.parametrize("dt_in,dt_table", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8)])
def test_one_input(lut_isa, dt_in, dt_table):
    for n in SIZES:
        _lut(_bytes((n,), dt_in), table=_table(256, dt_table))


def test_two_inputs_of_one_shape(lut_isa):
    for n in (1, 63, 64, 65, 300):
        _lut(_bytes((n,), np.uint8), _bytes((n,), np.int8)[::-1].copy(), table=_table(65536, np.uint8))


def test_per_channel_operand(lut_isa):
    """[N, C, 1, W] with a per-channel ([C, 1, 1], [1, C, 1, 1], [N, C, 1, 1]) or per-tensor operand on either
    side (a shape that is a prefix of the other's, then ones: qdq_lut._inner): runs of W around 64."""
    table = _table(65536, np.int8)
    for hw in (2, 63, 64, 65, 130):  # W = 1: operands of one size, where numpy's broadcast runs instead
        one = _bytes((1, 3, 1, hw), np.uint8)
        two = _bytes((2, 3, 1, hw), np.uint8)
        for big, small in ((one, _bytes((3, 1, 1), np.uint8)), (one, _bytes((1, 3, 1, 1), np.int8)),
                           (two, _bytes((2, 3, 1, 1), np.uint8)), (two, _bytes((1,), np.uint8))):
            _lut(big, small, table=table)
            _lut(small, big, table=table)


def test_tasks_of_2_18_elements(lut_isa):
    _lut(_bytes((CHUNK + 65,), np.uint8), table=_table(256, np.uint8), threads=2)
    big = _bytes((3, (CHUNK + 5) // 3 + 1), np.uint8)  # runs cut by the task boundary
    _lut(big, _bytes((3, 1), np.uint8), table=_table(65536, np.uint8), threads=2)
