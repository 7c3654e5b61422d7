"""Differential sweep of com.microsoft QLinearAdd and QLinearMul on the native kernels (issue 40):
``qlinear_add``/``qlinear_mul`` (kernels/native/qlinear_binary.cc) against the reference model
(kernels/ops/qlinear_binary.py, which reproduces ORT's MLAS sequence), bit for bit: int8 and uint8, every
broadcast (ranks 0..4, an operand constant along the innermost run on either side or both, size-0 axes), operand
values over the whole byte range (saturation at both ends), many scale ratios and zero points, constants in place
and parameters fed at run time, run lengths around the vector lanes and the 32768-element task split on one and
two threads, every ISA the rows are compiled for. The bound step is checked against the kernel by ``_sweep``.
Sessions show NpuEP ran the node as its bound native step (no Python step) with the CPU EP's integers, exactly
(ORT's own MLAS float32 sequence is the reference; test_qlinear_binary.py pins the reference to it)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, assert_session_runs_natively, check
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4061)
TASK = 32768  # qlinear_binary.cc's kTaskElems
MS = "com.microsoft"
OPS = ["QLinearAdd", "QLinearMul"]
NATIVE = {"QLinearAdd": "qlinear_add", "QLinearMul": "qlinear_mul"}
SHAPES = [((2, 3, 40), (2, 3, 40)), ((2, 3, 40), (40,)), ((2, 3, 40), (2, 3, 1)), ((1,), (4, 33)),
          ((4, 33), ()), ((3, 1, 17), (1, 5, 17)), ((5, 1), (1, 7)), ((), ()), ((2, 1, 1, 9), (2, 3, 5, 1)),
          ((2, 0, 3), (1, 3)), ((1, 1), (1, 1))]


@pytest.fixture(params=host_isas(top="avx512"))
def row_isa(request):
    yield from cap_isa(request.param)


def _bytes(shape, dt) -> np.ndarray:
    n = int(np.prod(shape))
    v = np.concatenate([np.arange(256), RNG.integers(0, 256, max(0, n - 256))])[:n]
    return RNG.permutation(v).astype(np.uint8).view(dt).reshape(shape)


def _params(op: str, dt, rng: np.random.Generator) -> tuple:
    info = np.iinfo(dt)
    zps = [int(rng.integers(info.min, info.max, endpoint=True)) for _ in range(3)]
    scales = [float(10 ** rng.uniform(-3, 0)) for _ in range(3)]
    return scales, zps


def _inputs(a, b, scales, zps, runtime_params=False) -> list:
    dt = a.dtype
    return [("a", a, False), ("a_s", np.array(scales[0], np.float32), not runtime_params),
            ("a_z", np.array(zps[0], dt), not runtime_params), ("b", b, False),
            ("b_s", np.array(scales[1], np.float32), True), ("b_z", np.array(zps[1], dt), True),
            ("c_s", np.array(scales[2], np.float32), True), ("c_z", np.array(zps[2], dt), True)]


def _check(op, a, b, scales, zps, threads=1, runtime_params=False, const_b=False):
    inputs = _inputs(a, b, scales, zps, runtime_params)
    if const_b:
        inputs[3] = ("b", b, True)
    return check(op, inputs, NATIVE[op], domain=MS, threads=threads)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_broadcasts_and_parameters_bit_exact(row_isa, op, dt):
    rng = np.random.default_rng(7)
    for sa, sb in SHAPES:
        for _ in range(3):
            scales, zps = _params(op, dt, rng)
            _check(op, _bytes(sa, dt), _bytes(sb, dt), scales, zps)
            _check(op, _bytes(sb, dt), _bytes(sa, dt), scales, zps)


@pytest.mark.parametrize("op", OPS)
def test_lane_tails_constants_and_runtime_parameters(row_isa, op):
    rng = np.random.default_rng(8)
    for n in around(16, 32, 64):
        scales, zps = _params(op, np.int8, rng)
        _check(op, _bytes((n,), np.int8), _bytes((n,), np.int8), scales, zps)
        _check(op, _bytes((2, n), np.uint8), _bytes((2, 1), np.uint8), scales, [z + 128 for z in zps])
    scales, zps = _params(op, np.uint8, rng)
    _check(op, _bytes((3, 70), np.uint8), _bytes((70,), np.uint8), scales, zps, runtime_params=True)
    _check(op, _bytes((3, 70), np.uint8), _bytes((3, 1), np.uint8), scales, zps, const_b=True)


@pytest.mark.parametrize("op", OPS)
def test_task_split_same_bytes_on_two_threads(op):
    scales, zps = [0.02, 0.03, 0.05], [3, -7, 1]
    a, b = _bytes((3, TASK + 9), np.int8), _bytes((3, TASK + 9), np.int8)
    one = _check(op, a, b, scales, zps, threads=1)
    two = _check(op, a, b, scales, zps, threads=2)
    assert one[0].tobytes() == two[0].tobytes()


def test_operands_of_two_dtypes_are_refused_by_name():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"qlinear_add: a and b must be C-order arrays of one dtype.*int8\[3\]"):
        nat.qlinear_add(np.zeros(3, np.int8), np.zeros(3, np.uint8), 1.0, 1.0, 0.0, None, 1)
    with pytest.raises(ValueError, match=r"qlinear_mul: shapes \[2\] and \[3\] do not broadcast"):
        nat.qlinear_mul(np.zeros(2, np.int8), np.zeros(3, np.int8), 0, 0, 1.0, 0.0, None, 1)


def _session(op: str, dt, a_shape, b_shape):
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    zp = 0 if dt == np.int8 else 128
    names = ["a", "a_s", "a_z", "b", "b_s", "b_z", "c_s", "c_z"]
    node = helper.make_node(op, names, ["y"], name="the_op", domain=MS)
    consts = {"a_s": np.array(0.031, np.float32), "a_z": np.array(zp + 3, dt), "b_s": np.array(0.047, np.float32),
              "b_z": np.array(zp - 2, dt), "c_s": np.array(0.06 if op == "QLinearAdd" else 0.4, np.float32),
              "c_z": np.array(zp + 1, dt)}
    out = list(np.broadcast_shapes(a_shape, b_shape))
    model = make_model([node], [helper.make_tensor_value_info("a", elem, list(a_shape)),
                                helper.make_tensor_value_info("b", elem, list(b_shape))],
                       [helper.make_tensor_value_info("y", elem, out)], consts, opset=17, extra_opsets=[(MS, 1)])
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    return model, npu_session(model, so=so)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("shapes", [((1, 16, 20, 20), (1, 16, 20, 20)), ((1, 16, 20, 20), (1, 16, 1, 1))])
def test_session_runs_the_bound_step_with_cpu_ep_integers(op, dt, shapes):
    model, sess = _session(op, dt, *shapes)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"a": _bytes(shapes[0], dt), "b": _bytes(shapes[1], dt)}
    assert_session_runs_natively(sess, model, feeds)
