"""Differential sweep of npu::QdqMatMul's small products on the native kernels (issue 40): ``qdq_matmul_small``
(kernels/native/qdq_matmul.cc) against the reference model (kernels/ops/qdq_matmul.py: float64 BLAS, exact, then
the float32 requantization), bit for bit: 8- and 16-bit activations, signed and unsigned, per-tensor and per-column
weight scales, 8- and 16-bit outputs saturating at both ends, ranks 1..3, K and N around the vector lanes, products
up to the SMALL_PRODUCT bound (a larger one stays on the reference). The bound step is checked against the kernel by
``_sweep``. A session of a 16-bit QDQ MatMul unit shows NpuEP ran it as its bound native step (no Python step)
within one quantum of the CPU EP (ORT sums the dequantized products in float32, see the module docstring)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import check, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.qdq_matmul import SMALL_PRODUCT
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4064)


def _ints(shape, dt, lo=None, hi=None) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dt)


def _inputs(x, k, n, per_column, out_dt, ys=0.05):
    w = _ints((k, n), np.int8)
    ws = (RNG.uniform(0.001, 0.02, n) if per_column else np.array(0.01)).astype(np.float32)
    wz = np.zeros(n if per_column else (), np.int8)
    info = np.iinfo(x.dtype)
    return [("x", x, False), ("xs", np.array(0.002, np.float32), True),
            ("xz", np.array(info.min // 4 + info.max // 4, x.dtype), True), ("w", w, True), ("ws", ws, True),
            ("wz", wz, True), ("ys", np.array(ys, np.float32), True), ("yz", np.array(3, out_dt), True)]


@pytest.mark.parametrize("act", [np.int16, np.uint16, np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_small_products_bit_exact(act, per_column):
    for shape, n in (((1, 64), 64), ((3, 7), 9), ((2, 3, 31), 17), ((33,), 15), ((1, 1), 1)):
        out = act if act in (np.int16, np.uint16) else np.int8
        check("QdqMatMul", _inputs(_ints(shape, act, -300 if act == np.int16 else None, 2000 if act in
                                         (np.int16, np.uint16) else None), shape[-1], n, per_column, out),
              "qdq_matmul_small", domain="npu")


def test_outputs_saturate_at_both_ends():
    x = _ints((4, 16), np.int16)
    check("QdqMatMul", _inputs(x, 16, 8, True, np.int8, ys=1e-6), "qdq_matmul_small", domain="npu")
    check("QdqMatMul", _inputs(x, 16, 8, False, np.uint16, ys=1e-6), "qdq_matmul_small", domain="npu")


def test_a_larger_product_stays_on_the_reference():
    x = _ints((SMALL_PRODUCT // 64 + 1, 8), np.int16, -100, 100)
    got, want, calls = native_vs_reference("QdqMatMul", _inputs(x, 8, 8, False, np.int16), domain="npu")
    assert "qdq_matmul_small" not in calls
    np.testing.assert_array_equal(got[0], want[0])


def test_session_of_a_16_bit_unit_runs_the_bound_step():
    k, n = 64, 64
    w = _ints((k, n), np.int8, -20, 20)
    consts = {"xs": np.array(0.002, np.float32), "xz": np.array(0, np.int16), "w": w,
              "ws": np.array(0.01, np.float32), "wz": np.array(0, np.int8), "ys": np.array(0.05, np.float32),
              "yz": np.array(0, np.int16)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], name="dq_w"),
             helper.make_node("MatMul", ["xf", "wf"], ["yf"], name="mm"),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"], name="q_y")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT16, [1, k])],
                       [helper.make_tensor_value_info("y", TensorProto.INT16, [1, n])], consts, opset=21)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    feeds = {"x": _ints((1, k), np.int16, -3000, 3000)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype
        assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1
    assert python_steps(sess) == [], "the unit ran its Python kernel instead of the bound native step"
