"""The native conv-net kernels (kernels/native/conv.cc, pool.cc, quantize.cc) against the numpy reference model
(kernels/ops/conv.py, pool.py with ``kernels=reference``), on every instruction-set path this host runs:

- QLinearConv: bit-exact (exact int32 sums, the same MLAS requantization) over odd sizes, pads, strides,
  dilations, groups, depthwise (depth multipliers), 1-D, channel counts that are not a multiple of 4, K beyond
  one 64-deep GEMM tile, more output pixels than one task's block, saturating outputs, u8/s8 combinations ORT's
  CPU EP runs, with per-channel zero points;
- float Conv: bit-exact for depthwise convs (the same float32 operations in the same order); other shapes (blocked
  implicit GEMM, or the BLAS in blocks of pixels: each sums an output in its own order, which for the BLAS depends
  on the kernel OpenBLAS picks for the CPU) within 2 K eps sum|x * w| + |bias| eps of the reference, the float32
  dot-product bound both are within of the exact sum (test_sweep_conv.py);
- MaxPool float32, uint8, int8: bit-exact (a maximum has one answer; NaN propagates as in numpy);
- per-tensor QuantizeLinear / DequantizeLinear (the element-wise steps of QDQ graphs): bit-exact, with ties,
  NaN, infinities and saturation;
- same bits at any thread count;
- whole nets in NpuEP sessions (graph assignment checked): the benchmark's conv/relu/pool x3 + Gemm net in fp32
  (vs ORT's CPU EP, rtol 1e-4) and quantized by ORT's quantize_static (native == reference bit for bit, and within
  one output quantum of ORT's CPU EP with ORT_DISABLE_ALL, which runs the QDQ graph literally).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from _single_op import model as single_op_model
from _single_op import run_ort
from npu_ep.ep import _native as ext
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.tail_program import CODES
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.convnet import small_net
from tests.ep._qdq_models import quantize_qdq
from tests.npu_testing import assignment, cpu_run, npu_session

NK = ext.kernels
RNG = np.random.default_rng(21)
TARGET = Target.load("npu-ref")



def _prepared(op: str, inputs, **attrs):
    """(kernel, prepared, run args) of one node, typed from ORT's own run of it."""
    from _single_op import _with_output_types

    m = single_op_model(op, inputs, **attrs)
    (node,) = nodes_from_model(_with_output_types(m, run_ort(m, inputs)))
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, TARGET)
    feeds = {s[0]: s[1] for s in inputs if not s[2]}
    return k, p, [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]


def _run(k, p, args, kernels: str, threads: int = 1) -> np.ndarray:
    runtime.configure([p], kernels, threads)
    return k.run(p, args)[0]


# x shape, w shape, attrs
SHAPES = [
    ((1, 3, 11, 9), (8, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 4, 10, 10), (6, 2, 3, 2), dict(group=2, strides=[2, 1], dilations=[1, 2])),
    ((1, 6, 7, 8), (6, 1, 3, 3), dict(group=6, auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 16, 9, 9), (32, 1, 3, 3), dict(group=16, strides=[2, 2], pads=[0, 1, 1, 0])),  # depth multiplier 2
    ((2, 8, 7, 7), (8, 1, 5, 5), dict(group=8, auto_pad="SAME_LOWER")),
    ((1, 6, 11, 10), (12, 1, 3, 3), dict(group=6, dilations=[2, 1], strides=[1, 2], pads=[2, 1, 2, 1])),
    ((1, 5, 9, 6), (7, 5, 1, 1), dict()),  # pointwise
    ((2, 8, 70, 65), (12, 8, 1, 1), dict()),  # pointwise over two pixel blocks per image (x's rows as B)
    ((1, 6, 9, 7), (8, 3, 1, 1), dict(group=2)),  # grouped pointwise
    ((1, 4, 6, 7), (6, 4, 1, 1), dict(pads=[1, 0, 0, 1])),  # 1x1 with pads
    ((1, 3, 8, 8), (4, 3, 4, 4), dict(auto_pad="SAME_LOWER")),
    ((1, 37, 13, 11), (19, 37, 3, 3), dict(pads=[2, 0, 1, 3], strides=[1, 2])),  # K = 333: GEMM depth tails
    ((1, 1, 45, 40), (5, 1, 3, 3), dict(pads=[1, 1, 1, 1])),  # one input channel, 1800 pixels: several tasks
    ((1, 20, 40, 33), (24, 20, 3, 3), dict(pads=[1, 1, 1, 1], dilations=[2, 2])),  # pixel blocks with a tail
    ((1, 2, 4, 4), (3, 2, 5, 5), dict(pads=[2, 2, 2, 2], strides=[3, 3])),  # kernel larger than the input
    ((2, 4, 17), (6, 4, 3), dict(pads=[1, 1])),  # 1-D
    ((1, 8, 20), (8, 1, 5), dict(group=8, strides=[2], pads=[2, 2])),  # depthwise 1-D
    ((1, 10, 9, 12), (10, 1, 5, 5), dict(group=10, strides=[2, 1], pads=[2, 2, 2, 2])),  # PP-LCNet's (2, 1) stride
    ((1, 4, 13, 9), (8, 1, 3, 3), dict(group=4, strides=[3, 1], dilations=[2, 1], pads=[1, 0, 2, 1])),
    # rows wider than one 16-float register, with a partial last one (the register-blocked AVX-512 rows)
    ((1, 6, 2, 37), (6, 1, 5, 5), dict(group=6, pads=[2, 2, 2, 2])),
    ((1, 3, 7, 50), (6, 1, 3, 3), dict(group=3, strides=[2, 1], dilations=[1, 2], pads=[1, 2, 0, 3])),
    ((1, 3, 16), (5, 3, 4), dict(dilations=[3], pads=[0, 2])),
    # AVX-512: B read in place from zero-padded input rows (unit width stride, rows of >= 16 outputs)
    ((1, 37, 20, 32), (19, 37, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 1])),  # K = 333 in two depth chunks
    ((2, 6, 18, 48), (10, 3, 3, 3), dict(group=2, dilations=[2, 1], pads=[2, 1, 0, 1])),
    ((1, 3, 64, 64), (16, 3, 3, 3), dict(pads=[1, 1, 1, 1])),  # the small net's first conv: 2 blocks of rows
    ((1, 5, 7, 20), (3, 5, 2, 5), dict(pads=[0, 2, 1, 2])),  # 20 outputs a row: one full vector and a partial one
]


def _depthwise(xs, ws, attrs) -> bool:
    """Depthwise convs do the reference's float32 operations in its order."""
    return ws[1] == 1 and attrs.get("group", 1) == xs[1] and xs[1] > 1


@pytest.mark.parametrize("xs,ws,attrs", SHAPES)
def test_float_conv_native_equals_reference(isa, xs, ws, attrs):
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True), ("b", b, True)], **attrs)
    got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    assert got.shape == want.shape and got.dtype == want.dtype
    if _depthwise(xs, ws, attrs):
        np.testing.assert_array_equal(got, want)
        return
    ka, pa, args_abs = _prepared("Conv", [("x", np.abs(x), False), ("w", np.abs(w), True)], **attrs)
    eps = np.finfo(np.float32).eps
    bound = 2 * int(np.prod(ws[1:])) * eps * _run(ka, pa, args_abs, "reference")
    bound += eps * np.abs(b).reshape(1, -1, *([1] * (len(xs) - 2)))
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound), np.abs(got.astype(np.float64) - want).max()


@pytest.mark.parametrize("xs,ws,attrs", [SHAPES[0], SHAPES[1], SHAPES[11], SHAPES[13]])
def test_float_conv_without_a_cblas_symbol_uses_native_patches_and_numpy_matmul(monkeypatch, xs, ws, attrs):
    """A BLAS without cblas_sgemm64: one native patch matrix per image times numpy's matmul (the reference's
    product for one-group convs of one image: bit-equal)."""
    from npu_ep.kernels import host_blas

    monkeypatch.setattr(host_blas, "sgemm_address", lambda: None)
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True)], **attrs)
    got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    if attrs.get("group", 1) == 1 and xs[0] == 1:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float_depthwise_edge_values_bit_exact(isa):
    """NaN, Inf and signed zeros go through the same float32 operations as in the reference."""
    x = RNG.standard_normal((1, 4, 9, 10)).astype(np.float32)
    x[0, 0, 3, 4], x[0, 1, 0, 0], x[0, 2, 8, 9], x[0, 3] = np.nan, np.inf, -np.inf, -0.0
    w = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    w[1, 0, 1, 1] = 0.0
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True)], group=4, pads=[1, 1, 1, 1])
    with np.errstate(invalid="ignore"):  # inf * 0 in the reference, as IEEE says
        got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("xs,ws,attrs", [SHAPES[0], SHAPES[23]])
def test_float_dense_edge_values(isa, xs, ws, attrs):
    """NaN and infinities reach the same outputs as in the reference (a GEMM sums in its own order: values
    within rtol 1e-5)."""
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    x[0, 0, 2, 3], x[0, 1, 5, 7], x[0, 2, 1, 1] = np.nan, np.inf, -np.inf
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True)], **attrs)
    with np.errstate(invalid="ignore"):  # inf - inf in the reference's sums, as IEEE says
        got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _qinputs(xs, ws, dtx, dtw, per_channel, y_scale=None):
    ix, iw = np.iinfo(dtx), np.iinfo(dtw)
    x = RNG.integers(ix.min, ix.max + 1, xs).astype(dtx)
    w = RNG.integers(iw.min, iw.max + 1, ws).astype(dtw)
    m = ws[0]
    wsc = (RNG.uniform(0.002, 0.01, m) if per_channel else np.array(0.005)).astype(np.float32)
    if per_channel:
        wzp = RNG.integers(iw.min, iw.max + 1, m).astype(dtw) if dtw == np.uint8 else np.zeros(m, dtw)
    else:
        wzp = np.array(0 if dtw == np.int8 else 120, dtw)
    k = ws[1] * int(np.prod(ws[2:]))
    ys = np.float32(y_scale if y_scale is not None else 0.05 * np.sqrt(k))
    return [("x", x, False), ("xs", np.array(0.03, np.float32), True),
            ("xz", np.array(128 if dtx == np.uint8 else -3, dtx), True), ("w", w, True), ("ws", wsc, True),
            ("wz", wzp, True), ("ys", np.array(ys, np.float32), True), ("yz", np.array(5, dtx), True),
            ("b", RNG.integers(-3000, 3000, m).astype(np.int32), True)]


@pytest.mark.parametrize("xs,ws,attrs", SHAPES)
@pytest.mark.parametrize("dtx,dtw", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
def test_qlinearconv_native_bit_exact(isa, xs, ws, attrs, dtx, dtw):
    k, p, args = _prepared("QLinearConv", _qinputs(xs, ws, dtx, dtw, per_channel=True), **attrs)
    got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xs,ws,attrs", [SHAPES[0], SHAPES[3], SHAPES[9]])
def test_qlinearconv_saturation_and_per_tensor(isa, xs, ws, attrs):
    """A tiny output scale saturates most outputs at both ends; per-tensor weight scale and zero point."""
    k, p, args = _prepared("QLinearConv", _qinputs(xs, ws, np.uint8, np.uint8, False, y_scale=1e-3), **attrs)
    got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    assert (got == 0).any() and (got == 255).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [SHAPES[4], SHAPES[10], SHAPES[11], SHAPES[23], SHAPES[25]])
def test_same_bits_at_any_thread_count(shape):
    xs, ws, attrs = shape
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    kf, pf, af = _prepared("Conv", [("x", x, False), ("w", w, True)], **attrs)
    kq, pq, aq = _prepared("QLinearConv", _qinputs(xs, ws, np.uint8, np.int8, True), **attrs)
    f1, q1 = _run(kf, pf, af, "native", 1), _run(kq, pq, aq, "native", 1)
    for t in (2, 3):
        np.testing.assert_array_equal(_run(kf, pf, af, "native", t), f1)
        np.testing.assert_array_equal(_run(kq, pq, aq, "native", t), q1)


@pytest.mark.parametrize("xs,ws,attrs", [((1, 64, 20, 20), (72, 64, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
                                         ((1, 512, 10, 10), (44, 512, 1, 1), dict())])
def test_small_map_split_over_output_channels_keeps_the_bits(isa, xs, ws, attrs):
    """A small map (YOLO's 10x10) is one pixel block: on AVX-512 its output channels go to two tasks (40 + 32,
    24 + 20 channels). The bits equal one thread's; against float64 within a float32 dot product's rounding bound."""
    rng = np.random.default_rng(41)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True)], **attrs)
    one = _run(k, p, args, "native", 1)
    for t in (2, 3):
        assert _run(k, p, args, "native", t).tobytes() == one.tobytes()
    ref = _run(k, p, args, "reference")
    ka, pa, aa = _prepared("Conv", [("x", np.abs(x), False), ("w", np.abs(w), True)], **attrs)
    bound = 2 * ws[1] * ws[2] * ws[3] * np.finfo(np.float32).eps * _run(ka, pa, aa, "reference")  # both orders' error
    assert (np.abs(one - ref) <= bound).all()


@pytest.mark.parametrize("c,m,side", [(128, 33, 8), (64, 49, 9), (64, 65, 8), (64, 81, 7), (64, 129, 6)])
def test_small_map_split_over_output_channels_computes_every_channel(isa, c, m, side):
    """Issue 38: the two output-channel tasks of a small map were each Mg/2 rounded to 8 rows, so M = 16j + 1 left
    its last channel unwritten (leftover memory). Every channel within a float32 dot product's rounding bound of
    the reference, and against ORT's CPU EP in a session (graph assignment checked)."""
    rng = np.random.default_rng(61)
    x = rng.standard_normal((1, c, side, side)).astype(np.float32)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True)], pads=[1, 1, 1, 1])
    got, ref = _run(k, p, args, "native", 2), _run(k, p, args, "reference")
    ka, pa, aa = _prepared("Conv", [("x", np.abs(x), False), ("w", np.abs(w), True)], pads=[1, 1, 1, 1])
    bound = 2 * c * 9 * np.finfo(np.float32).eps * _run(ka, pa, aa, "reference")
    assert np.isfinite(got).all() and (np.abs(got - ref) <= bound).all()
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, got.shape)], [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    np.testing.assert_allclose(_on_npu(model, x, "native"), cpu_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,ws", [((1, 16, 32, 32), (32, 16, 3, 3)), ((1, 32, 16, 16), (64, 32, 3, 3)),
                                   ((1, 8, 9, 9), (24, 8, 3, 3))])
def test_qlinearconv_one_chunk_image_split_for_two_threads_keeps_the_bits(xs, ws):
    """An image whose pixels fit one packed chunk is cut in two when it is worth two threads (the first two shapes:
    a small net's 32x32 and 16x16 convs; the third stays one chunk): the reference's bits at 1, 2 and 3 threads."""
    k, p, args = _prepared("QLinearConv", _qinputs(xs, ws, np.uint8, np.int8, True), pads=[1, 1, 1, 1])
    want = _run(k, p, args, "reference")
    for t in (1, 2, 3):
        np.testing.assert_array_equal(_run(k, p, args, "native", t), want)


@pytest.mark.parametrize("xs,attrs", [
    ((1, 5, 12, 11), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 3, 6, 70), dict(kernel_shape=[2, 2], strides=[2, 2])),  # 35 outputs a row: two 16-wide steps and a tail
    ((2, 3, 9, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 4, 7, 8), dict(kernel_shape=[3, 2], dilations=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 5, 6), dict(kernel_shape=[1, 3], strides=[1, 3], auto_pad="SAME_LOWER")),
    ((1, 3, 15), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),  # 1-D
    ((2, 3, 11, 33), dict(kernel_shape=[2, 2], strides=[2, 2])),  # odd sides: the last row and column unused
    ((1, 2, 9, 40), dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 2])),  # dilated: pairs not adjacent
    ((1, 2, 8, 37), dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[1, 2])),
])
@pytest.mark.parametrize("dt", [np.float32, np.uint8, np.int8])
def test_maxpool_native_bit_exact(isa, xs, attrs, dt):
    if dt == np.float32:
        x = RNG.standard_normal(xs).astype(np.float32)
        x.reshape(-1)[::17] = np.nan
        x.reshape(-1)[5::23] = -np.inf
    else:
        x = RNG.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, xs).astype(dt)
    k, p, args = _prepared("MaxPool", [("x", x, False)], **attrs)
    np.testing.assert_array_equal(_run(k, p, args, "native"), _run(k, p, args, "reference"))


@pytest.mark.parametrize("xs,attrs", [
    ((1, 6, 3, 80), dict(kernel_shape=[3, 2], strides=[3, 2])),  # the OCR recognizer's pool
    ((2, 3, 9, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((2, 3, 9, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)),
    ((1, 4, 7, 8), dict(kernel_shape=[3, 2], dilations=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 7, 9), dict(kernel_shape=[2, 1], strides=[3, 3], auto_pad="SAME_LOWER")),  # negative pads
    ((1, 2, 2, 2), dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2])),  # windows wholly in padding: 0 / 0
    ((1, 3, 15), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),  # 1-D
    ((1, 2, 8, 37), dict(kernel_shape=[2, 2], strides=[1, 1])),
])
def test_averagepool_native_bit_exact(isa, xs, attrs):
    """The same float32 sums in the same tap order, the same division: the reference's bits, signed zeros (a
    window of -0.0 with padding in it sums to +0.0), NaN and Inf included."""
    x = RNG.standard_normal(xs).astype(np.float32)
    x.reshape(-1)[::19] = np.nan
    x.reshape(-1)[5::29] = np.inf
    x.reshape(-1)[7::31] = -np.inf
    x[0, 0] = -0.0
    k, p, args = _prepared("AveragePool", [("x", x, False)], **attrs)
    got, want = _run(k, p, args, "native"), _run(k, p, args, "reference")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    for t in (2, 3):
        np.testing.assert_array_equal(_run(k, p, args, "native", t), got)


@pytest.mark.parametrize("qt", [np.uint8, np.int8])
def test_per_tensor_quantize_dequantize_native_bit_exact(isa, qt):
    """Ties (x / scale = k + 0.5), NaN (to the lowest value), +-Inf and far out-of-range values saturate."""
    scale, zp = np.float32(0.05), qt(3)
    x = np.concatenate([RNG.standard_normal(70000).astype(np.float32) * 5,
                        (np.arange(-300, 300, dtype=np.float32) + 0.5) * scale,
                        np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, -0.0, 0.0], np.float32)]).reshape(1, -1)
    k, p, args = _prepared("QuantizeLinear", [("x", x, False), ("s", np.array(scale), True),
                                              ("z", np.array(zp), True)])
    got = _run(k, p, args, "native", 2)
    np.testing.assert_array_equal(got, _run(k, p, args, "reference"))
    assert got.dtype == qt and got.min() == np.iinfo(qt).min and got.max() == np.iinfo(qt).max
    k, p, args = _prepared("DequantizeLinear", [("q", got, False), ("s", np.array(scale), True),
                                                ("z", np.array(zp), True)])
    np.testing.assert_array_equal(_run(k, p, args, "native", 2), _run(k, p, args, "reference"))


def test_bad_geometry_is_a_clear_error():
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(ValueError, match="group 3 must divide C=4"):
        NK.conv_im2col(x, 0, [6, 3, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        NK.conv_im2col(x, 0, [6, 1, 7, 3, 1, 1, 1, 1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="w has 3 elements"):
        NK.conv_depthwise(x, np.zeros(3, np.float32), None, [4, 4, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0])


@pytest.mark.parametrize("ws,group,c", [((6, 4, 3, 3), 1, 2), ((6, 4, 3, 3), 1, 3), ((6, 8, 3, 3), 1, 5),
                                         ((6, 2, 3, 3), 2, 2)])
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_qlinearconv_symbolic_channel_dim_that_does_not_match_the_weights_is_refused(ws, group, c, kernels):
    """Issue 38: x [1, "C", 5, 5] fed with C = 2 or 3 against 4 weight channels (or 5 against 8) ran natively (the
    native weights pad C/group up to 4 and the padding was read as channels of zero-point input). The CPU EP
    refuses it; NpuEP must too, naming the node, the op and both shapes."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
        "w": rng.integers(-100, 100, ws).astype(np.int8), "ws": np.array(0.01, np.float32),
        "wz": np.array(0, np.int8), "ys": np.array(0.5, np.float32), "yz": np.array(100, np.uint8)}.items()]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="qconv",
                            group=group, pads=[1, 1, 1, 1])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, "C", 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, ws[0], 5, 5])], inits),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    sess = npu_session(model, {"kernels": kernels})
    assert assignment(sess) == {"qconv": "NpuEP"}
    good = {"x": rng.integers(0, 256, (1, ws[1] * group, 5, 5)).astype(np.uint8)}
    np.testing.assert_array_equal(sess.run(None, good)[0], cpu_run(model, good)[0])
    bad = {"x": rng.integers(0, 256, (1, c, 5, 5)).astype(np.uint8)}
    with pytest.raises(Exception):  # noqa: B017 - ORT's error classes are not public
        cpu_run(model, bad)
    wshape = ", ".join(map(str, ws))
    with pytest.raises(Exception, match=rf"node 'qconv' \(QLinearConv\).*QLinearConv: input X \[1, {c}, 5, 5\] "
                                        rf"has {c} channels; weights \[{wshape}\] with group {group} need "
                                        rf"{ws[1] * group}"):
        sess.run(None, bad)


# --- whole nets in NpuEP sessions ------------------------------------------------------------------------------
def _on_npu(model, x, kernels: str, output: int = 0) -> np.ndarray:
    sess = npu_session(model, {"kernels": kernels})
    placed = assignment(sess)
    assert placed and set(placed.values()) == {"NpuEP"}, placed
    return sess.run(None, {"x": x})[output]


def test_small_conv_net_fp32_session_matches_cpu_ep():
    """The convs, pools and flatten equal the reference model to its old tolerance; the head's 4096-deep product
    sums in the packed GEMM's order on AVX-512 hosts (numpy's elsewhere), so it is held to the float32 dot-product
    error bound around the exact (float64) product of the same flattened features."""
    model = small_net()
    model.graph.output.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 64 * 8 * 8]))
    x = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    got = _on_npu(model, x, "native")
    np.testing.assert_allclose(got, cpu_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    features = _on_npu(model, x, "native", output=1)
    np.testing.assert_allclose(features, _on_npu(model, x, "reference", output=1), rtol=1e-5, atol=1e-6)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w, b = init["wf"].T.astype(np.float64), init["bf"].astype(np.float64)
    exact = features.astype(np.float64) @ w + b
    bound = w.shape[0] * 2.0 ** -24 * (np.abs(features).astype(np.float64) @ np.abs(w)) + 1e-30
    assert (np.abs(got - exact) <= bound).all(), float(np.max(np.abs(got - exact) / bound))


def test_small_conv_net_qdq_session(tmp_path):
    model = quantize_qdq(small_net(), (1, 3, 64, 64), tmp_path, "convnet")
    x = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    got = _on_npu(model, x, "native")
    np.testing.assert_array_equal(got, _on_npu(model, x, "reference"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    scale = next(float(np.asarray(i.float_data or np.frombuffer(i.raw_data, np.float32))[0])
                 for n in model.graph.node if n.output[0] == model.graph.output[0].name
                 for i in model.graph.initializer if i.name == n.input[1])
    assert np.all(np.abs(got - ref) <= scale * 1.0001), np.abs(got - ref).max() / scale


def test_depthwise_scratch_follows_the_geometry():
    """The padded-plane scratch is kept per thread across calls: convs of the same scratch size but other padding,
    run alternately, each still equal the reference."""
    x = RNG.standard_normal((1, 6, 8, 10)).astype(np.float32)
    w = RNG.standard_normal((6, 1, 3, 3)).astype(np.float32)
    convs = [_prepared("Conv", [("x", x, False), ("w", w, True)], group=6, pads=pads)
             for pads in ([1, 1, 1, 1], [2, 2, 0, 0], [0, 0, 2, 2])]
    for _ in range(2):
        for k, p, args in convs:
            np.testing.assert_array_equal(_run(k, p, args, "native"), _run(k, p, args, "reference"))


@pytest.mark.parametrize("ws,attrs", [((6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1])), ((4, 6, 3, 3), dict())])
def test_native_call_made_once_per_shape_follows_replaced_constants(ws, attrs):
    """The float conv's native call is built once per input shape (conv._float_call); a bias or weight object that
    was replaced since (a rebased ORT initializer) rebuilds it, and other shapes get their own."""
    w, b = RNG.standard_normal(ws).astype(np.float32), RNG.standard_normal(ws[0]).astype(np.float32)
    x = RNG.standard_normal((1, 6, 8, 9)).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True), ("b", b, True)], **attrs)
    first = _run(k, p, args, "native")
    np.testing.assert_array_equal(_run(k, p, args, "native"), first)
    p.consts["bias"] = p.consts["bias"] + np.float32(1.0)
    np.testing.assert_allclose(_run(k, p, args, "native"), first + 1.0, rtol=1e-6, atol=1e-6)
    small = [x[:, :, :5, :7]] + args[1:]
    np.testing.assert_allclose(_run(k, p, small, "native"), _run(k, p, small, "reference"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ws,attrs", [
    ((6, 1, 5, 5), dict(group=6, pads=[2, 2, 2, 2], strides=[2, 2])),  # PP-LCNet's
    ((6, 1, 3, 3), dict(group=6, pads=[1, 2, 0, 1], strides=[1, 3], dilations=[2, 2])),
    ((12, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1], strides=[2, 2])),  # multiplier 2
])
def test_float_depthwise_wider_strides_bit_exact_with_edge_values(isa, ws, attrs):
    """On AVX-512 a width stride > 1 reads the plane as column phases (one per stride step) with unit-stride loads:
    the reference's float32 operations in its order all the same, NaN, Inf and signed zeros included."""
    rng = np.random.default_rng(43)
    x = rng.standard_normal((2, 6, 14, 17)).astype(np.float32)
    x[0, 0, 3, 4], x[0, 1, 0, 0], x[1, 2, 13, 16], x[1, 3] = np.nan, np.inf, -np.inf, -0.0
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True), ("b", b, True)], **attrs)
    with np.errstate(invalid="ignore"):
        got, want = _run(k, p, args, "native", 2), _run(k, p, args, "reference")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("c,m,relu", [(48, 40, False), (300, 70, True), (512, 1280, False)])
def test_pointwise_over_a_few_pixels_sums_each_output_as_the_pixel_gemm_does(isa, c, m, relu):
    """A 1x1 conv over fewer than 16 pixels (PP-LCNet's 1x1 head, SE blocks) puts its output channels in the lanes
    on AVX-512: each output is the same sum as in a 16-pixel image (depth chunks of 256 in order, then the bias and
    the ReLU), so a pixel's output does not depend on the image size; the same bits at any thread count."""
    rng = np.random.default_rng(47)
    big = rng.standard_normal((1, c, 4, 4)).astype(np.float32)  # 16 pixels: the pixel-lane GEMM
    w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)

    def run(x, threads):
        k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True), ("b", b, True)])
        if relu:  # the conv tail's lone clip, as the fusion pass writes it
            p.consts["tail_codes"] = np.asarray([CODES["clip"]], np.int32)
            p.consts["tail_c"] = np.asarray([[0.0, np.inf]], np.float32)
        return _run(k, p, args, "native", threads)

    for pixels in ((1, 1), (1, 3), (3, 5)):
        small = np.ascontiguousarray(big[:, :, :pixels[0], :pixels[1]])
        one = run(small, 1)
        assert run(small, 2).tobytes() == one.tobytes()
        if isa in ("avx512", "avx512_vnni", "amx_int8"):
            np.testing.assert_array_equal(one, run(big, 1)[:, :, :pixels[0], :pixels[1]])
        want = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), small.astype(np.float64)) \
            + b[None, :, None, None]
        if relu:
            want = np.maximum(want, 0)
        bound = 2 * c * np.finfo(np.float32).eps * (np.einsum("mc,nchw->nmhw", np.abs(w[:, :, 0, 0]), np.abs(small))
                                                    + np.abs(b)[None, :, None, None])
        assert (np.abs(one - want) <= bound).all()


@pytest.mark.parametrize("ws,attrs", [((24, 16, 5, 1), dict()),
                                      ((24, 16, 3, 1), dict(pads=[1, 0, 2, 0], strides=[2, 1])),
                                      ((8, 8, 3, 1), dict(group=2, dilations=[2, 1]))])
def test_a_column_image_runs_as_the_same_conv_along_its_row(isa, ws, attrs):
    """Magika's conv: x [N, C, L, 1] with a kx1 kernel is computed as [N, C, 1, L] with 1xk (the same memory and
    weight order), its L outputs read in place; within a dot product's rounding bound of the reference."""
    rng = np.random.default_rng(53)
    x = rng.standard_normal((2, 16, 300, 1)).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    k, p, args = _prepared("Conv", [("x", x, False), ("w", w, True)], **attrs)
    got = _run(k, p, args, "native", 2)
    assert _run(k, p, args, "native", 1).tobytes() == got.tobytes()
    ref = _run(k, p, args, "reference")
    ka, pa, aa = _prepared("Conv", [("x", np.abs(x), False), ("w", np.abs(w), True)], **attrs)
    bound = 2 * ws[1] * ws[2] * np.finfo(np.float32).eps * _run(ka, pa, aa, "reference")
    assert got.shape == ref.shape and (np.abs(got - ref) <= bound).all()


@pytest.mark.parametrize("xs,attrs", [
    ((1, 8, 10, 10), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])),  # YOLOv8's SPPF
    ((2, 3, 9, 37), dict(kernel_shape=[3, 4], pads=[1, 0, 2, 3])),  # 37 outputs a row: two 16-wide steps and a tail
    ((1, 3, 6, 7), dict(kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 1], ceil_mode=1)),
    ((1, 2, 5, 20), dict(kernel_shape=[3, 9], pads=[1, 4, 1, 4])),  # windows wider than the row's ends
])
def test_unit_stride_maxpool_column_pass_bit_exact(isa, xs, attrs):
    """AVX-512 takes a unit-width-stride window's columns 16 outputs at a time from the row maximum laid out with
    the pads: the reference's values, NaN and -inf included."""
    rng = np.random.default_rng(59)
    x = rng.standard_normal(xs).astype(np.float32)
    x.reshape(-1)[::13] = np.nan
    x.reshape(-1)[4::7] = -np.inf
    k, p, args = _prepared("MaxPool", [("x", x, False)], **attrs)
    np.testing.assert_array_equal(_run(k, p, args, "native", 2), _run(k, p, args, "reference"))


@pytest.mark.parametrize("xs,attrs,padded", [
    ((1, 2, 8, 36), dict(kernel_shape=[2, 2], strides=[2, 2]), False),  # the 2x2 register kernel
    ((1, 2, 9, 36), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 0, 0]), True),  # column pairs, a padded row
    ((1, 2, 10, 20), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), True),  # the unit-stride column pass (SPPF)
    ((1, 2, 9, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), True),  # the scalar pass
    ((1, 2, 7, 9), dict(kernel_shape=[2, 2], dilations=[2, 2]), False),
])
def test_maxpool_over_minus_infinity_equals_the_reference(isa, xs, attrs, padded):
    """A window of -inf values gives -inf, and -FLT_MAX where it reaches the padding (the reference pads with
    -FLT_MAX, as MLAS pads a row's ends); the native kernel gave -FLT_MAX everywhere. Without padding ORT agrees.
    With padding ORT's answer depends on its implementation (PERF.md's executor history, session 23: its 2-D kernel
    ignores the padded rows, its dilated one every pad, its 1-D one gives -FLT_MAX even inside), so the reference
    keeps one rule."""
    x = np.full(xs, -np.inf, np.float32)
    x[0, 1, ::3, ::4] = np.arange(x[0, 1, ::3, ::4].size, dtype=np.float32).reshape(x[0, 1, ::3, ::4].shape)
    k, p, args = _prepared("MaxPool", [("x", x, False)], **attrs)
    ref = _run(k, p, args, "reference")
    assert np.isneginf(ref).any()
    np.testing.assert_array_equal(_run(k, p, args, "native", 2), ref)
    if not padded:
        want = run_ort(single_op_model("MaxPool", [("x", x, False)], **attrs), [("x", x, False)])[0]
        np.testing.assert_array_equal(ref, want)
