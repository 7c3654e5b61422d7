"""Differential sweep of com.microsoft QLinearSigmoid on the native kernels (issue 40): its 256-entry table read by
``qdq_lut`` (kernels/native/qdq_lut.cc) against the reference model (kernels/ops/qlinear_lut.py: numpy indexing of
the same table), byte for byte: int8 and uint8, every byte value, sizes around the 64-byte AVX-512 VBMI step and
the 2^18-element task split, scales and zero points constant or fed at run time, every ISA qdq_lut dispatches to.
The bound step is checked against the kernel by ``_sweep``. A session shows NpuEP ran the node as its bound native
step (no Python step), within one quantum of the CPU EP (ORT's MLAS logistic is an approximation; see
test_qlinear_ops.py), and bit-equal to the kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4060)
CHUNK = 1 << 18  # qdq_lut.cc's kLutChunk
MS = "com.microsoft"
PARAMS = [(0.05, 0, 1 / 256, 0), (0.1, 7, 0.004, 3), (0.02, -5, 0.01, 100)]


@pytest.fixture(params=host_isas(top="avx512"))
def lut_isa(request):
    yield from cap_isa(request.param)


def _bytes(shape, dt) -> np.ndarray:
    """Every byte value first, then random ones."""
    n = int(np.prod(shape))
    v = np.concatenate([np.arange(256), RNG.integers(0, 256, max(0, n - 256))])[:n]
    return v.astype(np.uint8).view(dt).reshape(shape)


def _inputs(x: np.ndarray, params, const: bool = True) -> list:
    sx, zx, sy, zy = params
    if x.dtype == np.uint8:
        zx, zy = zx + 128, min(255, abs(zy))
    return [("x", x, False), ("x_s", np.array(sx, np.float32), const), ("x_z", np.array(zx, x.dtype), const),
            ("y_s", np.array(sy, np.float32), const), ("y_z", np.array(zy, x.dtype), const)]


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("params", PARAMS)
def test_every_byte_and_lane_tail(lut_isa, dt, params):
    for n in around(64, 128, 256):
        check("QLinearSigmoid", _inputs(_bytes((n,), dt), params), "qdq_lut", domain=MS)
    check("QLinearSigmoid", _inputs(_bytes((2, 3, 5, 7), dt), params), "qdq_lut", domain=MS)


def test_runtime_parameters_and_task_split():
    check("QLinearSigmoid", _inputs(_bytes((3, 70), np.int8), PARAMS[1], const=False), "qdq_lut", domain=MS)
    x = _bytes((CHUNK + 65,), np.uint8)
    one = check("QLinearSigmoid", _inputs(x, PARAMS[2]), "qdq_lut", domain=MS, threads=1)
    two = check("QLinearSigmoid", _inputs(x, PARAMS[2]), "qdq_lut", domain=MS, threads=2)
    assert one[0].tobytes() == two[0].tobytes()


def _model(dt) -> tuple:
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    zp = 0 if dt == np.int8 else 128
    node = helper.make_node("QLinearSigmoid", ["x", "x_s", "x_z", "y_s", "y_z"], ["y"], name="the_op", domain=MS)
    consts = {"x_s": np.array(0.06, np.float32), "x_z": np.array(zp, dt), "y_s": np.array(1 / 256, np.float32),
              "y_z": np.array(zp - 128 if dt == np.int8 else 0, dt)}
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [1, 16, 40, 40])],
                       [helper.make_tensor_value_info("y", elem, [1, 16, 40, 40])], consts, opset=17,
                       extra_opsets=[(MS, 1)])
    return model


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_session_runs_the_bound_step_within_one_quantum_of_cpu_ep(dt):
    model = _model(dt)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    x = _bytes((1, 16, 40, 40), dt)
    want = cpu_run(model, {"x": x})[0]
    first = sess.run(None, {"x": x})[0]
    for _ in range(2):  # the bound step's calls
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == dt and got.tobytes() == first.tobytes()
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1, diff.max()
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
