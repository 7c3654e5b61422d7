"""Differential sweep of Range (issue 40): ``range_fill`` (kernels/native/range.cc) against the reference model
(kernels/ops/generate.py), exact: float32/float64 accumulating value += delta (fractional and negative steps,
counts whose last step rounds up), int16/int32/int64 wrapping at the type's limits, empty ranges (limit behind
start), one-element [1] inputs; delta 0 and counts beyond reach stay on the reference, which raises or answers. The
bound step equals the kernel (``_sweep``); a session shows NpuEP ran the node, as its bound native step (no Python
step), with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

FLOAT_CASES = [(0.0, 10.0, 1.0), (0.0, 1.0, 0.1), (5.0, -3.0, -0.7), (1e7, 1e7 + 300.0, 0.3), (2.0, 2.0, 1.0),
               (3.0, 1.0, 1.0), (-1.5, 1000.0, 0.37)]
INT_CASES = [(0, 10, 1), (10, -7, -3), (0, 100, 7), (5, 5, 1), (9, 1, 2), (-1000, 1000, 13)]


def _check(start, limit, delta, dt, shape=(), threads=1) -> np.ndarray:
    inputs = [(n, np.array(v, dt).reshape(shape), False) for n, v in zip(("s", "l", "d"), (start, limit, delta))]
    got, want, calls = native_vs_reference("Range", inputs, threads=threads)
    what = f"Range({start}, {limit}, {delta}) {np.dtype(dt)}"
    assert "range_fill" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == np.dtype(dt) and g.shape == w.shape, f"{what}: {g.shape} vs {w.shape}"
    assert g.tobytes() == w.tobytes(), f"{what}: values differ"
    return g


@pytest.fixture(params=host_isas(top="avx2"))
def capped_isa(request):
    """range.cc's integer loop and float closed form have AVX2 builds beside the baseline ones."""
    yield from cap_isa(request.param)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_float_ranges_exact(capped_isa, dt):
    for case in FLOAT_CASES:
        _check(*case, dt)
    _check(0.0, 5.0, 0.5, dt, shape=(1,))


@pytest.mark.parametrize("dt", [np.int16, np.int32, np.int64])
def test_integer_ranges_exact_and_wrapping(capped_isa, dt):
    for case in INT_CASES:
        _check(*case, dt)
    info = np.iinfo(dt)
    _check(info.max - 5, info.max, 2, dt)
    _check(info.min + 6, info.min, -2, dt)
    _check(info.min, info.max, info.max // 3, dt)  # the difference wraps in the dtype, as the reference's
    for n in around(4, 8, 16, 32, 64):  # vector widths and their tails
        wrapped = (info.max - n // 2 + n - info.min) % 2 ** info.bits + info.min  # the limit as the dtype holds it
        _check(info.max - n // 2, wrapped, 1, dt)  # the values wrap past max within a vector
        _check(3, 3 + 7 * n, 7, dt)


TASK = 1 << 16  # range.cc's elements per parallel task
SPLIT_BYTES = 1 << 23  # an integer range splits over threads from these bytes


@pytest.mark.parametrize("dt", [np.int32, np.int64])  # an int16 range is at most 128 KB
def test_integer_ranges_split_over_threads_exact(capped_isa, dt):
    """From 8 MB an integer range fills in tasks of 2^16 elements on two threads (each task's first value computed
    from its index): counts around the split and around task multiples, steps that wrap within a task and across
    task starts, negative steps."""
    first = SPLIT_BYTES // np.dtype(dt).itemsize
    info = np.iinfo(dt)
    for n in (first - 1, first, first + 1, first + TASK - 1, first + TASK + 1, 3 * first + 7):
        _check(0, n, 1, dt, threads=2)
        _check(info.max, info.max - 3 * n, -3, dt, threads=2)  # limit wraps: the count follows the wrapped diff
        _check(-5, -5 + n, 1, dt, threads=2)
    _check(info.min, info.max, info.max // (2 * first), dt, threads=2)
    _check(info.max - 2 * first, info.min + first, 1, dt, threads=2)  # the values wrap past max in a later task


PROBE = 1 << 10  # range.cc tries a float range's closed form on these first elements


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_float_closed_form_gives_the_in_order_bits(capped_isa, dt, threads):
    """A float range is written in closed form where each value is the previous plus delta rounded, and in order
    from the first index where it is not. Integer and power-of-two steps hold (negative, from -0.0, overflowing to
    inf); steps like 0.1 miss at once; past 2^mantissa the in-order sum sticks and the closed form misses there,
    which these cases put inside the probe, at its end, at a task's first element, inside a task and in the last
    task, below and above the thread split."""
    big = 2.0 ** (np.finfo(dt).nmant + 1) + 1  # about here start + 1 rounds back in the dtype
    first = SPLIT_BYTES // np.dtype(dt).itemsize
    for n in (*around(2, 4, 8, 16, 32), PROBE - 1, PROBE, PROBE + 1, PROBE + TASK + 5, first + TASK + 7):
        _check(0.0, float(n), 1.0, dt, threads=threads)
        _check(-0.0, n * 0.25, 0.25, dt, threads=threads)
        _check(5.0, 5.0 - 2.0 * n, -2.0, dt, threads=threads)
    _check(0.0, 2.0e5 * 0.1, 0.1, dt, threads=threads)
    _check(-1.0e5, 1.0e5, 0.37, dt, threads=threads)
    _check(1.0e7, 1.0e7 + 3.0e4, 0.3, dt, threads=threads)
    finite = float(np.finfo(dt).max)
    _check(finite / 2, finite, finite / 64, dt, threads=threads)  # the last values overflow to inf in both forms
    for miss in (5, PROBE - 2, PROBE - 1, PROBE, PROBE + 1, PROBE + TASK - 1, PROBE + TASK, PROBE + TASK + 9,
                 PROBE + 2 * TASK + 1):
        n = PROBE + 3 * TASK + 11
        _check(big - miss, big - miss + n, 1.0, dt, threads=threads)
    n = first + 2 * TASK + 3  # a miss in the last task of a split range
    _check(big - (n - 100), big + 100, 1.0, dt, threads=threads)


@pytest.mark.parametrize("dt", [np.float32, np.int16, np.int64])
def test_lent_buffer_is_written_and_returned(dt):
    """``lend`` is asked with [n] once the count is known: an array of the dtype and size is written and returned
    (ORT's buffer); anything else (another dtype, size, order, read-only, None) gives a new array; both hold the
    reference's values."""
    nat = runtime.native_module()
    start, limit, delta = (np.array(v, dt) for v in (-10000, 20000, 3))
    want = nat.range_fill(start, limit, delta)
    asked = []

    def lend(buffer):
        return lambda dims: (asked.append(list(dims)), buffer)[1]

    buf = np.full(10000, 9, dt)
    got = nat.range_fill(start, limit, delta, lend(buf), 2)
    assert want.size == 10000 and got is buf and asked == [[10000]] and got.tobytes() == want.tobytes()
    read_only = np.zeros(10000, dt)
    read_only.flags.writeable = False
    for other in (np.zeros(10000, np.float64), np.zeros(9999, dt), np.zeros((10000, 2), dt)[:, 0], read_only, None,
                  [0] * 10000):
        got = nat.range_fill(start, limit, delta, lend(other), 1)
        assert got is not other and got.dtype == np.dtype(dt) and got.tobytes() == want.tobytes()
    empty = nat.range_fill(np.array(5, dt), np.array(1, dt), np.array(1, dt), lend(np.zeros(0, dt)))
    assert empty.size == 0 and asked[-1] == [0]


def test_what_stays_on_the_reference():
    nat = runtime.native_module()
    assert nat.range_fill(np.array(0, np.int64), np.array(5, np.int64), np.array(0, np.int64)) is None
    assert nat.range_fill(np.array(0.0, np.float32), np.array(np.inf, np.float32), np.array(1.0, np.float32)) is None
    with pytest.raises(ValueError, match="delta is 0"):
        _check(0, 5, 0, np.int64)


def test_session_matches_cpu_ep_and_runs_on_npu_ep():
    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info(n, TensorProto.INT64, []) for n in ("s", "l", "d")],
                       [helper.make_tensor_value_info("y", TensorProto.INT64, ["n"])], opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    # the bound step follows the values: its output's length changes (into ORT's buffer, past the thread split)
    for limit in (100, 37, 100, 2_500_003, 100):
        feeds = {"s": np.array(3, np.int64), "l": np.array(limit, np.int64), "d": np.array(2, np.int64)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
