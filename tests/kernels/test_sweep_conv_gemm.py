"""Differential sweep of the float conv's own GEMM (conv_gemm_avx512.cc's GemmAvx512) around its register tile: up
to 12 output channels a tile, M cut into ceil(M / 12) row blocks of near-equal size (so 13 rows are 7 + 6, 25 are
9 + 8 + 8), two 16-pixel slots a tile, depth passes of 256. Each output is summed in k order with fused
multiply-adds per pass whatever its row block, so the native conv is held to the dot-product bound against the
reference (test_sweep_conv's ``_float_conv``), with NaN, infinities, -0, huge values and denormals in x, and its
bits are the same at one and two threads (the output channels split between tasks by the thread count). The
channels-in-lanes kernel (ChannelGemmAvx512) copies A's 64-channel blocks into contiguous panels where M is a
multiple of 128 and at least 256 and a task has more than 12 pixels: M 256, 384 (a panel of 4 vectors) and
272 (no copy), 4x5 to 20x21 maps, strides 1-2, depth around the 256-deep pass. A task takes the lanes where they
need fewer vector multiply-adds than the pixels' tiles (M per slot and k) and A's 64-channel block is at most
2048 deep: convs on both sides of the count and of the depth; a task's lone last slot runs in the lanes (any, up to
depth 2048; a short unsplit one beyond). At stride 1 the padded rows of up to 48 columns are
built a plane per call in 16-column masked moves (longer ones by a copy a row): widths around 16, 32 and 48 padded
columns, asymmetric and wide pads, rows above and below the plane, dilation. Pixel blocks hold whole slot pairs (no lone
slot per block but the last), near-equal: maps whose blocks were odd, at one and two threads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from test_sweep_conv import _float_conv, _floats


@pytest.fixture(params=host_isas(top="avx512"))  # the float conv kernels have no path above AVX-512
def float_isa(request):
    yield from cap_isa(request.param)


# Output channels around the 12-row tile's block counts (1..4 blocks, 8 and 16 for the lanes' boundary).
GEMM_M = [1, 7, 8, 11, 12, 13, 16, 23, 24, 25, 36, 37, 49]
# (channels, output width, width stride): depth 28 * 9 = 252 and 29 * 9 = 261 around the 256-deep pass; widths
# whose 16-pixel slots cross a row end (13, 26: a split slot), fill it (16) or leave a lone last slot (40).
GEMM_SHAPES = [(28, 13, 1), (29, 26, 1), (29, 16, 2), (28, 40, 2), (3, 26, 2)]
GRID = list(itertools.product(GEMM_M, GEMM_SHAPES))
TAILS = [None, [("clip", 0.0, 6.0)],
         [("save", 0.0, 0.0), ("mul", 1 / 6, 0.0), ("add", 0.5, 0.0), ("clip", 0.0, 1.0), ("mul_saved", 0.0, 0.0)]]


def _case(m, shape, tail, threads=1):
    cg, ow, sw = shape
    rng = np.random.default_rng(m * 1000 + cg * 10 + ow + sw)
    x = _floats((1, cg, 4 * sw + 1, (ow - 1) * sw + 1), rng, specials=True)
    w = _floats((m, cg, 3, 3), rng)
    return _float_conv(x, w, _floats((m,), rng), threads=threads, tail=tail, strides=[sw, sw], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("case", GRID)
def test_gemm_row_blocks_slots_and_depth(float_isa, case):
    m, shape = case
    _case(m, shape, TAILS[(m + shape[1]) % len(TAILS)])


@pytest.mark.parametrize("m", [13, 25, 37, 64])
def test_gemm_row_blocks_same_bits_at_two_threads(float_isa, m):
    """A worth-two-threads image (P * K * M >= kMinParallelWork) whose tasks split pixels or output channels."""
    rng = np.random.default_rng(m)
    x = _floats((1, 48, 30, 30), rng, specials=True)
    w = _floats((m, 48, 3, 3), rng)
    b = _floats((m,), rng)
    one = _float_conv(x, w, b, pads=[1, 1, 1, 1])
    two = _float_conv(x, w, b, threads=2, pads=[1, 1, 1, 1])
    assert one.tobytes() == two.tobytes()


@pytest.mark.parametrize("m", [256, 272, 384])
@pytest.mark.parametrize("cg, hw, stride", [(28, 10, 1), (29, 20, 2), (32, 4, 1), (16, 7, 1)])
def test_lanes_panels(float_isa, m, cg, hw, stride):
    rng = np.random.default_rng(m + cg + hw)
    x = _floats((1, cg, hw, hw + 1), rng, specials=True)
    w = _floats((m, cg, 3, 3), rng)
    b = _floats((m,), rng)
    one = _float_conv(x, w, b, strides=[stride, stride], pads=[1, 1, 1, 1], tail=[("clip", 0.0, 6.0)])
    two = _float_conv(x, w, b, threads=2, strides=[stride, stride], pads=[1, 1, 1, 1], tail=[("clip", 0.0, 6.0)])
    assert one.tobytes() == two.tobytes()


# (M, channels, map, stride): by the count the lanes (10x10 maps: 7 slots for 100 pixels) or the pixels (20x20: 16-pixel
# slots full across row ends), 80 = a 64-channel block and a 16-channel one; depth 227 * 9 = 2043 (lanes) and
# 228 * 9 = 2052 (pixels), over one and two pixel blocks. A lone last slot (odd slot count) in the lanes: split across
# a row end (13-wide rows: 169 pixels in 11 slots), whole, or short; past depth 2048 only a short unsplit one.
LANES_CASES = [(64, 16, 10, 1), (80, 16, 20, 1), (80, 24, 10, 1), (128, 32, 20, 2), (96, 16, 20, 1),
               (32, 227, 10, 1), (32, 228, 10, 1), (48, 227, 13, 1), (48, 228, 13, 1), (32, 16, 13, 1),
               (48, 16, 20, 2), (32, 8, 14, 1), (16, 230, 14, 1)]


@pytest.mark.parametrize("case", LANES_CASES)
def test_lanes_or_pixels(float_isa, case):
    m, cg, hw, stride = case
    rng = np.random.default_rng(m * cg + hw)
    x = _floats((1, cg, hw, hw), rng, specials=True)
    w = _floats((m, cg, 3, 3), rng)
    b = _floats((m,), rng)
    kw = dict(strides=[stride, stride], pads=[1, 1, 1, 1])
    one = _float_conv(x, w, b, tail=[("clip", 0.0, 6.0)], **kw)
    two = _float_conv(x, w, b, threads=2, tail=[("clip", 0.0, 6.0)], **kw)
    assert one.tobytes() == two.tobytes()


# (width, kernel, pads [t, l, b, r], dilation): padded widths 16, 17, 32, 33, 48 (short rows) and 49 (a copy a row)
PAD_CASES = [(14, 3, [1, 1, 1, 1], 1), (15, 3, [1, 1, 1, 1], 1), (30, 3, [1, 1, 1, 1], 1), (31, 3, [1, 1, 1, 1], 1),
             (46, 3, [1, 1, 1, 1], 1), (47, 3, [1, 1, 1, 1], 1), (20, 3, [2, 0, 1, 3], 1), (9, 5, [3, 2, 3, 2], 1),
             (12, 3, [2, 2, 2, 2], 2), (17, 3, [0, 0, 0, 0], 1), (20, 1, [2, 17, 1, 1], 1)]


@pytest.mark.parametrize("case", PAD_CASES)
@pytest.mark.parametrize("m", [16, 25])
def test_stride1_padded_rows(float_isa, case, m):
    width, k, pads, dil = case
    rng = np.random.default_rng(width * 7 + k + m)
    x = _floats((1, 5, 6, width), rng, specials=True)
    w = _floats((m, 5, k, k), rng)
    b = _floats((m,), rng)
    one = _float_conv(x, w, b, pads=pads, dilations=[dil, dil])
    assert one.tobytes() == _float_conv(x, w, b, threads=2, pads=pads, dilations=[dil, dil]).tobytes()


# (channels, map, M, stride): pixel blocks of whole slot pairs, near-equal (the first ones a pair larger), the odd last
# slot the last block's, which is the first task: 64 ch on 32x32 (64 slots in 5 blocks of 14, 14, 12, 12, 12), 40x40
# (100 slots), 61x61 (233: an odd last slot), slots crossing row ends (29, 37 wide); more blocks than pairs at two
# threads (10x10 with 24 channels: 7 slots in 4 blocks of slots).
EVEN_CASES = [(64, 32, 16, 1), (64, 40, 13, 1), (64, 37, 24, 1), (48, 58, 25, 2), (80, 29, 16, 1), (64, 61, 16, 1),
              (48, 25, 16, 2), (64, 10, 24, 1)]


@pytest.mark.parametrize("case", EVEN_CASES)
def test_even_slot_blocks(float_isa, case):
    cg, hw, m, stride = case
    rng = np.random.default_rng(cg + hw + m)
    x = _floats((1, cg, hw, hw), rng, specials=True)
    w = _floats((m, cg, 3, 3), rng)
    b = _floats((m,), rng)
    kw = dict(strides=[stride, stride], pads=[1, 1, 1, 1])
    one = _float_conv(x, w, b, **kw)
    assert one.tobytes() == _float_conv(x, w, b, threads=2, **kw).tobytes()


@pytest.mark.parametrize("width", [31, 33, 35, 63, 65, 67])
def test_stride2_column_split(float_isa, width):
    """A stride-2 row's columns split into even and odd phases: 15, 16, 17, 31, 32 and 33 columns in place (whole
    16-column vectors unmasked, the last short one masked), the pad's columns around them."""
    rng = np.random.default_rng(width)
    x = _floats((1, 6, 5, width), rng, specials=True)
    w = _floats((16, 6, 3, 3), rng)
    b = _floats((16,), rng)
    kw = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    assert _float_conv(x, w, b, **kw).tobytes() == _float_conv(x, w, b, threads=2, **kw).tobytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_dense_convs_in_a_session(threads):
    """yolov8n-like 3x3 convs (stride 1 and 2, 13 and 40 output channels: 12-row blocks with short ones) + Relu in a
    session: NpuEP runs them natively, within 1e-4 of the CPU EP, the same bits on every run."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import assignment, cpu_run, make_model, npu_session, session_options
    from onnx import TensorProto, helper

    rng = np.random.default_rng(33)
    inits, nodes, prev = {}, [], "x"
    for i, (c, m, s) in enumerate([(16, 40, 2), (40, 13, 1)]):
        inits[f"w{i}"] = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(m).astype(np.float32)
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}", pads=[1, 1, 1, 1],
                                   strides=[s, s]),
                  helper.make_node("Relu", [f"c{i}"], [f"a{i}"], f"act{i}")]
        prev = f"a{i}"
    nodes[-1].output[0] = "y"
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 46, 46])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 13, 23, 23])], inits)
    so = session_options()
    so.intra_op_num_threads = threads
    tag_session_options(so)
    sess = npu_session(model, so=so)
    feeds = {"x": rng.standard_normal((1, 16, 46, 46)).astype(np.float32)}
    first = sess.run(None, feeds)[0]
    assert sess.run(None, feeds)[0].tobytes() == first.tobytes()
    placed = assignment(sess)
    assert all(placed[f"conv{i}"] == "NpuEP" for i in range(2)), placed
    assert [s for s in python_steps(sess) if s["op"] == "Conv"] == []
    np.testing.assert_allclose(first, cpu_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
