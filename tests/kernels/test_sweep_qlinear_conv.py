"""Differential sweep of QLinearConv / ConvInteger's stride-1 path that reads B straight from the padded image
(qlinear_conv.cc DenseFlat: VNNI hosts, int8 weights, every weight zero point 0) against the reference model, bit for
bit, on every instruction-set level the host runs (below VNNI the same shapes take the packed path).

Its blocks: quad planes of 4 channels (channels per group around multiples of 4, groups), register tiles of 8 weight
rows (output channels per group around 8 and 16: tiles of 8, 4, 2 and 1 rows) x 48 flat pixels, where the flat pixel
index runs over the padded width (output rows whose padded width is below, at and above 48, so a block holds several
rows, one, or part of one; the last block's tail), tasks of a few blocks on one or more threads; taps from 1x1 to 5x5,
dilations, asymmetric pads; zero points at the types' ends; int8 and uint8 inputs and outputs; the fused output table;
ConvInteger's int32 sums. ``test_sweep_conv.py`` holds the packed path's grids."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from _sweep import around, assert_matches, ints_with_extremes, native_calls, node_model
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")


def _native_and_reference(op: str, inputs, threads: int = 1, **attrs):
    m = node_model(op, inputs, **attrs)
    (node,) = nodes_from_model(m)
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, REF)
    feeds = {s[0]: s[1] for s in inputs if not s[2]}
    args = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    fn = "qlinear_conv" if op == "QLinearConv" else "conv_integer"
    with native_calls() as calls:
        runtime.configure([p], "native", threads)
        got = k.run(p, args)[0]
    assert fn in calls, f"{op} {attrs}: the native {fn} did not run ({calls})"
    runtime.configure([p], "reference", 1)
    return got, k.run(p, args)[0]


def _qlinear(xs, ws, rng, dtx=np.uint8, dty=None, xz=None, yz=3, threads=1, **attrs):
    """QLinearConv native vs reference, bit-exact; int8 weights with zero points 0, per-channel scales."""
    dty = dty or dtx
    x, w = ints_with_extremes(xs, dtx, rng), ints_with_extremes(ws, np.int8, rng)
    m, k = ws[0], ws[1] * int(np.prod(ws[2:]))
    ix = np.iinfo(dtx)
    inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True),
              ("xz", np.array(ix.max if xz is None else xz, dtx), True), ("w", w, True),
              ("ws", rng.uniform(0.002, 0.01, m).astype(np.float32), True), ("wz", np.zeros(m, np.int8), True),
              ("ys", np.array(0.05 * np.sqrt(k), np.float32), True), ("yz", np.array(yz, dty), True),
              ("b", rng.integers(-5000, 5000, m).astype(np.int32), True)]
    got, want = _native_and_reference("QLinearConv", inputs, threads, **attrs)
    assert_matches(got, want, exact=True, what=f"QLinearConv x{xs} w{ws} {dtx.__name__} {attrs}")
    return got


# channels per group around the quad, rows around the 8-row tile and 16, padded widths (W + 2) around 48 with
# 3 or 4 output rows (several rows per block, one, part of one; tails), groups
GRID = [(cg, m, w, h, g) for cg in (1, 3, 4, 5, 8, 9) for m in (1, 2, 3, *around(8, 16))
        for w in (1, 5, *around(46, 48)) for h in (3, 4) for g in (1, 2)]


def _sample(cases: list, n: int, seed: int) -> list:
    if len(cases) <= n:
        return cases
    idx = np.random.default_rng(seed).choice(len(cases), size=n, replace=False)
    return [cases[i] for i in sorted(idx)]


def _grid_case(cg, m, w, h, g, dtx=np.uint8):
    rng = np.random.default_rng(cg * 100000 + m * 1000 + w * 10 + h + g)
    _qlinear((1, cg * g, h, w), (m * g, cg, 3, 3), rng, dtx, group=g, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("case", _sample(GRID, 24, 7))
def test_flat_quads_rows_and_blocks(isa, case):
    _grid_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("dtx", [np.uint8, np.int8])
def test_flat_quads_rows_and_blocks_wide(isa, dtx):
    for case in GRID:
        _grid_case(*case, dtx)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[1, 1]), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
    dict(kernel_shape=[1, 3], pads=[0, 1, 0, 1]),
    dict(kernel_shape=[3, 1], pads=[1, 0, 1, 0]), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
    dict(kernel_shape=[3, 3], dilations=[1, 3], pads=[0, 1, 2, 0]), dict(kernel_shape=[3, 3]),
    dict(kernel_shape=[2, 2], pads=[1, 0, 0, 1]), dict(kernel_shape=[3, 3], pads=[1, 2, 1, 0]),
    dict(kernel_shape=[1, 1], pads=[1, 2, 1, 1]), dict(kernel_shape=[3, 3], pads=[0, 3, 1, 3])])
@pytest.mark.parametrize("w", [7, 49, 50])
def test_flat_taps_dilations_and_pads(isa, attrs, w):
    """A row's right pads double as the next row's left ones where the kernel's span covers the narrower side (the
    image's pitch is W + the wider pad), else the pitch holds both."""
    rng = np.random.default_rng(w)
    kh, kw = attrs["kernel_shape"]
    _qlinear((2, 6, 5, w), (11, 6, kh, kw), rng, **attrs)


# strided convs read sh x sw phase planes (sw <= 2; wider width strides take the packed path): heights and widths odd
# and even around the 48-pixel block of the phase pitch, with dilations and asymmetric pads
STRIDED = [dict(strides=[2, 2], pads=[1, 1, 1, 1]), dict(strides=[2, 2]), dict(strides=[2, 1], pads=[1, 1, 1, 1]),
           dict(strides=[1, 2], pads=[0, 1, 2, 1]), dict(strides=[3, 2], pads=[1, 0, 1, 2]),
           dict(strides=[2, 2], dilations=[2, 2], pads=[2, 2, 2, 2]), dict(strides=[3, 3], pads=[1, 1, 1, 1]),
           dict(strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[1, 1])]


@pytest.mark.parametrize("attrs", STRIDED)
@pytest.mark.parametrize("h,w", [(5, 7), (6, 94), (7, 97), (9, 98)])
def test_flat_strided_phases(isa, attrs, h, w):
    rng = np.random.default_rng(h * 100 + w)
    kh, kw = attrs.get("kernel_shape", [3, 3])
    _qlinear((1, 7, h, w), (9, 7, kh, kw), rng, **attrs)
    _qlinear((2, 4, h, w), (16, 2, kh, kw), rng, np.int8, group=2, **attrs)


@pytest.mark.parametrize("dtx,dty,xz,yz", [(np.uint8, np.uint8, 0, 0), (np.uint8, np.uint8, 255, 255),
                                           (np.uint8, np.int8, 128, -128), (np.int8, np.int8, -128, 127),
                                           (np.int8, np.int8, 127, -128), (np.int8, np.uint8, 0, 255)])
def test_flat_zero_points_at_the_ends(isa, dtx, dty, xz, yz):
    rng = np.random.default_rng(abs(xz) + abs(yz))
    _qlinear((1, 13, 4, 47), (17, 13, 3, 3), rng, dtx, dty, xz=xz, yz=yz, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("shape", [(1, 16, 56, 56), (1, 64, 20, 20), (1, 8, 1, 300)])
def test_flat_bits_do_not_depend_on_threads(isa, shape):
    outs = [_qlinear(shape, (24, shape[1], 3, 3), np.random.default_rng(1), threads=t, pads=[1, 1, 1, 1])
            for t in (1, 2, 3)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.parametrize("dtx,xz", [(np.uint8, 0), (np.uint8, 255), (np.int8, -128), (np.int8, 127)])
@pytest.mark.parametrize("cg,m,w", [(3, 9, 46), (8, 17, 48), (5, 1, 5)])
def test_flat_conv_integer_sums(isa, dtx, xz, cg, m, w):
    rng = np.random.default_rng(cg * 100 + m + w)
    inputs = [("x", ints_with_extremes((1, cg, 4, w), dtx, rng), False),
              ("w", ints_with_extremes((m, cg, 3, 3), np.int8, rng), True),
              ("xz", np.array(xz, dtx), True), ("wz", np.array(0, np.int8), True)]
    got, want = _native_and_reference("ConvInteger", inputs, pads=[1, 1, 1, 1])
    assert_matches(got, want, exact=True, what=f"ConvInteger {dtx.__name__} {cg} {m} {w}")


def _fused_table_matches_the_plain_conv(x, m, rng):
    """A uint8 3x3 conv of x to m channels with a fused output table gives the table of its plain output, on one and
    two threads."""
    nat = runtime.native_module()
    c = x.shape[1]
    qw = np.zeros((m, 3, 3, -(-c // 4) * 4), np.int8)
    qw[..., :c] = ints_with_extremes((m, c, 3, 3), np.int8, rng).transpose(0, 2, 3, 1)
    qw = qw.reshape(m, -1)
    bias = rng.integers(-3000, 3000, m).astype(np.int32)
    mult = rng.uniform(0.001, 0.01, m).astype(np.float32)
    lut = rng.integers(0, 256, 256).astype(np.uint8)
    geom = [m, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
    for threads in (1, 2):
        plain = nat.qlinear_conv(x, 7, qw, np.zeros(m, np.int32), bias, mult, 9, False, geom, False, threads, None)
        fused = nat.qlinear_conv(x, 7, qw, np.zeros(m, np.int32), bias, mult, 9, False, geom, False, threads, lut)
        np.testing.assert_array_equal(fused, lut[plain])


# (width, output channels, input channels): one task, or (64 channels, 80 outputs: 2M multiply-adds a block) a task
# per block, whose ends fall on a padding column (width 47: the padded row is 49, block 1 starts on its column 48)
@pytest.mark.parametrize("w,m,c", [(5, 3, 6), (46, 9, 6), (48, 8, 6), (130, 17, 6), (47, 80, 64), (21, 80, 64)])
def test_flat_fused_output_table(isa, w, m, c):
    """The table applied over each task's output pixels (a block's runs cross rows and task ends)."""
    rng = np.random.default_rng(w)
    _fused_table_matches_the_plain_conv(ints_with_extremes((1, c, 5, w), np.uint8, rng), m, rng)


@pytest.mark.parametrize("threads,stride", [(1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("op,dtx", list(itertools.product(["QLinearConv", "ConvInteger"], [np.uint8, np.int8])))
def test_flat_in_a_session_against_the_cpu_ep(threads, stride, op, dtx):
    """A 3x3 conv of 32 channels on a 30x30 map in a session: NpuEP runs it as a native step with the CPU EP's bits
    (int8 weights, zero point 0: the path that reads B from the image; at stride 2 from its phase planes)."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import assignment, cpu_run, npu_session, session_options

    rng = np.random.default_rng(threads)
    c, m = 32, 40
    x = ints_with_extremes((1, c, 30, 30), dtx, rng)
    w = rng.integers(-64, 64, (m, c, 3, 3)).astype(np.int8)
    wz = np.zeros(m, np.int8)
    if stride == 2 and dtx == np.uint8:  # uint8 weights with zero points: the pixel sums
        w, wz = (w.astype(np.int16) + 128).astype(np.uint8), rng.integers(100, 156, m).astype(np.uint8)
    if op == "QLinearConv":
        inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True),
                  ("xz", np.array(100 if dtx == np.uint8 else -20, dtx), True), ("w", w, True),
                  ("ws", rng.uniform(0.002, 0.01, m).astype(np.float32), True), ("wz", wz, True),
                  ("ys", np.array(0.3, np.float32), True), ("yz", np.array(5, dtx), True),
                  ("b", rng.integers(-5000, 5000, m).astype(np.int32), True)]
    else:
        inputs = [("x", x, False), ("w", w, True), ("xz", np.array(3, dtx), True), ("wz", wz[:1], True)]
    model = node_model(op, inputs, pads=[1, 1, 1, 1], strides=[stride, stride])
    model.graph.node[0].name = "conv"
    so = session_options()
    so.intra_op_num_threads = threads
    tag_session_options(so)
    sess = npu_session(model, so=so)
    feeds = {"x": x}
    got = sess.run(None, feeds)[0]
    assert assignment(sess)["conv"] == "NpuEP"
    assert [s for s in python_steps(sess) if s["op"] == op] == []
    np.testing.assert_array_equal(got, cpu_run(model, feeds)[0])


# small maps of many output channels run in tasks of weight-row tiles over every block (each task sums its rows'
# weights): a 5x5 map (one 48-pixel block) with 200 rows (25 tiles, two tasks), a 3x3 one with 41, a 7x7 one (a
# 16-pixel last block) with 100; the last block's 1, 2 or 3 vectors; uint8 weights with zero points; threads
@pytest.mark.parametrize("c,m,hw", [(64, 200, 5), (16, 41, 3), (24, 100, 7), (8, 60, 4)])
@pytest.mark.parametrize("dtw", [np.int8, np.uint8])
def test_flat_row_tasks_on_small_maps(isa, c, m, hw, dtw):
    rng = np.random.default_rng(c + m + hw)
    info = np.iinfo(dtw)
    wz = np.zeros(m, dtw) if dtw == np.int8 else rng.integers(info.min, info.max + 1, m).astype(dtw)
    outs = [_qlinear_wzp((1, c, hw, hw), (m, c, 3, 3), np.random.default_rng(1), np.uint8, dtw, wz, threads=t,
                         pads=[1, 1, 1, 1]) for t in (1, 2)]
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("c,m,hw", [(64, 200, 5), (24, 100, 7)])
def test_flat_row_tasks_fused_output_table(isa, c, m, hw):
    rng = np.random.default_rng(m)
    _fused_table_matches_the_plain_conv(ints_with_extremes((1, c, hw, hw), np.uint8, rng), m, rng)


# --- weight zero points (uint8 weights, or int8 ones with a zero point): the flat path subtracts w_zp sum_k x' of
# each flat pixel (PixelSums over a group's quad planes, then the taps) ---------------------------------------------
def _qlinear_wzp(xs, ws, rng, dtx, dtw, wz, op="QLinearConv", threads=1, **attrs):
    x, w = ints_with_extremes(xs, dtx, rng), ints_with_extremes(ws, dtw, rng)
    m = ws[0]
    xz = np.array(np.iinfo(dtx).min + 7, dtx)
    if op == "ConvInteger":
        inputs = [("x", x, False), ("w", w, True), ("xz", xz, True), ("wz", np.asarray(wz, dtw).reshape(-1)[:1], True)]
    else:
        inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True), ("xz", xz, True), ("w", w, True),
                  ("ws", rng.uniform(0.002, 0.01, m).astype(np.float32), True), ("wz", np.asarray(wz, dtw), True),
                  ("ys", np.array(0.05 * np.sqrt(ws[1] * 9), np.float32), True), ("yz", np.array(3, dtx), True),
                  ("b", rng.integers(-5000, 5000, m).astype(np.int32), True)]
    got, want = _native_and_reference(op, inputs, threads, **attrs)
    assert_matches(got, want, exact=True, what=f"{op} w_zp x{xs} w{ws} {dtw.__name__} {attrs}")
    return got


@pytest.mark.parametrize("dtw", [np.uint8, np.int8])
@pytest.mark.parametrize("cg,m,w,g", [(3, 9, 46, 1), (8, 17, 47, 2), (5, 8, 5, 1), (4, 1, 130, 1)])
@pytest.mark.parametrize("attrs", [dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(strides=[1, 2], pads=[0, 2, 1, 1], dilations=[2, 1])])
def test_flat_weight_zero_points(isa, dtw, cg, m, w, g, attrs):
    rng = np.random.default_rng(cg * 1000 + m * 10 + w)
    info = np.iinfo(dtw)
    wz = rng.integers(info.min, info.max + 1, m * g).astype(dtw)
    wz[::3], wz[1::3] = info.min, info.max
    if m * g > 2:
        wz[2] = 0  # rows without a zero point among rows with one
    for dtx in (np.uint8, np.int8):
        _qlinear_wzp((1, cg * g, 5, w), (m * g, cg, 3, 3), rng, dtx, dtw, wz, group=g, **attrs)


@pytest.mark.parametrize("wz", [0, 128, 255, 119])
@pytest.mark.parametrize("attrs", [dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2], pads=[1, 1, 1, 1])])
def test_flat_conv_integer_uint8_weights(isa, wz, attrs):
    """The dynamically quantized CRNN's ConvInteger: uint8 weights with one zero point."""
    rng = np.random.default_rng(wz)
    _qlinear_wzp((1, 16, 8, 40), (24, 16, 3, 3), rng, np.uint8, np.uint8, [wz], op="ConvInteger", **attrs)


def test_flat_weight_zero_points_threads(isa):
    rng = np.random.default_rng(9)
    wz = rng.integers(0, 256, 40).astype(np.uint8)
    outs = [_qlinear_wzp((1, 32, 30, 30), (40, 32, 3, 3), np.random.default_rng(9), np.uint8, np.uint8, wz,
                         threads=t, pads=[1, 1, 1, 1]) for t in (1, 2)]
    np.testing.assert_array_equal(outs[0], outs[1])


# --- depthwise (DepthwiseFlat on AVX-512: int32 phase planes, 64 flat pixels of sums in registers) ---------------
def _depthwise(xs, mult, rng, dtx=np.uint8, dtw=np.uint8, threads=1, op="QLinearConv", xz=None, **attrs):
    c = xs[1]
    kh, kw = attrs.pop("kernel_shape", [3, 3])
    x, w = ints_with_extremes(xs, dtx, rng), ints_with_extremes((c * mult, 1, kh, kw), dtw, rng)
    iw = np.iinfo(dtw)
    wz = rng.integers(iw.min, iw.max + 1, c * mult).astype(dtw)  # per channel, the extremes planted by _ints' rule
    wz[::3] = iw.min
    wz[1::3] = iw.max
    xz = np.array(np.iinfo(dtx).max if xz is None else xz, dtx)
    if op == "ConvInteger":
        inputs = [("x", x, False), ("w", w, True), ("xz", xz, True), ("wz", wz, True)]
    else:
        inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True), ("xz", xz, True), ("w", w, True),
                  ("ws", rng.uniform(0.002, 0.01, c * mult).astype(np.float32), True), ("wz", wz, True),
                  ("ys", np.array(0.5, np.float32), True), ("yz", np.array(3, dtx), True),
                  ("b", rng.integers(-5000, 5000, c * mult).astype(np.int32), True)]
    got, want = _native_and_reference(op, inputs, threads, group=c, kernel_shape=[kh, kw], **attrs)
    assert_matches(got, want, exact=True, what=f"depthwise {op} x{xs} x{mult} {attrs}")
    return got


# padded widths around the 64-pixel chunk (several rows per chunk, one, part of one), strides (width phases <= 2;
# 3 takes the old path), dilations, kernels 1x1 to 5x5, depth multipliers 1 and 2
DW_ATTRS = [dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2], pads=[1, 1, 1, 1]), dict(strides=[2, 1], pads=[0, 1, 2, 1]),
            dict(strides=[1, 2]), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), dict(strides=[3, 3], pads=[1, 1, 1, 1]),
            dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), dict(kernel_shape=[1, 1]),
            dict(kernel_shape=[3, 3], pads=[0, 2, 1, 0], dilations=[1, 2])]


@pytest.mark.parametrize("attrs", DW_ATTRS)
@pytest.mark.parametrize("w", [5, *around(62, 64), 130])
def test_depthwise_chunks_strides_and_taps(isa, attrs, w):
    rng = np.random.default_rng(w)
    for mult in (1, 2):
        _depthwise((1, 3, 5, w), mult, rng, **dict(attrs))


@pytest.mark.parametrize("dtx,dtw,xz", [(np.uint8, np.uint8, 0), (np.uint8, np.int8, 255), (np.int8, np.int8, -128),
                                        (np.int8, np.uint8, 127)])
@pytest.mark.parametrize("op", ["QLinearConv", "ConvInteger"])
def test_depthwise_types_and_zero_points(isa, dtx, dtw, xz, op):
    rng = np.random.default_rng(abs(xz))
    _depthwise((2, 5, 7, 61), 1, rng, dtx, dtw, op=op, xz=xz, pads=[1, 1, 1, 1])
    _depthwise((1, 4, 9, 33), 2, rng, dtx, dtw, op=op, xz=xz, strides=[2, 2], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("shape", [(1, 32, 56, 56), (2, 8, 30, 30)])
def test_depthwise_bits_do_not_depend_on_threads(isa, shape):
    outs = [_depthwise(shape, 1, np.random.default_rng(3), threads=t, pads=[1, 1, 1, 1]) for t in (1, 2, 3)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_fused_output_table(isa, stride):
    nat = runtime.native_module()
    rng = np.random.default_rng(stride)
    c = 5
    x = ints_with_extremes((1, c, 9, 70), np.uint8, rng)
    w = ints_with_extremes((c, 9), np.uint8, rng)
    wz = rng.integers(0, 256, c).astype(np.int32)
    bias = rng.integers(-3000, 3000, c).astype(np.int32)
    mult = rng.uniform(0.001, 0.01, c).astype(np.float32)
    lut = rng.integers(0, 256, 256).astype(np.uint8)
    geom = [c, c, 3, 3, stride, stride, 1, 1, 1, 1, 1, 1]
    plain = nat.qlinear_conv(x, 7, w, wz, bias, mult, 9, False, geom, True, 2, None)
    fused = nat.qlinear_conv(x, 7, w, wz, bias, mult, 9, False, geom, True, 2, lut)
    np.testing.assert_array_equal(fused, lut[plain])


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_in_a_session_against_the_cpu_ep(stride):
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import assignment, cpu_run, npu_session, session_options

    rng = np.random.default_rng(stride)
    c = 24
    x = ints_with_extremes((1, c, 30, 30), np.uint8, rng)
    inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True), ("xz", np.array(100, np.uint8), True),
              ("w", rng.integers(-100, 100, (c, 1, 3, 3)).astype(np.int8), True),
              ("ws", rng.uniform(0.002, 0.01, c).astype(np.float32), True), ("wz", np.zeros(c, np.int8), True),
              ("ys", np.array(0.05, np.float32), True), ("yz", np.array(5, np.uint8), True),
              ("b", rng.integers(-5000, 5000, c).astype(np.int32), True)]
    model = node_model("QLinearConv", inputs, group=c, pads=[1, 1, 1, 1], strides=[stride, stride])
    model.graph.node[0].name = "conv"
    so = session_options()
    so.intra_op_num_threads = 2
    tag_session_options(so)
    sess = npu_session(model, so=so)
    got = sess.run(None, {"x": x})[0]
    assert assignment(sess)["conv"] == "NpuEP"
    assert [s for s in python_steps(sess) if s["op"] == "QLinearConv"] == []
    np.testing.assert_array_equal(got, cpu_run(model, {"x": x})[0])
