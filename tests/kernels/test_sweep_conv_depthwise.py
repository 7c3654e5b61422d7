"""Differential sweep of the native depthwise float conv (kernels/native/conv_depthwise.cc) against the reference
model (kernels/ops/conv.py ``_depthwise``), issue 40; and depthwise convs in a session against the CPU EP.

Paths: on AVX-512, a conv with one output channel per input channel, strides 1-2 and no dilation on a small map
(3x3 kernels up to 28 x 28 outputs, 25 taps or more up to 56 x 56) runs with 16 channels in the lanes: each block of
16 planes transposed into a zero-padded channels-last scratch, up to 8 output pixels of a row summed at once (3x3
and 5x5 at width stride 1: each input column loaded once per tap row and multiplied into every pixel reading it),
the result transposed back (lanes past the last channel compute zeros, never stored); one task per block.
Otherwise, on AVX-512, 3x3 and 5x5 kernels with strides 1-2 and no dilation run as register blocks of 4 output rows x
one 8-column vector (OW <= 8), one 16-column vector (OW <= 16) or two, over a ring of zero-padded input rows
(stride 2: even/odd column phases), the output rows split evenly into 4 tasks from 2^17 multiply-adds on, a multiple
of 4 of about 2^18 each beyond (segments start and end inside planes);
every other shape (7x7, dilation 2, stride 3) and every lower ISA level takes the per-plane kernels. The grid
crosses each block (multiplier 1 takes the lanes on the grid's small maps, so the grid runs again with multiplier 2
for the register blocks; the lanes' own grid crosses the 16-channel blocks and the map limits): channels 2 (a
one-channel conv is a dense one), 15-17, 33; output rows 1-9 (blocks of 4 and their remainders 1-3); widths from 1
to twice the kernel and around 16 and 32 output columns; pads symmetric, asymmetric and none (odd and even left pads
move the stride-2 phases); depth multiplier 2; special values (NaN,
+-Inf, -0, 1e30, denormals) in x and w; fused tails; threads 1 and 2 (the same bits whatever the split).

Tolerance: bit-exact. The kernel computes per output x_0 * w_0, then + x_t * w_t tap by tap (padded taps multiply
0), then + bias, in float32 without fused multiply-adds: the reference's operations in its order. NaN must be where
the reference has NaN (its payload and sign are not pinned: numpy orders a NaN's operands its own way); every other
value, its sign included, equal. The default run takes a sample of the grid; ``-m slow`` runs it whole."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import native_calls, node_model
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.tail_program import CODES
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, 1e-40, -3e-39], np.float32)


@pytest.fixture(params=host_isas(top="avx512"))
def float_isa(request):
    yield from cap_isa(request.param)


def _floats(shape, rng: np.random.Generator, specials: bool = False) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    if specials:
        flat = x.reshape(-1)
        where = rng.choice(flat.size, size=min(flat.size, SPECIALS.size), replace=False)
        flat[where] = SPECIALS[:where.size]
    return x


def _run(x, w, b, tail, threads: int, kernels: str, **attrs) -> np.ndarray:
    """The Conv node through its kernel on ``kernels``; ``tail`` a fused conv tail [(code name, c0, c1), ...]."""
    inputs = [("x", x, False), ("w", w, True)] + ([("b", b, True)] if b is not None else [])
    (node,) = nodes_from_model(node_model("Conv", inputs, **attrs))
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, REF)
    if tail:
        p.consts["tail_codes"] = np.asarray([CODES[t[0]] for t in tail], np.int32)
        p.consts["tail_c"] = np.asarray([t[1:] for t in tail], np.float32).reshape(-1, 2)
    runtime.configure([p], kernels, threads)
    with np.errstate(all="ignore"):
        return k.run(p, [x])[0]


def _depthwise(x, w, b=None, *, tail=None, threads: int = 1, **attrs) -> np.ndarray:
    """The native depthwise conv ran and equals the reference bit for bit (module docstring); returns its output."""
    label = f"Conv x{list(x.shape)} w{list(w.shape)} {attrs} tail={tail} threads={threads}"
    with native_calls() as calls:
        got = _run(x, w, b, tail, threads, "native", group=x.shape[1], **attrs)
    assert "conv_depthwise" in calls, f"{label}: the native conv_depthwise did not run ({calls})"
    want = _run(x, w, b, tail, 1, "reference", group=x.shape[1], **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32, label
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), label)
    np.testing.assert_array_equal(got, want, label)
    np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]), label)
    return got


def _sample(cases: list, n: int, seed: int) -> list:
    """A fixed sample of ``n`` cases (the default run); the slow run takes them all."""
    if len(cases) <= n:
        return cases
    idx = np.random.default_rng(seed).choice(len(cases), size=n, replace=False)
    return [cases[i] for i in sorted(idx)]


# (channels, output rows, output columns, kernel, strides, pads [top, left, bottom, right], depth multiplier)
PADS = {3: [[1, 1, 1, 1], [0, 0, 0, 0], [0, 2, 1, 0], [2, 1, 0, 2]],
        5: [[2, 2, 2, 2], [0, 0, 0, 0], [1, 3, 0, 1], [4, 0, 2, 4]]}
GRID = [(c, oh, ow, k, st, pads, mult)
        for k in (3, 5) for st in ((1, 1), (2, 2), (1, 2), (2, 1)) for pads in PADS[k]
        for c, oh, ow, mult in ((2, 1, 1, 1), (15, 3, 2, 1), (16, 4, 5, 2), (17, 5, 16, 1), (33, 9, 17, 1),
                                (2, 6, 31, 1), (3, 7, 32, 2), (2, 8, 33, 1), (2, 2, 8, 1), (3, 3, 9, 2),
                                (17, 4, 12, 1), (15, 6, 14, 1), (2, 9, 48, 1))]


def _input_size(out: int, k: int, stride: int, pad: int) -> int:
    """An input size giving ``out`` outputs (at least 1): (in + pad - k) // stride + 1 == out when reachable."""
    return max(1, (out - 1) * stride + k - pad)


def _grid_case(c, oh, ow, k, st, pads, mult, specials=True):
    rng = np.random.default_rng(hash((c, oh, ow, k, st, tuple(pads), mult)) % 2**32)
    h = _input_size(oh, k, st[0], pads[0] + pads[2])
    w_in = _input_size(ow, k, st[1], pads[1] + pads[3])
    x = _floats((1, c, h, w_in), rng, specials)
    w = _floats((c * mult, 1, k, k), rng, specials)
    _depthwise(x, w, _floats((c * mult,), rng), strides=list(st), pads=pads, kernel_shape=[k, k])


@pytest.mark.parametrize("case", _sample(GRID, 40, 40))
def test_blocks_strides_pads_and_widths(float_isa, case):
    _grid_case(*case)


@pytest.mark.slow
def test_blocks_strides_pads_and_widths_wide(float_isa):
    for case in GRID:  # one test: collecting the grid case by case cost the default run seconds
        _grid_case(*case)


@pytest.mark.parametrize("case", _sample(GRID, 24, 41))
def test_register_blocks_with_multiplier_2(float_isa, case):
    """The grid's small maps with depth multiplier 2: the register blocks (the lanes take multiplier 1 only)."""
    _grid_case(*case[:-1], 2)


# (channels, output rows, output columns, kernel, strides, pads) around the lanes' limits: 3x3 up to 28 outputs a
# side, 5x5 up to 56 (one past each takes the register blocks), channels around the 16-lane blocks
LANES_GRID = [(c, oh, ow, k, st, pads)
              for k, sides in ((3, ((1, 1), (7, 14), (28, 28), (28, 29), (29, 5))),
                               (5, ((2, 3), (7, 7), (14, 13), (56, 56), (57, 9), (9, 57))))
              for oh, ow in sides for st in ((1, 1), (2, 2), (1, 2), (2, 1)) for pads in PADS[k][:3]
              for c in (2, 15, 16, 17, 33)]


def _lanes_case(c, oh, ow, k, st, pads, threads=1, batch=1):
    rng = np.random.default_rng(hash((c, oh, ow, k, st, tuple(pads), threads)) % 2**32)
    h, w_in = _input_size(oh, k, st[0], pads[0] + pads[2]), _input_size(ow, k, st[1], pads[1] + pads[3])
    x = _floats((batch, c, h, w_in), rng, specials=True)
    w = _floats((c, 1, k, k), rng, specials=True)
    _depthwise(x, w, _floats((c,), rng), threads=threads, strides=list(st), pads=pads, kernel_shape=[k, k])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", _sample(LANES_GRID, 30, 42))
def test_lanes_channel_blocks_and_limits(float_isa, case, threads):
    """Channels 2, 15-17, 33 (a block's last lanes idle), maps up to and one past each limit, strides 1-2, pads
    symmetric, none and asymmetric, specials in x and w: the reference's bits from either path."""
    _lanes_case(*case, threads=threads, batch=1 + (case[0] == 17))


@pytest.mark.slow
def test_lanes_channel_blocks_and_limits_wide(float_isa):
    for case in LANES_GRID:
        _lanes_case(*case)
        _lanes_case(*case, threads=2, batch=2)


@pytest.mark.parametrize("threads", [1, 2])
def test_lanes_scratch_across_geometries(float_isa, threads):
    """Each thread keeps one channels-last scratch and zeroes only the padding of a new geometry: convs of different
    maps in turn (a NaN map without padding first, so a stale value anywhere in the new padding shows as a NaN),
    symmetric, asymmetric and no pads, back to an earlier geometry, the reference's bits each time."""
    rng = np.random.default_rng(7)
    seq = [((2, 33, 30, 30), 3, [1, 1], [0, 0, 0, 0], True),
           ((2, 33, 28, 28), 3, [2, 2], [1, 1, 1, 1], False),
           ((1, 17, 14, 14), 5, [2, 2], [2, 2, 2, 2], False),
           ((1, 17, 27, 29), 3, [1, 2], [2, 1, 0, 2], False),
           ((2, 33, 30, 30), 3, [1, 1], [0, 0, 0, 0], True),
           ((1, 17, 7, 7), 5, [1, 1], [2, 2, 2, 2], False),
           ((2, 33, 28, 28), 3, [2, 2], [1, 1, 1, 1], False)]
    for shape, k, st, pads, poison in seq:
        x = np.full(shape, np.nan, np.float32) if poison else _floats(shape, rng, specials=True)
        w = _floats((shape[1], 1, k, k), rng)
        _depthwise(x, w, _floats((shape[1],), rng), threads=threads, strides=st, pads=pads, kernel_shape=[k, k])


def test_lanes_tail_and_no_bias(float_isa):
    """A fused tail on each of a block's planes (17 channels: a full block and a one-lane block), and no bias."""
    rng = np.random.default_rng(17)
    x = _floats((2, 17, 14, 14), rng, specials=True)
    w = _floats((17, 1, 5, 5), rng)
    tail = [("add", 3.0, 0.0), ("clip", 0.0, 6.0), ("div", 6.0, 0.0)]
    _depthwise(x, w, _floats((17,), rng), tail=tail, strides=[2, 2], pads=[2] * 4)
    _depthwise(x, w, None, threads=2, pads=[2] * 4)


@pytest.mark.parametrize("width", [1, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49])
def test_lanes_rows_of_every_block_width(float_isa, width):
    """The lanes transpose each input row in blocks of 16 columns (rows under 8 wide 16 // width at a time, the last
    group short on 9 rows): row widths around the blocks' multiples, 16 and 17 channels (a full and a one-lane channel
    block), symmetric and asymmetric pads, strides 1 (up to 28 output columns) and 2, specials in x and w."""
    rng = np.random.default_rng(width)
    for c, st, pads in ((16, 1, [1, 1, 1, 1]), (17, 2, [1, 1, 1, 1]), (17, 2, [0, 2, 1, 0]), (16, 2, [2, 1, 0, 2])):
        if (width + pads[1] + pads[3] - 3) // st + 1 > 28:
            continue
        x = _floats((1, c, 9, width), rng, specials=True)
        w = _floats((c, 1, 3, 3), rng, specials=True)
        _depthwise(x, w, _floats((c,), rng), strides=[st, st], pads=pads, kernel_shape=[3, 3])


def test_lanes_scratch_keeps_no_rows_of_another_map():
    """The per-thread scratch is kept across calls while the padded geometry is the same: a map one row and column
    larger with the bottom and right pads dropped has the same padded size, and must not read the previous map's
    last row and column where its padding was."""
    rng = np.random.default_rng(5)
    w, b = _floats((16, 1, 3, 3), rng), _floats((16,), rng)
    _depthwise(_floats((1, 16, 11, 11), rng) * 1e6, w, b, pads=[1, 1, 0, 0])
    _depthwise(_floats((1, 16, 10, 10), rng), w, b, pads=[1, 1, 1, 1])
    _depthwise(_floats((1, 16, 11, 11), rng), w, b, pads=[1, 1, 0, 0])


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("sw", [1, 2])
def test_small_inputs_every_width_and_height(k, sw):
    """Input sides 1 .. 2k (odd and even for stride 2), with the kernel's own pads: every edge case of the ring's
    zero padding and the phases' first and last columns."""
    rng = np.random.default_rng(k * 10 + sw)
    for side in range(1, 2 * k + 1):
        x = _floats((1, 3, side, side + 1), rng, specials=True)
        _depthwise(x, _floats((3, 1, k, k), rng), _floats((3,), rng), strides=[sw, sw], pads=[k // 2] * 4)


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[7, 7], pads=[3, 3, 3, 3]),
                                   dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
                                   dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[3, 5], pads=[1, 2, 1, 2]),
                                   dict(kernel_shape=[1, 1])])
def test_shapes_off_the_register_kernels(float_isa, attrs):
    """7x7, dilation 2, stride 3, 3x5 and 1x1 keep to the per-plane kernels, still the reference's bits."""
    rng = np.random.default_rng(len(str(attrs)))
    x = _floats((2, 17, 11, 37), rng, specials=True)
    _depthwise(x, _floats((34, 1, *attrs["kernel_shape"]), rng), _floats((34,), rng), **attrs)


def test_zero_weights_meet_infinities_and_denormals(float_isa):
    """0 * Inf = NaN where an Inf meets a zero weight, -0 sums keep their sign, denormal products are kept (no
    flush to zero), padded taps add 0 * w (0 * Inf weight = NaN at the borders)."""
    x = np.full((1, 2, 6, 20), 1e-30, np.float32)
    x[0, 0, 2, 5], x[0, 1, 0, 0] = np.inf, -0.0
    w = np.full((2, 1, 3, 3), 1e-12, np.float32)
    w[0, 0, 1, 1], w[1, 0, 0, 0] = 0.0, np.inf
    _depthwise(x, w, None, pads=[1, 1, 1, 1])
    _depthwise(-np.zeros((1, 2, 5, 18), np.float32), -np.ones((2, 1, 5, 5), np.float32), None, pads=[2] * 4,
               strides=[2, 2])


HARDSWISH = [("save", 0.0, 0.0), ("mul", 1 / 6, 0.0), ("add", 0.5, 0.0), ("clip", 0.0, 1.0), ("mul_saved", 0.0, 0.0)]
TAILS = [[("clip", 0.0, 6.0)], [("mul", 0.5, 0.0), ("add", 1.0, 0.0)],
         [("add", 3.0, 0.0), ("clip", 0.0, 6.0), ("div", 6.0, 0.0)], HARDSWISH]


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("k,st", [(3, 1), (5, 2)])
def test_fused_tails_on_each_block(float_isa, tail, k, st):
    """The tail runs on each finished block of rows (a remainder block of 1-3 rows included), with specials."""
    rng = np.random.default_rng(k + st + len(tail))
    x = _floats((1, 5, 11, 37), rng, specials=True)
    _depthwise(x, _floats((5, 1, k, k), rng), _floats((5,), rng), tail=tail, strides=[st, st], pads=[k // 2] * 4)


@pytest.mark.parametrize("k,st,mult", [(3, 1, 1), (3, 2, 1), (5, 1, 2), (5, 2, 2), (3, 2, 2)])
@pytest.mark.parametrize("ow", [5, 8, 9, 16, 17, 32, 33, 56])
def test_hardswish_tail_on_the_blocks(float_isa, k, st, mult, ow):
    """HardSwish's program as the fused tail across the 8/16/32-column vectors and their tails, 1-3 row remainders,
    the multiplier 2 (register blocks) and the lanes (multiplier 1, small maps), specials in x, 1 and 2 threads."""
    rng = np.random.default_rng(k * 1000 + st * 100 + ow + mult)
    x = _floats((1, 3, _input_size(7, k, st, k - 1), _input_size(ow, k, st, k - 1)), rng, specials=True)
    w, b = _floats((3 * mult, 1, k, k), rng), _floats((3 * mult,), rng)
    for threads in (1, 2):
        _depthwise(x, w, b, tail=HARDSWISH, threads=threads, strides=[st, st], pads=[k // 2] * 4)


@pytest.mark.parametrize("tail", [[("clip", 0.0, 6.0)], [("clip", -1.0, 1.0)], HARDSWISH])
@pytest.mark.parametrize("k,st", [(3, 1), (3, 2), (5, 1), (5, 2)])
def test_lanes_tails_in_registers(float_isa, tail, k, st):
    """One clip (Relu, Clip) or HardSwish's program: the lanes apply it to each output vector before its store
    (other tails run on the stored planes); 17 channels (a block's unused lanes), specials in x, 1 and 2 threads."""
    rng = np.random.default_rng(k * 10 + st + len(tail))
    x = _floats((1, 17, 13, 14), rng, specials=True) * 4
    w, b = _floats((17, 1, k, k), rng), _floats((17,), rng)
    for threads in (1, 2):
        _depthwise(x, w, b, tail=tail, threads=threads, strides=[st, st], pads=[k // 2] * 4)


@pytest.mark.parametrize("shape,k,st", [((1, 33, 48, 48), 3, 1), ((2, 17, 40, 41), 5, 2), ((1, 16, 56, 56), 3, 2),
                                        ((1, 37, 14, 14), 5, 1), ((1, 128, 28, 28), 3, 2), ((1, 256, 14, 14), 5, 2)])
def test_threads_split_rows_with_the_same_bits(float_isa, shape, k, st):
    """Enough work for several tasks (4 from 2^17 multiply-adds, PP-LCNet's small stride-2 and 5x5 maps among them;
    segments starting inside planes): threads 1 and 2 give the reference's bits."""
    rng = np.random.default_rng(sum(shape))
    x = _floats(shape, rng, specials=True)
    w, b = _floats((shape[1], 1, k, k), rng), _floats((shape[1],), rng)
    one = _depthwise(x, w, b, strides=[st, st], pads=[k // 2] * 4)
    two = _depthwise(x, w, b, threads=2, strides=[st, st], pads=[k // 2] * 4)
    assert one.tobytes() == two.tobytes()


# Depthwise convs of real mobile nets (PP-LCNet, MobileNet): 3x3 stride 1 and 2 on 56-112 maps, 5x5 on small maps,
# each followed by the HardSwish or Relu the compiler fuses as the conv's tail.
SESSION_CASES = [((1, 16, 56, 56), 3, 1, "Relu"), ((1, 32, 56, 57), 3, 2, "HardSwish"),
                 ((1, 64, 14, 14), 5, 1, "HardSwish"), ((1, 48, 15, 14), 5, 2, None)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,k,st,act", SESSION_CASES)
def test_session_matches_cpu_ep_as_a_native_step(xs, k, st, act, threads):
    """NpuEP ran the node (assignment, no Python step) with the CPU EP's results within float32 rounding: MLAS sums
    the k*k products with fused multiply-adds in its own order, so the two differ by a few ulps of the sum of |x w|
    (outputs ~1-10 here: rtol 1e-5, atol 1e-5 * k * k)."""
    rng = np.random.default_rng(xs[1] + k)
    c = xs[1]
    w, b = (rng.standard_normal((c, 1, k, k)) * 0.5).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], name="the_conv", group=c,
                              kernel_shape=[k, k], strides=[st, st], pads=[k // 2] * 4)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"], name="the_act"))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], {"w": w, "b": b},
                       opset=17)
    so = session_options()
    so.intra_op_num_threads = threads
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}, assignment(sess)
    x = rng.standard_normal(xs).astype(np.float32)
    want = cpu_run(model, {"x": x})[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k * k)
    assert python_steps(sess) == [], "the depthwise Conv ran its Python kernel instead of the bound step"


def test_grid_covers_the_blocks():
    """The grid reaches every remainder of the 4-row blocks and each vector choice (8 lanes, 16, 2 x 16), at both
    kernels and every stride."""
    seen = {(k, st, oh % 4, (ow > 8) + (ow > 16)) for _, oh, ow, k, st, _, _ in GRID}
    want = set(itertools.product((3, 5), ((1, 1), (2, 2), (1, 2), (2, 1)), range(4), range(3)))
    assert want <= seen, sorted(want - seen)
