"""Pad vs ORT CPU (bit-exact: only moves bytes), through the kernel and NpuEP sessions on both targets: every mode,
negative pads (crop), opset-18 axes, runtime pads, constant value input and the opset-2 attributes."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep, declined_by
from _vector_ortref import rand

I64 = np.int64
BOTH = ("npu-ref", "npu-edge")
PADS = [[1, 2, 0, 3, 1, 0], [0, 0, 2, 0, 0, 2], [-1, 1, 0, 2, -2, 1], [1, -2, -1, 0, 2, -3], [0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_modes_with_positive_and_negative_pads(mode, pads, dtype):
    x = rand((4, 5, 6), dtype, seed=1)
    inputs = [("x", x, False), ("p", np.array(pads, I64), True)]
    if mode == "constant":
        inputs.append(("v", np.array(7, dtype), True))
    check_on_ep("Pad", inputs, [("y", dtype)], {"mode": mode}, targets=BOTH)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_axes_input_opset18_and_runtime_pads(mode):
    x = rand((2, 3, 4, 5), np.float32, seed=2)
    check_on_ep("Pad", [("x", x, False), ("p", np.array([1, -1, 2, 0], I64), False), None,
                        ("a", np.array([-1, 1], I64), True)], [("y", np.float32)], {"mode": mode}, opset=18)


def test_constant_mode_without_value_pads_zero_and_bool():
    x = rand((4, 3), np.bool_, seed=3)
    check_on_ep("Pad", [("x", x, False), ("p", np.array([1, 0, 0, 2], I64), True)], [("y", np.bool_)])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_opset2_attributes(mode):
    x = rand((3, 4), np.float32, seed=4)
    check_on_ep("Pad", [("x", x, False)], [("y", np.float32)], {"mode": mode, "pads": [1, 2, 2, 1], "value": 1.5},
                opset=2)


def test_cost_counts_cropped_input_and_padded_output():
    from _vector_ortref import make_model, run_npu
    x = rand((10, 10), np.float32)
    _, _, cost = run_npu(make_model("Pad", [("x", x, False), ("p", np.array([-2, 0, 3, 0], I64), True)],
                                    [("y", np.float32)]), {"x": x})
    assert cost.dma_bytes == 8 * 10 * 4 + 11 * 10 * 4


def test_unknown_mode_declined():
    x = rand((3, 4), np.float32)
    assert declined_by("Pad", [("x", x, False), ("p", np.array([0, 1, 0, 1], I64), True)], [("y", np.float32)],
                       {"mode": "mirror"}, target="npu-ref") is not None


def test_reflect_pad_not_shorter_than_the_cropped_axis_raises_like_ort():
    from _vector_ortref import make_model, run_npu
    x, pads = rand((3, 5), np.float32), np.array([-1, 0, 2, 0], I64)
    model = make_model("Pad", [("x", x, False), ("p", pads, True)], [("y", np.float32)], {"mode": "reflect"})
    with pytest.raises(ValueError, match=r"reflect pads \(0, 2\) need axis 0 longer"):
        run_npu(model, {"x": x})
