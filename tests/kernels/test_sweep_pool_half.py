"""Differential sweep of the float16 pools (kernels/native/pool.cc, pool_bindings.cc) against the reference model
(kernels/ops/pool.py), issue 40, on every instruction-set level pool.cc has; and float16 pools in a session against
the CPU EP, on NpuEP's bound native steps.

MaxPool / AveragePool widen each float16 plane to float32 (exact) and run the float32 plane kernels the float32 sweep
(test_sweep_pool.py) covers path by path, then round once: here the same dispatch geometries (the 2x2 register
kernel, the register-span and tap-by-tap window kernels, the scalar row/column pass below AVX-512) in float16, with
planes of 1 and 2 pixels, NaN, +-Inf, -0.0, float16's largest and subnormal values. Both are bit-exact by contract:
a maximum rounds nothing; an average is the reference's float32 sums and division, rounded once as its astype.
GlobalMaxPool takes 32 pixels a step in two registers and a masked tail on AVX-512, 1024-pixel chunks below it (pixel
counts around 16, 32 and 1024), exact; GlobalAveragePool widens
and sums in numpy's pairwise float32 order (the reference's np.add.reduce: eight running sums up to 128 values, halves
at multiples of 8 above), pixel counts around 8, 128, 256 and the splits: bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(40)
POOL_ISAS = host_isas(top="avx512")  # pool.cc has no path above AVX-512
HALF_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 65504.0, -65504.0, 6.0e-8, -3.0e-5)


@pytest.fixture(params=POOL_ISAS)
def pool_isa(request):
    yield from cap_isa(request.param)


def _image(shape) -> np.ndarray:
    """float16 values of either sign with about 5% of them special (each special at least once where it fits)."""
    x = (RNG.standard_normal(shape) * 10).astype(np.float16)
    flat = x.reshape(-1)
    where = RNG.choice(flat.size, size=min(flat.size, max(len(HALF_SPECIALS), flat.size // 20)), replace=False)
    flat[where] = np.resize(np.asarray(HALF_SPECIALS, np.float16), where.size)
    return x


def _max(x, threads=1, **attrs):
    return check("MaxPool", [("x", x, False)], "max_pool_half", exact=True, threads=threads, **attrs)


def _avg(x, threads=1, **attrs):
    return check("AveragePool", [("x", x, False)], "avg_pool_half", exact=True, threads=threads, **attrs)


# One geometry per float32 plane path: the 2x2 register kernel, register spans of 1, 2 and 3 registers, the
# tap-by-tap kernel (span past 48 columns), ceil_mode, SAME with a negative left pad, a 1-D pool.
GEOMETRIES = [dict(kernel_shape=[2, 2], strides=[2, 2]),
              dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
              dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
              dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]),
              dict(kernel_shape=[2, 18], pads=[0, 3, 1, 9]),  # span 33
              dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[1, 10], pads=[0, 4, 0, 4]),  # span 51
              dict(kernel_shape=[3, 4], strides=[3, 3], pads=[1, 1, 1, 2], ceil_mode=1),
              dict(kernel_shape=[3, 2], strides=[2, 4], auto_pad="SAME_UPPER")]


@pytest.mark.parametrize("attrs", GEOMETRIES)
def test_float16_max_and_average(pool_isa, attrs):
    for w in sorted({*around(16, 32), 5, 9}):
        for h in (4, 7):
            kh, kw = attrs["kernel_shape"]
            dh, dw = attrs.get("dilations", [1, 1])
            t, left, b, r = attrs.get("pads", [0, 0, 0, 0])
            if "auto_pad" not in attrs and (h + t + b <= (kh - 1) * dh or w + left + r <= (kw - 1) * dw):
                continue
            x = _image((1, 3, h, w))
            _max(x, threads=2, **attrs)
            _avg(x, threads=2, **attrs)
            _avg(x, count_include_pad=1, **attrs)


def test_float16_1d_pools_and_tiny_planes(pool_isa):
    for w in (1, 2, 15, 17):
        _max(_image((2, 3, w)), kernel_shape=[3], pads=[1, 1])
        _avg(_image((2, 3, w)), kernel_shape=[2], strides=[2], ceil_mode=1)


def test_float16_windows_of_specials(pool_isa):
    """Windows of one special value: -inf inside, float16's lowest (-65504, the padding's value) where a window
    reaches the padding; sums of 65504 overflow to inf in float16 only at the rounding, as the reference."""
    for fill in (-np.inf, -0.0, np.nan, 65504.0, 6.0e-8):
        x = np.full((1, 1, 5, 19), fill, np.float16)
        for attrs in (GEOMETRIES[1], GEOMETRIES[2], GEOMETRIES[5]):
            _max(x, **attrs)
            _avg(x, **attrs)


@pytest.mark.parametrize("pixels", [*around(8, 16, 32, 128, 136, 256), 1, 2, 255, 3136, *around(1024, 2048)])
def test_float16_global_pools(pool_isa, pixels):
    x = _image((2, 3, pixels))
    check("GlobalMaxPool", [("x", x, False)], "global_max_pool_half", exact=True, threads=2)
    check("GlobalAveragePool", [("x", x, False)], "global_average_pool_half", exact=True)
    finite = (RNG.standard_normal((1, 4, pixels, 1)) * 100).astype(np.float16)
    check("GlobalMaxPool", [("x", finite, False)], "global_max_pool_half", exact=True)
    check("GlobalAveragePool", [("x", finite, False)], "global_average_pool_half", exact=True)


def test_float16_planes_across_conversion_chunks(pool_isa):
    """Small planes widen and narrow in chunks of whole planes (2048 values): 700 planes of 5x5 cross chunk ends."""
    x = _image((1, 700, 5, 5))
    for attrs in (GEOMETRIES[0], GEOMETRIES[1]):
        _max(x, threads=2, **attrs)
        _avg(x, threads=2, **attrs)


@pytest.mark.parametrize("pixels", [3136, 777, 4100, 49])
def test_float16_global_average_over_threads(pool_isa, pixels):
    """GlobalAveragePool's rows split over 2 threads in tasks of whole rows (from 128K values): the same bits, leaves
    of equal and mixed lengths."""
    x = _image((2, (1 << 17) // pixels // 2 + 3, pixels))
    check("GlobalAveragePool", [("x", x, False)], "global_average_pool_half", exact=True, threads=2)


# Float16 pools of real models in a session: every node on NpuEP, as its bound native step, against the CPU EP.
SESSION_CASES = [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 8, 56, 56)),  # ResNet stem
    ("MaxPool", dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]), (1, 8, 20, 20)),  # YOLO SPPF
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0),
     (1, 8, 35, 35)),  # Inception
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), (1, 8, 28, 28)),
    ("GlobalAveragePool", {}, (1, 32, 7, 7)), ("GlobalMaxPool", {}, (2, 16, 9, 9))]


@pytest.mark.parametrize("op,attrs,shape", SESSION_CASES)
def test_float16_pools_match_cpu_ep_as_native_steps(op, attrs, shape):
    """MaxPool and GlobalMaxPool equal the CPU EP's (a maximum is exact); the averages are within one float16
    rounding of it (ORT sums in another order, MLAS in float32 as we do: rtol 1e-3)."""
    node = helper.make_node(op, ["x"], ["y"], name="the_op", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [None] * 4)], opset=21)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    x = (RNG.standard_normal(shape) * 4).astype(np.float16)
    want = cpu_run(model, {"x": x})[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == np.float16 and got.shape == want.shape
        if "Max" in op:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound step"
