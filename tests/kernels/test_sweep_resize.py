"""Differential sweep of the native 2-D Resize (kernels/native/resize.cc) against the reference model
(kernels/ops/resize.py), issue 40; and Resize in a session against the CPU EP, on NpuEP's bound native step.

The kernels walk the per-axis tables the reference computes with its own functions, one task per (n, c) plane:
nearest copies bits (1/2/4/8-byte elements; a repeated source row is a copy of the row just written), linear runs
the reference's two float32 passes (rows, then columns; a multiply then an add, no fused multiply-add; float16
widened per plane and rounded once per row). Both are bit-exact by contract: here every coordinate mode they take,
every nearest mode, scales and sizes, up- and down-sampling, one axis left alone, output widths around the
vectorized row blend's 8 and 16 lanes, NaN/Inf/-0.0/huge values, float32/float16/uint8/int8/int64, threads.
4-byte nearest has an AVX-512 path (16-column blocks, each one masked load and a permute, a row's last block
overlapping the one before, a run of equal source rows stored from the same registers; a block whose sources span
more than 16 columns sends the resize to the element loop): the nearest tests run at every ISA cap up to it.
Linear's column pass has the same blocks on AVX-512 (both neighbours from one masked load by two permutes), and its
row blends are compiled per ISA level: the linear tests run at every cap too.
The [N, H, W, C] kernels (axes 1 and 2) copy whole pixels (nearest) and blend whole rows, then pixels of C (linear,
its blends compiled per ISA level): swept over channel counts around the blend's lanes, every mode, one and two
threads, tasks of output rows splitting an image."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check, kernel_and_bound_step
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(41)
COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [(2.0, 2.0), (0.5, 0.6), (1.5, 3.0), (1.0, 0.75), (3.0, 1.0)]  # one axis left alone in the last two


@pytest.fixture(params=host_isas(top="avx512"))  # resize.cc has no path above AVX-512
def resize_isa(request):
    yield from cap_isa(request.param)


def _image(shape, dt) -> np.ndarray:
    if np.dtype(dt).kind == "f":
        x = (RNG.standard_normal(shape) * 10).astype(dt)
        flat = x.reshape(-1)
        specials = (np.nan, np.inf, -np.inf, -0.0, 6.0e4, -6.0e4)
        where = RNG.choice(flat.size, size=min(flat.size, max(6, flat.size // 20)), replace=False)
        flat[where] = np.resize(np.asarray(specials, dt), where.size)
        return x
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


def _inputs(x, scales=None, sizes=None, runtime_scales=False):
    """Resize's input specs (``_single_op``): roi omitted, scales or sizes, trailing omitted inputs dropped."""
    specs = [("x", x, False), ("roi", None, False),
             ("scales", None if scales is None else np.asarray(scales, np.float32), not runtime_scales),
             ("sizes", None if sizes is None else np.asarray(sizes, np.int64), True)]
    while specs[-1][1] is None:
        specs.pop()
    return specs


def _resize(inputs, native_fn, threads=1, **attrs):
    return check("Resize", inputs, native_fn, exact=True, threads=threads, **attrs)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.uint8, np.int8, np.int64, np.int32])
def test_nearest_every_coordinate_and_rounding_mode(resize_isa, coord, dt):
    for nearest in NEAREST:
        for hw in SCALES:
            x = _image((1, 2, 5, 7), dt)
            _resize(_inputs(x, scales=[1, 1, *hw]), "resize_nearest", threads=2, mode="nearest",
                    coordinate_transformation_mode=coord, nearest_mode=nearest)


@pytest.mark.parametrize("coord", ["half_pixel_symmetric", *COORDS])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_linear_every_coordinate_mode(resize_isa, coord, dt):
    for hw in SCALES:
        x = _image((2, 3, 6, 5), dt)
        _resize(_inputs(x, scales=[1, 1, *hw]), "resize_linear", threads=2, mode="linear",
                coordinate_transformation_mode=coord)


@pytest.mark.parametrize("mode,fn", [("nearest", "resize_nearest"), ("linear", "resize_linear")])
def test_widths_around_the_row_blend_and_sizes(resize_isa, mode, fn):
    """Input and output widths around 8, 16 and 32 (the row blend's vectors and their tails, linear's 16-column
    blocks: upsampled, downsampled just within a block's 16 input columns and beyond), sizes instead of scales, one
    row or column in or out."""
    for w in sorted({*around(8, 16, 32), 1}):
        x = _image((1, 2, 3, w), np.float32)
        for sizes in ([1, 2, 7, 2 * w], [1, 2, 1, w + 1], [1, 2, 3, max(1, w // 2)], [1, 2, 5, 1],
                      [1, 2, 4, max(1, w * 15 // 16)], [1, 2, 2, w * 3 // 2 + 1]):
            if tuple(sizes) == x.shape:  # the output is the input (returned as it is)
                continue
            _resize(_inputs(x, sizes=sizes), fn, mode=mode, coordinate_transformation_mode="half_pixel")
            _resize(_inputs(x, sizes=sizes), fn, mode=mode, coordinate_transformation_mode="align_corners")


@pytest.mark.parametrize("dt", [np.float32, np.int32])
def test_nearest_blocks(resize_isa, dt):
    """The 4-byte block path: output widths around its 16-column blocks (one block, a masked one below 16, the
    overlapping last block), up-sampling by whole and fractional factors with runs of equal source rows, blocks
    whose sources span just 16 columns and just more (0.9x and 0.5x: the element loop), planes on two threads."""
    for w in sorted({*around(8, 16, 32), 1, 47, 63}):
        x = _image((2, 3, 4, w), dt)
        for sizes in ([2, 3, 8, 2 * w], [2, 3, 9, 3 * w], [2, 3, 3, w + 5], [2, 3, 4, max(1, w * 9 // 10)],
                      [2, 3, 5, max(1, w // 2)], [2, 3, 1, 16], [2, 3, 7, 17]):
            if tuple(sizes) == x.shape:
                continue
            for coord in ("asymmetric", "half_pixel"):
                _resize(_inputs(x, sizes=sizes), "resize_nearest", threads=2, mode="nearest",
                        coordinate_transformation_mode=coord, nearest_mode="floor")


# [N, H, W, C] (axes 1 and 2): channel counts around the W pass's 8- and 16-lane blends and their tails (one
# channel is the planes' case), up- and down-sampling by non-integer factors, one of the two axes left alone.
CHANNELS = [1, 3, 8, 15, 16, 17, 64]
NHWC_SCALES = [(2.0, 2.0), (0.5, 0.6), (1.5, 3.0), (1.0, 0.75), (3.0, 1.0), (0.7, 1.3)]


def _nhwc_fn(mode: str, h_kept: bool) -> str:
    """The kernel an [N, H, W, C] resize calls: with H kept, it is a resize of the last two axes (W and C)."""
    return f"resize_{mode}" + ("" if h_kept else "_nhwc")


@pytest.mark.parametrize("c", sorted({2, 4, *CHANNELS}))
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.uint8, np.int8, np.int64])
def test_nhwc_nearest_every_coordinate_and_rounding_mode(resize_isa, c, dt):
    """Whole pixels copied (C elements of 2 to 512 bytes: fixed-size moves up to 16 bytes, else a memcpy), a
    repeated source row copied from the output row before it."""
    for i, (coord, nearest) in enumerate((co, ne) for co in COORDS for ne in NEAREST):
        hw = NHWC_SCALES[i % len(NHWC_SCALES)]
        x = _image((2, 5, 7, c), dt)
        _resize(_inputs(x, scales=[1, *hw, 1]), _nhwc_fn("nearest", hw[0] == 1), threads=1 + i % 2,
                mode="nearest", coordinate_transformation_mode=coord, nearest_mode=nearest)


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_nhwc_linear_every_coordinate_mode(resize_isa, c, dt):
    """The H pass over rows of W * C, the W pass over pixels of C, at every ISA level (the blends are compiled per
    level, fp-contract off: the same bits)."""
    for coord in ["half_pixel_symmetric", *COORDS]:
        for k, hw in enumerate(NHWC_SCALES):
            x = _image((2, 6, 5, c), dt)
            _resize(_inputs(x, scales=[1, *hw, 1]), _nhwc_fn("linear", hw[0] == 1),
                    threads=1 + k % 2, mode="linear", coordinate_transformation_mode=coord)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_nhwc_sizes_and_widths(resize_isa, mode):
    """Sizes instead of scales; widths W * C around the row blend's vectors; one row or column in or out."""
    for w in (1, 2, 5, 8, 9):
        for c in (3, 16, 17):
            x = _image((1, 3, w, c), np.float32)
            for sizes in ([1, 7, 2 * w, c], [1, 1, w + 1, c], [1, 3, max(1, w // 2), c], [1, 5, 1, c]):
                if tuple(sizes) == x.shape:
                    continue
                for coord in ("half_pixel", "align_corners"):
                    _resize(_inputs(x, sizes=sizes), _nhwc_fn(mode, sizes[1] == 3), mode=mode,
                            coordinate_transformation_mode=coord)


@pytest.mark.parametrize("mode,fn", [("nearest", "resize_nearest_nhwc"), ("linear", "resize_linear_nhwc")])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_nhwc_tasks_split_inside_an_image(mode, fn, dt):
    """Enough work for several tasks of output rows, their boundaries inside an image and between two rows of one
    source row (a task's first row gathers, it never copies the row before it): the same bits on one thread and
    two."""
    x = _image((2, 200, 50, 33), dt)
    for threads in (1, 2):
        _resize(_inputs(x, scales=[1, 2, 2, 1]), fn, threads=threads, mode=mode,
                coordinate_transformation_mode="asymmetric" if mode == "nearest" else "half_pixel",
                nearest_mode="floor")


@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 2, 2, 1]])
def test_bound_step_takes_runtime_scales(scales):
    """Scales given at run time (NCHW's last two axes, NHWC's middle two): the step holds the bound ones and equals
    the kernel bit for bit."""
    x = _image((1, 4, 9, 10), np.float16)
    got, bound = kernel_and_bound_step("Resize", _inputs(x, scales=scales, runtime_scales=True), mode="linear")
    assert bound and bound[0].tobytes() == got[0].tobytes()


def test_declines_what_it_does_not_walk():
    """Three axes resized, N and H, cubic, tf_crop_and_resize and rank 3 stay on the reference (no native call)."""
    from _sweep import native_vs_reference

    x = _image((2, 3, 4, 5), np.float32)
    cases = [(_inputs(x, scales=[1, 2, 2, 2]), dict(mode="nearest")), (_inputs(x, scales=[2, 2, 1, 1]),
                                                                       dict(mode="nearest")),
             (_inputs(x, scales=[1, 1, 2, 2]),
                                                                       dict(mode="cubic")),
             (_inputs(x, sizes=[2, 3, 5, 6]), dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize")),
             (_inputs(x[0], scales=[1, 2, 2]), dict(mode="nearest"))]
    for inputs, attrs in cases:
        got, want, calls = native_vs_reference("Resize", inputs, **attrs)
        assert not [c for c in calls if c.startswith("resize_")], attrs
        np.testing.assert_array_equal(got[0], want[0])


# Resizes of real models in a session: YOLO's nearest 2x upsample, a segmentation head's bilinear (half_pixel and
# align_corners, as torch exports them), float16 and uint8.
SESSION_CASES = [(TensorProto.FLOAT, np.float32, dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                                                      nearest_mode="floor")),
                 (TensorProto.FLOAT, np.float32, dict(mode="linear", coordinate_transformation_mode="half_pixel")),
                 (TensorProto.FLOAT, np.float32, dict(mode="linear", coordinate_transformation_mode="align_corners")),
                 (TensorProto.FLOAT16, np.float16, dict(mode="linear",
                                                        coordinate_transformation_mode="pytorch_half_pixel")),
                 (TensorProto.UINT8, np.uint8, dict(mode="nearest"))]


@pytest.mark.parametrize("elem,dt,attrs", SESSION_CASES)
def test_session_matches_cpu_ep_as_a_native_step(elem, dt, attrs):
    """Nearest equals the CPU EP's; linear is within float32 rounding of it (ORT blends in another order:
    float32 rtol 1e-5, float16 one float16 rounding, 2e-3)."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="the_op", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [1, 8, 20, 24])],
                       [helper.make_tensor_value_info("y", elem, [1, 8, 40, 48])],
                       {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=19)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    x = (RNG.standard_normal((1, 8, 20, 24)) * 4).astype(dt) if dt != np.uint8 else \
        RNG.integers(0, 256, (1, 8, 20, 24), dtype=np.uint8)
    want = cpu_run(model, {"x": x})[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        if attrs["mode"] == "nearest":
            np.testing.assert_array_equal(got, want)
        else:
            tol = 1e-5 if dt == np.float32 else 2e-3
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound step"
