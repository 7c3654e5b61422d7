"""QLinearConv's bound step writes a partition output straight into ORT's buffer (qlinear_conv out=): the same
bytes as a new array, a wrong buffer refused, and in a session the CPU EP's values with no copy by the bridge."""

from __future__ import annotations

import numpy as np
import pytest

from _sweep import ints_with_extremes, node_model
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, npu_session, session_options

NAT = runtime.native_module()
pytestmark = pytest.mark.skipif(NAT is None, reason="no native kernels")


def _call(x, depthwise, y_signed, rng, lut=None):
    """qlinear_conv's arguments after x for a 3x3 pad-1 conv of x's channels (M = 12, or C when depthwise)."""
    c = x.shape[1]
    m = c if depthwise else 12
    w = ints_with_extremes((m, 9) if depthwise else (m, 3, 3, -(-c // 4) * 4), np.int8, rng)
    wz = np.zeros(m, np.int32)
    bias = rng.integers(-5000, 5000, m).astype(np.int32)
    mult = rng.uniform(0.001, 0.01, m).astype(np.float32)
    geom = [m, c if depthwise else 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
    return (7 if x.dtype == np.uint8 else -7, w, wz, bias, mult, -3 if y_signed else 9, y_signed, geom, depthwise, 2,
            lut)


@pytest.mark.parametrize("dtx", [np.uint8, np.int8])
@pytest.mark.parametrize("y_signed", [False, True])
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("hw", [(1, 1), (5, 17), (30, 31)])
@pytest.mark.parametrize("with_lut", [False, True])
def test_out_gets_the_bytes_of_a_new_array(dtx, y_signed, depthwise, hw, with_lut):
    rng = np.random.default_rng(hw[1] + 2 * depthwise + y_signed)
    x = ints_with_extremes((1, 8, *hw), dtx, rng)
    ydt = np.int8 if y_signed else np.uint8
    lut = ints_with_extremes((256,), ydt, rng) if with_lut else None
    args = _call(x, depthwise, y_signed, rng, lut)
    want = NAT.qlinear_conv(x, *args)
    assert want.dtype == ydt
    out = np.full(want.shape, 0x5A, ydt)
    got = NAT.qlinear_conv(x, *args, out=out)
    assert got.__array_interface__["data"][0] == out.__array_interface__["data"][0]
    assert out.tobytes() == want.tobytes()
    flat = np.full(want.size, 0x5A, ydt)  # any C-order shape of the output's size (ORT's 1-D conv output is 3-D)
    NAT.qlinear_conv(x, *args, out=flat)
    assert flat.tobytes() == want.tobytes()


def test_a_wrong_buffer_is_refused():
    rng = np.random.default_rng(1)
    x = ints_with_extremes((1, 8, 6, 6), np.uint8, rng)
    args = _call(x, False, False, rng)
    for bad in (np.empty((1, 12, 6, 6), np.int8), np.empty((1, 12, 6, 6), np.int32), np.empty((1, 12, 6, 5), np.uint8),
                np.empty((1, 12, 6, 12), np.uint8)[..., ::2], "buffer"):
        with pytest.raises(ValueError):
            NAT.qlinear_conv(x, *args, out=bad)
    ro = np.empty((1, 12, 6, 6), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        NAT.qlinear_conv(x, *args, out=ro)


@pytest.mark.parametrize("dtx", [np.uint8, np.int8])
@pytest.mark.parametrize("group", [1, 16])
@pytest.mark.parametrize("one_d", [False, True])
def test_session_writes_orts_buffer_with_the_cpu_eps_bits(monkeypatch, dtx, group, one_d):
    """The partition's output is the QLinearConv's: its bound step is given ORT's buffer and returns it (the bridge
    copies nothing), with the CPU EP's bits on every call."""
    seen = []
    real = NAT.qlinear_conv

    def spy(*args, **kw):
        y = real(*args, **kw)
        out = args[13] if len(args) > 13 else kw.get("out")  # after x, its 11 arguments and w_sums
        seen.append(out is not None and y is out)
        return y

    monkeypatch.setattr(NAT, "qlinear_conv", spy)
    rng = np.random.default_rng(group + one_d)
    c = m = 16
    spatial = (29,) if one_d else (9, 10)
    x = ints_with_extremes((1, c, *spatial), dtx, rng)
    inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True),
              ("xz", np.array(100 if dtx == np.uint8 else -20, dtx), True),
              ("w", rng.integers(-100, 100, (m, c // group, *(3,) * len(spatial))).astype(np.int8), True),
              ("ws", rng.uniform(0.002, 0.01, m).astype(np.float32), True), ("wz", np.zeros(m, np.int8), True),
              ("ys", np.array(0.3, np.float32), True), ("yz", np.array(5, dtx), True),
              ("b", rng.integers(-5000, 5000, m).astype(np.int32), True)]
    model = node_model("QLinearConv", inputs, group=group, pads=[1] * 2 * len(spatial))
    model.graph.node[0].name = "conv"
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess)["conv"] == "NpuEP"
    want = cpu_run(model, {"x": x})[0]
    for _ in range(4):  # the first call runs the kernel (a new array); later ones the bound step
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert [s for s in python_steps(sess) if s["op"] == "QLinearConv"] == []
    (program,) = session_of(sess).programs.values()
    assert program.native_step_counts[0] >= 2 and program.native_step_counts[1] == 0
    assert seen and seen[-1]


def _row_sums(w) -> np.ndarray:
    return w.reshape(w.shape[0], -1).sum(axis=1, dtype=np.int64).astype(np.int32)


@pytest.mark.parametrize("dtw", [np.int8, np.uint8])
@pytest.mark.parametrize("cg,m,hw", [(5, 8, (3, 3)), (8, 200, (3, 3)), (8, 41, (7, 7)), (5, 20, (30, 31)),
                                     (16, 100, (9, 50))])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("wzp", [False, True])
def test_given_weight_sums_give_the_per_call_bits(dtw, cg, m, hw, group, stride, wzp):
    """w_sums (made once for constant weights) give the bits of the sums each call makes, on every path: small
    maps of many rows (tasks of weight-row tiles, which summed their own rows), large maps, groups, strides, uint8
    weights (flipped), weight zero points, the fused table; and a wrong length is refused."""
    rng = np.random.default_rng(cg * m + group + stride)
    c, mm = cg * group, m * group
    x = ints_with_extremes((2, c, *hw), np.uint8, rng)
    w = ints_with_extremes((mm, 3, 3, -(-cg // 4) * 4), dtw, rng)
    mid = 128 if dtw == np.uint8 else 0  # the weights' zero: no zero-point term
    zp = rng.integers(-20, 20, mm) + mid if wzp else np.full(mm, mid)
    args = (17, w, zp.astype(np.int32), rng.integers(-5000, 5000, mm).astype(np.int32),
            rng.uniform(1e-5, 1e-3, mm).astype(np.float32), 9, False,
            [mm, group, 3, 3, stride, stride, 1, 1, 1, 1, 1, 1], False, 2)
    lut = ints_with_extremes((256,), np.uint8, rng)
    for table in (None, lut):
        want = NAT.qlinear_conv(x, *args, table)
        got = NAT.qlinear_conv(x, *args, table, _row_sums(w))
        assert got.tobytes() == want.tobytes()
    with pytest.raises(ValueError):
        NAT.qlinear_conv(x, *args, None, _row_sums(w)[:-1])


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("cg", [3, 8])
def test_uint8_weights_made_once_as_int8_keep_the_reference_bits(stride, cg):
    """uint8 weights go to the VNNI path as int8 w - 128 with zero points z - 128, made once (kernel_cache): the
    reference's bits, zero points at the type's ends; other paths keep the uint8 weights."""
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.registry import kernel_for
    from npu_ep.kernels.target import Target

    rng = np.random.default_rng(stride * cg)
    m = 20
    x = ints_with_extremes((1, cg, 11, 13), np.uint8, rng)
    wz = rng.integers(0, 256, m).astype(np.uint8)
    wz[:2] = [0, 255]
    inputs = [("x", x, False), ("xs", np.array(0.02, np.float32), True), ("xz", np.array(100, np.uint8), True),
              ("w", ints_with_extremes((m, cg, 3, 3), np.uint8, rng), True),
              ("ws", rng.uniform(0.002, 0.01, m).astype(np.float32), True), ("wz", wz, True),
              ("ys", np.array(0.5, np.float32), True), ("yz", np.array(5, np.uint8), True),
              ("b", rng.integers(-5000, 5000, m).astype(np.int32), True)]
    (node,) = nodes_from_model(node_model("QLinearConv", inputs, pads=[1, 1, 1, 1], strides=[stride, stride]))
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, Target.load("npu-ref"))
    args = [x] + [None] * 8
    runtime.configure([p], "native", 2)
    got = k.run(p, args)[0]
    flat = NAT.isa() in ("avx512_vnni", "amx_int8") and stride <= 2
    assert p.kernel_cache["dense_w"][1][0].dtype == (np.int8 if flat else np.uint8)
    runtime.configure([p], "reference", 1)
    np.testing.assert_array_equal(got, k.run(p, args)[0])
