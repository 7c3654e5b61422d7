"""Differential sweep of the native npu::RotateHalf (kernels/native/rotate_half.cc), issue 38, against the
reference model's unfused float32 ops (kernels/ops/rotate_half.py: x * cos + concat(-x2, x1) * sin), bit for bit:
the kernel promises the same two products and their sum per element, no multiply-add contraction.

The row loop is compiler-vectorized (4 / 8 / 16 lanes by the build), so half widths cross 4, 8 and 16 with their
scalar remainders; cos and sin broadcast from every pattern of 1s over x's rank (the kernel's row strides of 0),
rows run on two threads. Values: NaN, +-Inf, -0.0 (x * 0 and the negation's sign), huge products overflowing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from _sweep import around, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3806)
HALVES = around(4, 8, 16, 32)


def _reference(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = np.concatenate([np.negative(x[..., half:]), x[..., :half]], axis=-1)
    with np.errstate(all="ignore"):
        return np.add(np.multiply(x, cos), np.multiply(rotated, sin))


def _values(shape) -> np.ndarray:
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0, 3e38, -3e38, 1e-45), fraction=0.03)


def _check(x, cos, sin, threads=1):
    got = runtime.native_module().rotate_half(x, cos, sin, x.shape[-1] // 2, threads)
    want = _reference(x, cos, sin)
    assert got.shape == want.shape and got.dtype == want.dtype
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"x {x.shape} cos {cos.shape} sin {sin.shape}: {int((~same).sum())} elements differ"


def test_half_widths():
    for half in HALVES:
        x = _values((2, 3, 5, 2 * half))
        _check(x, _values((1, 1, 5, 2 * half)), _values((1, 1, 5, 2 * half)), threads=2)


def test_every_broadcast_pattern():
    """cos and sin of x's rank (1..4) with any of the leading dims 1, or of a lower rank."""
    for rank in range(1, 5):
        shape = [2, 3, 4][: rank - 1] + [10]
        x = _values(shape)
        for ones in itertools.product((False, True), repeat=rank - 1):
            cs = [1 if one else d for one, d in zip(ones, shape)] + [shape[-1]]
            _check(x, _values(cs), _values(cs[1:] if len(cs) > 1 else cs))


@pytest.mark.slow
def test_every_half_to_70():
    for half in range(1, 71):
        _check(_values((3, 1, 7, 2 * half)), _values((3, 1, 1, 2 * half)), _values((7, 2 * half)), threads=2)
