"""Differential sweep of Mod (issue 40): ``mod_into`` (kernels/native/mod.cc) against the reference model
(kernels/ops/elementwise.py: numpy's remainder for fmod=0, numpy's fmod for fmod=1), byte for byte: both are exact
(integer remainders; fmod's float result is exact, so float16 computed in float32 and rounded is too), NaN payloads
and -0.0 included. Integers over their whole range with negative dividends and divisors (the sign rules of fmod=0
and fmod=1), INT_MIN % -1, every broadcast of the two operands (ranks 0..4, size-1 and size-0 axes), constants in
place, sizes around the 8192-element task split, one thread and two; floats with NaN, +-Inf, -0, subnormals and zero
divisors on both sides. A zero integer divisor returns None from the kernel and the reference raises. Sessions show
NpuEP ran the node as its bound native step (no Python step) with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import around, assert_session_runs_natively, bit_values, native_vs_reference, node_model, run_kernel
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4042)
TASK = 8192  # mod.cc's kTaskElems
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((), (2, 3, 4)), ((3, 1), (1, 5)), ((2, 0, 3), (1, 3)),
          ((), ()), ((5, 1, 1, 2), (3, 1, 2)), ((1, 7), (6, 1)), ((2, 3, 4, 5), (3, 1, 5))]


def _dividends(shape, dt) -> np.ndarray:
    x = bit_values(shape, dt, RNG)
    if x.dtype.kind in "iu" and x.size:  # small values too: most remainders of whole-range values are the dividend
        x.reshape(-1)[::3] = RNG.integers(-20 if x.dtype.kind == "i" else 0, 20, x.reshape(-1)[::3].size)
        if x.dtype.kind == "i":
            x.reshape(-1)[0] = np.iinfo(x.dtype).min
    return x


def _divisors(shape, dt) -> np.ndarray:
    """Nonzero integers (small and whole-range, -1 among them) or floats with specials and zeros."""
    x = bit_values(shape, dt, RNG)
    flat = x.reshape(-1)
    if x.dtype.kind in "iu":
        flat[::2] = RNG.integers(-7 if x.dtype.kind == "i" else 1, 8, flat[::2].size)
        flat[flat == 0] = 3
        if x.dtype.kind == "i" and flat.size:
            flat[0] = -1
    elif flat.size > 2:
        flat[1], flat[2] = 0.0, -0.0
    return x


def _bytes_equal(a, b, fmod: int, consts=(), threads: int = 1) -> np.ndarray:
    inputs = [("a", a, 0 in consts), ("b", b, 1 in consts)]
    got, want, calls = native_vs_reference("Mod", inputs, threads=threads, fmod=fmod)
    what = f"Mod fmod={fmod} {a.dtype}{a.shape} {b.shape} consts={consts} threads={threads}"
    assert "mod_into" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == a.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert g.tobytes() == w.tobytes(), f"{what}: bytes differ"
    return g


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_broadcasts_and_constants_byte_for_byte(dt, fmod):
    for sa, sb in SHAPES:
        for consts in ((), (0,), (1,)):
            _bytes_equal(_dividends(sa, dt), _divisors(sb, dt), fmod, consts)


@pytest.mark.parametrize("dt", FLOATS)
def test_float_fmod_with_specials_byte_for_byte(dt):
    for sa, sb in SHAPES:
        for consts in ((), (1,)):
            _bytes_equal(_dividends(sa, dt), _divisors(sb, dt), 1, consts)
    specials = np.array([0.0, -0.0, 1.5, -1.5, 3.0, -7.25, np.inf, -np.inf, np.nan, 1e-40, 6e4, 1e-7], np.float64)
    _bytes_equal(specials.astype(dt)[:, None], specials.astype(dt)[None, :], 1)  # every pair


def test_sign_rules_and_int_min():
    """fmod=0 takes the divisor's sign, fmod=1 the dividend's; INT_MIN % -1 is 0 (C's would trap)."""
    a = np.array([7, -7, 7, -7, -2**31, 0], np.int32)
    b = np.array([3, 3, -3, -3, -1, -5], np.int32)
    assert _bytes_equal(a, b, 0).tolist() == [1, 2, -2, -1, 0, 0]
    assert _bytes_equal(a, b, 1).tolist() == [1, -1, 1, -1, 0, 0]


@pytest.mark.parametrize("dt", [np.int32, np.int64, np.float16, np.float32])
def test_task_split_byte_for_byte(dt):
    fmod = int(np.dtype(dt).kind == "f")
    for n in around(8, 16, TASK):
        _bytes_equal(_dividends((n,), dt), _divisors((n,), dt), fmod)
        _bytes_equal(_dividends((2, n), dt), _divisors((2, 1), dt), fmod)
    a, b = _dividends((3, TASK + 9), dt), _divisors((1,), dt)
    assert _bytes_equal(a, b, fmod, threads=1).tobytes() == _bytes_equal(a, b, fmod, threads=2).tobytes()


def _fmod_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 dividends and divisors for mod.cc's 16-lane path: any bits (quotients far beyond 2^50, NaN payloads,
    subnormals, infinities: the lanes left to std::fmod), exponents a few apart, and dividends at, one ulp off and
    around multiples q * y for q up to 2^52 (the double quotient's rounding and the one-step correction)."""
    bits = RNG.integers(0, 2**32, (2, n), dtype=np.uint64).astype(np.uint32).view(np.float32)
    e = RNG.integers(-149, 128, n)
    near_x = (RNG.random(n) * 2.0 ** e).astype(np.float32) * RNG.choice(np.float32([-1, 1]), n)
    near_y = (RNG.random(n) * 2.0 ** (e - RNG.integers(0, 60, n))).astype(np.float32)
    y = (RNG.random(n) + 0.5).astype(np.float32) * RNG.choice(np.float32([-1, 1]), n)
    multiple = (np.floor(RNG.random(n) * 2.0 ** RNG.integers(0, 53, n)) * y).astype(np.float32)
    multiple *= RNG.choice(np.float32([-1, 1]), n)
    xs = [bits[0], near_x, multiple, np.nextafter(multiple, np.float32(np.inf)),
          np.nextafter(multiple, np.float32(-np.inf))]
    return np.concatenate(xs), np.concatenate([bits[1], near_y, y, y, y])


def test_float32_vector_fmod_byte_for_byte():
    """mod.cc's 16-lane fmod in double gives std::fmod's bits: every lane kind, runs with tails around 16 lanes and
    one-value operands, one thread and two across the task split."""
    x, y = _fmod_pairs(4000)
    for n in around(16, 32, low=1):
        _bytes_equal(x[:n], y[:n], 1)
        _bytes_equal(x[-n:], y[:1], 1)
        _bytes_equal(x[:1], y[-n:], 1)
    a, b = _fmod_pairs(TASK)
    assert _bytes_equal(a, b, 1, threads=1).tobytes() == _bytes_equal(a, b, 1, threads=2).tobytes()
    h = np.arange(65536, dtype=np.uint16).view(np.float16)  # float16: every value widened through the same lanes
    for d in h[RNG.integers(0, 65536, 6)]:
        _bytes_equal(h.reshape(256, 256), np.array([d], np.float16), 1, threads=2)


@pytest.mark.parametrize("fmod", [0, 1])
def test_zero_integer_divisor_declines_and_the_reference_raises(fmod):
    a, b = np.arange(6, dtype=np.int64), np.array([1, 2, 0, 4, 5, 6], np.int64)
    assert runtime.native_module().mod_into(a, b, bool(fmod), None, 1) is None
    m = node_model("Mod", [("a", a, False), ("b", b, False)], fmod=fmod)
    for kernels in ("native", "reference"):
        with pytest.raises(ZeroDivisionError, match=r"modulo by zero: the divisor int64\[6\] holds 1 zero"):
            run_kernel(m, {"a": a, "b": b}, kernels)


def test_bad_operands_name_them():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"\[2,3\] and \[4\] do not broadcast"):
        nat.mod_into(np.zeros((2, 3), np.int32), np.ones(4, np.int32), False, None, 1)
    with pytest.raises(ValueError, match=r"floats with fmod=1\), got float32\[3\] and float32\[3\], fmod=0"):
        nat.mod_into(np.zeros(3, np.float32), np.ones(3, np.float32), False, None, 1)


def _session(elem, sa, sb, fmod: int, b_const: np.ndarray | None):
    node = helper.make_node("Mod", ["a", "b"], ["out"], name="the_op", fmod=fmod)
    inputs = [helper.make_tensor_value_info("a", elem, list(sa))]
    if b_const is None:
        inputs.append(helper.make_tensor_value_info("b", elem, list(sb)))
    out = list(np.broadcast_shapes(sa, sb))
    model = make_model([node], inputs, [helper.make_tensor_value_info("out", elem, out)],
                       {} if b_const is None else {"b": b_const}, opset=17)
    so = session_options()
    tag_session_options(so)  # so python_steps finds the session's programs
    return model, npu_session(model, so=so)


@pytest.mark.parametrize("case", ["int64_fmod0_broadcast", "int32_fmod1_const", "float32_fmod", "float16_fmod"])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """Integer Mod with negative operands (the CPU EP's sign rules), float fmod with NaN, +-Inf and zero divisors:
    the CPU EP's bytes (its std::fmod is exact too); no INT_MIN dividend, whose % -1 kills the CPU EP's process."""
    dt, elem, fmod = {"int64_fmod0_broadcast": (np.int64, TensorProto.INT64, 0),
                      "int32_fmod1_const": (np.int32, TensorProto.INT32, 1),
                      "float32_fmod": (np.float32, TensorProto.FLOAT, 1),
                      "float16_fmod": (np.float16, TensorProto.FLOAT16, 1)}[case]
    sa, sb = (4, 3, 40), (3, 1)
    b = _divisors(sb, dt)
    const = b if case == "int32_fmod1_const" else None
    model, sess = _session(elem, sa, sb, fmod, const)
    a = _dividends(sa, dt)
    if a.dtype.kind == "i":
        a[a == np.iinfo(dt).min] = -5  # the CPU EP's INT_MIN % -1 traps (SIGFPE); the kernel's gives 0, as numpy's
    feeds = {"a": a} | ({} if const is not None else {"b": b})
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, feeds, bits=True)
