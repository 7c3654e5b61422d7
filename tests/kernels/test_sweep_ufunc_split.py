"""Differential sweep of ``ufunc_split`` (kernels/native/ufunc_split.cc): numpy's own float32 loop of np.exp, np.tanh,
np.sin, np.cos and np.log run on chunks over the threads must give numpy's bits (the reference of float32 Exp, Tanh,
Sin, Cos: kernels/ops/elementwise.py), on a grid of float32 bit patterns and on random data with NaN/+-Inf/-0/
denormals/overflow and underflow edges, at sizes around the 16-element chunk rounding, the 16384-element task and
the split into two threads' even chunks, on 1 and 2 threads; the ops bind it from ``SPLIT_MIN_ELEMS`` elements."""

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
    with pytest.raises(ValueError, match="C-order float32"):
        nat.ufunc_split(np.exp, np.ones((4, 4), np.float32).T, None, 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.ufunc_split(np.exp, x, np.empty(7, np.float32), 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.ufunc_split(np.exp, x, np.empty(8, np.float64), 1)


@pytest.mark.parametrize("op", ["Exp", "Tanh", "Sin", "Cos"])
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
