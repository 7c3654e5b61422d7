"""Differential sweep of npu::QdqMatMul on the native kernels (issue 40) against the reference model
(kernels/ops/qdq_matmul.py: float64 BLAS, exact, then the float32 requantization), bit for bit.

``qdq_matmul_int`` (the exact integer GEMM on W - w_zp packed as int16 panels) at every ISA it dispatches to: 8- and
16-bit activations, signed and unsigned, zero points at both ends of their ranges, per-tensor and per-column weight
scales, 8- and 16-bit outputs saturating at both ends, ranks 1..3; M around the 4-row register tile and the 32-row
task, N around the 16-column panel, the 2-panel tile and the 128-column task, K odd and even and around the
int32 chunk (128 pairs of K for 8-bit weights), and worst-case operands whose sums pass 2^31 (the int64 flush).
``qdq_matmul_small`` (float64) keeps weights whose |W - w_zp| is not int16. The bound step is checked against the
kernel by ``_sweep``. Sessions of 16-bit QDQ MatMul units show NpuEP ran them as bound native steps (no Python
step) within one quantum of the CPU EP (ORT sums the dequantized products in float32, see the module docstring)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import REF, around, check, native_vs_reference, node_model
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.ops.qdq_matmul import SMALL_PRODUCT
from npu_ep.tools.bench.ops import _ep_session, python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4064)


def _ints(shape, dt, lo=None, hi=None) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dt)


def _inputs(x, k, n, per_column, out_dt, ys=0.05, xz=None, w=None, wz=0):
    w = _ints((k, n), np.int8) if w is None else w
    ws = (RNG.uniform(0.001, 0.02, n) if per_column else np.array(0.01)).astype(np.float32)
    wz = np.full(n if per_column else (), wz, w.dtype)
    info = np.iinfo(x.dtype)
    xz = info.min // 4 + info.max // 4 if xz is None else xz
    return [("x", x, False), ("xs", np.array(0.002, np.float32), True),
            ("xz", np.array(xz, x.dtype), True), ("w", w, True), ("ws", ws, True),
            ("wz", wz, True), ("ys", np.array(ys, np.float32), True), ("yz", np.array(3, out_dt), True)]


@pytest.fixture(params=host_isas(top="avx512_vnni"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _out_for(act):
    return act if act in (np.int16, np.uint16) else np.int8


@pytest.mark.parametrize("act", [np.int16, np.uint16, np.int8, np.uint8])
def test_integer_gemm_bit_exact_across_tiles(capped_isa, act):
    for m in around(4, 32, low=1)[:6] + [33]:
        for k, n in ((1, 1), (2, 16), (7, 17), (64, 31), (255, 32), (257, 33), (128, 129)):
            x = _ints((m, k), act)
            check("QdqMatMul", _inputs(x, k, n, per_column=(m + n) % 2 == 1, out_dt=_out_for(act)),
                  "qdq_matmul_int", domain="npu", what=f"{capped_isa} {act.__name__} M={m} K={k} N={n}")


@pytest.mark.parametrize("act", [np.int16, np.uint16, np.int8, np.uint8])
@pytest.mark.parametrize("wdt", [np.int8, np.uint8])
def test_zero_points_at_the_extremes(capped_isa, act, wdt):
    info, winfo = np.iinfo(act), np.iinfo(wdt)
    for xz in (info.min, info.max, 0):
        for wz in (winfo.min, winfo.max):
            x = _ints((5, 33), act)
            check("QdqMatMul", _inputs(x, 33, 40, True, _out_for(act), xz=xz, w=_ints((33, 40), wdt), wz=wz),
                  "qdq_matmul_int", domain="npu", what=f"{capped_isa} x_zp={xz} w_zp={wz}")


@pytest.mark.parametrize("act", [np.int16, np.uint16])
def test_sums_past_int32_stay_exact(capped_isa, act):
    """|x - x_zp| = 65535 and |W - w_zp| = 255 over K = 1031: each sum is ~4.4e9 (past 2^31), so a wrapped int32
    lane would show; tiny scales keep the outputs unsaturated."""
    info = np.iinfo(act)
    k, n = 1031, 18
    x = np.full((3, k), info.max, act)
    x[1] = info.min
    w = np.full((k, n), 127, np.int8)
    w[:, 1::2] = -1
    inputs = _inputs(x, k, n, False, np.int16, ys=1.0, xz=info.min if act == np.int16 else 0, w=w, wz=-128)
    inputs[1] = ("xs", np.array(1e-3, np.float32), True)
    inputs[4] = ("ws", np.array(5e-4, np.float32), True)
    got = check("QdqMatMul", inputs, "qdq_matmul_int", domain="npu", what=f"{capped_isa} worst case")[0]
    assert 1000 < np.abs(got.astype(np.int64)).max() < 32767  # neither saturated nor zero


def test_threads_split_rows_and_columns():
    x = _ints((70, 200), np.int16)
    check("QdqMatMul", _inputs(x, 200, 300, True, np.int16), "qdq_matmul_int", domain="npu", threads=2)
    x = _ints((1, 1024), np.uint16)
    check("QdqMatMul", _inputs(x, 1024, 1100, False, np.uint16), "qdq_matmul_int", domain="npu", threads=2)


@pytest.mark.parametrize("act", [np.int16, np.uint16, np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_ranks_bit_exact(act, per_column):
    for shape, n in (((1, 64), 64), ((3, 7), 9), ((2, 3, 31), 17), ((33,), 15), ((1, 1), 1)):
        check("QdqMatMul", _inputs(_ints(shape, act, -300 if act == np.int16 else None, 2000 if act in
                                         (np.int16, np.uint16) else None), shape[-1], n, per_column, _out_for(act)),
              "qdq_matmul_int", domain="npu")


def test_outputs_saturate_at_both_ends():
    x = _ints((4, 16), np.int16)
    check("QdqMatMul", _inputs(x, 16, 8, True, np.int8, ys=1e-6), "qdq_matmul_int", domain="npu")
    check("QdqMatMul", _inputs(x, 16, 8, False, np.uint16, ys=1e-6), "qdq_matmul_int", domain="npu")


def _wide_weights(k, n):
    """int16 weights with w_zp = -32768: |W - w_zp| reaches 65535, past the integer GEMM's int16 panels."""
    w = _ints((k, n), np.int16, -32768, -30000)
    w[0, 0] = 32767
    return w


def test_packed_weights_are_the_only_copy_prepare_keeps():
    """The float64 W the reference multiplies by (8 bytes a weight) is made on its first run, not kept at prepare
    beside the int16 panels."""
    k, n = 300, 200
    (node,) = nodes_from_model(node_model("QdqMatMul", _inputs(_ints((2, k), np.int16), k, n, False, np.int16),
                                          domain="npu"))
    p = kernel_for("npu", "QdqMatMul").prepare(node, REF)
    assert p.consts["wp"].dtype == np.int16
    assert sum(np.asarray(v).nbytes for v in p.consts.values()) < 2 * (k + 1) * (n + 15) + 16 * n


def test_weights_past_int16_take_the_float64_loop():
    x = _ints((3, 8), np.int16, -100, 100)
    check("QdqMatMul", _inputs(x, 8, 8, False, np.int16, w=_wide_weights(8, 8), wz=-32768), "qdq_matmul_small",
          domain="npu")


def test_a_larger_product_of_wide_weights_stays_on_the_reference():
    x = _ints((SMALL_PRODUCT // 64 + 1, 8), np.int16, -100, 100)
    got, want, calls = native_vs_reference("QdqMatMul", _inputs(x, 8, 8, False, np.int16, w=_wide_weights(8, 8),
                                                                 wz=-32768), domain="npu")
    assert "qdq_matmul_small" not in calls and "qdq_matmul_int" not in calls
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("act, lead, k, n", [(np.int16, (1,), 64, 64), (np.uint16, (1, 40), 96, 80),
                                             (np.int16, (2, 33), 130, 47)])
def test_session_of_a_16_bit_unit_runs_the_bound_step(act, lead, k, n, monkeypatch):
    onnx_type = TensorProto.INT16 if act == np.int16 else TensorProto.UINT16
    info = np.iinfo(act)
    w = _ints((k, n), np.int8, -20, 20)
    consts = {"xs": np.array(0.002, np.float32), "xz": np.array(info.min // 2 + info.max // 2 + 7, act), "w": w,
              "ws": np.array(0.01, np.float32), "wz": np.array(-3, np.int8), "ys": np.array(0.05, np.float32),
              "yz": np.array(5, act)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], name="dq_w"),
             helper.make_node("MatMul", ["xf", "wf"], ["yf"], name="mm"),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"], name="q_y")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", onnx_type, [*lead, k])],
                       [helper.make_tensor_value_info("y", onnx_type, [*lead, n])], consts, opset=21)
    bound = []
    real_call_step = runtime.call_step

    def recording(p, fn, *args):
        bound.append((fn.__name__, args[4] if len(args) > 4 else None))  # (function, ort_outputs)
        return real_call_step(p, fn, *args)

    monkeypatch.setattr(runtime, "call_step", recording)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    mid = info.min // 2 + info.max // 2
    feeds = {"x": _ints((*lead, k), act, mid - 3000, mid + 3000)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1
    assert python_steps(sess) == [], "the unit ran its Python kernel instead of the bound native step"
    assert [s.op for p in _ep_session(sess).programs.values() for s in p.steps] == ["npu::QdqMatMul"]
    assert bound == [("qdq_matmul_int", [(13, 0, [*lead, n])])], "not bound to write into ORT's output buffer"


def test_weight_arrays_of_other_layouts_are_converted_as_before():
    """The kernels borrow C-order weights of their dtype as they are and convert others as pybind11's caster did
    (a Fortran-order W, a list mult) to the same bytes; a value that is no array of numbers is a TypeError naming
    it."""
    nat = runtime.native_module()
    x = _ints((3, 8), np.int16, -100, 100)
    w = RNG.integers(-50, 50, (8, 5)).astype(np.float64)
    mult = np.array([0.01], np.float64)
    args = (0.0, mult, np.float32(0.5), np.float32(0), np.float32(-32768), np.float32(32767), np.dtype(np.int16))
    want = nat.qdq_matmul_small(x, w, *args)
    got = nat.qdq_matmul_small(x, np.asfortranarray(w), 0.0, mult.tolist(), *args[2:])
    assert got.tobytes() == want.tobytes()
    with pytest.raises(TypeError, match="mult"):
        nat.qdq_matmul_small(x, w, 0.0, "mult", *args[2:])
    with pytest.raises(TypeError, match="wp"):
        nat.qdq_matmul_int(x, "wp", np.zeros(16, np.int64), 5, 0, 64, mult, *args[2:])
