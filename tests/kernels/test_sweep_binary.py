"""Differential sweep of the native binary ops of kernels/native/binary.cc (issue 40). Float16 Add/Sub/Mul/Div:
``binary_f16`` against the reference model (kernels/ops/elementwise.py: numpy's float16 ufuncs, which compute in
float32 and round once), bit for bit (the sign of zero included; NaN where the reference has NaN) on every ISA level
the host runs (the scalar _Float16 path and F16C's 8 lanes): sizes around the 8-lane tail and the 16384-element task
split, every broadcast direction (ranks 0..4, size-1 and size-0 axes, a per-channel [1,C,1,1] operand), a constant
operand on either side, NaN/+-Inf/-0/subnormal/65504 values, and random bit patterns (every rounding case float32
reaches). Float16 comparisons: ``compare_f16`` exactly as numpy's (NaN false, -0 == +0), the same cases. Integer Div:
``div_int`` (int32/int64, truncating toward zero; int32 in float64 lanes on AVX2) exact against the reference's numpy
arithmetic, with the type's extremes, -1 (INT_MIN / -1 wraps as in numpy) and every sign combination; a zero divisor
anywhere leaves the call to the reference, which raises. The bound step (what a session's loop runs) is checked
against the kernel by ``_sweep``; sessions show NpuEP ran the node, as its bound native step (no Python step), with
the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, native_vs_reference
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_ep.ep.sessions import tag_session_options
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4040)
OPS = ["Add", "Sub", "Mul", "Div"]
TASK = 16384  # binary.cc's kTaskElems
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0e-8, -6.1e-5, 65504.0, -65504.0, 1.0, 2049.0, 0.1)
BROADCASTS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((2, 1, 4), (1, 3, 1)), ((3, 1), (1, 5)),
              ((1,), (2, 2)), ((2, 0, 3), (1, 3)), ((5, 1, 1, 2), (3, 1, 2)), ((), (3, 9)), ((3, 9), ()), ((), ()),
              ((1, 6, 5, 7), (1, 6, 1, 1)), ((1, 6, 5, 7), (1, 1, 5, 7)), ((2, 17), (2, 1)), ((1, 1, 33), (4, 1, 1))]


@pytest.fixture(params=host_isas(top="avx2"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _values(shape, specials: bool = True) -> np.ndarray:
    x = np.asarray(RNG.standard_normal(shape) * 30).astype(np.float16)
    if specials and x.size:
        flat = x.reshape(-1)
        where = RNG.choice(flat.size, size=min(flat.size, max(len(SPECIALS), flat.size // 8)), replace=False)
        flat[where] = np.resize(np.asarray(SPECIALS, np.float16), where.size)
    return x


def _bits_equal(op: str, a: np.ndarray, b: np.ndarray, const: int | None = None, threads: int = 1) -> np.ndarray:
    """The native kernel ran and has the reference's exact bits (NaN where it has NaN); its bound step's bits too
    (``native_vs_reference``)."""
    inputs = [("a", a, const == 0), ("b", b, const == 1)]
    got, want, calls = native_vs_reference(op, inputs, threads=threads)
    what = f"{op} {a.dtype}{a.shape} {b.shape} const={const} threads={threads}"
    native = "binary_f16" if a.dtype == np.float16 else "div_int"
    assert native in calls, f"{what}: the native kernel did not run ({calls})"
    if a.dtype.kind == "i":
        g, w = np.asarray(got[0]), np.asarray(want[0])
        assert g.dtype == w.dtype == a.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=what)
        return g
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == np.float16 and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ"
    diff = np.flatnonzero(g.view(np.uint16)[~nan] != w.view(np.uint16)[~nan])
    assert diff.size == 0, f"{what}: bits differ at {diff[:5]}: {g[~nan][diff[:5]]} vs {w[~nan][diff[:5]]}"
    return g


@pytest.mark.parametrize("op", OPS)
def test_lane_tails_and_task_split_bit_for_bit(capped_isa, op):
    for n in around(8, 16, TASK):
        _bits_equal(op, _values((n,)), _values((n,)))
    for n in around(8, 16):  # one repeated operand on either side, a run that is not a multiple of 8
        _bits_equal(op, _values((3, n)), _values((3, 1)))
        _bits_equal(op, _values((1, n)), _values((3, n)))


@pytest.mark.parametrize("op", OPS)
def test_broadcasts_and_constants_bit_for_bit(capped_isa, op):
    for sa, sb in BROADCASTS:
        for const in (None, 0, 1):
            _bits_equal(op, _values(sa), _values(sb), const)


@pytest.mark.parametrize("op", OPS)
def test_random_bit_patterns_bit_for_bit(capped_isa, op):
    """Every float16 bit pattern is a value (NaNs, subnormals, infinities included): random pairs reach ties,
    overflow to Inf, underflow to subnormals and zeros of either sign."""
    a = RNG.integers(0, 1 << 16, 40000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    b = RNG.integers(0, 1 << 16, 40000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    _bits_equal(op, a, b)


@pytest.mark.parametrize("op", OPS)
def test_threads_split_the_work_bit_for_bit(op):
    a, b = _values((3, 2 * TASK + 77)), _values((1, 2 * TASK + 77))
    one = _bits_equal(op, a, b, threads=1)
    two = _bits_equal(op, a, b, threads=2)
    assert one.tobytes() == two.tobytes()


def test_strided_inputs_stay_on_the_reference():
    """A transposed view is not C-order: the kernel's run takes numpy's ufunc (same values), never a wrong read."""
    from _sweep import run_kernel, node_model
    a = _values((6, 10)).T
    b = _values((6,))
    m = node_model("Add", [("a", a, False), ("b", b, False)])
    got = run_kernel(m, {"a": a, "b": b}, "native")[0]
    np.testing.assert_array_equal(got, a + b)


def test_shapes_that_do_not_broadcast_name_them():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"\[2,3\] and \[4\] do not broadcast"):
        nat.binary_f16(0, np.zeros((2, 3), np.float16), np.zeros(4, np.float16), None, 1)
    with pytest.raises(ValueError, match="op must be"):
        nat.binary_f16(7, np.zeros(3, np.float16), np.zeros(3, np.float16), None, 1)


def _session_case(op: str, shape_a, shape_b, const_b: np.ndarray | None):
    node = helper.make_node(op, ["a", "b"], ["y"], name="the_op")
    out = list(np.broadcast_shapes(shape_a, shape_b))
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT16, list(shape_a))]
    if const_b is None:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT16, list(shape_b)))
    return make_model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, out)],
                      {} if const_b is None else {"b": const_b}, opset=17)


# ORT's CPU EP computes float16 Add/Sub/Mul/Div through float32 as well (MLAS's half kernels or Eigen's half,
# each op rounded once): the values are equal, exact here.
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shapes", [((1, 128, 384), (1, 128, 384), False), ((1, 64, 56, 56), (1, 64, 1, 1), True)])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(op, shapes):
    sa, sb, constant = shapes
    b = _values(sb, specials=False)
    b[b == 0] = 1.0
    model = _session_case(op, sa, sb, b if constant else None)
    feeds = {"a": _values(sa, specials=False)} | ({} if constant else {"b": b})
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, want)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


INTS = [np.int32, np.int64]


def _ints(shape, dt, divisor: bool = False) -> np.ndarray:
    """Values of every sign with the type's extremes and -1; no zero when ``divisor``."""
    info = np.iinfo(dt)
    x = np.asarray(RNG.integers(-1000, 1001, shape)).astype(dt)
    if x.size:
        flat = x.reshape(-1)
        flat[::5] = info.min
        flat[1::7] = info.max
        flat[2::9] = -1
        flat[3::11] = RNG.integers(info.min, info.max, flat[3::11].size, dtype=dt, endpoint=True)
        if divisor:
            flat[flat == 0] = 3
    return x


@pytest.mark.parametrize("dt", INTS)
def test_integer_div_exact(capped_isa, dt):
    for n in around(8, TASK):
        _bits_equal("Div", _ints((n,), dt), _ints((n,), dt, divisor=True))
    for sa, sb in BROADCASTS:
        for const in (None, 0, 1):
            _bits_equal("Div", _ints(sa, dt), _ints(sb, dt, divisor=True), const)
    info = np.iinfo(dt)
    a = np.array([info.min, info.min, info.max, -7, 7, -7, 7, 0, info.min], dt)
    b = np.array([-1, 1, -1, 2, -2, -2, 2, -5, info.min], dt)
    q = _bits_equal("Div", a, b)
    np.testing.assert_array_equal(q, np.array([info.min, info.min, -info.max, -3, -3, 3, 3, 0, 1], dt))


@pytest.mark.parametrize("dt", INTS)
def test_integer_div_by_zero_leaves_the_reference_to_raise(dt):
    nat = runtime.native_module()
    assert nat.div_int(np.array([4, 5], dt), np.array([2, 0], dt), None, 1) is None
    from _sweep import node_model, run_kernel
    a, b = np.array([4, 5], dt), np.array([2, 0], dt)
    with pytest.raises(ZeroDivisionError, match="holds 1 zero"):
        run_kernel(node_model("Div", [("a", a, False), ("b", b, False)]), {"a": a, "b": b}, "native")


@pytest.mark.parametrize("dt", INTS)
def test_integer_div_session_matches_cpu_ep_and_runs_on_npu_ep(dt):
    elem = TensorProto.INT32 if dt == np.int32 else TensorProto.INT64
    node = helper.make_node("Div", ["a", "b"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info("a", elem, [2, 3, 50]),
                                helper.make_tensor_value_info("b", elem, [3, 1])],
                       [helper.make_tensor_value_info("y", elem, [2, 3, 50])], opset=17)
    a = _ints((2, 3, 50), dt)
    a[a == np.iinfo(dt).min] = 9  # INT_MIN / -1 traps in ORT's C++ division
    feeds = {"a": a, "b": np.array([[7], [-3], [1]], dt)}
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


COMPARES = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]


def _compare_equal(op: str, a: np.ndarray, b: np.ndarray, const: int | None = None, threads: int = 1) -> np.ndarray:
    got, want, calls = native_vs_reference(op, [("a", a, const == 0), ("b", b, const == 1)], threads=threads)
    what = f"{op} {a.shape} {b.shape} const={const} threads={threads}"
    assert "compare_f16" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == np.bool_ and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    np.testing.assert_array_equal(g, w, err_msg=what)
    return g


@pytest.mark.parametrize("op", COMPARES)
def test_float16_comparisons_exact(capped_isa, op):
    """NaN compares false, -0 equals +0, neighbours one ulp apart differ: numpy's float16 comparisons."""
    for n in around(8, 16, TASK):
        _compare_equal(op, _values((n,)), _values((n,)))
    for sa, sb in BROADCASTS:
        for const in (None, 0, 1):
            _compare_equal(op, _values(sa), _values(sb), const)
    a = RNG.integers(0, 1 << 16, 40000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    _compare_equal(op, a, (a.view(np.uint16) ^ RNG.integers(0, 2, a.size, dtype=np.uint16)).view(np.float16))
    _compare_equal(op, a, a)
    signs = np.array([0.0, -0.0, np.nan, 1.0], np.float16)
    _compare_equal(op, signs, np.array([-0.0, 0.0, np.nan, np.nan], np.float16))
    a, b = _values((3, TASK + 11)), _values((1,))
    assert _compare_equal(op, a, b, threads=2).tobytes() == _compare_equal(op, a, b, threads=1).tobytes()


@pytest.mark.parametrize("op", COMPARES)
def test_float16_comparison_session_matches_cpu_ep_and_runs_on_npu_ep(op):
    node = helper.make_node(op, ["a", "b"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT16, [1, 128, 384]),
                                helper.make_tensor_value_info("b", TensorProto.FLOAT16, [384])],
                       [helper.make_tensor_value_info("y", TensorProto.BOOL, [1, 128, 384])], opset=17)
    feeds = {"a": _values((1, 128, 384), specials=False), "b": _values((384,), specials=False)}
    feeds["a"][0, :, ::5] = feeds["b"][::5]  # equal values
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
