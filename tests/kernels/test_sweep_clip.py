"""Clip's bound steps (issue 40): a float32/float64 Clip with constant bounds binds its kernel's own call (the clip
ufunc with ORT's open bounds, ``activation._clip_bind``), an integer Clip the clip ufunc with the type's limits (the
kernel's max then min: the same values), a Clip without bounds a view step. The sweep checks the step against the
kernel's run bit for bit (the sign of zero, NaN, +-Inf, values at and beyond the bounds, the types' extremes, one
side open, lo > hi, ranks 1..4), that it bound at all where it should, and that runtime bounds stay on the kernel;
float16 runs ``clip_f16`` (unary_f16.cc), checked against the reference's numpy float16 maximum and minimum on all
65536 values; sessions show NpuEP ran the node as its bound step (no Python step) with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, kernel_and_bound_step, native_vs_reference, with_specials
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import elementwise as ew
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4043)
BOUNDS = [(0.0, 6.0), (-1.0, None), (None, 0.5), (3.0, -3.0), (-0.0, 0.0), (-np.inf, np.inf)]


def _values(shape, dt) -> np.ndarray:
    x = (RNG.standard_normal(shape) * 8).astype(dt)
    return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0, 3e38), fraction=0.1)


def _inputs(x: np.ndarray, lo, hi, runtime_bounds: bool = False) -> list:
    dt = x.dtype
    return [("x", x, False), ("lo", None if lo is None else np.array(lo, dt), not runtime_bounds),
            ("hi", None if hi is None else np.array(hi, dt), not runtime_bounds)]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_bound_step_equals_the_kernel_bit_for_bit(dt):
    for shape in ((7,), (3, 17), (2, 3, 4, 5)):
        for lo, hi in BOUNDS:
            got, bound = kernel_and_bound_step("Clip", _inputs(_values(shape, dt), lo, hi))
            assert bound, f"Clip {dt} {shape} [{lo}, {hi}]: no step bound"
            assert bound[0].dtype == got[0].dtype and bound[0].tobytes() == got[0].tobytes(), (dt, shape, lo, hi)


def test_without_bounds_a_view_step_returns_x():
    x = _values((4, 5), np.float32)
    got, bound = kernel_and_bound_step("Clip", [("x", x, False)])
    assert bound and bound[0].tobytes() == got[0].tobytes() == x.tobytes()


INTS = [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("dt", INTS)
def test_integer_bound_step_equals_the_kernel(dt):
    info = np.iinfo(dt)
    for shape in ((7,), (3, 17), (2, 3, 4, 5)):
        x = RNG.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
        x.reshape(-1)[::4] = info.max
        x.reshape(-1)[1::4] = info.min
        for lo, hi in ((0, 6), (info.min, None), (None, 5), (9, 2), (info.max, info.max)):
            inputs = [("x", x, False), ("lo", None if lo is None else np.array(lo, dt), True),
                      ("hi", None if hi is None else np.array(hi, dt), True)]
            got, bound = kernel_and_bound_step("Clip", inputs)
            assert bound, f"Clip {np.dtype(dt)} {shape} [{lo}, {hi}]: no step bound"
            assert bound[0].dtype == got[0].dtype and bound[0].tobytes() == got[0].tobytes(), (dt, shape, lo, hi)


NARROW = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.uint64]


@pytest.fixture(params=host_isas(top="avx512"))
def capped_isa(request):
    yield from cap_isa(request.param)


@pytest.mark.parametrize("dt", NARROW)
def test_clip_num_of_narrow_and_unsigned_integers_bit_for_bit(capped_isa, dt):
    """clip_num (unary.cc: 8/16-bit in whole AVX-512 vectors, 4 at a time, the tail masked) against numpy's clip
    ufunc: sizes around the lane, 4-vector and task boundaries and past the 1 MB thread split, 1 and 2 threads, the
    types' extremes, ties, lo > hi, one side at the type's limit."""
    nat = runtime.native_module()
    info = np.iinfo(dt)
    size = np.dtype(dt).itemsize
    lanes = 64 // size
    task = 131072 // size if size <= 2 else 32768
    sizes = [*around(lanes, 4 * lanes, 5 * lanes), 2 * task + 77, (1 << 20) // size + 4 * lanes + 3]
    bounds = [(3, 100), (info.min, 7), (9, info.max), (9, 2), (info.max, info.max), (info.min, info.min)]
    for n in sizes:
        x = RNG.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        x[::5], x[1::7], x[2::11], x[3::13] = info.max, info.min, 3, 100
        for lo, hi in bounds:
            lo_a, hi_a = np.array(lo, dt), np.array(hi, dt)
            want = ew.CLIP_UFUNC(x, lo_a, hi_a)
            for threads in (1, 2):
                out = np.empty_like(x)
                got = nat.clip_num(x, lo_a, hi_a, out, threads)
                assert got is out and got.tobytes() == want.tobytes(), (np.dtype(dt), n, lo, hi, threads)


EVERY_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (-1.0, None), (None, 0.5), (3.0, -3.0), (-0.0, 0.0), (0.0, -0.0),
                                   (-np.inf, np.inf), (np.nan, 1.0), (1.0, np.nan)])
def test_float16_clip_every_value_bit_for_bit(lo, hi):
    """clip_f16 against the reference's numpy float16 maximum then minimum, all 65536 float16 values: the chosen
    operand's bits (NaN payloads, signed zeros), the bound step too."""
    x = EVERY_HALF.reshape(256, 256)
    inputs = [("x", x, False), ("lo", None if lo is None else np.array(lo, np.float16), True),
              ("hi", None if hi is None else np.array(hi, np.float16), True)]
    got, want, calls = native_vs_reference("Clip", inputs)
    assert "clip_f16" in calls, calls
    assert got[0].dtype == want[0].dtype == np.float16 and got[0].tobytes() == want[0].tobytes(), (lo, hi)
    _, bound = kernel_and_bound_step("Clip", inputs)
    assert bound and bound[0].tobytes() == got[0].tobytes()


def test_runtime_bounds_stay_on_the_kernel():
    _, bound = kernel_and_bound_step("Clip", _inputs(_values((3, 4), np.float32), 0.0, 6.0, runtime_bounds=True))
    assert bound == []


@pytest.mark.parametrize("dt,bounds", [(np.float32, (0.0, 6.0)), (np.float32, (None, 1.0)), (np.float32, None),
                                       (np.uint8, (3, 200)), (np.float16, (0.0, 6.0))])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(dt, bounds):
    """Relu6 as an exported MobileNetV3 writes it (Clip(x, 0, 6), constant bounds), one side open, no bounds, uint8,
    float16."""
    inits = {}
    names = ["x"]
    if bounds is not None:
        for name, b in zip(("lo", "hi"), bounds):
            if b is not None:
                inits[name] = np.array(b, dt)
            names.append(name if b is not None else "")
    node = helper.make_node("Clip", names, ["y"], name="the_op")
    shape = [1, 64, 28, 28]
    elem = {np.float32: TensorProto.FLOAT, np.uint8: TensorProto.UINT8, np.float16: TensorProto.FLOAT16}[dt]
    model = make_model([node], [helper.make_tensor_value_info("x", elem, shape)],
                       [helper.make_tensor_value_info("y", elem, shape)], inits, opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": RNG.integers(0, 256, shape, dtype=np.uint8) if dt == np.uint8
             else (RNG.standard_normal(shape) * 8).astype(dt)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.tobytes() == want.tobytes()
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound step"
