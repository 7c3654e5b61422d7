"""Differential sweep of com.microsoft QLinearAdd and QLinearMul on the native kernels (issue 40):
``qlinear_add``/``qlinear_mul`` (kernels/native/qlinear_binary.cc) against the reference model
(kernels/ops/qlinear_binary.py, which reproduces ORT's MLAS sequence), bit for bit: int8 and uint8, every
broadcast (ranks 0..4, an operand constant along the innermost run on either side or both, size-0 axes), operand
values over the whole byte range (saturation at both ends), many scale ratios and zero points, constants in place
and parameters fed at run time, run lengths around the vector lanes, the 64-element packs and the 32768-element
task split on one and two threads, ratios on both sides of the int32 bound of the packs, every ISA the rows are
compiled for. The bound step is checked against the kernel by ``_sweep``. Sessions show NpuEP ran the node as its
bound native step (no Python step) with the CPU EP's integers, exactly (ORT's own MLAS float32 sequence is the
reference; test_qlinear_binary.py pins the reference to it, and every byte pair here pins QLinearAdd's fixed part
and folded operand)."""

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


# (scales, zero points): ratios whose values stay inside int32 (64-element packs), at the +-2^30 bound on either
# side, far past it (every lane saturates; the 16-element float clamp), with zero points at the type's extremes
_WIDE = {"QLinearAdd": [([1.0, 1.0, 1 / 2.0e6], [0, 0, 0]), ([1.0, 1.0, 1 / 2.2e6], [0, 0, 0]),
                        ([1.0, 0.5, 1e-9], [5, -5, 0]), ([0.5, 0.25, 1.0], [-128, 127, -128]),
                        ([2.0, 3.0, 0.01], [127, -128, 127])],
         "QLinearMul": [([100.0, 100.0, 1 / 150.0], [0, 0, 0]), ([100.0, 100.0, 1 / 170.0], [-128, 127, 0]),
                        ([1.0, 1.0, 1e-9], [3, 4, 0]), ([0.05, 0.05, 0.01], [-128, 127, -128]),
                        ([0.02, 0.03, 0.05], [127, -128, 127])]}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_packed_runs_at_64_element_boundaries_and_int32_bound(row_isa, op, dt):
    shift = 0 if dt == np.int8 else 128
    for scales, zps in _WIDE[op]:
        zps = [z + shift for z in zps]
        for n in around(64, 128, 192):
            _check(op, _bytes((2, n), dt), _bytes((2, n), dt), scales, zps)
            _check(op, _bytes((3, n), dt), _bytes((3, 1), dt), scales, zps)
            _check(op, _bytes((1,), dt), _bytes((2, n), dt), scales, zps)


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
        nat.qlinear_add(np.zeros(3, np.int8), np.zeros(3, np.uint8), 1.0, 1.0, 0.0, 0.0, None, 1)
    with pytest.raises(ValueError, match=r"qlinear_mul: shapes \[2\] and \[3\] do not broadcast"):
        nat.qlinear_mul(np.zeros(2, np.int8), np.zeros(3, np.int8), 0, 0, 1.0, 0.0, None, 1)


def _session(op: str, dt, a_shape, b_shape, scales=None, zps=None):
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    zp = 0 if dt == np.int8 else 128
    scales = scales or (0.031, 0.047, 0.06 if op == "QLinearAdd" else 0.4)
    zps = zps or (zp + 3, zp - 2, zp + 1)
    names = ["a", "a_s", "a_z", "b", "b_s", "b_z", "c_s", "c_z"]
    node = helper.make_node(op, names, ["y"], name="the_op", domain=MS)
    consts = {f"{k}_s": np.array(s, np.float32) for k, s in zip("abc", scales)}
    consts.update({f"{k}_z": np.array(z, dt) for k, z in zip("abc", zps)})
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


# Parameters where ORT's fixed part, zC - fma(rA, zA, rB * zB), differs from the unfused zC - (rA*zA + rB*zB) and
# from the fma on B's side by an ulp that moves some codes
_CONTRACTED = [(np.uint8, (0.785060703754425, 0.016029082238674164, 0.0076860422268509865), (200, 232, 38)),
               (np.int8, (0.036692336201667786, 0.008450931869447231, 0.015369837172329426), (-126, 31, 77)),
               (np.int8, (0.002525817137211561, 0.0013739203568547964, 0.0033458510879427195), (50, 54, 126)),
               (np.uint8, (0.00446026585996151, 0.01753680594265461, 0.024531275033950806), (174, 92, 20))]


@pytest.mark.parametrize("dt,scales,zps", _CONTRACTED)
@pytest.mark.parametrize("shapes", [((256, 256), (256, 256)), ((256, 256), (256, 1)), ((256, 1), (256, 256))])
def test_add_fixed_part_and_folded_operand_are_ort_fmas_on_every_pair(dt, scales, zps, shapes):
    """Every (a, b) byte pair, both varying and with either operand constant along the run (folded into the fixed
    part by an fma, as ORT's compiled MLAS kernel does): the CPU EP's codes, exactly."""
    model, sess = _session("QLinearAdd", dt, *shapes, scales=scales, zps=zps)
    codes = np.arange(256, dtype=np.uint8).view(dt)
    a = np.broadcast_to(codes[:, None], shapes[0]).copy()
    b = np.broadcast_to(codes[None, :] if shapes[1][1] == 256 else codes[:, None], shapes[1]).copy()
    assert_session_runs_natively(sess, model, {"a": a, "b": b})
