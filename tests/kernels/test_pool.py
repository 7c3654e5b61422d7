"""MaxPool (exact), AveragePool and GlobalAveragePool (fp32 rtol 1e-6, fp16 1e-3) vs ORT CPU: pads, strides,
dilations, ceil_mode, count_include_pad, odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from _single_op import both

RNG = np.random.default_rng(5)
CASES = [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1),
         dict(kernel_shape=[3, 2], strides=[1, 2], pads=[0, 1, 2, 0], ceil_mode=1),
         dict(kernel_shape=[2, 2])]


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int8, np.uint8])
def test_maxpool_exact(attrs, dt):
    x = (RNG.standard_normal((2, 3, 11, 10)) * 50).astype(dt)
    a = dict(attrs)
    if dt == np.float32:
        a["dilations"] = [1, 2] if "ceil_mode" not in a else [1, 1]
    ours, ref, _, cost = both("MaxPool", [("x", x, False)], **a)
    np.testing.assert_array_equal(ours[0], ref[0])
    assert cost.cycles > 0


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_averagepool_matches_cpu(attrs, include_pad, dt):
    x = RNG.standard_normal((1, 4, 9, 12)).astype(dt)
    ours, ref, _, _ = both("AveragePool", [("x", x, False)], count_include_pad=include_pad, **attrs)
    tol = 1e-6 if dt == np.float32 else 1e-3
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_globalaveragepool_matches_cpu(dt):
    x = RNG.standard_normal((2, 5, 7, 3)).astype(dt)
    ours, ref, _, _ = both("GlobalAveragePool", [("x", x, False)])
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), rtol=1e-3, atol=1e-3)
