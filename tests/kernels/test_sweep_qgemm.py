"""Differential sweep of com.microsoft QGemm on the native kernels (issue 40): a quantized-output QGemm with a
constant B and no C runs ``int8_matmul`` (kernels/native/int8_gemm.cc, B packed at prepare, MLAS's requantization
fused), bit for bit against the reference model (kernels/ops/qgemm.py: exact int32 product, the same float32
multiplier and requantization): int8/uint8 A and B, transB 0 and 1, per-tensor and per-column B scales and zero
points, alpha, M, K and N around the kernel's 16-column and 64-deep blocks, outputs saturating at both ends. A
float output or a C bias stays on the reference. The bound step is checked against the kernel by ``_sweep``. A
session shows NpuEP ran the node as its bound native step (no Python step) with the CPU EP's integers exactly
(bit-exact where MLAS's integer GEMM is exact: VNNI hosts, see the module docstring)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import assert_session_runs_natively, check, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4065)
MS = "com.microsoft"


def _ints(shape, dt) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


def _inputs(m, k, n, dta, dtb, trans_b, per_column, dty=np.int8, ys=0.4, c=None):
    b = _ints((n, k) if trans_b else (k, n), dtb)
    bs = (RNG.uniform(0.001, 0.01, n) if per_column else np.array(0.004)).astype(np.float32)
    bz = _ints((n,) if per_column else (), dtb) // 8
    return [("a", _ints((m, k), dta), False), ("as", np.array(0.02, np.float32), True),
            ("az", np.array(5, dta), True), ("b", b, True), ("bs", bs, True), ("bz", bz.astype(dtb), True),
            ("c", c, True), ("ys", np.array(ys, np.float32), True), ("yz", np.array(-3 if dty == np.int8 else 120,
                                                                                   dty), True)]


@pytest.mark.parametrize("dta,dtb", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_quantized_output_bit_exact(dta, dtb, trans_b):
    for m, k, n in ((1, 64, 16), (3, 63, 17), (5, 65, 15), (2, 130, 33), (1, 1, 1)):
        for per_column in (False, True):
            check("QGemm", _inputs(m, k, n, dta, dtb, trans_b, per_column, dty=dta), "int8_matmul", domain=MS,
                  transB=trans_b, alpha=0.75)


def test_outputs_saturate_at_both_ends():
    check("QGemm", _inputs(4, 64, 32, np.uint8, np.int8, 1, True, dty=np.uint8, ys=1e-5), "int8_matmul",
          domain=MS, transB=1)


def test_a_c_bias_stays_on_the_reference():
    inputs = _inputs(2, 16, 8, np.uint8, np.int8, 0, False, c=RNG.integers(-50, 50, 8).astype(np.int32))
    got, want, calls = native_vs_reference("QGemm", inputs, domain=MS)
    assert "int8_matmul" not in calls
    np.testing.assert_array_equal(got[0], want[0])


def test_session_runs_the_bound_step_with_cpu_ep_integers():
    m, k, n = 8, 128, 64
    names = ["a", "as", "az", "b", "bs", "bz", "", "ys", "yz"]
    node = helper.make_node("QGemm", names, ["y"], name="the_op", domain=MS, transB=1)
    consts = {"as": np.array(0.02, np.float32), "az": np.array(128, np.uint8), "b": _ints((n, k), np.int8),
              "bs": np.array(0.004, np.float32), "bz": np.array(0, np.int8), "ys": np.array(0.3, np.float32),
              "yz": np.array(128, np.uint8)}
    model = make_model([node], [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, [m, n])], consts, opset=17,
                       extra_opsets=[(MS, 1)])
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"a": _ints((m, k), np.uint8)}
    assert_session_runs_natively(sess, model, feeds)
