"""Differential sweep of ``exp_tanh`` (kernels/native/exp_tanh.cc), float32 and float16 Exp and Tanh, against
their reference (kernels/ops/elementwise.py: numpy's float32 np.exp / np.tanh, float16 widened and rounded once)
within the stated bound (``EXP_TANH_ULP``, measured over all 2^32 float32 patterns): ulps on a stride through every
float32 pattern and a dense grid over the ranges where the results are finite and not 0 or 1, on every ISA path
this host takes (all with the same bits); exact special values (NaN, +-inf, -0, overflow to inf, underflow to 0,
tanh's saturation to +-1, tanh(-0) = -0); an element's bits independent of the threads, the chunk and the tail it
lands in (sizes around the 16-lane vector, the 16384-element task and two threads' chunks); every float16
pattern; the ops binding it."""

from __future__ import annotations

import numpy as np
import pytest

from _sweep import around, native_vs_reference, with_specials
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import elementwise

pytestmark = pytest.mark.skipif(runtime.native_module() is None or not hasattr(runtime.native_module(), "exp_tanh"),
                                reason="native extension not built")

RNG = np.random.default_rng(4040)
OPS = {"Exp": (0, np.exp), "Tanh": (1, np.tanh)}
TASK = 16384
SPECIALS = (np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0e-45, -1.0e-45, 1.0e-40, -1.17e-38, 1.1754942e-38,
            88.72283, 88.72284, 88.7229, 89.0, 100.0, -87.33654, -87.3366, -103.27893, -103.97207, -103.97208,
            -103.97209, -104.0, -200.0, 3.4028235e38, -3.4028235e38, 9.0, -9.0, 9.01, -9.02, 10.0, -20.0, 1.0e4,
            -1.0e4, 1.0e20, 0.55, -0.55, 0.5493, 1.0e-4, -1.0e-4, 0.3465736, -0.3465736, np.pi)


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32 bits as integers in the floats' order (adjacent floats differ by one; -0 and +0 both 0)."""
    b = x.view(np.uint32).astype(np.int64)
    return np.where(b >= 1 << 31, (1 << 31) - b, b)


def _reference(fn, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return fn(x)


def assert_within_bound(op: str, x: np.ndarray, got: np.ndarray, what: str = "") -> None:
    """NaN exactly where the reference has NaN; its bits where it is +-inf or +-0, and tanh's +-1 from |x| = 10
    (exp near 0 is 1 + x correctly rounded, where numpy's gives 1); elsewhere within ``EXP_TANH_ULP[op]`` ulp."""
    want = _reference(OPS[op][1], x)
    assert got.dtype == np.float32 and got.shape == want.shape, what
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{op} {what}: NaN positions differ"
    exact = ~nan & (np.isinf(want) | (want == 0) | ((np.abs(x) >= 10) if op == "Tanh" else False))
    bad = np.flatnonzero(got[exact].view(np.uint32) != want[exact].view(np.uint32))
    assert bad.size == 0, f"{op} {what}: x={x[exact][bad[:4]]} gave {got[exact][bad[:4]]}, want {want[exact][bad[:4]]}"
    ulps = np.abs(_ordered(got[~nan]) - _ordered(want[~nan]))
    if ulps.size:
        i = int(ulps.argmax())
        assert ulps[i] <= elementwise.EXP_TANH_ULP[op], \
            f"{op} {what}: {ulps[i]} ulp at x={x[~nan][i]!r}: {got[~nan][i]!r}, numpy {want[~nan][i]!r}"


def _grid() -> np.ndarray:
    """A stride through all 2^32 patterns, every pattern in [-110, 110] at a finer stride, and the special values."""
    coarse = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    top = int(np.float32(110.0).view(np.uint32))
    fine = np.arange(0, top, 97, dtype=np.uint32).view(np.float32)
    return np.concatenate([coarse, fine, -fine, np.asarray(SPECIALS, np.float32)])


GRID = _grid()


@pytest.mark.parametrize("op", OPS)
def test_within_bound_of_numpy_on_every_path(op, isa):
    nat = runtime.native_module()
    got = nat.exp_tanh(OPS[op][0], GRID, None, 2)
    assert_within_bound(op, GRID, got, f"isa={isa}")
    spec = np.asarray(SPECIALS, np.float32)
    if op == "Tanh":
        num = spec[~np.isnan(spec)]
        assert np.array_equal(np.signbit(nat.exp_tanh(1, num, None, 1)), np.signbit(num))  # odd, -0 included
    assert nat.exp_tanh(OPS[op][0], np.float32([-0.0]), None, 1).view(np.uint32)[0] == \
        np.float32(-0.0 if op == "Tanh" else 1.0).view(np.uint32)


@pytest.mark.parametrize("op", OPS)
def test_every_path_gives_the_same_bits(op):
    """AVX-512, AVX2 + FMA and scalar std::fma are the same operations: the same bits on every host."""
    from _isa import cap_isa, host_isas

    nat = runtime.native_module()
    x = np.concatenate([GRID, with_specials((RNG.standard_normal(4099) * 30).astype(np.float32), RNG,
                                            values=SPECIALS)])
    results = {}
    for name in host_isas():
        for _ in cap_isa(name):
            results[name] = nat.exp_tanh(OPS[op][0], x, None, 1).view(np.uint32)
    first = next(iter(results.values()))
    for name, bits in results.items():
        diff = np.flatnonzero((bits != first) & ~np.isnan(x))
        assert diff.size == 0, f"{op} {name}: differs at x={x[diff[:4]]}"


@pytest.mark.parametrize("op", OPS)
def test_an_element_does_not_depend_on_threads_chunk_or_tail(op):
    nat = runtime.native_module()
    code = OPS[op][0]
    big = with_specials((RNG.standard_normal(5 * TASK + 64) * 40).astype(np.float32), RNG, values=SPECIALS)
    whole = nat.exp_tanh(code, big, None, 1)
    assert_within_bound(op, big, whole)
    sizes = around(1, 15, 16, 17, 32, TASK, 2 * TASK, 3 * TASK, 4 * TASK + 16) + [0, 5 * TASK + 7]
    for n in sizes:
        for start in (0, 3):
            x = big[start:start + n]
            x = x.reshape(-1, 1) if n % 2 else x
            for threads in (1, 2):
                out = np.full(x.shape, 7.0, np.float32)
                got = nat.exp_tanh(code, x, out, threads)
                assert got is out, f"{op} n={n}"
                assert got.reshape(-1).tobytes() == whole[start:start + n].tobytes(), \
                    f"{op} n={n} start={start} threads={threads}"


def test_refuses_what_it_cannot_run():
    nat = runtime.native_module()
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="op must be"):
        nat.exp_tanh(2, x, None, 1)
    with pytest.raises(ValueError, match="C-order float32"):
        nat.exp_tanh(0, x.astype(np.float64), None, 1)
    with pytest.raises(ValueError, match="C-order float32"):
        nat.exp_tanh(1, x.astype(np.float64).view(np.int64), None, 1)
    with pytest.raises(ValueError, match="C-order float32"):
        nat.exp_tanh(0, np.ones((4, 4), np.float32).T, None, 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.exp_tanh(0, x, np.empty(7, np.float32), 1)
    with pytest.raises(ValueError, match="out must be"):
        nat.exp_tanh(0, x.astype(np.float16), np.empty(8, np.float32), 1)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("threads", [1, 2])
def test_ops_bind_it_from_their_threshold(op, threads):
    """Float32 Exp/Tanh's kernel (and bound step) runs ``exp_tanh`` from ``_F32_SPLIT_FROM`` elements (over the threads
    from ``_EXP_TANH_THREADS_FROM``), within the bound of the reference; below it numpy's one call (the reference's
    bits), a 0-d input too."""
    low = elementwise.SPLIT_MIN_ELEMS
    start = elementwise._F32_SPLIT_FROM.get(op, low)
    split = elementwise._EXP_TANH_THREADS_FROM[op]
    for n in (1, 64, start - 1, start, start + 1, low - 1, low, low + 1, 3 * TASK + 5, split - 1, split + 17):
        x = with_specials((RNG.standard_normal(n) * 40).astype(np.float32), RNG, values=SPECIALS).reshape(1, n)
        got, want, calls = native_vs_reference(op, [("x", x, False)], threads=threads)
        assert ("exp_tanh" in calls) == (n >= start) and "ufunc_split" not in calls, f"{op} n={n}: {calls}"
        if n < start:
            assert got[0].tobytes() == want[0].tobytes(), f"{op} n={n}"
        assert_within_bound(op, x, got[0], f"n={n} threads={threads}")
    got, want, calls = native_vs_reference(op, [("x", np.float32(0.75).reshape(()), False)], threads=threads)
    assert "exp_tanh" not in calls and got[0].tobytes() == want[0].tobytes(), f"{op} 0-d: {calls}"


EVERY_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
F16_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0e-8, -6.0e-8, 6.1e-5, 65504.0, -65504.0, 11.09, 11.1, -17.3,
                -16.6, 0.5, -2.5, 1.691, -1.691, 4.5, -4.5)
# float16 Tanh's patterns one float16 ulp off the reference (measured over every pattern); Exp has none
TANH_F16_OFF = (1.691, -1.691)


def assert_f16_within_one_ulp(x: np.ndarray, got: np.ndarray, what: str = "", op: str = "Exp") -> None:
    """Float16 Exp and Tanh: NaN where the reference has NaN, its bits where it is inf, 0 or +-1, the sign of zero
    kept, elsewhere within one float16 ulp (measured over every float16 pattern: Exp none off, Tanh two)."""
    with np.errstate(all="ignore"):
        want = OPS[op][1](x.astype(np.float32)).astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape, what
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN positions differ"
    w, g = want[~nan].view(np.int16).astype(np.int32), got[~nan].view(np.int16).astype(np.int32)
    exact = np.isinf(want[~nan]) | (want[~nan] == 0) | (np.abs(want[~nan]) == 1)
    assert np.array_equal(g[exact], w[exact]), f"{what}: inf/0/1 differ"
    assert (np.abs(g - w) <= 1).all(), f"{what}: more than one float16 ulp off"  # same sign: bits ordered


@pytest.mark.parametrize("op", OPS)
def test_float16_every_bit_pattern(op, isa):
    nat = runtime.native_module()
    code = OPS[op][0]
    for threads in (1, 2):
        got = nat.exp_tanh(code, EVERY_F16, None, threads)
        assert_f16_within_one_ulp(EVERY_F16, got, f"{op} isa={isa} threads={threads}", op)
        with np.errstate(all="ignore"):
            off = EVERY_F16[got.view(np.uint16) != OPS[op][1](EVERY_F16.astype(np.float32)).astype(np.float16)
                            .view(np.uint16)]
        off = off[~np.isnan(off)]
        assert sorted(off.tolist()) == sorted(np.float16(TANH_F16_OFF).tolist() if op == "Tanh" else []), off
        got = nat.exp_tanh(code, EVERY_F16.reshape(256, 256), None, threads)
        assert got.shape == (256, 256)
        assert_f16_within_one_ulp(EVERY_F16.reshape(256, 256), got, f"{op} 256x256 threads={threads}", op)


@pytest.mark.parametrize("op", OPS)
def test_float16_every_path_gives_the_same_bits(op):
    """The fused float16 rows (AVX-512, AVX2 + F16C: widened and rounded in registers) and the scalar path's blocked
    widen / row / round give the same bits, around the vectors' tails."""
    from _isa import cap_isa, host_isas

    nat = runtime.native_module()
    x = np.concatenate([EVERY_F16, with_specials((RNG.standard_normal(1100) * 6).astype(np.float16), RNG,
                                                 values=F16_SPECIALS)])
    results = {}
    for name in host_isas():
        for _ in cap_isa(name):
            results[name] = [nat.exp_tanh(OPS[op][0], x[:n], None, 1).view(np.uint16)
                             for n in (len(x), *around(1, 7, 8, 9, 15, 16, 17, 31, 1024))]
    first = next(iter(results.values()))
    for name, runs in results.items():
        for got, want in zip(runs, first):
            diff = np.flatnonzero((got != want) & ~np.isnan(x[:len(got)]))
            assert diff.size == 0, f"{op} {name} n={len(got)}: differs at x={x[diff[:4]]}"


@pytest.mark.parametrize("op", OPS)
def test_float16_sizes_around_blocks_and_tasks(op, isa):
    nat = runtime.native_module()
    code = OPS[op][0]
    big = with_specials((RNG.standard_normal(3 * TASK + 1100) * 6).astype(np.float16), RNG, values=F16_SPECIALS)
    whole = nat.exp_tanh(code, big, None, 1)
    assert_f16_within_one_ulp(big, whole, op=op)
    for n in around(1, 7, 8, 16, 1024, 2048, TASK, 2 * TASK) + [0, 3 * TASK + 1029]:
        for start in (0, 3):
            for threads in (1, 2):
                out = np.full(n, 7.0, np.float16)
                got = nat.exp_tanh(code, big[start:start + n], out, threads)
                assert got is out and got.tobytes() == whole[start:start + n].tobytes(), \
                    f"{op} n={n} start={start} threads={threads}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("threads", [1, 2])
def test_float16_binds_it_at_every_size(op, threads):
    low = elementwise.SPLIT_MIN_ELEMS
    for shape in [(1,), (3, 5), (1, 64), (low - 1,), (low,), (1, 2 * TASK + 9)]:
        x = with_specials((RNG.standard_normal(shape) * 6).astype(np.float16), RNG, values=F16_SPECIALS)
        got, _, calls = native_vs_reference(op, [("x", x, False)], threads=threads)
        assert "exp_tanh" in calls and "ufunc_split" not in calls, f"float16 {op} {shape}: {calls}"
        assert_f16_within_one_ulp(x, np.asarray(got[0]), f"float16 {op} {shape} threads={threads}", op)


@pytest.mark.parametrize("op,dtype", [("Exp", np.float32), ("Tanh", np.float32), ("Exp", np.float16),
                                      ("Tanh", np.float16)])
def test_session_runs_it_on_npu_ep_and_matches_the_cpu_ep(op, dtype):
    """A whole session at a size past the threshold: NpuEP ran the node (ORT's assignment), its bound step (no Python
    kernel), and the result is the CPU EP's within a few ulp (ORT's MLAS exp/tanh is a polynomial of its own too, so
    neither side is exact: 8 float32 ulp relative, 2 float16 ulp; NaN and inf in the same places; below the smallest
    normal float an absolute tiny: ORT's tanh gives 0 for denormal x, numpy, the reference, gives x)."""
    from onnx import TensorProto, helper

    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    n = 3 * TASK + 5
    model = make_model([helper.make_node(op, ["x"], ["y"], name="the_op")],
                       [helper.make_tensor_value_info("x", elem, [1, n])],
                       [helper.make_tensor_value_info("y", elem, [1, n])])
    scale = 40 if dtype == np.float32 else 6
    x = with_specials((RNG.standard_normal((1, n)) * scale).astype(dtype), RNG,
                      values=SPECIALS if dtype == np.float32 else F16_SPECIALS)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    for _ in range(2):  # the first call observes and binds, the second runs the bound step
        got = sess.run(None, {"x": x})[0]
    want = cpu_run(model, {"x": x})[0]
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    inf = ~nan & np.isinf(want)
    assert np.array_equal(got[inf], want[inf])
    ulp = np.finfo(dtype).eps
    np.testing.assert_allclose(got[~nan].astype(np.float64), want[~nan].astype(np.float64),
                               rtol=(8 if dtype == np.float32 else 2) * ulp, atol=float(np.finfo(dtype).tiny))
