"""Differential sweep of ``unary_num`` and ``clip_num`` (kernels/native/unary.cc, issue 40): Relu/Abs/Neg/Sqrt of
float32/float64/int8/int16/int32/int64, Not of bool and Clip by one-element bounds against the reference model's
numpy functions (kernels/ops/elementwise.py, activation.py) byte for byte (-0 kept by Relu and Clip, NaN signs,
Abs/Neg(INT_MIN) = INT_MIN): on every ISA level the host runs, sizes around the lane tails and the task split,
NaN/+-Inf/-0/subnormal/extreme values, 1 and 2 threads. Large nodes (from ``NATIVE_MIN_ELEMS`` elements; float32 and
float64 from ``_num_unary_min``) run and bind them; a session runs them natively with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, assert_session_runs_natively, bit_values, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import activation as act
from npu_ep.kernels.ops import elementwise as ew
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4042)
TASK = 32768
CASES = [(op, dt) for op, (_, dts) in ew._NUM_UNARY.items() for dt in dts]
CLIP_DTYPES = [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64]


@pytest.fixture(params=host_isas(top="avx512"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _values(shape, dt) -> np.ndarray:
    x = bit_values(shape, dt, RNG)
    if x.size and np.dtype(dt).kind == "i":
        x.reshape(-1)[::7] = np.iinfo(dt).min
    elif x.size and np.dtype(dt).kind == "f":
        x.reshape(-1)[2::9] = -0.0
        x.reshape(-1)[3::11] = np.array(-np.nan, dt)  # a NaN with the sign set
    return x


def _assert_bytes(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} vs {want.dtype}"
    assert got.tobytes() == want.tobytes(), f"{what}: {got.reshape(-1)[:8]} vs {want.reshape(-1)[:8]}"


def _reference(op, x):
    with np.errstate(all="ignore"):
        return np.asarray(ew._UNARY[op][0](x))


@pytest.mark.parametrize("op,dt", CASES, ids=[f"{op}-{np.dtype(dt)}" for op, dt in CASES])
def test_unary_bit_for_bit(capped_isa, op, dt):
    nat = runtime.native_module()
    for n in [*around(8, 16, 32, 64, 1024), 2 * TASK + 77]:
        x = _values((n,), dt)
        for threads in (1, 2):
            _assert_bytes(nat.unary_num(ew._NUM_UNARY[op][0], x, None, threads), _reference(op, x),
                          f"{op} {np.dtype(dt)} n={n} threads={threads}")


def _clip_bounds(dt):
    if np.dtype(dt).kind == "f":
        return [(-1.5, 2.0), (0.0, np.inf), (-0.0, 0.0), (3.0, -3.0), (None, 1.0), (-1.0, None)]
    return [(-5, 7), (0, None), (None, -3), (9, -9)]


@pytest.mark.parametrize("dt", CLIP_DTYPES)
def test_clip_bit_for_bit(capped_isa, dt):
    """numpy's clip ufunc with the open sides at the reference's defaults (FLOAT_RANGES: Clip(inf) without a max is
    FLT_MAX, as ORT's): ties and NaN keep x, lo > hi gives hi."""
    nat = runtime.native_module()
    ranges = ew.FLOAT_RANGES.get(np.dtype(dt)) or act._INT_RANGES[np.dtype(dt)]
    for lo, hi in _clip_bounds(dt):
        lo_a = ranges[0] if lo is None else np.array(lo, dt)
        hi_a = ranges[1] if hi is None else np.array(hi, dt)
        for n in [*around(16, 64), 2 * TASK + 77]:
            x = _values((n,), dt)
            for threads in (1, 2):
                _assert_bytes(nat.clip_num(x, lo_a, hi_a, None, threads), ew.CLIP_UFUNC(x, lo_a, hi_a),
                              f"Clip {np.dtype(dt)} [{lo}, {hi}] n={n} threads={threads}")


def test_clip_nan_bound_is_left_to_the_reference():
    nat = runtime.native_module()
    x = np.ones(10, np.float32)
    assert nat.clip_num(x, np.array(np.nan, np.float32), np.array(1, np.float32), None, 1) is None
    assert nat.clip_num(x, np.array(0, np.float32), np.array(np.nan, np.float32), None, 1) is None


def test_refusals():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match="no kernel"):
        nat.unary_num(3, np.zeros(3, np.int32), None, 1)  # integer Sqrt
    with pytest.raises(ValueError, match="no kernel"):
        nat.unary_num(4, np.zeros(3, np.float32), None, 1)  # Not of floats
    with pytest.raises(ValueError, match="out must be"):
        nat.unary_num(1, np.zeros(3, np.float32), np.zeros(4, np.float32), 1)
    with pytest.raises(ValueError, match="lo, hi"):
        nat.clip_num(np.zeros(3, np.float32), np.zeros(1, np.float64), np.zeros(1, np.float32), None, 1)


@pytest.mark.parametrize("op,dt", CASES, ids=[f"{op}-{np.dtype(dt)}" for op, dt in CASES])
def test_large_nodes_run_and_bind_unary_num(op, dt):
    x = _values((3, 30011), dt)
    if op == "Sqrt":
        x = np.abs(x)  # the run's reference warns nothing either way; keep the values positive for realism
    got, want, calls = native_vs_reference(op, [("x", x, False)])
    assert "unary_num" in calls, calls
    _assert_bytes(got[0], want[0], f"{op} {np.dtype(dt)}")
    _, _, calls = native_vs_reference(op, [("x", x[:, :64], False)])
    assert "unary_num" not in calls  # small and strided: the ufunc
    for n in (1, 1023, 1024, 8191, 8192, 8193):  # float32/float64 from _num_unary_min (Sqrt 1024, else 8192)
        small = x.reshape(-1)[:n]
        got, want, calls = native_vs_reference(op, [("x", small, False)])
        native = np.dtype(dt).kind == "f" and n >= ew._num_unary_min(small, op)
        assert ("unary_num" in calls) == native, f"{op} {np.dtype(dt)} n={n}: {calls}"
        _assert_bytes(got[0], want[0], f"{op} {np.dtype(dt)} n={n}")


_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}


@pytest.mark.parametrize("op,dt", [("Relu", np.float32), ("Abs", np.int32), ("Neg", np.int64), ("Neg", np.float32),
                                   ("Sqrt", np.float32), ("Not", np.bool_), ("Clip", np.float32), ("Clip", np.int64)])
def test_session_matches_cpu_ep_and_runs_natively(op, dt):
    shape = [1, 300, 256]
    x = (RNG.random(shape) > 0.5) if dt == np.bool_ else np.asarray(RNG.integers(-50, 50, shape)).astype(dt)
    if op == "Sqrt":
        x = np.abs(x)
    t = _TYPES[np.dtype(dt)]
    inits = {}
    names = ["x"]
    if op == "Clip":
        inits = {"lo": np.array(-7, dt), "hi": np.array(20, dt)}
        names += ["lo", "hi"]
    node = helper.make_node(op, names, ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info("x", t, shape)],
                       [helper.make_tensor_value_info("y", t, shape)], inits, opset=17)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, {"x": x})
