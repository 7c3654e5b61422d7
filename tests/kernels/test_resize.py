"""Resize vs ORT CPU through the kernel and NpuEP sessions on both targets: nearest (every nearest_mode), linear and
cubic (coefficient, exclude_outside), every coordinate_transformation_mode, scales vs sizes, opset-18 axes and
keep_aspect_ratio_policy, tf_crop_and_resize with roi and extrapolation, integer nearest, opset 10. Nearest is
exact; linear and cubic float32 1e-5, float16 2e-3."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep, declined_by
from _vector_ortref import rand

BOTH = ("npu-ref", "npu-edge")
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_half_pixel_for_nn"]
NEAREST_COORDS = [c for c in COORDS if c != "half_pixel_symmetric"]  # declined for nearest, see resize.py
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [(2.0, 2.0), (0.5, 0.6), (1.5, 3.0), (0.75, 1.0)]
F32 = np.float32


def _inputs(x, scales=None, sizes=None, roi=None):
    return [("x", x, False), ("roi", np.asarray(roi, F32), True) if roi is not None else None,
            ("scales", np.asarray(scales, F32), True) if scales is not None else None,
            ("sizes", np.asarray(sizes, np.int64), True) if sizes is not None else None]


@pytest.mark.parametrize("coord", NEAREST_COORDS)
@pytest.mark.parametrize("nearest", NEAREST)
@pytest.mark.parametrize("hw", SCALES)
def test_nearest_every_coordinate_and_rounding_mode(coord, nearest, hw):
    x = rand((1, 2, 6, 5), F32, seed=1)
    check_on_ep("Resize", _inputs(x, scales=[1, 1, *hw]), [("y", F32)],
                {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest})


@pytest.mark.parametrize("coord", [c for c in COORDS if c != "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("hw", SCALES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_linear_every_coordinate_mode(coord, hw, dtype):
    x = rand((2, 3, 7, 6), dtype, seed=2)
    check_on_ep("Resize", _inputs(x, scales=[1, 1, *hw]), [("y", dtype)],
                {"mode": "linear", "coordinate_transformation_mode": coord}, targets=BOTH)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("sizes", [(1, 3, 14, 9), (1, 3, 1, 1), (1, 3, 4, 12), (1, 3, 1, 7)])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
def test_sizes_instead_of_scales(mode, sizes, coord):
    x = rand((1, 3, 5, 6), F32, seed=3)
    check_on_ep("Resize", _inputs(x, sizes=sizes), [("y", F32)],
                {"mode": mode, "coordinate_transformation_mode": coord}, targets=BOTH)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("roi", [[0, 0, 0.2, 0.3, 1, 1, 0.8, 0.9], [0, 0, -0.2, 0.1, 1, 1, 1.3, 0.6]])
def test_tf_crop_and_resize_with_extrapolation(mode, roi):
    x = rand((1, 2, 6, 8), F32, seed=4)
    check_on_ep("Resize", _inputs(x, sizes=[1, 2, 5, 7], roi=roi), [("y", F32)],
                {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -7.5})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("size_or_scale", [{"sizes": [1, 2, 5, 7]}, {"sizes": [1, 2, 1, 3]},
                                           {"scales": [1, 1, 0.5, 1.5]}])
def test_tf_crop_and_resize_without_roi_crops_the_whole_input(mode, size_or_scale):
    """roi omitted: ORT's CPU kernel takes the whole input (starts 0, ends 1); NpuEP failed the run (issue 38
    item 11)."""
    x = rand((1, 2, 6, 8), F32, seed=4)
    check_on_ep("Resize", _inputs(x, **size_or_scale), [("y", F32)],
                {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -7.5},
                targets=BOTH)


def test_tf_crop_and_resize_without_roi_on_named_axes():
    x = rand((1, 2, 6, 8), F32, seed=4)
    check_on_ep("Resize", [("x", x, False), None, None, ("sizes", np.array([4, 11], np.int64), True)], [("y", F32)],
                {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "axes": [2, 3]}, opset=19)


def test_tf_crop_and_resize_with_an_empty_roi_fails_as_ort():
    """An empty roi tensor is not an omitted one: ORT's CPU kernel fails the run on it, and so does NpuEP, after
    running the node (graph assignment)."""
    from _vector_ortref import make_model, run_ort
    from npu_testing import assignment, npu_session

    x = rand((1, 2, 6, 8), F32, seed=4)
    sizes = ("sizes", np.array([1, 2, 3, 3], np.int64), True)
    inputs = [("x", x, False), ("roi", np.zeros(0, F32), False), None, sizes]
    model = make_model("Resize", inputs, [("y", F32)], {"coordinate_transformation_mode": "tf_crop_and_resize"})
    feeds = {"x": x, "roi": np.zeros(0, F32)}
    with pytest.raises(Exception, match="roi"):
        run_ort(model, feeds)
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    with pytest.raises(Exception, match=r"Resize_0.*roi holds 0 values"):
        sess.run(None, feeds)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_axes_and_keep_aspect_ratio_policy(policy):
    x = rand((1, 2, 6, 8), F32, seed=5)
    check_on_ep("Resize", [("x", x, False), None, None, ("sizes", np.array([9, 10], np.int64), True)], [("y", F32)],
                {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": policy}, opset=19)


def test_axes_with_scales_and_negative_axis():
    x = rand((1, 2, 6, 8), F32, seed=6)
    check_on_ep("Resize", [("x", x, False), None, ("scales", np.array([2.0], F32), True)], [("y", F32)],
                {"mode": "linear", "axes": [-1]}, opset=19)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_integer_nearest_is_exact(dtype):
    x = rand((1, 3, 5, 5), dtype, seed=7)
    check_on_ep("Resize", _inputs(x, scales=[1, 1, 2, 1.5]), [("y", dtype)], {"mode": "nearest"}, targets=BOTH)


def test_runtime_scales_and_3d_nearest():
    x = rand((2, 4, 9), F32, seed=8)
    check_on_ep("Resize", [("x", x, False), None, ("scales", np.array([1, 0.5, 2.5], F32), False)], [("y", F32)],
                {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"})


@pytest.mark.parametrize("coord", [c for c in COORDS if c != "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("hw", SCALES)
@pytest.mark.parametrize("a,exclude", [(-0.75, 0), (-0.5, 1), (-0.5, 0)])
def test_cubic_every_coordinate_mode(coord, hw, a, exclude):
    x = rand((1, 2, 7, 6), F32, seed=12)
    check_on_ep("Resize", _inputs(x, scales=[1, 1, *hw]), [("y", F32)],
                {"mode": "cubic", "coordinate_transformation_mode": coord, "cubic_coeff_a": a,
                 "exclude_outside": exclude}, targets=BOTH)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cubic_sizes_and_crop(dtype):
    x = rand((2, 3, 8, 9), dtype, seed=13)
    check_on_ep("Resize", _inputs(x, sizes=[2, 3, 13, 5]), [("y", dtype)], {"mode": "cubic"})
    check_on_ep("Resize", _inputs(x, sizes=[2, 3, 5, 6], roi=[0, 0, -0.1, 0.2, 1, 1, 0.9, 1.2]), [("y", dtype)],
                {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 2.0})


@pytest.mark.parametrize("attrs,why", [({"mode": "area"}, "mode 'area'"), ({"antialias": 1}, "antialias"),
                                       ({"mode": "linear"}, "integer inputs: nearest only"),
                                       ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric"},
                                        "nearest with half_pixel_symmetric")])
def test_declined_with_reason(attrs, why):
    x = rand((1, 1, 4, 4), np.uint8 if why.startswith("integer") else F32, seed=9)
    reason = declined_by("Resize", _inputs(x, scales=[1, 1, 2, 2]), [("y", x.dtype)], attrs, target="npu-ref")
    assert reason is not None and why in reason, reason


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric"])
def test_output_shape_equal_to_input_is_a_copy_whatever_the_scales(mode, coord):
    """floor(3 * 1.25) == 3: ORT copies the input instead of sampling at the 1.25 scale."""
    x = rand((1, 2, 3, 3), F32, seed=10)
    check_on_ep("Resize", _inputs(x, scales=[1, 1, 1.25, 1.2]), [("y", F32)],
                {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": "floor"})


def test_linear_half_pixel_symmetric_over_a_grid_of_sizes():
    for n_in in range(2, 10):
        for s in (0.3, 0.6, 0.75, 1.25, 1.7, 2.5):
            if int(np.float32(n_in) * np.float32(s)) < 1:
                continue
            x = rand((1, n_in), F32, seed=n_in)
            check_on_ep("Resize", _inputs(x, scales=[1, s]), [("y", F32)],
                        {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, kernel=False)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 1.5], [1, 1, 0.6, 0.7], [1, 1, 1.7, 0.45]])
def test_opset10_scales_input(mode, scales):
    """Opset 10: (X, scales) only, asymmetric coordinates; nearest ceils when downsampling, else truncates (ORT)."""
    x = rand((1, 2, 4, 6), F32, seed=11)
    check_on_ep("Resize", [("x", x, False), ("scales", np.array(scales, F32), True)], [("y", F32)], {"mode": mode},
                opset=10, targets=BOTH)
