"""Differential sweep of the native convolution kernels against the reference model (issue 38): float Conv
(kernels/native/conv.cc, conv_gemm.cc, conv_gemm_avx512.cc, conv_tail.cc) and QLinearConv / ConvInteger
(qlinear_conv.cc) over shape grids that cross every block, tile and tail boundary of each dispatch path, with special
values, on every instruction-set level the host runs; a few points against ORT's CPU EP, the spec.

Float Conv paths and their blocks (AVX-512; scalar/AVX2 levels run the same shapes on the BLAS path):
- DenseFloatOwnGemm (>= 16 output pixels): register tile of 8 output channels (kRows) x 2 slots of 16 pixels
  (kSlots), depth in passes of 256 (kKc), a lone last slot of <= 8 pixels in the channel lanes; B read in place
  from padded rows held as the width stride's column phases when OW >= 8 (a vector crossing a row end jumps over
  the padding), else a patch matrix; the output channels in
  the lanes instead (ChannelGemmAvx512, tiles of 4 x 16 channels x 6 pixels) where that takes fewer vector
  multiply-adds (small maps, Mg a multiple of 16, K >= 64); pixel blocks of
  clamp(131072 / K, 64, 4096) pixels, at least two tasks per thread when the image is worth 2^20 multiply-adds (on
  a small map whose pixel blocks would be short or uneven, blocks of output channels instead); a one-block image
  with Mg >= 32 and 2^21 multiply-adds splits its output channels in two at one thread (the M = 16j + 1 bug: M
  around 32, 48, 64 on small maps);
- PanelsFloat (any conv over < 16 output pixels, and 1x1 ones over small maps where _panels_pay; conv_panels):
  weights packed once in panels of 64 output channels ([g, panels, K, 64], zeros past Mg), one panel a task, 4
  vectors x up to 6 pixels a register tile, the sums ChannelGemmAvx512's (per 256-deep pass from zero, the passes
  added in order); a short last panel through scratch rows; B the input planes read in place by tap and pixel
  offsets (a padded conv: a zero-padded copy);
- DenseFloat on the BLAS (every conv below AVX-512); a column image [N, C, L, 1] with a kx1 kernel runs as the
  same conv along its row;
- DepthwiseFloat: DepthwiseRowsAvx512 takes 32 output columns in two registers, 16 or fewer in one, any width
  stride as column phases, kernels up to 64 taps wide (wider: the per-tap multiply-add passes);
- fused tails (conv_tail.cc): a lone clip in the GEMM's registers, any other tail over each finished block.

Tolerances: depthwise convs do the reference's float32 operations in its order (bit-exact: NaN, Inf and signed zeros
included; a fused sigmoid within conv_tail.cc's 2 ulp). Dense convs sum each output in another order than
numpy's BLAS: both are within the float32 dot-product bound K * eps * sum|x * w| of the exact sum, so they are held
to 2 K eps sum|x * w| of each other (the reference run on |x| and |w| gives that sum), plus |bias| eps; where a
special value reaches a sum, NaN must be where the reference has NaN and infinities equal (the finite rest within
the bound). QLinearConv and ConvInteger sum integers
exactly and requantize as MLAS does: bit-exact.

The default run takes a sample of each grid; ``-m slow`` runs the whole grids."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _single_op import run_ort
from _sweep import around, assert_matches, ints_with_extremes, native_calls, node_model
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.tail_program import CODES
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.conv import _panels_pay
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")
EPS = np.finfo(np.float32).eps
FLOAT_ISAS = host_isas(top="avx512")  # the float conv kernels have no path above AVX-512


@pytest.fixture(params=FLOAT_ISAS)
def float_isa(request):
    yield from cap_isa(request.param)


def _prepared(op: str, inputs, tail=None, slopes=None, **attrs):
    """(kernel, prepared, run args) of one node; ``tail``: a fused conv tail [(code name, c0, c1), ...];
    ``slopes``: per output channel, the tail's first instruction's constant (a folded per-channel PRelu)."""
    m = node_model(op, inputs, **attrs)
    (node,) = nodes_from_model(m)
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, REF)
    if tail:
        p.consts["tail_codes"] = np.asarray([CODES[t[0]] for t in tail], np.int32)
        p.consts["tail_c"] = np.asarray([t[1:] for t in tail], np.float32).reshape(-1, 2)
    if slopes is not None:
        p.consts["tail_slopes"], p.attrs["tail_channel_at"] = np.asarray(slopes, np.float32), 0
    feeds = {s[0]: s[1] for s in inputs if not s[2]}
    return k, p, [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]


def _run(k, p, args, kernels: str, threads: int = 1) -> np.ndarray:
    runtime.configure([p], kernels, threads)
    with np.errstate(all="ignore"):
        return k.run(p, args)[0]


def _native_and_reference(op: str, inputs, native_fn: str, tail=None, threads: int = 1, slopes=None, **attrs):
    """(native output, reference output) of one node; the native function ``native_fn`` must have run."""
    k, p, args = _prepared(op, inputs, tail, slopes, **attrs)
    with native_calls() as calls:
        got = _run(k, p, args, "native", threads)
    assert native_fn in calls, f"{op} {attrs}: the native {native_fn} did not run ({calls})"
    return got, _run(k, p, args, "reference")


# --- float Conv ---------------------------------------------------------------------------------------------------
def _float_conv(x, w, b=None, *, native_fn: str = "conv_dense", threads: int = 1, tail=None, slopes=None, **attrs):
    """The conv native vs reference within the dot-product bound (module docstring); returns the native output."""
    inputs = [("x", x, False), ("w", w, True)] + ([("b", b, True)] if b is not None else [])
    if native_fn == "conv_dense" and _panels_path(x, w, attrs):
        native_fn = "conv_panels"
    got, want = _native_and_reference("Conv", inputs, native_fn, tail, threads, slopes, **attrs)
    label = f"Conv x{list(x.shape)} w{list(w.shape)} {attrs} tail={tail}"
    if native_fn == "conv_depthwise" and tail and any(t[0] == "sigmoid" for t in tail):
        # the tail's sigmoid: exp in lanes within 2 ulp of numpy's (conv_tail.cc), so a few float32 roundings
        assert_matches(got, want, exact=False, rtol=8 * 2.0 ** -23, atol=1e-37, what=label)
        return got
    if native_fn == "conv_depthwise":
        assert_matches(got, want, exact=True, what=label)
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]), label)
        return got
    assert got.shape == want.shape and got.dtype == want.dtype, label
    abs_inputs = [("x", np.abs(x), False), ("w", np.abs(w), True)]
    k, p, args = _prepared("Conv", abs_inputs, **attrs)
    k_depth = w.shape[1] * int(np.prod(w.shape[2:]))
    bound = 2 * k_depth * EPS * _run(k, p, args, "reference")
    if b is not None:
        bound = bound + EPS * np.abs(b).reshape(1, -1, *([1] * (x.ndim - 2)))
    if tail:  # a tail scales the error by at most its constants' size (mul, div by >= 1 here, sigmoid's slope < 1)
        bound = bound * 4 + 1e-6
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), label)
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), label)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), label)
    finite = np.isfinite(want) & np.isfinite(bound)
    excess = np.abs(got[finite] - want[finite]) - bound[finite]
    assert (excess <= 0).all(), f"{label}: {excess.max()} over the bound"
    return got


def _out_pixels(x, w, attrs) -> int:
    """Output pixels per image of the conv (explicit pads)."""
    dims = x.ndim - 2
    pads = attrs.get("pads", [0] * 2 * dims)
    strides, dil = attrs.get("strides", [1] * dims), attrs.get("dilations", [1] * dims)
    sizes = [x.shape[2 + i] + pads[i] + pads[i + dims] - (w.shape[2 + i] - 1) * dil[i] for i in range(dims)]
    return int(np.prod([(sizes[i] - 1) // strides[i] + 1 for i in range(dims)]))


def _panels_path(x, w, attrs) -> bool:
    """Whether the conv runs on ``conv_panels`` (AVX-512, where ``_panels_pay``: under 16 output pixels, or a 1x1,
    stride-1, unpadded conv on a small map)."""
    plain = all(v == 0 for v in attrs.get("pads", [0])) and all(v == 1 for v in attrs.get("strides", [1]))
    mg = w.shape[0] // attrs.get("group", 1)
    pointwise = w.shape[2:] in ((1, 1), (1,)) and plain
    k = w.shape[1] * int(np.prod(w.shape[2:]))
    return (_panels_pay(_out_pixels(x, w, attrs), k, mg, pointwise)
            and runtime.native_module().isa() in ("avx512", "avx512_vnni", "amx_int8"))


def _floats(shape, rng, specials: bool = False) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    if specials:
        flat = x.reshape(-1)
        where = rng.choice(flat.size, size=min(flat.size, 6), replace=False)
        flat[where] = np.resize(np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, 1e-40], np.float32), where.size)
    return x


def _sample(cases: list, n: int, seed: int) -> list:
    """A fixed sample of ``n`` cases (the default run); the slow run takes them all."""
    if len(cases) <= n:
        return cases
    idx = np.random.default_rng(seed).choice(len(cases), size=n, replace=False)
    return [cases[i] for i in sorted(idx)]


# Own GEMM: output channels around the 8-row register tile and 16; depth around one 256-deep pass (C * 3 * 3: 252,
# 261; 1x1: 255..257); output widths around the 16-pixel slot and the 32-pixel tile (in place at OW 16 and 31-32,
# a patch matrix at 15, 17, 33), one or two images, one to three groups.
DENSE_M = [1, *around(8, 16)]
DENSE_K = [(28, 3), (29, 3), (255, 1), (256, 1), (257, 1), (3, 3)]  # (C per group, kernel side)
DENSE_OW = around(16, 32)
DENSE_GRID = [(m, ck, ow, n, g) for m, ck, ow in itertools.product(DENSE_M, DENSE_K, DENSE_OW)
              for n, g in ((1, 1), (2, 1), (1, 2), (1, 3))]


def _dense_case(m, ck, ow, n, g, rng, specials=False, stride=1):
    (cg, side) = ck
    pad = side // 2
    x = _floats((n, cg * g, 3, (ow - 1) * stride + 1), rng, specials)
    w = _floats((m * g, cg, side, side), rng)
    b = _floats((m * g,), rng)
    return _float_conv(x, w, b, group=g, pads=[pad] * 4, strides=[1, stride])


@pytest.mark.parametrize("case", _sample(DENSE_GRID, 24, 1))
def test_float_dense_tiles_depth_and_widths(float_isa, case):
    _dense_case(*case, np.random.default_rng(hash(case) % 2**32))


@pytest.mark.slow
def test_float_dense_tiles_depth_and_widths_wide(float_isa):
    for case in DENSE_GRID:  # one test: collecting the grid case by case cost the default run seconds
        _dense_case(*case, np.random.default_rng(hash(case) % 2**32))


# Strided (a patch matrix at any width: sw = 2) and dilated convs over widths around the tile, with specials.
@pytest.mark.parametrize("ow", around(16, 32))
@pytest.mark.parametrize("attrs", [dict(strides=[2, 2], pads=[1, 1, 1, 1]), dict(dilations=[2, 3], pads=[2, 3, 2, 3]),
                                   dict(strides=[1, 3], dilations=[2, 1], pads=[0, 1, 2, 1])])
def test_float_dense_strided_and_dilated_with_specials(float_isa, ow, attrs):
    rng = np.random.default_rng(ow)
    sw = attrs.get("strides", [1, 1])[1]
    x = _floats((1, 5, 7, ow * sw), rng, specials=True)
    w = _floats((9, 5, 3, 3), rng)
    _float_conv(x, w, _floats((9,), rng), **attrs)


# Pixel blocks: P around the block cap clamp(131072 / K, 64, 4096) (K = 9: 4096 pixels, 64 x 64 rows; K = 2304:
# 64) and the two-block split of a worth-two-threads image (P >= 128); same bits at 1 and 3 threads.
@pytest.mark.parametrize("shape", [((1, 1, 64, 64), (4, 1, 3, 3)), ((1, 1, 65, 64), (4, 1, 3, 3)),
                                   ((1, 256, 8, 8), (16, 256, 3, 3)), ((1, 256, 8, 9), (16, 256, 3, 3)),
                                   ((1, 64, 11, 12), (40, 64, 3, 3)), ((1, 64, 12, 11), (40, 64, 3, 3))])
def test_float_dense_pixel_blocks(float_isa, shape):
    rng = np.random.default_rng(7)
    x, w = _floats(shape[0], rng), _floats(shape[1], rng)
    one = _float_conv(x, w, pads=[1, 1, 1, 1])
    three = _float_conv(x, w, threads=3, pads=[1, 1, 1, 1])
    assert one.tobytes() == three.tobytes()


# In-place rows: output widths around the 8-pixel limit (a patch matrix below it), the 16-pixel vector and the
# 32-pixel tile, where vectors cross from one output row into the next (the jump over the padding columns) or stop
# short of a third row; width strides 1..3 as column phases (2: the even/odd split, 32 floats a step), height
# strides, dilations and a 6x6 stride-2 stem; depth around one 256-deep pass (28 * 9 = 252, 29 * 9 = 261); output
# channels around the 8-row tile. Same bits at 1 and 2 threads (the pixel blocks follow the thread count).
ROWS_GRID = [(ow, sw, sh, dil, k, m, cg) for ow in (*around(8, 16, 32), 56)
             for sw, sh in ((1, 1), (2, 2), (3, 1), (1, 2)) for dil, k in ((1, 3), (2, 3), (1, 6))
             for m, cg in ((9, 29), (16, 3), (7, 28))]


def _rows_case(ow, sw, sh, dil, k, m, cg, threads=1):
    rng = np.random.default_rng(ow * 1000 + sw * 100 + sh * 10 + dil + k + m)
    pad = (k - 1) * dil // 2
    w_in = (ow - 1) * sw + (k - 1) * dil + 1 - 2 * pad
    x = _floats((1, cg, 2 * sh + (k - 1) * dil + 1 - 2 * pad + 3, w_in), rng, specials=ow % 2 == 0)
    return _float_conv(x, _floats((m, cg, k, k), rng), _floats((m,), rng), threads=threads, strides=[sh, sw],
                       dilations=[dil, dil], pads=[pad] * 4)


@pytest.mark.parametrize("case", _sample(ROWS_GRID, 24, 4))
def test_float_dense_in_place_rows_and_phases(float_isa, case):
    _rows_case(*case)


@pytest.mark.slow
def test_float_dense_in_place_rows_and_phases_wide(float_isa):
    for case in ROWS_GRID:  # one test: collecting the grid case by case cost the default run seconds
        _rows_case(*case)


# Width stride 2: the columns whose both phases lie inside the input split in place, the edge columns one by one;
# left pads 0 to 3, odd and even widths, a right edge the kernel never reaches.
@pytest.mark.parametrize("width", [16, 17, 33, 34])
@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 0, 0, 1], [0, 3, 1, 0], [2, 2, 2, 2]])
def test_float_dense_stride2_phase_edges(float_isa, width, pads):
    rng = np.random.default_rng(width + sum(pads))
    x = _floats((1, 4, 7, width), rng, specials=True)
    _float_conv(x, _floats((8, 4, 3, 3), rng), _floats((8,), rng), strides=[2, 2], pads=pads)


# Output channels in the lanes (ChannelGemmAvx512: small maps whose rows fill pixel vectors badly, Mg a multiple
# of 16, K >= 64): 1 to 5 vectors of 16 channels (the 4-vector pass and its tail), pixel counts crossing the 6-pixel
# tile, depth around one 256-deep pass, a bias and a fused clip.
CHANNEL_GRID = [(m, ck, hw) for m in (16, 32, 48, 64, 80) for ck in ((8, 3), (29, 3), (64, 1))
                for hw in ((8, 8), (3, 10), (4, 9), (2, 11))]


def _channel_case(m, ck, hw):
    cg, side = ck
    rng = np.random.default_rng(m + cg + hw[1])
    x = _floats((1, cg, *hw), rng, specials=m == 48)
    w = _floats((m, cg, side, side), rng)
    pads = [side // 2] * 4
    _float_conv(x, w, _floats((m,), rng), pads=pads, strides=[1, 1 + (hw[0] == 2)])
    _float_conv(x, w, _floats((m,), rng), tail=[("clip", 0.0, 6.0)], pads=pads)


@pytest.mark.parametrize("case", _sample(CHANNEL_GRID, 12, 5))
def test_float_dense_channels_in_lanes(float_isa, case):
    _channel_case(*case)


@pytest.mark.slow
def test_float_dense_channels_in_lanes_wide(float_isa):
    for case in CHANNEL_GRID:  # one test: collecting the grid case by case cost the default run seconds
        _channel_case(*case)


# One vector of 16 channels against the pixel GEMM over split slots (rows of 7..15 pixels): near the choice's
# border either way, with a bias and a fused clip.
@pytest.mark.parametrize("cg,hw", [(16, (8, 8)), (16, (12, 12)), (16, (14, 14)), (16, (7, 7)), (29, (9, 11)),
                                   (64, (7, 7)), (8, (8, 8))])
def test_float_dense_one_channel_vector_on_small_maps(float_isa, cg, hw):
    rng = np.random.default_rng(cg + hw[1])
    x = _floats((1, cg, *hw), rng, specials=True)
    w = _floats((16, cg, 3, 3), rng)
    _float_conv(x, w, _floats((16,), rng), pads=[1, 1, 1, 1])
    _float_conv(x, w, _floats((16,), rng), tail=[("clip", 0.0, 6.0)], pads=[1, 1, 1, 1])


# Worth two threads (P * K * Mg >= 2^20): the image splits into at least two tasks per thread, so the tasks differ
# between 1, 2 and 3 threads; every output's bits must not. Pixel blocks where they come out even (56x56, 48x48);
# on small maps whose pixel blocks would be short or uneven (PP-LCNet's 28x28, 14x14 and 7x7 1x1 convs) the output
# channels instead: whole 16-row vectors (the channels in the lanes at 7x7) or 8-row tiles with a short last block
# (Mg 40, 72), one or two images.
@pytest.mark.parametrize("xs,ws,attrs", [((1, 32, 56, 56), (32, 32, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((1, 3, 96, 90), (16, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
                                         ((2, 16, 20, 21), (24, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((1, 16, 48, 48), (32, 16, 1, 1), {}),
                                         ((1, 64, 28, 28), (128, 64, 1, 1), {}),
                                         ((1, 128, 14, 14), (256, 128, 1, 1), {}),
                                         ((1, 256, 7, 7), (512, 256, 1, 1), {}),
                                         ((1, 400, 7, 7), (64, 400, 1, 1), {}),
                                         ((2, 128, 9, 9), (40, 128, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((1, 64, 14, 13), (72, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((1, 144, 10, 10), (64, 144, 3, 3), dict(strides=[2, 1], pads=[1, 1, 1, 1]))])
def test_float_dense_bits_do_not_depend_on_threads(float_isa, xs, ws, attrs):
    rng = np.random.default_rng(11)
    x, w = _floats(xs, rng), _floats(ws, rng)
    one = _float_conv(x, w, **attrs)
    for threads in (2, 3):
        assert one.tobytes() == _float_conv(x, w, threads=threads, **attrs).tobytes(), threads


# The small map's output-channel split (one pixel block, Mg >= 32, P * K * Mg >= 2^21): M around 32, 48 and 64 and
# their 16j + 1 (issue 38, item 1), maps 6x6 to 9x9; every channel within the bound, none left unwritten.
SPLIT_GRID = [(m, side) for m in (*around(32, 48, 64), 81, 97, 129) for side in (6, 7, 8, 9)]


def _split_case(m, side):
    rng = np.random.default_rng(m * 10 + side)
    c = 128 if m < 48 else 64
    x, w = _floats((1, c, side, side), rng), _floats((m, c, 3, 3), rng)
    got = _float_conv(x, w, threads=2, pads=[1, 1, 1, 1])
    assert np.isfinite(got).all()


@pytest.mark.parametrize("case", _sample(SPLIT_GRID, 10, 2))
def test_float_small_map_channel_split(float_isa, case):
    _split_case(*case)


@pytest.mark.slow
def test_float_small_map_channel_split_wide(float_isa):
    for case in SPLIT_GRID:  # one test: collecting the grid case by case cost the default run seconds
        _split_case(*case)


# Pointwise over < 16 pixels: output channels around the 16-channel vector, the 64-channel panel and two panels,
# input channels around the 256-deep pass; pixel counts 1..15 (the 6-pixel tile and its rest; 16: the pixel GEMM).
@pytest.mark.parametrize("m", around(16, 64, 128))
@pytest.mark.parametrize("c,pixels", [(255, (1, 1)), (256, (3, 5)), (257, (1, 15)), (8, (4, 4))])
def test_float_pointwise_few_pixels(float_isa, m, c, pixels):
    rng = np.random.default_rng(m + c)
    x = _floats((1, c, *pixels), rng, specials=m % 2 == 1)
    _float_conv(x, _floats((m, c, 1, 1), rng), _floats((m,), rng))


# Pointwise over < 16 pixels with more than two panels a group: Mg around the 16-channel vector (a short last
# panel), K around the 256-deep pass, pixels 1..15, images and groups, the panels split over 1 to 3 threads with the
# same bits.
STREAM_GRID = [(m, c, pixels, ng) for m in (129, *around(144), 1280) for c in (1, 3, 6, 255, 256, 257, 513)
               for pixels in ((1, 1), (3, 5), (1, 15)) for ng in ((1, 1), (2, 1), (1, 2), (2, 3))
               if c > 1 or ng[1] == 1]  # one input channel a group is a depthwise conv


def _stream_case(m, c, pixels, ng):
    n, g = ng
    rng = np.random.default_rng(m * 7 + c)
    x = _floats((n, c * g, *pixels), rng, specials=c % 2 == 1)
    w, b = _floats((m * g, c, 1, 1), rng), _floats((m * g,), rng)
    one = _float_conv(x, w, b, group=g)
    for threads in (2, 3):
        assert one.tobytes() == _float_conv(x, w, b, threads=threads, group=g).tobytes(), threads


@pytest.mark.parametrize("case", _sample(STREAM_GRID, 12, seed=8))
def test_float_pointwise_stream(float_isa, case):
    _stream_case(*case)


@pytest.mark.slow
def test_float_pointwise_stream_wide(float_isa):
    for case in STREAM_GRID:
        _stream_case(*case)


# Pointwise over small maps of 16..127 pixels where the panels pay (_panels_pay: a 7x7 map's 49 pixels): pixels
# around the 6-pixel register tile and the 16-pixel slot, Mg around the 64-channel panel (a short last one), K
# around the 256-deep pass, images and groups, 1 to 3 threads with the same bits; the rule's own boundary.
PANEL_MAP_GRID = [(m, c, hw, ng) for m in (48, 64, 80, 512) for c in (64, 255, 256, 257, 512)
                  for hw in ((4, 4), (5, 5), (7, 7), (3, 11), (8, 8)) for ng in ((1, 1), (2, 1), (1, 2))
                  if _panels_pay(hw[0] * hw[1], c, m)]


def _panel_map_case(m, c, hw, ng):
    n, g = ng
    rng = np.random.default_rng(m + c + hw[1])
    x = _floats((n, c * g, *hw), rng, specials=c % 2 == 1)
    w, b = _floats((m * g, c, 1, 1), rng), _floats((m * g,), rng)
    one = _float_conv(x, w, b, group=g)
    for threads in (2, 3):
        assert one.tobytes() == _float_conv(x, w, b, threads=threads, group=g).tobytes(), threads


@pytest.mark.parametrize("case", _sample(PANEL_MAP_GRID, 12, seed=32))
def test_float_pointwise_panels_on_small_maps(float_isa, case):
    _panel_map_case(*case)


@pytest.mark.slow
def test_float_pointwise_panels_on_small_maps_wide(float_isa):
    for case in PANEL_MAP_GRID:
        _panel_map_case(*case)


def test_panels_pay_where_the_lanes_fill_vectors_better():
    """7x7 maps of PP-LCNet's widths take the panels, 14x14 and shallow or ragged convs the pixel GEMM."""
    assert all(_panels_pay(49, k, m) for k, m in ((256, 512), (512, 512), (512, 128), (128, 512)))
    assert all(_panels_pay(p, 512, 1280) for p in range(1, 16))
    assert not any(_panels_pay(*a) for a in ((196, 256, 256), (49, 32, 64), (49, 256, 24), (128, 256, 256),
                                             (0, 256, 256)))


# Non-pointwise convs over < 16 output pixels (conv_panels on AVX-512, the BLAS below; more in
# test_sweep_conv_panels.py) and a column image's kx1 conv along L (L around 16 and 32).
@pytest.mark.parametrize("xs,ws,attrs", [((1, 6, 3, 4), (5, 6, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((2, 4, 5, 5), (8, 2, 2, 2), dict(group=2, strides=[2, 2])),
                                         ((1, 3, 2, 2), (4, 3, 1, 1), dict(pads=[1, 0, 0, 1]))])
def test_float_few_pixels_not_pointwise(float_isa, xs, ws, attrs):
    rng = np.random.default_rng(3)
    _float_conv(_floats(xs, rng, specials=True), _floats(ws, rng), **attrs)


@pytest.mark.parametrize("length", around(16, 32))
@pytest.mark.parametrize("ws,attrs", [((8, 6, 5, 1), dict(pads=[2, 0, 2, 0])), ((4, 6, 3, 1), dict(strides=[2, 1]))])
def test_float_column_image(float_isa, length, ws, attrs):
    rng = np.random.default_rng(length)
    _float_conv(_floats((2, 6, length, 1), rng, specials=True), _floats(ws, rng), **attrs)


# Depthwise: output widths around the 16- and 32-column register steps, width strides 1..3 (column phases), height
# strides, dilations, a depth multiplier, kernels 64 and 65 taps wide (the register kernel's limit), with specials.
DEPTHWISE_GRID = [(ow, sw, sh, dil, mult) for ow in around(16, 32) for sw in (1, 2, 3) for sh in (1, 2)
                  for dil in (1, 2) for mult in (1, 2)]


def _depthwise_case(ow, sw, sh, dil, mult):
    rng = np.random.default_rng(ow * 100 + sw * 10 + sh + dil + mult)
    k = 3
    w_in = (ow - 1) * sw + (k - 1) * dil + 1 - 2
    x = _floats((1, 3, 9, w_in), rng, specials=True)
    w = _floats((3 * mult, 1, k, k), rng)
    w.reshape(-1)[0] = 0.0  # 0 * Inf = NaN where an Inf meets it, as in the reference
    _float_conv(x, w, _floats((3 * mult,), rng), native_fn="conv_depthwise", group=3, strides=[sh, sw],
                dilations=[dil, dil], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("case", _sample(DEPTHWISE_GRID, 16, 3))
def test_float_depthwise_widths_strides_dilations(float_isa, case):
    _depthwise_case(*case)


@pytest.mark.slow
def test_float_depthwise_widths_strides_dilations_wide(float_isa):
    for case in DEPTHWISE_GRID:  # one test: collecting the grid case by case cost the default run seconds
        _depthwise_case(*case)


@pytest.mark.parametrize("kw", [63, 64, 65])
def test_float_depthwise_kernel_width_limit(float_isa, kw):
    rng = np.random.default_rng(kw)
    x = _floats((1, 2, 3, 80), rng, specials=True)
    _float_conv(x, _floats((2, 1, 1, kw), rng), native_fn="conv_depthwise", group=2, pads=[0, 3, 0, 3])


# Fused tails: a lone clip (in the GEMM's registers), other tails over each finished block (dense and depthwise).
TAILS = [[("clip", 0.0, np.inf)], [("clip", -1.0, 1.0)], [("mul", 0.5, 0.0), ("add", 1.0, 0.0)],
         [("save", 0.0, 0.0), ("sigmoid", 0.0, 0.0), ("mul_saved", 0.0, 0.0)],
         [("add", 3.0, 0.0), ("clip", 0.0, 6.0), ("div", 6.0, 0.0)],
         [("save", 0.0, 0.0), ("mul", 1 / 6, 0.0), ("add", 0.5, 0.0), ("clip", 0.0, 1.0), ("mul_saved", 0.0, 0.0)]]


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("shape", [((1, 5, 6, 17), (9, 5, 3, 3), 1, "conv_dense"),
                                   ((1, 300, 2, 3), (70, 300, 1, 1), 1, "conv_dense"),
                                   ((1, 4, 7, 33), (4, 1, 3, 3), 4, "conv_depthwise")])
def test_float_fused_tails(float_isa, tail, shape):
    xs, ws, g, fn = shape
    rng = np.random.default_rng(len(tail))
    pads = [0, 0, 0, 0] if ws[2] == 1 else [1, 1, 1, 1]
    _float_conv(_floats(xs, rng, specials=True), _floats(ws, rng), _floats((ws[0],), rng), native_fn=fn,
                tail=tail, group=g, pads=pads)


@pytest.mark.parametrize("tail", TAILS)
def test_float_pointwise_stream_tails(float_isa, tail):
    """A fused tail (a lone clip too) and per-channel slopes over a few pixels' finished panels."""
    rng = np.random.default_rng(5)
    x, w, b = _floats((2, 520, 1, 3), rng, specials=True), _floats((290, 260, 1, 1), rng), _floats((290,), rng)
    _float_conv(x, w, b, tail=tail, group=2)
    slopes = rng.uniform(-0.5, 0.5, 290)
    _float_conv(x, w, b, tail=[("leaky_relu", 0.0, 0.0), *tail], slopes=slopes, group=2, threads=2)


# HardSwish fused into the own GEMM's registers (the pixel tiles, the channels in the lanes, a patch matrix, two
# depth passes) must give the bits of the conv followed by the tail's chunk interpreter, one pass per instruction.
HARD_SWISH = [("save", 0.0, 0.0), ("mul", 1 / 6, 0.0), ("add", 0.5, 0.0), ("clip", 0.0, 1.0), ("mul_saved", 0.0, 0.0)]


@pytest.mark.parametrize("xs,ws,attrs", [((1, 16, 40, 40), (32, 16, 1, 1), {}),
                                         ((1, 64, 7, 7), (64, 64, 1, 1), {}),
                                         ((1, 256, 14, 14), (256, 256, 1, 1), {}),  # a lone last slot in the lanes
                                         ((1, 300, 9, 9), (40, 300, 1, 1), {}),
                                         ((1, 8, 17, 19), (24, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((1, 6, 5, 6), (17, 6, 3, 3), dict(strides=[2, 2]))])
def test_float_dense_hard_swish_in_registers_is_the_tails_bits(float_isa, xs, ws, attrs):
    rng = np.random.default_rng(21)
    x, w, b = _floats(xs, rng, specials=True) * 3, _floats(ws, rng), _floats((ws[0],), rng)
    for threads in (1, 2):
        fused = _float_conv(x, w, b, tail=HARD_SWISH, threads=threads, **attrs)
        plain = _float_conv(x, w, b, threads=threads, **attrs)
        codes = np.asarray([CODES[t[0]] for t in HARD_SWISH], np.int32)
        consts = np.asarray([t[1:] for t in HARD_SWISH], np.float32)
        runtime.native_module().conv_tail(plain, codes, consts, 1, True)
        assert fused.tobytes() == plain.tobytes(), threads


@pytest.mark.parametrize("xs,ws,attrs", [((1, 128, 8, 8), (33, 128, 3, 3), dict(pads=[1, 1, 1, 1])),
                                         ((2, 6, 9, 20), (6, 1, 5, 5), dict(group=6, strides=[1, 2], pads=[2] * 4)),
                                         ((1, 300, 1, 3), (130, 300, 1, 1), dict())])
def test_float_conv_native_against_the_cpu_ep(float_isa, xs, ws, attrs):
    """ORT's CPU EP is the spec: three dispatch paths within 1e-4 of it."""
    rng = np.random.default_rng(9)
    x, w = _floats(xs, rng), _floats(ws, rng)
    got = _float_conv(x, w, native_fn="conv_depthwise" if attrs.get("group") else "conv_dense", **attrs)
    inputs = [("x", x, False), ("w", w, True)]
    np.testing.assert_allclose(got, run_ort(node_model("Conv", inputs, **attrs), inputs)[0], rtol=1e-4, atol=1e-4)


# --- QLinearConv / ConvInteger ------------------------------------------------------------------------------------
def _qlinear(xs, ws, dtx, dtw, rng, y_scale=None, threads=1, **attrs):
    """QLinearConv native vs reference, bit-exact; per-channel weight scales and zero points."""
    x, w = ints_with_extremes(xs, dtx, rng), ints_with_extremes(ws, dtw, rng)
    m = ws[0]
    ix, iw = np.iinfo(dtx), np.iinfo(dtw)
    wz = rng.integers(iw.min, iw.max + 1, m).astype(dtw) if dtw == np.uint8 else np.zeros(m, dtw)
    k = ws[1] * int(np.prod(ws[2:]))
    inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True),
              ("xz", np.array(ix.max if dtx == np.uint8 else ix.min, dtx), True), ("w", w, True),
              ("ws", rng.uniform(0.002, 0.01, m).astype(np.float32), True), ("wz", wz, True),
              ("ys", np.array(y_scale or 0.05 * np.sqrt(k), np.float32), True), ("yz", np.array(3, dtx), True),
              ("b", rng.integers(-5000, 5000, m).astype(np.int32), True)]
    fn = "qlinear_conv"
    got, want = _native_and_reference("QLinearConv", inputs, fn, threads=threads, **attrs)
    assert_matches(got, want, exact=True, what=f"QLinearConv x{xs} w{ws} {attrs}")
    return got, inputs


def _conv_integer(xs, ws, rng, threads=1, **attrs):
    x, w = ints_with_extremes(xs, np.uint8, rng), ints_with_extremes(ws, np.uint8, rng)
    inputs = [("x", x, False), ("w", w, True), ("xz", np.array(rng.integers(0, 256), np.uint8), True),
              ("wz", np.array(255, np.uint8), True)]
    got, want = _native_and_reference("ConvInteger", inputs, "conv_integer", threads=threads, **attrs)
    assert_matches(got, want, exact=True, what=f"ConvInteger x{xs} w{ws} {attrs}")
    return got, inputs


# Dense integer convs: channels per group around the 4-channel quad (one int32 lane of the int8 GEMM), output
# channels around its 8-row tile and 16, output widths around the 16-pixel packed block and the 32-column task,
# groups; kp (the packed depth) crosses 64 with C/g * 9 around 64.
QLINEAR_GRID = [(cg, m, ow, g) for cg in (1, 3, 4, 5, 7, 8, 9) for m in (1, *around(8, 16)) for ow in around(16, 32)
                for g in (1, 2)]


def _qlinear_case(cg, m, ow, g, dtx=np.uint8, dtw=np.int8):
    rng = np.random.default_rng(cg * 1000 + m * 10 + ow + g)
    xs = (1, cg * g, 4, ow)
    if cg == 1 and g == 1:
        xs = (2, 1, 4, ow)
    _qlinear(xs, (m * g, cg, 3, 3), dtx, dtw, rng, group=g, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("case", _sample(QLINEAR_GRID, 18, 4))
def test_qlinearconv_dense_quads_rows_and_pixel_blocks(isa, case):
    _qlinear_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("dtx,dtw", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
def test_qlinearconv_dense_quads_rows_and_pixel_blocks_wide(isa, dtx, dtw):
    for case in QLINEAR_GRID:  # one test per type pair: collecting the grid case by case cost the default run time
        _qlinear_case(*case, dtx, dtw)


# Depthwise (one channel per group), multipliers 1 and 2, widths around 16 and 32, strides and dilations; the
# packed chunk (clamp(256 KiB / kp, 64, 1024) pixels, two when a one-group image is worth two threads): pixel counts
# around 64 and 1024.
@pytest.mark.parametrize("ow", around(16, 32))
@pytest.mark.parametrize("attrs", [dict(strides=[1, 1]), dict(strides=[2, 2]), dict(dilations=[2, 2], strides=[1, 3])])
def test_qlinearconv_depthwise(isa, ow, attrs):
    rng = np.random.default_rng(ow)
    sw = attrs["strides"][1]
    for mult in (1, 2):
        _qlinear((1, 4, 7, ow * sw), (4 * mult, 1, 3, 3), np.uint8, np.uint8, rng, group=4, pads=[1, 1, 1, 1],
                 **attrs)


@pytest.mark.parametrize("pixels", [(8, 8), (1, 63), (1, 65), (32, 32), (33, 32)])
def test_qlinearconv_packed_chunks_same_bits_at_any_thread_count(isa, pixels):
    rng = np.random.default_rng(pixels[1])
    one, _ = _qlinear((1, 16, *pixels), (24, 16, 3, 3), np.uint8, np.int8, rng, pads=[1, 1, 1, 1])
    rng = np.random.default_rng(pixels[1])
    three, _ = _qlinear((1, 16, *pixels), (24, 16, 3, 3), np.uint8, np.int8, rng, threads=3, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(one, three)


def test_qlinearconv_saturates_at_both_ends(isa):
    """A tiny output scale drives most outputs to the type's ends."""
    rng = np.random.default_rng(5)
    got, _ = _qlinear((1, 8, 5, 17), (9, 8, 3, 3), np.uint8, np.int8, rng, y_scale=1e-3, pads=[1, 1, 1, 1])
    assert (got == 0).any() and (got == 255).any()


@pytest.mark.parametrize("cg,m,ow", [(c, m, ow) for c in (1, 3, 4, 5) for m in (1, 8, 9) for ow in (15, 16, 17, 33)])
def test_conv_integer_quads_rows_and_widths(isa, cg, m, ow):
    _conv_integer((1, cg, 5, ow), (m, cg, 3, 3), np.random.default_rng(cg * 100 + m + ow), pads=[1, 1, 1, 1])


def test_integer_convs_against_the_cpu_ep():
    """Integer sums are exact: the CPU EP's bits (uint8 x and w, what its ConvInteger and QLinearConv take)."""
    rng = np.random.default_rng(6)
    got, inputs = _conv_integer((1, 5, 6, 17), (9, 5, 3, 3), rng, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(got, run_ort(node_model("ConvInteger", inputs, pads=[1, 1, 1, 1]), inputs)[0])
    got, inputs = _qlinear((1, 5, 6, 33), (9, 5, 3, 3), np.uint8, np.uint8, rng, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(got, run_ort(node_model("QLinearConv", inputs, pads=[1, 1, 1, 1]), inputs)[0])


@pytest.mark.parametrize("bias", [2**31 - 50, -(2**31) + 50])
def test_qlinearconv_bias_wraps_in_int32(isa, bias):
    """A bias at the int32 ends: the sum wraps as int32 hardware (qlinear_conv.cc, as the reference's int32 add)."""
    rng = np.random.default_rng(8)
    m = 9
    inputs = [("x", ints_with_extremes((1, 5, 4, 17), np.uint8, rng), False), ("xs", np.array(0.02, np.float32), True),
              ("xz", np.array(128, np.uint8), True), ("w", ints_with_extremes((m, 5, 3, 3), np.int8, rng), True),
              ("ws", np.full(m, 0.004, np.float32), True), ("wz", np.zeros(m, np.int8), True),
              ("ys", np.array(1e-6, np.float32), True), ("yz", np.array(128, np.uint8), True),
              ("b", np.full(m, bias, np.int32), True)]
    got, want = _native_and_reference("QLinearConv", inputs, "qlinear_conv", pads=[1, 1, 1, 1])
    assert_matches(got, want, exact=True, what=f"bias {bias}")
    assert (got == 0).any() and (got == 255).any()  # wrapped sums of both signs


@pytest.mark.parametrize("y_scale", [0.0, 1e-45])  # an infinite multiplier: 0 * inf is NaN, the rest saturate
def test_qlinearconv_nan_requantization_gives_the_lowest_code_as_ort(isa, y_scale):
    """The scalar and AVX2 epilogues shared the VNNI one's clip only in int8_gemm.cc: QLinearConv's own copy cast a
    NaN (a zero sum times an infinite multiplier) to an integer (undefined; 0 here) where ORT and the AVX-512 path
    give the lowest code. Both now call int8_gemm.h's Requantize."""
    rng = np.random.default_rng(11)
    xs, ws = (1, 3, 6, 6), (8, 3, 3, 3)
    x = np.zeros(xs, np.int8)  # every sum is 0 (x_zp = 0): int8, whose lowest code is not a cast NaN's low byte
    inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True), ("xz", np.array(0, np.int8), True),
              ("w", ints_with_extremes(ws, np.int8, rng), True), ("ws", np.full(8, 0.01, np.float32), True),
              ("wz", np.zeros(8, np.int8), True), ("ys", np.array(y_scale, np.float32), True),
              ("yz", np.array(3, np.int8), True)]
    with np.errstate(all="ignore"):
        got, want = _native_and_reference("QLinearConv", inputs, "qlinear_conv", pads=[1, 1, 1, 1])
        ort = run_ort(node_model("QLinearConv", inputs, pads=[1, 1, 1, 1]), inputs)[0]
    np.testing.assert_array_equal(got, ort)
    np.testing.assert_array_equal(want, ort)
    assert (got == -128).all()  # the lowest int8 code


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hw", [(1, 1), (2, 3), (7, 7)])
def test_pointwise_panels_in_a_session(threads, hw):
    """PP-LCNet's 1x1-map convs (an SE block's 512 -> 128 + Relu and 128 -> 512 + HardSigmoid, the head's 512 -> 1280
    + HardSwish) in a session, and the same on a 7x7 map: NpuEP runs them as bound native steps on panel-packed
    weights, within 1e-4 of the CPU EP."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import _ep_session, python_steps
    from npu_testing import assignment, cpu_run, make_model, npu_session, session_options
    from onnx import TensorProto, helper

    rng = np.random.default_rng(32)
    inits = {}
    nodes = []
    prev = "x"
    for i, (c, m, act) in enumerate([(512, 128, "Relu"), (128, 512, "HardSigmoid"), (512, 1280, "HardSwish")]):
        inits[f"w{i}"] = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(m).astype(np.float32)
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}"),
                  helper.make_node(act, [f"c{i}"], [f"a{i}"], f"act{i}")]
        prev = f"a{i}"
    nodes[-1].output[0] = "y"
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, *hw])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1280, *hw])], inits)
    so = session_options()
    so.intra_op_num_threads = threads
    tag_session_options(so)
    sess = npu_session(model, so=so)
    feeds = {"x": rng.standard_normal((1, 512, *hw)).astype(np.float32)}
    first = sess.run(None, feeds)[0]
    for _ in range(2):
        assert sess.run(None, feeds)[0].tobytes() == first.tobytes()
    placed = assignment(sess)
    assert all(placed[f"conv{i}"] == "NpuEP" for i in range(3)), placed
    assert [s for s in python_steps(sess) if s["op"] == "Conv"] == []
    convs = [st for prog in _ep_session(sess).programs.values() for st in prog.steps if st.op == "Conv"]
    on_avx512 = runtime.native_module().isa() in ("avx512", "avx512_vnni", "amx_int8")
    assert len(convs) == 3 and all(("w_panels" in st.prepared.kernel_cache) == on_avx512 for st in convs)
    np.testing.assert_allclose(first, cpu_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
