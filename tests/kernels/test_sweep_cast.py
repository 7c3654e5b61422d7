"""Differential sweep of Cast (issue 40): ``cast`` (kernels/native/cast.cc) against the reference model
(kernels/ops/elementwise.py: numpy's astype) for every pair of the twelve numeric dtypes: bit for bit (NaN where the
reference has NaN), with the types' extremes (integers wrap), -0.0, fractions of either sign (truncation toward zero),
float16 ties, subnormals and overflow, NaN/Inf and floats beyond an integer's range (the kernel returns None there
and the reference gives numpy's platform result), on every ISA level the host runs (F16C's float32 <-> float16
lanes, and 16 on AVX-512; the conversion loops built for AVX2 and for the baseline; 64-bit integers to float in
AVX-512DQ lanes, with every rounding case near 2^24, 2^53 and 2^63), around the lanes and the 32768-element task
split on one thread and two. Sessions show NpuEP ran the node, as its bound native step (no Python step), with the CPU
EP's values."""

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

RNG = np.random.default_rng(4042)
TASK = 32768  # cast.cc's kTaskElems
DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16,
          np.float32, np.float64]
ONNX_TYPE = {np.bool_: TensorProto.BOOL, np.int64: TensorProto.INT64, np.float32: TensorProto.FLOAT,
             np.float16: TensorProto.FLOAT16, np.int32: TensorProto.INT32}


@pytest.fixture(params=host_isas(top="avx512"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _values(n: int, dt, specials: bool) -> np.ndarray:
    """Values of ``dt`` every conversion meets: extremes, zero, fractions; NaN/Inf/huge only with ``specials``."""
    dt = np.dtype(dt)
    if dt == np.bool_:
        return RNG.random(n) > 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        x = RNG.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        x[::7] = info.max
        x[1::7] = info.min
        x[2::7] = RNG.integers(-3 if info.min < 0 else 0, 4, x[2::7].size)
        return x
    with np.errstate(over="ignore"):  # float16 overflows to Inf: a value the cast meets
        x = (RNG.standard_normal(n) * np.array([1.0, 100.0, 3e4])[np.arange(n) % 3]).astype(dt)
    x[::11] = -0.0
    x[1::13] = -0.75  # truncates to 0, also for unsigned integers
    x[2::17] = 2049.0  # a float16 tie (2048 and 2050)
    if specials:
        with np.errstate(over="ignore"):
            extra = np.array([np.nan, np.inf, -np.inf, 65520.0, 1e-8, 3e9, -3e9, 1e19], np.float64).astype(dt)
        x[3::19] = np.resize(extra, x[3::19].size)
    return x


def _check(x: np.ndarray, to, threads: int = 1) -> np.ndarray:
    got, want, calls = native_vs_reference("Cast", [("x", x, False)], threads=threads,
                                           to=int(helper.np_dtype_to_tensor_dtype(np.dtype(to))))
    what = f"Cast {x.dtype}{x.shape} -> {np.dtype(to)} threads={threads}"
    assert "cast" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == np.dtype(to) and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}"
    if g.dtype.kind == "f":
        nan = np.isnan(w)
        assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ"
        g, w = g[~nan], w[~nan]
    assert g.tobytes() == w.tobytes(), f"{what}: values differ: {g[g != w][:5]} vs {w[g != w][:5]}"
    return np.asarray(got[0])


def _pairs():
    return [(s, d) for s in DTYPES for d in DTYPES
            if s is not d and not (d is np.float16 and np.dtype(s).kind in "iu")]


@pytest.mark.parametrize("src,dst", _pairs(), ids=lambda t: np.dtype(t).name)
def test_every_pair_bit_for_bit(capped_isa, src, dst):
    _check(_values(301, src, specials=False), dst)
    if np.dtype(src).kind == "f":  # NaN/Inf/out of range: the kernel declines, the reference answers
        _check(_values(301, src, specials=True), dst)


@pytest.mark.parametrize("src,dst", [(np.float32, np.float16), (np.float16, np.float32), (np.int64, np.float32),
                                     (np.float32, np.int64), (np.bool_, np.float32), (np.int8, np.float32),
                                     (np.uint8, np.float32), (np.int32, np.float32), (np.float64, np.int8)],
                         ids=lambda t: np.dtype(t).name)
def test_lanes_and_task_split_bit_for_bit(capped_isa, src, dst):
    """Around the lanes of both loops (scalar build: SSE2's; AVX2's: 8 and 32 lanes of bytes) and the task split."""
    for n in around(8, 16, 32, 64, TASK):
        _check(_values(n, src, specials=False), dst)
    x = _values(2 * TASK + 5, src, specials=False)
    assert _check(x, dst, threads=1).tobytes() == _check(x, dst, threads=2).tobytes()


@pytest.mark.parametrize("src,dst", [(np.int64, np.float32), (np.uint64, np.float32), (np.int64, np.float64),
                                     (np.uint64, np.float64)], ids=lambda t: np.dtype(t).name)
def test_wide_integers_to_float_every_rounding_case(capped_isa, src, dst):
    """64-bit integers where float32/float64 round (ties to even at 2^24, 2^53 and up to the type's ends, the high
    bit of uint64 set), random bit patterns, around the 8- and 16-lane tails: numpy's astype bits."""
    info = np.iinfo(src)
    edges = []
    for p in (24, 25, 53, 54, 62, 63):
        for base in (1 << p, (1 << p) + (1 << max(p - 24, 0)), (1 << p) + (1 << max(p - 53, 0))):
            edges += [base + d for d in (-3, -2, -1, 0, 1, 2, 3)]
    edges = [v for e in edges for v in (e, -e) if info.min <= v <= info.max] + [info.min, info.max, 0]
    bits = RNG.integers(0, 1 << 63, 4000, dtype=np.uint64) * np.uint64(2) + RNG.integers(0, 2, 4000, np.uint64)
    x = np.concatenate([np.array(edges, src), bits.view(src)])
    for n in around(8, 16, 64, low=1) + [x.size]:
        _check(x[:n], dst)


def test_float32_to_float16_every_rounding_case():
    """Random float32 bit patterns (ties, subnormals, overflow, NaN) through F16C: numpy's astype bits."""
    x = RNG.integers(0, 1 << 32, 60000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[~np.isnan(x)]  # NaN payloads: numpy keeps a signalling one's, F16C quiets it
    _check(x, np.float16)


def test_float16_to_float32_every_pattern(capped_isa):
    """All 65536 float16 patterns, and float32 rounding cases, through each ISA's lanes (16 on AVX-512, 8 on F16C)."""
    _check(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16), np.float32)
    x = RNG.integers(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    _check(x[~np.isnan(x)], np.float16)


def test_integer_to_float16_stays_on_the_reference():
    nat = runtime.native_module()
    assert nat.cast(np.arange(5, dtype=np.int64), np.dtype(np.float16), None, 1) is None
    assert nat.cast(np.array([np.nan], np.float32), np.dtype(np.int32), None, 1) is None


@pytest.mark.parametrize("src,dst", [(np.float32, np.float16), (np.int64, np.float32), (np.bool_, np.float32),
                                     (np.float32, np.int32)], ids=lambda t: np.dtype(t).name)
def test_session_matches_cpu_ep_and_runs_on_npu_ep(src, dst):
    node = helper.make_node("Cast", ["x"], ["y"], name="the_op", to=ONNX_TYPE[dst])
    model = make_model([node], [helper.make_tensor_value_info("x", ONNX_TYPE[src], [1, 128, 384])],
                       [helper.make_tensor_value_info("y", ONNX_TYPE[dst], [1, 128, 384])], opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": _values(128 * 384, src, specials=False).reshape(1, 128, 384)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


def test_non_native_byte_order_stays_on_the_reference():
    from _sweep import node_model, run_kernel
    x = np.arange(6, dtype=">f4")
    m = node_model("Cast", [("x", x.astype(np.float32), False)], to=TensorProto.FLOAT16)
    got = run_kernel(m, {"x": x}, "native")[0]
    assert got.dtype == np.float16 and got.tobytes() == x.astype(np.float16).tobytes()
    with pytest.raises(ValueError, match="not a cast between numeric dtypes"):
        runtime.native_module().cast(x, np.dtype(np.float16), None, 1)
