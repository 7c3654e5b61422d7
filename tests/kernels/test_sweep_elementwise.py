"""Differential sweep of the element-wise ops' native steps (issue 38): a float32 Sigmoid's native kernel is swept in
test_sweep_sigmoid.py; every other element-wise op binds its own numpy ufunc as a native CallStep
(kernels/ops/elementwise.py's _ufunc_binder, Relu's clip, Pow's multiply / power), which a session's C++ loop runs
with the inputs put in by ep/native/native_steps.cc. The sweep checks that step against the kernel's run (the
reference model's call) bit for bit over what the step's plumbing handles: broadcasts in every direction (ranks
0..4, size-1 and size-0 axes), a constant operand held in place on either side, strided and transposed inputs, and
dtypes (float32/64, int8..int64, uint8, bool), with NaN, +-Inf, -0.0, integer extremes as values."""

from __future__ import annotations

import numpy as np
import pytest

from _sweep import kernel_and_bound_step, with_specials
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3810)
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And", "Or", "Xor"]  # their ufunc bound
UNARY = ["Relu", "Abs", "Neg", "Exp", "Sqrt", "Tanh", "Floor", "Ceil", "Sign", "Not", "Sin", "Cos"]
SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((2, 1, 4), (1, 3, 1)), ((3, 1), (1, 5)),
          ((1,), (2, 2)), ((2, 0, 3), (1, 3)), ((5, 1, 1, 2), (3, 1, 2)), ((7,), (7,))]


def _values(shape, dt) -> np.ndarray:
    dt = np.dtype(dt)
    if dt == np.bool_:
        return RNG.random(shape) > 0.5
    if dt.kind == "f":
        x = (RNG.standard_normal(shape) * 4).astype(dt)
        return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0), fraction=0.1) if x.size else x
    info = np.iinfo(dt)
    x = RNG.integers(max(info.min, -100), min(info.max, 100) + 1, shape).astype(dt)
    if x.size:
        x.reshape(-1)[::5] = info.max
        x.reshape(-1)[1::7] = info.min if info.min < 0 else 0
    return x


def _op_dtypes(op: str) -> list:
    if op in ("And", "Or", "Xor", "Not"):
        return [np.bool_]
    if op in ("Equal", "Less", "Greater", "Add", "Sub", "Mul"):
        return [np.float32, np.int64, np.int8]
    if op in ("Relu", "Abs", "Neg", "Sign"):
        return [np.float32, np.float64, np.int32]
    return [np.float32, np.float64]


def _check_bound(op, inputs, **attrs):
    got, bound = kernel_and_bound_step(op, inputs, **attrs)
    for i, (b, g) in enumerate(zip(bound, got)):
        assert b.shape == g.shape and b.dtype == g.dtype and b.tobytes() == g.tobytes(), (op, i)
    return bool(bound)


@pytest.mark.parametrize("op", BINARY)
def test_binary_steps(op):
    bound = 0
    for dt in _op_dtypes(op):
        for sa, sb in SHAPES:
            a, b = _values(sa, dt), _values(sb, dt)
            for const in (None, 0, 1):
                bound += _check_bound(op, [("a", a, const == 0), ("b", b, const == 1)])
    assert bound, f"{op}: no case bound a native step"


@pytest.mark.parametrize("op", UNARY)
def test_unary_steps(op):
    bound = 0
    for dt in _op_dtypes(op):
        for shape in ((), (1,), (7,), (2, 0, 3), (3, 1, 4, 2)):
            x = _values(shape, dt)
            bound += _check_bound(op, [("x", x, False)])
    assert bound, f"{op}: no case bound a native step"


def test_strided_and_transposed_inputs():
    """A Transpose's view feeding an element-wise op: a ufunc step reads any layout (a numpy view), as the kernel;
    Relu's step takes C-contiguous inputs only (it declines the others: the kernel runs)."""
    base = _values((4, 6, 5), np.float32)
    for view in (base.transpose(2, 0, 1), base[:, ::2], base[::-1], base[..., 1:4]):
        for op in ("Add", "Mul"):
            assert _check_bound(op, [("a", view, False), ("b", _values(view.shape[-1:], np.float32), True)])
        _check_bound("Relu", [("x", view, False)])


def test_pow_exponents():
    x = _values((3, 17), np.float32)
    for e in (np.float32(2.0), np.float32(0.5), np.float32(-1.0), np.float32(3.0)):
        assert _check_bound("Pow", [("x", x, False), ("e", np.array(e), True)])
    assert _check_bound("Pow", [("x", x, False), ("e", _values((17,), np.float32), False)])

