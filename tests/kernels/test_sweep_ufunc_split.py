"""Differential sweep of ``ufunc_split`` (kernels/native/ufunc_split.cc): numpy's own float32 loop of np.exp, np.tanh,
np.sin, np.cos and np.log run on chunks over the threads must give numpy's bits (the reference of float32 Exp, Tanh,
Sin, Cos: kernels/ops/elementwise.py), on a grid of float32 bit patterns and on random data with NaN/+-Inf/-0/
denormals/overflow and underflow edges, at sizes around the 16-element chunk rounding, the 16384-element task and
the split into two threads' even chunks, on 1 and 2 threads; Sin and Cos bind it from ``SPLIT_MIN_ELEMS`` elements
(Exp and Tanh bind ``exp_tanh``: test_sweep_exp_tanh.py). Float16 (widened per 1024-element block, numpy's float32
loop, rounded once: the reference of float16 Exp and Log): every float16 bit pattern, sizes around the blocks, tasks
and lanes; float16 Log binds it at every size."""

from __future__ import annotations

import numpy as np
import pytest

from _sweep import around, native_vs_reference, with_specials
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import elementwise

pytestmark = pytest.mark.skipif(runtime.native_module() is None or not hasattr(runtime.native_module(),
                                                                                   "ufunc_split"),
                                reason="native extension not built (or built without numpy's headers)")

RNG = np.random.default_rng(929)
UFUNCS = (np.exp, np.tanh, np.sin, np.cos, np.log)
TASK = 16384
SPECIALS = (np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0e-45, -1.0e-45, 1.0e-40, -1.17e-38, 1.1754942e-38,
            88.72283, 88.72284, 89.0, -87.33654, -103.97208, -103.97209, -104.0, 3.4028235e38, -3.4028235e38, 9.0,
            -9.0, 1.0e4, -1.0e4, 1.0e20, 4194304.5, np.pi, -np.pi / 2)


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).view(np.uint32).tobytes()


def _reference(fn, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return fn(x)


def _data(n: int) -> np.ndarray:
    return with_specials((RNG.standard_normal(n) * 40).astype(np.float32), RNG, values=SPECIALS)


@pytest.mark.parametrize("fn", UFUNCS, ids=lambda f: f.__name__)
def test_every_bit_pattern_grid(fn):
    """A stride through all 2^32 float32 patterns (NaN payloads, denormals, both signs) and the special values."""
    nat = runtime.native_module()
    x = np.concatenate([np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.asarray(SPECIALS, np.float32)])
    want = _bits(_reference(fn, x))
    for threads in (1, 2):
        assert _bits(nat.ufunc_split(fn, x, None, threads)) == want, f"{fn.__name__} threads={threads}"


@pytest.mark.parametrize("fn", UFUNCS, ids=lambda f: f.__name__)
def test_sizes_around_chunks_and_tasks(fn):
    nat = runtime.native_module()
    sizes = around(1, 15, 16, 17, 32, TASK, 2 * TASK, 3 * TASK, 4 * TASK + 16) + [0, 5 * TASK + 7]
    for n in sizes:
        x = _data(n).reshape(-1, 1) if n % 2 else _data(n)
        want = _bits(_reference(fn, x))
        for threads in (1, 2):
            out = np.full(x.shape, 7.0, np.float32)
            got = nat.ufunc_split(fn, x, out, threads)
            assert got is out and _bits(got) == want, f"{fn.__name__} n={n} threads={threads}"
            fresh = nat.ufunc_split(fn, x, None, threads)
            assert fresh.shape == x.shape and _bits(fresh) == want


def test_refuses_what_it_cannot_run():
    nat = runtime.native_module()
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="no float32"):
        nat.ufunc_split(np.add, x, None, 1)  # two inputs
    with pytest.raises(ValueError, match="no float32"):
        nat.ufunc_split(np.isnan, x, None, 1)  # float32 -> bool
    with pytest.raises(ValueError, match="numpy ufunc"):
        nat.ufunc_split(abs, x, None, 1)
    with pytest.raises(ValueError, match="C-order float32"):
        nat.ufunc_split(np.exp, x.astype(np.float64), None, 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.ufunc_split(np.exp, x.astype(np.float16), np.empty(8, np.float32), 1)
    with pytest.raises(ValueError, match="C-order float32"):
        nat.ufunc_split(np.exp, np.ones((4, 4), np.float32).T, None, 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.ufunc_split(np.exp, x, np.empty(7, np.float32), 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.ufunc_split(np.exp, x, np.empty(8, np.float64), 1)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
@pytest.mark.parametrize("threads", [1, 2])
def test_ops_bind_it_from_the_threshold(op, threads):
    """The op kernel (and its bound step) runs ``ufunc_split`` from ``SPLIT_MIN_ELEMS`` elements with the
    reference's bits; below it numpy's one call."""
    low = elementwise.SPLIT_MIN_ELEMS
    for n in (low - 1, low, low + 1, 3 * TASK + 5):
        x = _data(n).reshape(1, n)
        got, want, calls = native_vs_reference(op, [("x", x, False)], threads=threads)
        assert ("ufunc_split" in calls) == (n >= low), f"{op} n={n}: {calls}"
        assert _bits(got[0]) == _bits(want[0]), f"{op} n={n} threads={threads}"


EVERY_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
F16_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0e-8, -6.0e-8, 6.1e-5, 65504.0, -65504.0, 11.09, 11.1, -17.3,
                -16.6, 0.5, -2.5)


def _f16_reference(fn, x: np.ndarray) -> np.ndarray:
    """The reference of a float16 op: widened to float32, numpy's float32 op, rounded once."""
    with np.errstate(all="ignore"):
        return fn(x.astype(np.float32)).astype(np.float16)


def _assert_f16_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bit for bit where the reference is a number (the sign of zero included); NaN where it has NaN."""
    assert got.dtype == np.float16 and got.shape == want.shape, what
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN positions differ"
    diff = np.flatnonzero(got.view(np.uint16)[~nan] != want.view(np.uint16)[~nan])
    assert diff.size == 0, f"{what}: {diff.size} elements differ, first at {want[~nan][diff[:3]]}"


@pytest.mark.parametrize("fn", UFUNCS, ids=lambda f: f.__name__)
def test_float16_every_bit_pattern(fn):
    nat = runtime.native_module()
    want = _f16_reference(fn, EVERY_F16)
    for threads in (1, 2):
        _assert_f16_equal(nat.ufunc_split(fn, EVERY_F16, None, threads), want, f"{fn.__name__} threads={threads}")
        _assert_f16_equal(nat.ufunc_split(fn, EVERY_F16.reshape(256, 256), None, threads), want.reshape(256, 256),
                          f"{fn.__name__} 256x256 threads={threads}")


@pytest.mark.parametrize("fn", [np.exp, np.tanh], ids=lambda f: f.__name__)
def test_float16_sizes_around_blocks_and_tasks(fn):
    nat = runtime.native_module()
    sizes = around(1, 7, 8, 16, 1024, 2048, TASK, 2 * TASK) + [0, 3 * TASK + 1029]
    for n in sizes:
        x = with_specials((RNG.standard_normal(n) * 6).astype(np.float16), RNG, values=F16_SPECIALS)
        want = _f16_reference(fn, x)
        for threads in (1, 2):
            out = np.full(x.shape, 7.0, np.float16)
            got = nat.ufunc_split(fn, x, out, threads)
            assert got is out, f"{fn.__name__} n={n}"
            _assert_f16_equal(got, want, f"{fn.__name__} n={n} threads={threads}")


@pytest.mark.parametrize("op", ["Log"])
@pytest.mark.parametrize("threads", [1, 2])
def test_float16_log_binds_it_at_every_size(op, threads):
    """Float16 Log's kernel (and bound step) runs ``ufunc_split`` at every size, with the reference's bits; float32
    Log stays on the engine (float16 Exp: ``exp_tanh``)."""
    low = elementwise.SPLIT_MIN_ELEMS
    for shape in [(1,), (3, 5), (1, 64), (low - 1,), (low,), (1, 2 * TASK + 9)]:
        x = with_specials((RNG.standard_normal(shape) * 6).astype(np.float16), RNG, values=F16_SPECIALS)
        if op == "Log":
            x = np.where(RNG.random(shape) < 0.9, np.abs(x), x)  # mostly in its domain, some NaN results
        got, want, calls = native_vs_reference(op, [("x", x, False)], threads=threads)
        assert "ufunc_split" in calls, f"{op} float16 {shape}: {calls}"
        _assert_f16_equal(np.asarray(got[0]), np.asarray(want[0]), f"{op} float16 {shape} threads={threads}")
    _, _, calls = native_vs_reference("Log", [("x", np.abs(_data(low)) + 1.0, False)], threads=threads)
    assert "ufunc_split" not in calls and "tail_of" in calls, calls


@pytest.mark.parametrize("op", ["Exp", "Log"])
def test_float16_session_runs_on_npu_ep_near_the_cpu_ep(op):
    """Float16 Exp / Log in a session: NpuEP runs the node, within one float16 ulp of ORT's CPU EP (both round a
    float32 result), bound as one native step (no Python step)."""
    from onnx import TensorProto, helper

    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

    shape = [1, 128, 384]
    node = helper.make_node(op, ["x"], ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)], opset=20)
    x = with_specials((RNG.standard_normal(shape) * 4).astype(np.float16), RNG, values=F16_SPECIALS)
    if op == "Log":
        x = np.abs(x)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    want = cpu_run(model, {"x": x})[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    spacing = np.spacing(np.abs(want[fin])).astype(np.float64)
    assert (np.abs(got[fin].astype(np.float64) - want[fin]) <= spacing).all()
    assert python_steps(sess) == []
