"""Differential sweep of the float conv over fewer than 16 output pixels on panel-packed weights (conv_panels:
kernels/native/conv_panels.cc, PanelsFloat on ChannelGemmAvx512) against the reference model, and of conv_dense over
so few pixels (our own GEMM on AVX-512, no BLAS call); and such convs (Silero VAD's 1-D convs over 4 frames) in a
session against the CPU EP on NpuEP's bound native step.

Blocks: panels of 64 output channels (Mg around 16, 64, 128: a short last panel through scratch rows, its 16-channel
vectors only), 4 vectors x 6 pixels a register tile (pixels 1..15), depth passes of 256 (K = Cg * kh * kw around
256 and tiny), groups and images (a task per image, group and panel), any kernel, strides, dilations and pads (B
read in place by tap and pixel offsets; a padded conv from a zero-padded copy), 1-D and 2-D, tails (a clip and
HardSwish in registers, any other tail and a per-channel slope after the panel), special values; the same bits at 1
to 3 threads. Tolerance: test_sweep_conv.py's dot-product bound (2 K eps sum|x * w| + |bias| eps; NaN and
infinities where the reference has them)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around
from npu_ep.kernels import host_blas, runtime
from npu_ep.kernels.ops.conv import _gemm_weights
from test_sweep_conv import EPS, TAILS, _float_conv, _floats, _out_pixels, _panels_path, _prepared, _run, _sample

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

AVX512 = ("avx512", "avx512_vnni", "amx_int8")


@pytest.fixture(params=host_isas(top="avx512"))
def float_isa(request):
    yield from cap_isa(request.param)


def _conv(x, w, b=None, threads=1, **attrs):
    """The conv on the native kernels within the bound; conv_panels where the host has AVX-512 and the map is small."""
    assert _out_pixels(x, w, attrs) < 16
    on_panels = runtime.native_module().isa() in AVX512
    assert _panels_path(x, w, attrs) == on_panels
    return _float_conv(x, w, b, threads=threads, **attrs)


# Output channels around the 16-channel vector and the 64-channel panel; depth around one 256-deep pass (2-D 3x3:
# 28 * 9 = 252, 29 * 9 = 261; 1-D kernel 3: 85 * 3 = 255, 86 * 3 = 258) and shallow; pixels 1..15 from the geometry.
PANEL_M = [1, *around(16, 64, 128)]
GEOMETRIES = [  # (x spatial, kernel, attrs)
    ((3, 4), (3, 3), dict(pads=[1, 1, 1, 1])),  # 12 pixels, padded
    ((5, 5), (3, 3), dict(strides=[2, 2])),  # 4, unpadded, strided
    ((1, 15), (1, 1), dict(strides=[1, 1])),  # 15, pointwise
    ((7, 9), (3, 3), dict(strides=[3, 2], dilations=[2, 1], pads=[0, 1, 2, 1])),  # 2 x 5
    ((4,), (3,), dict(pads=[1, 1])),  # 1-D, Silero's 4 frames
    ((8,), (3,), dict(strides=[2], pads=[1, 1])),  # 1-D strided: 4 frames
    ((640,), (256,), dict(strides=[128])),  # 1-D STFT frames: 4, K = 256 a channel
    ((2, 2), (2, 2), dict(pads=[1, 0, 1, 1])),  # 3 x 2, asymmetric pads wider than the input's rows
    ((6, 1), (5, 1), dict(pads=[2, 0, 2, 0], strides=[2, 1])),  # a column image: 3 pixels
]
GRID = [(m, cg, geo, ng) for m in PANEL_M for cg in (1, 3, 28, 29, 85, 86) for geo in range(len(GEOMETRIES))
        for ng in ((1, 1), (2, 1), (1, 2), (2, 3)) if cg > 1 or ng[1] == 1]  # one channel a group: depthwise


def _case(m, cg, geo, ng, threads=1):
    spatial, kernel, attrs = GEOMETRIES[geo]
    n, g = ng
    rng = np.random.default_rng(m * 1000 + cg * 10 + geo)
    x = _floats((n, cg * g, *spatial), rng, specials=(m + cg) % 3 == 0)
    w, b = _floats((m * g, cg, *kernel), rng), _floats((m * g,), rng)
    return _conv(x, w, b, threads=threads, group=g, **attrs)


@pytest.mark.parametrize("case", _sample(GRID, 40, seed=33))
def test_panels_channels_depth_geometry_groups(float_isa, case):
    _case(*case)


@pytest.mark.slow
def test_panels_channels_depth_geometry_groups_wide(float_isa):
    for case in GRID:  # one test: collecting the grid case by case cost the default run seconds
        _case(*case)


@pytest.mark.parametrize("pixels", range(1, 16))
def test_panels_every_pixel_count(float_isa, pixels):
    """1..15 output pixels of a padded 3x3 conv (a row of them): the 6-pixel tile and its rest, two panels + 1."""
    rng = np.random.default_rng(pixels)
    x = _floats((1, 29, 1, pixels), rng, specials=True)
    _conv(x, _floats((129, 29, 3, 3), rng), _floats((129,), rng), pads=[1, 1, 1, 1])


@pytest.mark.parametrize("m,ng", [(129, (2, 3)), (64, (3, 1)), (258, (1, 1)), (17, (1, 4))])
def test_panels_same_bits_at_any_thread_count(float_isa, m, ng):
    """Worth two threads (N * M * K * max(P, 4) >= 2^20): the panels spread over the threads, every output's bits
    the same at 1, 2 and 3."""
    n, g = ng
    rng = np.random.default_rng(m)
    x = _floats((n, 96 * g, 4), rng)
    w, b = _floats((m * g, 96, 3), rng), _floats((m * g,), rng)
    one = _conv(x, w, b, group=g, pads=[1, 1])
    for threads in (2, 3):
        assert _conv(x, w, b, threads=threads, group=g, pads=[1, 1]).tobytes() == one.tobytes(), threads


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("m", [48, 70])
def test_panels_tails(float_isa, tail, m):
    """A lone clip (and HardSwish) in the GEMM's registers, any other tail over the finished panel; a short panel."""
    rng = np.random.default_rng(m + len(tail))
    x = _floats((2, 40, 3, 3), rng, specials=True)
    w, b = _floats((m, 40, 3, 3), rng), _floats((m,), rng)
    _float_conv(x, w, b, tail=tail, strides=[2, 2], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("m", [20, 64, 130])
def test_panels_per_channel_slopes(float_isa, m):
    """A folded per-channel PRelu (leaky_relu with one slope per output channel) after the panel."""
    rng = np.random.default_rng(m)
    x = _floats((1, 12, 5), rng)
    w, b = _floats((m, 12, 3), rng), _floats((m,), rng)
    _float_conv(x, w, b, tail=[("leaky_relu", 0.1, 0.0)], slopes=rng.uniform(0.01, 0.5, m), pads=[1, 1])


# conv_dense over fewer than 16 pixels (callers that give it unpacked weights): our own GEMM on AVX-512, never the
# BLAS whose address it is given (a counting callback in its place).
SGEMM64 = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64)


@pytest.mark.parametrize("xs,ws,geom", [((1, 29, 3, 4), (70, 29, 3, 3), [1, 1, 1, 1, 1, 1, 1, 1, 1]),
                                        ((2, 6, 5, 5), (16, 3, 2, 2), [2, 2, 2, 1, 1, 0, 0, 0, 0]),
                                        ((1, 64, 1, 8), (128, 64, 1, 3), [1, 1, 2, 1, 1, 0, 1, 0, 1]),
                                        ((1, 300, 2, 3), (33, 300, 1, 1), [1, 1, 1, 1, 1, 0, 0, 0, 0])])
def test_conv_dense_few_pixels_on_our_gemm(float_isa, xs, ws, geom):
    """geom: group, sh, sw, dh, dw, pt, pl, pb, pr."""
    nat = runtime.native_module()
    rng = np.random.default_rng(xs[1])
    x, w, b = _floats(xs, rng, specials=True), _floats(ws, rng), _floats((ws[0],), rng)
    group = geom[0]
    full = [ws[0], group, ws[2], ws[3], *geom[1:]]
    attrs = dict(group=group, strides=geom[1:3], dilations=geom[3:5], pads=[geom[5], geom[6], geom[7], geom[8]])
    assert _out_pixels(x, w, attrs) < 16
    calls = []
    blas = SGEMM64(lambda *a: calls.append(a))
    real = host_blas.sgemm_address()
    address = ctypes.cast(blas, ctypes.c_void_p).value if nat.isa() in AVX512 else real
    if address is None:
        pytest.skip("no BLAS sgemm address")
    got = nat.conv_dense(x, _gemm_weights(w, group), b, full, address, 1)
    assert calls == []
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True), ("b", b, True)], **attrs)
    want = _run(k, p, args, "reference")
    ka, pa, aa = _prepared("Conv", [("x", np.abs(x), False), ("w", np.abs(w), True)], **attrs)
    bound = 2 * ws[1] * ws[2] * ws[3] * EPS * _run(ka, pa, aa, "reference") + EPS * np.abs(b)[:, None, None]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want) & np.isfinite(bound)
    assert (np.abs(got[finite] - want[finite]) <= bound[finite]).all()


@pytest.mark.parametrize("threads", [1, 2])
def test_vad_convs_in_a_session(threads):
    """Silero VAD's front: the STFT conv (258 x 1 x 256, stride 128) over 640 samples (4 frames), then 1-D convs of
    kernel 3 over those frames (129 -> 128, 128 -> 64 stride 2, 64 -> 64 stride 2, 64 -> 128) with Relu, and the
    decoder's 1x1 128 -> 1: NpuEP runs every conv as a bound native step on panel-packed weights (AVX-512), within
    1e-4 of the CPU EP."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import _ep_session, python_steps
    from npu_testing import assignment, cpu_run, make_model, npu_session, session_options
    from onnx import TensorProto, helper

    rng = np.random.default_rng(34)
    layers = [(1, 258, 256, 128, 0), (129, 128, 3, 1, 1), (128, 64, 3, 2, 1), (64, 64, 3, 2, 1), (64, 128, 3, 1, 1),
              (128, 1, 1, 1, 0)]
    inits, nodes, prev = {}, [], "x"
    for i, (c, m, k, s, pad) in enumerate(layers):
        inits[f"w{i}"] = (rng.standard_normal((m, c, k)) / np.sqrt(c * k)).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(m).astype(np.float32)
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}", strides=[s],
                                      pads=[pad, pad]))
        prev = f"c{i}"
        if i == 0:  # the magnitude of the STFT's first 129 channels, as Silero slices them
            inits["lo"], inits["hi"], inits["ax"] = (np.array([v], np.int64) for v in (0, 129, 1))
            nodes.append(helper.make_node("Slice", [prev, "lo", "hi", "ax"], ["mag"], "slice"))
            prev = "mag"
        elif i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], f"relu{i}"))
            prev = f"r{i}"
    nodes[-1].output[0] = "y"
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 640])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1])], inits)
    so = session_options()
    so.intra_op_num_threads = threads
    tag_session_options(so)
    sess = npu_session(model, so=so)
    feeds = {"x": rng.standard_normal((1, 1, 640)).astype(np.float32)}
    first = sess.run(None, feeds)[0]
    for _ in range(2):
        assert sess.run(None, feeds)[0].tobytes() == first.tobytes()
    placed = assignment(sess)
    assert all(placed[f"conv{i}"] == "NpuEP" for i in range(len(layers))), placed
    assert [s for s in python_steps(sess) if s["op"] == "Conv"] == []
    convs = [st for prog in _ep_session(sess).programs.values() for st in prog.steps if st.op == "Conv"]
    on_avx512 = runtime.native_module().isa() in AVX512
    assert len(convs) == len(layers) and all(("w_panels" in st.prepared.kernel_cache) == on_avx512 for st in convs)
    np.testing.assert_allclose(first, cpu_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_every_geometry_is_under_16_pixels():
    for spatial, kernel, attrs in GEOMETRIES:
        x, w = np.zeros((1, 1, *spatial), np.float32), np.zeros((1, 1, *kernel), np.float32)
        assert 0 < _out_pixels(x, w, attrs) < 16, (spatial, kernel, attrs)

