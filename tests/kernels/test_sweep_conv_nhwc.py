"""Differential sweep of the layout chain's NHWC convs (kernels/native/conv_nhwc.cc, npu::ConvNhwc in
kernels/ops/conv_nhwc.py) against the reference model: the Conv's numpy kernel in NCHW, x transposed to NCHW and the
result back.

Depthwise: channels in the lanes (pairs of 16-channel vectors, then one, the last one masked), blocks of 8 output
columns, then one of 1-7; rows outside the input read as a row of zeros; inputs read in place (stride > 1 under 256
channels, or under 32 channels) check the columns whose taps leave the input (the whole row when it has 16 columns
or fewer), the others are copied into compact rows with zero padding columns (NCHW inputs gathered by 16x16
transposes) and check nothing. Bit-exact
(the reference's x_0 * w_0, then + x_t * w_t tap by tap with padded taps multiplying 0, then + bias, no fused
multiply-adds), NaN where the reference has NaN, signs of zeros equal. The grid crosses the channel tails (2-17,
31-33, 63-65 and past 256), widths from under the kernel to past four register blocks, strides 1-3, symmetric,
asymmetric and no pads, special values (NaN, +-inf, -0, 1e30, denormals) in x and w, fused tails (HardSwish's two
programs and Clip in registers, others after the row), no bias, threads 1 and 2. Pointwise: the packed GEMM, within the
dot-product bound 2 K eps sum|x w| + |bias| eps (as test_sweep_conv.py), NaN and inf where the reference has them."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import native_calls, node_model
from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import conv_nhwc
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, 1e-40, -3e-39], np.float32)
HARDSWISH = [("save", 0.0, 0.0), ("mul", float(np.float32(1 / 6)), 0.0), ("add", 0.5, 0.0), ("clip", 0.0, 1.0),
             ("mul_saved", 0.0, 0.0)]
HARDSWISH_DIV = [("save", 0.0, 0.0), ("add", 3.0, 0.0), ("clip", 0.0, 6.0), ("mul_saved", 0.0, 0.0),
                 ("div", 6.0, 0.0)]  # PicoDet's x * clip(x + 3, 0, 6) / 6
CLIP = [("clip", 0.0, 6.0)]
OTHER = [("mul", 2.0, 0.0), ("add", -1.0, 0.0), ("abs", 0.0, 0.0)]  # no register form: applied to the stored row


@pytest.fixture(params=host_isas(top="avx512"))  # the depthwise kernel's AVX-512 rows and its scalar rows
def float_isa(request):
    yield from cap_isa(request.param)


def _floats(shape, rng, specials=False):
    x = rng.standard_normal(shape).astype(np.float32)
    if specials:
        flat = x.reshape(-1)
        where = rng.choice(flat.size, size=min(flat.size, SPECIALS.size), replace=False)
        flat[where] = SPECIALS[:where.size]
    return x


def _prepared(x_nchw, w, b, tail, nchw_in=False, **attrs):
    inputs = [("x", x_nchw, False), ("w", w, True)] + ([("b", b, True)] if b is not None else [])
    (node,) = nodes_from_model(node_model("Conv", inputs, **attrs))
    kind = "depthwise" if attrs.get("group", 1) > 1 else "pointwise"
    x = node.inputs[0]
    s = x.shape
    nhwc = x if nchw_in else dataclasses.replace(x, shape=(s[0], s[2], s[3], s[1]))
    node = dataclasses.replace(node, op_type="ConvNhwc", domain="npu", inputs=(nhwc, *node.inputs[1:]),
                               attrs={**node.attrs, "layout_kind": kind, **({"layout_in": "NCHW"} if nchw_in else {}),
                                      **({"conv_tail": tail} if tail else {})})
    k = kernel_for("npu", "ConvNhwc")
    assert k.check(node, REF) is None
    return k, k.prepare(node, REF), kind


def _both(x_nchw, w, b=None, *, tail=None, threads=1, nchw_in=False, **attrs):
    """(native, reference) outputs of the NHWC conv on x (given NCHW, run NHWC unless nchw_in); the native kernel
    ran."""
    k, p, kind = _prepared(x_nchw, w, b, tail, nchw_in, **attrs)
    x = x_nchw if nchw_in else np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))
    runtime.configure([p], "native", threads)
    with native_calls() as calls, np.errstate(all="ignore"):
        got = k.run(p, [x])[0]
    assert f"conv_nhwc_{kind}" in calls, calls
    runtime.configure([p], "reference", 1)
    with np.errstate(all="ignore"):
        want = k.run(p, [x])[0]
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    assert got.flags.c_contiguous
    return got, want


def _bits(got, want, label):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), label)
    np.testing.assert_array_equal(got, want, label)
    np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]), label)


PADS = {1: [[0, 0, 0, 0]], 3: [[1, 1, 1, 1], [0, 0, 0, 0], [0, 2, 1, 0]], 5: [[2, 2, 2, 2], [1, 3, 0, 1]],
        7: [[3, 3, 3, 3]]}
DW_GRID = [(c, h, wd, k, st, pads)
           for c in (1, 2, 15, 16, 17, 32, 33, 48)
           for k, st in ((3, 1), (3, 2), (5, 1), (5, 2), (3, 3), (7, 1))
           for pads in PADS[k]
           for h, wd in ((k, 1), (5, 4), (7, 9), (9, 16), (4, 23))]


def _dw_case(c, h, wd, k, st, pads, threads=1, tail=None, bias=True, batch=1, nchw_in=False):
    label = f"dw c={c} {h}x{wd} k={k} s={st} pads={pads} tail={tail and tail[0][0]} nchw_in={nchw_in}"
    if h + pads[0] + pads[2] < k or wd + pads[1] + pads[3] < k:
        return
    rng = np.random.default_rng(hash((c, h, wd, k, st, tuple(pads))) % 2**32)
    x = _floats((batch, c, h, wd), rng, specials=True)
    w = _floats((c, 1, k, k), rng, specials=True)
    b = _floats((c,), rng) if bias else None
    got, want = _both(x, w, b, tail=tail, threads=threads, nchw_in=nchw_in, group=c, strides=[st, st], pads=pads,
                      kernel_shape=[k, k])
    _bits(got, want, label)


def _sample(cases, n, seed):
    idx = np.random.default_rng(seed).choice(len(cases), size=min(n, len(cases)), replace=False)
    return [cases[i] for i in sorted(idx)]


@pytest.mark.parametrize("case", _sample([c for c in DW_GRID if c[0] > 1], 60, 7))
def test_depthwise_tails_widths_strides_pads(float_isa, case):
    _dw_case(*case)


@pytest.mark.parametrize("case", _sample([c for c in DW_GRID if c[0] > 1], 30, 8))
def test_depthwise_reading_nchw(float_isa, case):
    """A chain's first depthwise conv gathers its NCHW input's rows into the lanes itself (layout_in NCHW)."""
    _dw_case(*case, nchw_in=True, batch=2)


@pytest.mark.slow
def test_depthwise_whole_grid():
    for case in DW_GRID:
        if case[0] > 1:
            _dw_case(*case)
            _dw_case(*case, threads=2, batch=2)
            _dw_case(*case, nchw_in=True)


@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_tail_no_bias_threads(float_isa, threads):
    for c in (16, 17, 33):
        _dw_case(c, 56, 56, 3, 2, [1, 1, 1, 1], threads=threads, tail=HARDSWISH, batch=2)
        _dw_case(c, 14, 14, 5, 1, [2, 2, 2, 2], threads=threads, tail=HARDSWISH, bias=False)
        _dw_case(c, 28, 28, 3, 2, [1, 1, 1, 1], threads=threads, tail=HARDSWISH, nchw_in=True)
    # above 2^17 multiply-adds: split on two threads (groups x row blocks), channel tails included
    _dw_case(129, 28, 28, 3, 1, [1, 1, 1, 1], threads=threads, tail=HARDSWISH)
    _dw_case(500, 7, 7, 5, 1, [2, 2, 2, 2], threads=threads, tail=HARDSWISH, bias=False)
    _dw_case(97, 15, 15, 5, 2, [2, 2, 2, 2], threads=threads, tail=HARDSWISH, nchw_in=True)


TAIL_CHANNELS = [*range(2, 18), 31, 32, 33, 63, 64, 65]  # one channel is a dense conv
WIDTHS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 20, 21, 22, 24, 27, 29, 31, 36]


@pytest.mark.parametrize("c", TAIL_CHANNELS)
def test_depthwise_channel_tails_and_widths(float_isa, c):
    """Every channel tail of the 16-lane vectors and of the 32-channel pairs, at widths whose columns (in place: the
    interior, unchecked ones) fill 0 to 4 register blocks and leave every remainder, for the slid 3x3 and 5x5
    kernels at strides 1 and 2 (in place and, from 32 channels at stride 1, compact rows)."""
    for wd in WIDTHS:
        for k, st in ((3, 1), (3, 2), (5, 1), (5, 2)):
            _dw_case(c, 4, wd, k, st, [k // 2] * 4)


@pytest.mark.parametrize("c", [256, 257, 287, 300])
@pytest.mark.parametrize("nchw_in", [False, True])
def test_depthwise_wide_channels(float_isa, c, nchw_in):
    """Inputs of 256 channels or more are read from compact copies of their rows (the last group's lanes past the
    channels zero)."""
    for h, wd, k, st, pads in ((7, 7, 5, 1, [2, 2, 2, 2]), (9, 10, 5, 2, [2, 2, 2, 2]), (6, 13, 3, 1, [1, 1, 1, 1]),
                               (5, 9, 3, 3, [0, 2, 1, 0]), (8, 8, 7, 1, [3, 3, 3, 3]), (4, 1, 5, 1, [2, 2, 2, 2]),
                               (3, 17, 5, 1, [2, 2, 2, 2]), (3, 26, 5, 1, [1, 3, 0, 1]), (5, 23, 3, 2, [1, 1, 1, 1]),
                               (4, 9, 3, 1, [0, 4, 2, 3])):
        _dw_case(c, h, wd, k, st, pads, nchw_in=nchw_in)


@pytest.mark.parametrize("tail", [CLIP, HARDSWISH_DIV, OTHER], ids=["clip", "hardswish_div", "other"])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_other_tails(float_isa, tail, threads):
    for c in (16, 17, 48, 257):
        _dw_case(c, 14, 14, 3, 1, [1, 1, 1, 1], threads=threads, tail=tail, batch=2)
        _dw_case(c, 9, 11, 5, 2, [2, 2, 2, 2], threads=threads, tail=tail, bias=False, nchw_in=True)


def test_depthwise_weights_as_taps_or_grouped():
    """The binding takes the weights [kh*kw, C] (grouping them itself) or grouped as conv_nhwc._prepare makes them:
    the same bits."""
    nat = runtime.native_module()
    rng = np.random.default_rng(4)
    for c in (5, 32, 70):
        x = _floats((1, 9, 11, c), rng, specials=True)
        taps = _floats((9, c), rng, specials=True)
        grouped = conv_nhwc._grouped_taps(np.ascontiguousarray(taps.T))
        assert grouped.shape == (-(-c // nat.nhwc_depthwise_group), 9, nat.nhwc_depthwise_group)
        with np.errstate(all="ignore"):
            a = nat.conv_nhwc_depthwise(x, taps, None, [3, 3, 1, 2, 1, 1, 1, 1], 1)
            b = nat.conv_nhwc_depthwise(x, grouped, None, [3, 3, 1, 2, 1, 1, 1, 1], 1)
        _bits(a, b, f"c={c}")
    with pytest.raises(ValueError, match="w must be"):
        nat.conv_nhwc_depthwise(x, taps[:, :-1], None, [3, 3, 1, 2, 1, 1, 1, 1], 1)


def test_depthwise_asymmetric_stride():
    rng = np.random.default_rng(3)
    x = _floats((1, 17, 9, 13), rng, specials=True)
    w = _floats((17, 1, 3, 5), rng, specials=True)
    got, want = _both(x, w, _floats((17,), rng), group=17, strides=[1, 2], pads=[1, 2, 0, 1],
                      kernel_shape=[3, 5])
    _bits(got, want, "3x5 strides 1x2")


def _pw_case(c, m, h, wd, threads=1, tail=None, bias=True):
    rng = np.random.default_rng(c * 1000 + m + h * wd)
    x = _floats((1, c, h, wd), rng)
    w = _floats((m, c, 1, 1), rng)
    b = _floats((m,), rng) if bias else None
    got, want = _both(x, w, b, tail=tail, threads=threads)
    x2 = x.transpose(0, 2, 3, 1).reshape(-1, c).astype(np.float64)
    bound = 2 * c * np.finfo(np.float32).eps * (np.abs(x2) @ np.abs(w.reshape(m, c).T.astype(np.float64)))
    if b is not None:
        bound += np.abs(b) * np.finfo(np.float32).eps
    if tail:  # hard-swish: Lipschitz 1.5 over its range
        bound = 1.5 * bound + np.abs(want.reshape(-1, m)) * 4 * np.finfo(np.float32).eps
    err = np.abs(got.reshape(-1, m).astype(np.float64) - want.reshape(-1, m))
    assert np.all(err <= bound + 1e-37), f"pw c={c} m={m} {h}x{wd}: {err.max()} > bound"


@pytest.mark.parametrize("c,m", [(1, 1), (3, 17), (16, 32), (17, 33), (32, 64), (64, 128), (129, 31), (256, 512)])
@pytest.mark.parametrize("hw", [(1, 1), (3, 5), (7, 7), (14, 14), (28, 28)])
def test_pointwise_channels_and_maps(c, m, hw):
    _pw_case(c, m, *hw)


@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_tail_no_bias_threads(threads):
    _pw_case(64, 128, 56, 56, threads=threads, tail=HARDSWISH)
    _pw_case(33, 48, 15, 9, threads=threads, bias=False)
    # on two threads: pixel blocks of 8-row tiles and a shorter last one (28 x 28, 14 x 14), under 128 pixels column
    # groups (7 x 7), an uneven last group (80 columns: 64 + 16)
    _pw_case(64, 128, 28, 28, threads=threads, tail=HARDSWISH)
    _pw_case(128, 256, 14, 14, threads=threads, tail=HARDSWISH)
    _pw_case(128, 80, 10, 10, threads=threads, tail=HARDSWISH, bias=False)
    _pw_case(256, 512, 7, 7, threads=threads)


def test_pointwise_specials_propagate():
    rng = np.random.default_rng(5)
    x = _floats((1, 16, 4, 4), rng, specials=True)
    w = _floats((20, 16, 1, 1), rng)
    got, want = _both(x, w, _floats((20,), rng))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


# (kind, batch, channels, map side, kernel, stride or output channels): the splits of each side of the two-thread
# threshold (depthwise from 2^17 multiply-adds, pointwise 2^20), row blocks, column groups, uneven last ones
SPLITS = [("depthwise", 2, 48, 56, 3, 2), ("depthwise", 1, 128, 28, 3, 1), ("depthwise", 1, 128, 14, 3, 2),
          ("depthwise", 1, 512, 7, 5, 1), ("depthwise", 1, 40, 13, 3, 1), ("depthwise", 1, 96, 15, 5, 2),
          ("pointwise", 2, 48, 56, 1, 96), ("pointwise", 1, 64, 28, 1, 128), ("pointwise", 1, 128, 14, 1, 256),
          ("pointwise", 1, 128, 10, 1, 80), ("pointwise", 1, 256, 7, 1, 512), ("pointwise", 1, 16, 112, 1, 32)]


@pytest.mark.parametrize("kind,n,c,hw,k,s_or_m", SPLITS)
def test_the_bits_do_not_depend_on_the_thread_count(kind, n, c, hw, k, s_or_m):
    rng = np.random.default_rng(11)
    x = _floats((n, c, hw, hw), rng, specials=True)
    pad = k // 2
    attrs = ({"group": c, "kernel_shape": [k, k], "strides": [s_or_m] * 2, "pads": [pad] * 4} if kind == "depthwise"
             else {})
    w = _floats((c, 1, k, k) if kind == "depthwise" else (s_or_m, c, 1, 1), rng)
    k, p, _ = _prepared(x, w, None, HARDSWISH, **attrs)
    xn = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    outs = []
    for threads in (1, 2):
        runtime.configure([p], "native", threads)
        with np.errstate(all="ignore"):
            outs.append(k.run(p, [xn])[0])
    np.testing.assert_array_equal(outs[0], outs[1])


def _wide_chain_model(c, hw):
    """dw 5x5 on the NCHW input (gathered into the lanes) + HardSwish -> pw c->c+7 -> dw 3x3 s2 (c+7 channels, read
    from compact rows when c+7 >= 256) + Clip -> pw -> y."""
    rng = np.random.default_rng(1)
    m = c + 7
    inits = {"w0": (rng.standard_normal((c, 1, 5, 5)) / 5).astype(np.float32),
             "b0": rng.standard_normal(c).astype(np.float32),
             "w1": (rng.standard_normal((m, c, 1, 1)) / 8).astype(np.float32),
             "w2": (rng.standard_normal((m, 1, 3, 3)) / 3).astype(np.float32),
             "b2": rng.standard_normal(m).astype(np.float32),
             "w3": (rng.standard_normal((16, m, 1, 1)) / 8).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], group=c, kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
             helper.make_node("HardSwish", ["c0"], ["h0"]),
             helper.make_node("Conv", ["h0", "w1"], ["c1"]),
             helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], group=m, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["y"])]
    inits["lo"], inits["hi"] = np.float32(0.0), np.float32(6.0)
    f32 = TensorProto.FLOAT
    return make_model(nodes, [helper.make_tensor_value_info("x", f32, [1, c, hw, hw])],
                      [helper.make_tensor_value_info("y", f32, [1, 16, (hw + 1) // 2, (hw + 1) // 2])], inits)


@pytest.mark.parametrize("c,hw", [(24, 15), (250, 9)])
def test_session_with_the_layout_pass_matches_the_cpu_ep(c, hw):
    """conv_layout=nhwc: the chain runs as npu::ConvNhwc steps on their bound native calls (an NCHW-reading
    depthwise conv first, a compact-row one for c + 7 >= 256), within float32 rounding of the CPU EP."""
    model = _wide_chain_model(c, hw)
    LIVE_SESSIONS.clear()
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, {"conv_layout": "nhwc"}, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    steps = [s for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    convs = [s.prepared.attrs for s in steps if s.op == "npu::ConvNhwc"]
    assert [(a["layout_kind"], a["layout_in"]) for a in convs] == [("depthwise", "NCHW"), ("pointwise", "NHWC"),
                                                                   ("depthwise", "NHWC"), ("pointwise", "NHWC")]
    x = _floats((1, c, hw, hw), np.random.default_rng(2))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for _ in range(3):  # observed, then on the bound native steps
        got = sess.run(None, {"x": x})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert python_steps(sess) == []
