"""Differential sweep of ``binary_num`` (kernels/native/binary.cc, issue 40): Add/Sub/Mul/Div, Max/Min, comparisons,
And/Or/Xor and a Mean of two of float32/float64/int8/uint8/int16/int32/int64/bool against the reference model's
numpy functions (kernels/ops/elementwise.py), byte for byte (NaN payloads, the sign of zero, integer wraparound): on
every ISA level the host runs, sizes around the 8/16/64-lane tails and the 32768-element task split, every broadcast
direction (scalar, row, column, middle axis), NaN/+-Inf/-0/subnormal/extreme values and ties, 1 and 2 threads. Large
nodes (from ``NATIVE_MIN_ELEMS`` output elements) run it and bind it as their step; a session runs the node natively
with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import (REF, around, assert_session_runs_natively, bit_values, bound_step_outputs, native_calls,
                    native_vs_reference, node_model)
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import elementwise as ew
from npu_ep.kernels.registry import kernel_for
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4041)
TASK = 16384
REFERENCE = {**{op: fn for op, (fn, _, _) in ew._BINARY.items()},
             **{op: fn for op, (fn, _, _) in ew._VARIADIC.items() if op in ("Max", "Min")},
             "Mean": lambda a, b: np.add(a, b) / np.result_type(a, b).type(2)}  # the variadic fold of two
CASES = [(op, dt) for op, (_, dts) in ew._NUM_BINARY.items() for dt in dts]
BROADCASTS = [((37,), ()), ((), (37,)), ((3, 41), (41,)), ((41,), (3, 41)), ((5, 33), (5, 1)), ((5, 1), (5, 33)),
              ((2, 3, 19), (1, 3, 1)), ((2, 1, 19), (1, 3, 1)), ((4, 1), (1, 9)), ((), ()), ((2, 0, 3), (1, 3)),
              ((1, 6, 5, 7), (1, 6, 1, 1))]


@pytest.fixture(params=host_isas(top="avx512"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _values(shape, dt) -> np.ndarray:
    """bit_values with ties: float -0 and +0, the type's extremes, and every sign."""
    x = bit_values(shape, dt, RNG)
    if x.size and np.dtype(dt).kind in "iu":
        info = np.iinfo(dt)
        x.reshape(-1)[::7] = info.min
        x.reshape(-1)[3::11] = info.max
    elif x.size and np.dtype(dt).kind == "f":
        x.reshape(-1)[2::9] = -0.0
        x.reshape(-1)[4::13] = 0.0
    return x


def _pair(sa, sb, dt):
    a, b = _values(sa, dt), _values(sb, dt)
    if a.shape == b.shape and a.size:  # ties, and NaN against NaN
        b.reshape(-1)[::3] = a.reshape(-1)[::3]
    if dt == np.float32 and a.size > 5 and b.size > 5:  # NaNs of other signs and payloads on both sides
        a.reshape(-1)[5] = np.array([0xFFC00007], np.uint32).view(np.float32)[0]
        b.reshape(-1)[5] = np.array([0x7FC0A000], np.uint32).view(np.float32)[0]
    return a, b


def _want(op, a, b):
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCE[op](a, b))


def _check(op, dt, a, b, threads=1):
    code = ew._NUM_BINARY[op][0]
    got = runtime.native_module().binary_num(code, a, b, None, threads)
    want = _want(op, a, b)
    what = f"{op} {np.dtype(dt)} {a.shape} {b.shape} threads={threads}"
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} vs {want.dtype}"
    _assert_bits(got, want, what)
    return got


def _assert_bits(got, want, what):
    """The same bytes (the sign of zero included), NaN exactly where the reference has NaN: which NaN an Add or Mul
    of two NaNs gives is not the reference's to say (numpy's own loops give either operand's, by length)."""
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    if want.dtype.kind == "f":
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), f"{what}: NaN positions differ"
        got, want = got[~nan], want[~nan]
    unsigned = (lambda v: v) if want.dtype == np.bool_ else (lambda v: v.view(f"u{v.itemsize}"))
    bad = np.flatnonzero(unsigned(got) != unsigned(want))
    assert bad.size == 0, f"{what}: bytes differ at {bad[:5]}: {got[bad[:5]]} vs {want[bad[:5]]}"


@pytest.mark.parametrize("op,dt", CASES, ids=[f"{op}-{np.dtype(dt)}" for op, dt in CASES])
def test_tails_and_broadcasts_bit_for_bit(capped_isa, op, dt):
    for n in around(8, 16, 32, 64, 1024):
        _check(op, dt, *_pair((n,), (n,), dt))
    for sa, sb in BROADCASTS:
        _check(op, dt, *_pair(sa, sb, dt))


@pytest.mark.parametrize("op,dt", CASES, ids=[f"{op}-{np.dtype(dt)}" for op, dt in CASES])
def test_threads_and_task_split_bit_for_bit(op, dt):
    for sa, sb in (((3, 2 * TASK + 77), (3, 2 * TASK + 77)), ((3, 2 * TASK + 77), (1, 2 * TASK + 77)),
                   ((5, 30011), (5, 1)), ((70001,), ())):
        a, b = _pair(sa, sb, dt)
        one = _check(op, dt, a, b, threads=1)
        two = _check(op, dt, a, b, threads=2)
        assert one.tobytes() == two.tobytes()


def test_integer_wraparound():
    nat = runtime.native_module()
    for dt in (np.int8, np.int32, np.int64):
        info = np.iinfo(dt)
        a = np.array([info.max, info.min, info.min, info.max, -1], dt)
        b = np.array([1, -1, info.min, 2, info.min], dt)
        for code, fn in ((0, np.add), (1, np.subtract), (2, np.multiply)):
            with np.errstate(all="ignore"):
                np.testing.assert_array_equal(nat.binary_num(code, a, b, None, 1), fn(a, b))


def test_refusals_name_the_operands():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"\[2,3\] and \[4\] do not broadcast"):
        nat.binary_num(0, np.zeros((2, 3), np.float32), np.zeros(4, np.float32), None, 1)
    with pytest.raises(ValueError, match="no kernel"):
        nat.binary_num(3, np.zeros(3, np.int32), np.ones(3, np.int32), None, 1)  # integer Div is div_int's
    with pytest.raises(ValueError, match="no kernel"):
        nat.binary_num(0, np.zeros(3, np.float32), np.zeros(3, np.float64), None, 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.binary_num(6, np.zeros(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32), 1)


NODE_SHAPES = [((70001,), ()), ((2, 35000), (2, 1)), ((4, 17, 1031), (1, 17, 1)), ((1, 300, 256), (256,))]


@pytest.mark.parametrize("op", list(ew._NUM_BINARY))
def test_large_nodes_run_and_bind_binary_num(op):
    """From NATIVE_MIN_ELEMS output elements the node's run and its bound step are binary_num with the reference's
    bytes (``native_vs_reference`` compares the bound step's with the run's); a constant operand on either side."""
    dts = ew._NUM_BINARY[op][1]
    for i, (sa, sb) in enumerate(NODE_SHAPES):
        dt = dts[i % len(dts)]
        a, b = _pair(sa, sb, dt)
        for const in (None, 0, 1):
            got, want, calls = native_vs_reference(op, [("a", a, const == 0), ("b", b, const == 1)])
            what = f"{op} {np.dtype(dt)} {sa} {sb} const={const}"
            assert "binary_num" in calls, f"{what}: {calls}"
            _assert_bits(got[0], want[0], what)


def test_small_nodes_keep_the_ufunc():
    a, b = _pair((64,), (64,), np.float32)
    _, _, calls = native_vs_reference("Add", [("a", a, False), ("b", b, False)])
    assert "binary_num" not in calls


_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}


@pytest.mark.parametrize("op,dt,sb", [("Add", np.float32, (1, 300, 256)), ("Sub", np.int32, (256,)),
                                      ("Mul", np.int64, (1, 300, 1)), ("Div", np.float32, (1, 300, 256)),
                                      ("Max", np.float32, (1, 300, 256)), ("Min", np.int64, (1, 300, 256)),
                                      ("Equal", np.int32, (1, 300, 256)), ("Greater", np.float32, (256,)),
                                      ("LessOrEqual", np.int64, (1, 300, 256)), ("Xor", np.bool_, (1, 300, 256)),
                                      ("And", np.bool_, (256,)), ("Mean", np.float32, (1, 300, 256))])
def test_session_matches_cpu_ep_and_runs_natively(op, dt, sb):
    sa = (1, 300, 256)
    a = (RNG.random(sa) > 0.5) if dt == np.bool_ else np.asarray(RNG.integers(-50, 50, sa)).astype(dt)
    b = (RNG.random(sb) > 0.5) if dt == np.bool_ else np.asarray(RNG.integers(1, 50, sb)).astype(dt)
    out_t = TensorProto.BOOL if 6 <= ew._NUM_BINARY[op][0] <= 13 else _TYPES[np.dtype(dt)]
    node = helper.make_node(op, ["a", "b"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info("a", _TYPES[np.dtype(dt)], list(sa)),
                                helper.make_tensor_value_info("b", _TYPES[np.dtype(dt)], list(sb))],
                       [helper.make_tensor_value_info("y", out_t, list(sa))], {}, opset=17)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, {"a": a, "b": b})


def test_sum_of_two_large_inputs_runs_add_and_three_stay_variadic():
    """Sum of two large float32/int32 inputs binds Add's binary_num (broadcast too); Max of three stays on the
    variadic kernels (binary_num takes two operands)."""
    for dt, (sa, sb) in ((np.float32, ((3, 30011), (3, 30011))), (np.int32, ((3, 30011), (1, 30011)))):
        a, b = _pair(sa, sb, dt)
        m = node_model("Sum", [("a", a, False), ("b", b, False)])
        (node,) = nodes_from_model(m)
        k = kernel_for("", "Sum")
        p = k.prepare(node, REF)
        runtime.configure([p], "native", 1)
        outs = list(k.run(p, [a, b]))
        with native_calls() as calls:
            got = bound_step_outputs(k, p, [a, b], outs)
        assert "binary_num" in calls, calls
        _assert_bits(got[0], _want("Add", a, b), f"Sum {np.dtype(dt)}")
    xs = [_values((3, 30011), np.float32) for _ in range(3)]
    _, _, calls = native_vs_reference("Max", [(f"x{i}", x, False) for i, x in enumerate(xs)])
    assert "binary_num" not in calls


@pytest.mark.parametrize("n", around(ew._SUM_MIN_ELEMS, 3 * ew._SUM_MIN_ELEMS))
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("broadcast", [False, True])
def test_mean_of_two_binds_binary_num_from_the_sum_threshold(n, dt, broadcast):
    """Mean of two float32/float64 inputs binds ``binary_num``'s Mean from ``_SUM_MIN_ELEMS`` output elements (the
    fold's add then divide by 2: the reference's bytes, overflow to inf included), 1 and 2 threads; below it the
    variadic kernels stay."""
    a, b = _pair((1, n), (1, 1) if broadcast else (1, n), dt)
    a.reshape(-1)[1::17] = np.finfo(dt).max  # sums that overflow, halves that would not
    b.reshape(-1)[0] = np.finfo(dt).max
    m = node_model("Mean", [("a", a, False), ("b", b, False)])
    (node,) = nodes_from_model(m)
    k = kernel_for("", "Mean")
    for threads in (1, 2):
        p = k.prepare(node, REF)
        runtime.configure([p], "native", threads)
        with np.errstate(all="ignore"):
            outs = list(k.run(p, [a, b]))
        with native_calls() as calls:
            got = bound_step_outputs(k, p, [a, b], outs)
        what = f"Mean {np.dtype(dt)} n={n} broadcast={broadcast} threads={threads}"
        if n < ew._SUM_MIN_ELEMS:
            assert "binary_num" not in calls, f"{what}: {calls}"
            continue
        assert "binary_num" in calls, f"{what}: {calls}"
        assert got[0].dtype == np.dtype(dt)
        _assert_bits(got[0], _want("Mean", a, b), what)
        _assert_bits(outs[0], _want("Mean", a, b), f"{what} (the run)")


def test_mean_of_two_float16_and_three_stay_variadic():
    x16 = [_values((3, 30011), np.float16) for _ in range(2)]
    _, _, calls = native_vs_reference("Mean", [(f"x{i}", x, False) for i, x in enumerate(x16)])
    assert "binary_num" not in calls and "variadic_float" in calls, calls
    xs = [_values((3, 30011), np.float32) for _ in range(3)]
    _, _, calls = native_vs_reference("Mean", [(f"x{i}", x, False) for i, x in enumerate(xs)])
    assert "binary_num" not in calls, calls
