"""Differential sweep of the float16 Conv on the native conv kernels (kernels/native/conv_bindings.cc's FloatConv:
x widened exactly, the float32 conv_dense / conv_depthwise, rounded once to float16), issue 40; and float16 Conv in a
session against the CPU EP, on NpuEP's bound native step.

The float16 call must be the float32 kernel on the widened x rounded once: bit for bit the native float32 conv of
``x.astype(float32)`` (weights and bias are float16 values, widened exactly in both) cast to float16, at every ISA
the float kernels dispatch to. Against the reference (float32 conv, rounded once): depthwise convs do the reference's
float32 operations in its order, so bit-exact; dense convs sum in another order than numpy's BLAS, so within one
float16 rounding of each other (rtol 2^-10, plus the float32 sums' spread on values near zero). Shapes cross the
float kernels' blocks (test_sweep_conv.py's docstring): output widths 15/16/17 and 31/32/33 (in-place rows vs a
patch matrix), fewer than 16 pixels (the panel-packed path, the BLAS below AVX-512), output channels around the 8-row
register tile, depth around 256, depthwise rows around 16 and 32 columns; special values NaN, +-Inf, -0, 65504 (a
sum past float16's range rounds to Inf once) and float16 subnormals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, native_vs_reference, node_model, run_kernel
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from test_sweep_conv import _panels_path
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(26)
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 65504.0, -65504.0, 6e-8, -3e-6], np.float16)


@pytest.fixture(params=host_isas(top="avx512"))
def float_isa(request):
    yield from cap_isa(request.param)


def _halves(shape, specials: bool = False) -> np.ndarray:
    x = (RNG.standard_normal(shape) * 0.5).astype(np.float16)
    if specials:
        flat = x.reshape(-1)
        where = RNG.choice(flat.size, size=min(flat.size, SPECIALS.size), replace=False)
        flat[where] = SPECIALS[:where.size]
    return x


def _inputs(x, w, b):
    return [("x", x, False), ("w", w, True)] + ([("b", b, True)] if b is not None else [])


def _half_conv(x, w, b, native_fn: str, threads: int = 2, **attrs) -> None:
    """The float16 conv natively: its bound step ran with the kernel's bits, those bits are the native float32 conv
    of the widened inputs rounded once, and they match the reference (exact for depthwise)."""
    label = f"Conv float16 x{list(x.shape)} w{list(w.shape)} {attrs}"
    if native_fn == "conv_dense" and _panels_path(x, w, attrs):
        native_fn = "conv_panels"  # a conv over a few pixels: its weights packed in panels
    got, want, calls = native_vs_reference("Conv", _inputs(x, w, b), threads=threads, **attrs)
    assert native_fn in calls, f"{label}: the native {native_fn} did not run ({calls})"
    wide = [(n, v.astype(np.float32), c) for n, v, c in _inputs(x, w, b)]
    f32 = run_kernel(node_model("Conv", wide, **attrs), {"x": wide[0][1]}, "native", threads)[0]
    with np.errstate(over="ignore"):
        rounded = f32.astype(np.float16)
    assert got[0].dtype == np.float16 and got[0].tobytes() == rounded.tobytes(), \
        f"{label}: not the float32 conv rounded once"
    g, r = got[0].astype(np.float32), want[0].astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(r), label)
    if native_fn == "conv_depthwise":
        np.testing.assert_array_equal(g, r, label)  # NaN where the reference has NaN (its sign is not pinned)
        np.testing.assert_array_equal(np.signbit(g[~np.isnan(g)]), np.signbit(r[~np.isnan(r)]), label)
        return
    finite = np.isfinite(r) & np.isfinite(g)
    np.testing.assert_array_equal(g[~finite & ~np.isnan(r)], r[~finite & ~np.isnan(r)], label)
    np.testing.assert_allclose(g[finite], r[finite], rtol=2.0 ** -10, atol=1e-3, err_msg=label)


@pytest.mark.parametrize("ow", around(16, 32))
def test_dense_widths_around_the_pixel_slots(float_isa, ow):
    x = _halves((1, 5, 3, ow + 2))
    _half_conv(x, _halves((9, 5, 3, 3)), _halves((9,)), "conv_dense", pads=[0, 0, 0, 0])


@pytest.mark.parametrize("m", around(8, 32))
def test_dense_output_channels_around_the_register_tile(float_isa, m):
    _half_conv(_halves((1, 6, 8, 8)), _halves((m, 6, 3, 3)), _halves((m,)), "conv_dense", pads=[1, 1, 1, 1])


@pytest.mark.parametrize("c,k", [(28, 3), (29, 3), (255, 1), (257, 1)])
def test_dense_depth_around_a_pass(float_isa, c, k):
    _half_conv(_halves((1, c, 6, 18)), _halves((8, c, k, k)) * np.float16(0.1), None, "conv_dense")


@pytest.mark.parametrize("hw,attrs", [((3, 3), {}), ((2, 7), {}), ((4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
                                      ((1, 15), dict(group=2))])
def test_dense_few_pixels_pointwise_strided_and_grouped(float_isa, hw, attrs):
    """Fewer than 16 output pixels (few-pixel pointwise, BLAS blocks), a strided 3x3 and a grouped 1x1."""
    k = 3 if attrs.get("strides") else 1
    grp = attrs.get("group", 1)
    _half_conv(_halves((2, 8, *hw)), _halves((12, 8 // grp, k, k)), _halves((12,)), "conv_dense", **attrs)


@pytest.mark.parametrize("ow", around(16, 32))
def test_depthwise_rows_around_the_registers(float_isa, ow):
    x = _halves((1, 6, 5, ow + 2))
    _half_conv(x, _halves((6, 1, 3, 3)), _halves((6,)), "conv_depthwise", group=6, pads=[0, 0, 0, 0])
    _half_conv(x, _halves((12, 1, 3, 3)), None, "conv_depthwise", group=6, strides=[2, 2], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("native_fn,group", [("conv_dense", 1), ("conv_depthwise", 4)])
def test_special_values_and_overflow(float_isa, native_fn, group):
    """NaN, +-Inf, -0, 65504 and subnormals in x and w; a finite float32 sum past 65504 is Inf once rounded."""
    x, w = _halves((1, 4, 9, 20), specials=True), _halves((8, 4 // group, 3, 3), specials=True)
    _half_conv(x, w, _halves((8,)), native_fn, group=group, pads=[1, 1, 1, 1])
    big = np.full((1, 4, 4, 18), 300.0, np.float16)
    _half_conv(big, np.full((4, 4 // group, 3, 3), 30.0, np.float16), None, native_fn, group=group)


def test_1d_conv_and_threads():
    x = _halves((2, 6, 40))
    _half_conv(x, _halves((10, 6, 5)), _halves((10,)), "conv_dense", threads=1, pads=[2, 2])
    _half_conv(x, _halves((10, 6, 5)), _halves((10,)), "conv_dense", threads=3, pads=[2, 2])


# Float16 convs of real models: a small detector stem (3x3/2), a pointwise expansion and a depthwise 3x3 of a
# mobile block on small maps (the op table's small row is 1x16x8x8).
SESSION_CASES = [((1, 3, 16, 16), (16, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
                 ((1, 16, 8, 8), (32, 16, 1, 1), {}),
                 ((1, 16, 8, 8), (16, 1, 3, 3), dict(group=16, pads=[1, 1, 1, 1]))]


@pytest.mark.parametrize("xs,ws,attrs", SESSION_CASES)
def test_session_matches_cpu_ep_as_a_native_step(xs, ws, attrs):
    """Within float16 rounding of the CPU EP's (MLAS sums float32 products in its own order and rounds once;
    rtol 2^-10, atol 2e-3 on outputs of magnitude ~1), every call after the first on the bound native step."""
    w, b = (RNG.standard_normal(ws) * 0.3).astype(np.float16), RNG.standard_normal(ws[0]).astype(np.float16)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="the_conv", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(xs))],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [None] * 4)], {"w": w, "b": b},
                       opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_conv": "NpuEP"}
    x = RNG.standard_normal(xs).astype(np.float16)
    want = cpu_run(model, {"x": x})[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2.0 ** -10, atol=2e-3)
    assert python_steps(sess) == [], "the float16 Conv ran its Python kernel instead of the bound step"
