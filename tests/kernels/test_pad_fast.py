"""``pad.padded`` (Pad's constant/reflect/edge path) equals np.pad element for element over random ranks, shapes,
pads (zero, one-sided, reflect up to axis - 1) and dtypes, corners included; ORT agreement is test_pad.py's."""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.kernels.ops.pad import padded


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_padded_equals_np_pad(mode, dtype):
    rng = np.random.default_rng(hash((mode, np.dtype(dtype).name)) % 2**32)
    for _ in range(150):
        shape = tuple(int(v) for v in rng.integers(1, 7, rng.integers(1, 5)))
        x = (rng.standard_normal(shape) * 50).astype(dtype)
        hi = {"reflect": None}.get(mode, 5)
        grow = [(int(rng.integers(0, d if hi is None else hi)), int(rng.integers(0, d if hi is None else hi)))
                for d in shape]
        value = np.asarray(7).astype(dtype)
        want = np.pad(x, grow, mode=mode, **({"constant_values": value} if mode == "constant" else {}))
        got = padded(x, grow, mode, value)
        assert got.dtype == want.dtype and np.array_equal(got, want), (shape, grow)


def test_padded_constant_on_an_empty_axis():
    x = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(padded(x, [(1, 2), (0, 1)], "constant", np.float32(4)),
                                  np.pad(x, [(1, 2), (0, 1)], constant_values=4))
