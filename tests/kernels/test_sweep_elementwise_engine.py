"""Differential sweep of the element-wise engine (issue 40 item 2): float32 Erf, exact Gelu (ONNX and
com.microsoft), Pow by a constant 3, LeakyRelu, HardSigmoid, HardSwish and PRelu of one slope run as conv-tail
instructions on a copy of the input (``tail_of``, kernels/native/conv_tail.cc), against the reference model
(kernels/ops/elementwise.py, activation.py), which computes the same float32 operations: bit for bit, the sign of
zero included, on every ISA the host runs, around the 8/16-lane tails, the 2048-float chunk and the 2^16-float task
split, with NaN/+-Inf/-0/denormals/huge values. Erf's float32 algorithm (Eigen's rational approximation) is
measured against the exact erf; the ops also run in sessions against ORT's CPU EP with NpuEP's assignment shown."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check, with_specials
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.float_math import erf_f32
from npu_testing import assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4002)
TASK, CHUNK = 1 << 16, 2048
SIZES = around(8, 16, 32, CHUNK)
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0e-45, -1.0e-40, 1.17e-38, 3.0e38, -3.0e38, 4.0, -4.0, 3.92, 1e-20)

# (op, domain, attrs, constant second input or None, input scale)
CASES = {
    "Erf": ("Erf", "", {}, None, 3.0),
    "Gelu": ("Gelu", "", {}, None, 4.0),
    "ms_Gelu": ("Gelu", "com.microsoft", {}, None, 4.0),
    "Gelu_tanh": ("Gelu", "", {"approximate": "tanh"}, None, 4.0),
    "FastGelu": ("FastGelu", "com.microsoft", {}, None, 4.0),
    "Pow3": ("Pow", "", {}, np.array(3.0, np.float32), 5.0),
    "Pow_half": ("Pow", "", {}, np.array(0.5, np.float32), 5.0),
    "LeakyRelu": ("LeakyRelu", "", {"alpha": 0.1}, None, 5.0),
    "HardSigmoid": ("HardSigmoid", "", {"alpha": 0.3, "beta": 0.4}, None, 5.0),
    "HardSwish": ("HardSwish", "", {}, None, 5.0),
    "PRelu1": ("PRelu", "", {}, np.array([0.25], np.float32), 5.0),
}


@pytest.fixture(params=host_isas(top="avx512"))
def ew_isa(request):
    yield from cap_isa(request.param)


def _run(case: str, x: np.ndarray, threads: int = 1) -> np.ndarray:
    op, domain, attrs, const, _ = CASES[case]
    inputs = [("x", x, False)] + ([] if const is None else [("c", const, True)])
    got = check(op, inputs, "tail_of", domain=domain, threads=threads, what=f"{case} {x.shape}", **attrs)[0]
    want = check(op, inputs, "tail_of", domain=domain, threads=1, what=f"{case} {x.shape}", **attrs)[0]
    assert got.tobytes() == want.tobytes(), f"{case} {x.shape}: threads change the bits"
    return got


def _bits_equal(case: str, x: np.ndarray, threads: int = 1) -> None:
    """The native engine's output has the reference's exact bits (check() compares values: -0 == +0 there)."""
    from _sweep import native_vs_reference
    op, domain, attrs, const, _ = CASES[case]
    inputs = [("x", x, False)] + ([] if const is None else [("c", const, True)])
    got, want, calls = native_vs_reference(op, inputs, domain=domain, threads=threads, **attrs)
    assert "tail_of" in calls, f"{case}: the engine did not run ({calls})"
    g, w = got[0], want[0]
    assert g.dtype == w.dtype == np.float32 and g.shape == w.shape
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), f"{case}: NaN positions differ"
    assert np.array_equal(g.view(np.uint32)[~nan], w.view(np.uint32)[~nan]), \
        f"{case} {x.shape}: bits differ at {np.flatnonzero(g.view(np.uint32) != w.view(np.uint32))[:5]}"


@pytest.mark.parametrize("case", CASES)
def test_sizes_and_special_values_bit_for_bit(ew_isa, case):
    scale = CASES[case][4]
    for n in SIZES:
        x = with_specials((RNG.standard_normal(n) * scale).astype(np.float32), RNG, values=SPECIALS)
        _bits_equal(case, x)


@pytest.mark.parametrize("case", CASES)
def test_the_task_split_and_threads(ew_isa, case):
    x = np.linspace(-6, 6, 2 * TASK + 38, dtype=np.float32).reshape(1, 2, -1)
    x = with_specials(x, RNG, values=SPECIALS, fraction=0.001)
    _bits_equal(case, x, threads=2)
    _run(case, x, threads=2)


@pytest.mark.parametrize("shape", [(1,), (3, 1, 5), (2, 3, 4, 5), (1, 0, 4)])
@pytest.mark.parametrize("case", ["Erf", "LeakyRelu", "PRelu1"])
def test_ranks_and_empty(case, shape):
    _bits_equal(case, (RNG.standard_normal(shape) * 3).astype(np.float32))


def test_erf_f32_is_within_7_ulp_and_4_1e_7_of_the_exact_erf():
    """Eigen's float32 rational erf (the native instruction and its reference) against math.erf in float64, over
    every 9973rd float32 bit pattern of [0, 4.5] (erf is odd; beyond 4 it is 1 in float32): at most 7 ulp of the
    exact value rounded to float32, and 4.1e-7 absolute (the old float64 reference: below 1 ulp). Every 97th
    pattern (11M values, too slow here) gave 6.86 ulp at x = 3.6275 and 4.09e-7 absolute."""
    x = np.arange(0, np.float32(4.5).view(np.uint32), 9973, dtype=np.uint32).view(np.float32)
    exact = np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(np.float64)
    got = erf_f32(x).astype(np.float64)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 7.0
    assert np.max(np.abs(got - exact)) <= 4.1e-7
    assert np.array_equal(erf_f32(-x), -erf_f32(x))
    specials = erf_f32(np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], np.float32))
    assert np.isnan(specials[0]) and list(specials[1:3]) == [1.0, -1.0]
    assert np.signbit(specials[3]) and specials[4] == np.float32(1e-45)


def test_tanh_f32_is_within_6_ulp_and_3_3e_7_of_the_exact_tanh():
    """MLAS's float32 rational tanh (tanh-GELU's instruction and its reference) against float64 tanh over every
    997th float32 bit pattern of [0, 10] (odd; beyond 9 it is 1 in float32): at most 6 ulp (5.35 measured, at
    x = 5.83) and 3.3e-7 absolute."""
    from npu_ep.kernels.ops.float_math import tanh_f32
    x = np.arange(0, np.float32(10.0).view(np.uint32), 997, dtype=np.uint32).view(np.float32)
    exact = np.tanh(x.astype(np.float64))
    got = tanh_f32(x).astype(np.float64)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 6.0
    assert np.max(np.abs(got - exact)) <= 3.3e-7
    assert np.array_equal(tanh_f32(-x), -tanh_f32(x))


def _session_case(op: str, domain: str, attrs: dict, const, shape=(1, 37, 1500)):
    inits = {} if const is None else {"c": const}
    node = helper.make_node(op, ["x"] + ([] if const is None else ["c"]), ["y"], name="the_op", domain=domain,
                            **attrs)
    extra = [("com.microsoft", 1)] if domain else []
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits, opset=20,
                       extra_opsets=extra)
    return model


# ORT's CPU EP computes its own approximations (MLAS erf and tanh, powf): the tolerances are the engine's 7 ulp
# plus ORT's own few; a GELU's 1 + erf (or tanh) near -1 cancels, so its error is |x| / 2 times 7 ulp of 1 and
# more: |x| < 20 here gives atol 5e-6 for the GELUs
@pytest.mark.parametrize("case", CASES)
def test_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    op, domain, attrs, const, scale = CASES[case]
    model = _session_case(op, domain, attrs, const)
    x = (RNG.standard_normal((1, 37, 1500)) * scale).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    got = sess.run(None, {"x": x})[0]
    want = cpu_run(model, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=5e-6 if "Gelu" in case else 1e-6)


def test_tail_of_writes_into_a_given_buffer_and_rejects_a_wrong_one():
    """``out`` (ORT's output buffer when the op's result is a partition output) is written in place and returned;
    a buffer of another dtype, size or layout is refused by name."""
    kernels = runtime.native_module()
    codes, consts = np.array([11], np.int32), np.zeros((1, 2), np.float32)  # erf
    x = (RNG.standard_normal((3, 50)) * 2).astype(np.float32)
    out = np.empty(150, np.float32)
    got = kernels.tail_of(x, codes, consts, 1, out)
    assert np.shares_memory(got, out) and out.tobytes() == erf_f32(x).tobytes()
    for bad in (np.empty(150, np.float64), np.empty(149, np.float32), np.empty((50, 6), np.float32)[:, ::2]):
        with pytest.raises(ValueError, match="tail_of: out must be"):
            kernels.tail_of(x, codes, consts, 1, bad)


def test_float32_entries_borrow_c_order_float32_and_convert_the_rest_as_before():
    """tail_of, sigmoid and prelu_rows borrow a C-order float32 x (and int32 codes, float32 consts, slope) as the
    bound steps pass them, and convert anything else as an array_t argument did: a strided or list x gives the result
    of its C-order float32 copy; what does not convert (float64: no silent narrowing) is a TypeError naming it."""
    kernels = runtime.native_module()
    codes, consts = np.array([11], np.int32), np.zeros((1, 2), np.float32)  # erf
    x = (RNG.standard_normal((6, 40)) * 2).astype(np.float32)
    for other in (x[:, ::2], x[:, ::2].tolist()):
        want = erf_f32(np.ascontiguousarray(x[:, ::2]))
        assert kernels.tail_of(other, codes, consts, 1).tobytes() == want.tobytes()
        assert kernels.tail_of(other, [11], [[0.0, 0.0]], 1).tobytes() == want.tobytes()
        assert kernels.sigmoid(other, 1).tobytes() == kernels.sigmoid(np.ascontiguousarray(x[:, ::2]), 1).tobytes()
        slope = np.array([0.5, 0.25, 2.0], np.float32)
        want = kernels.prelu_rows(np.ascontiguousarray(x[:, ::2]), slope, 20, 1)
        assert kernels.prelu_rows(other, slope.tolist(), 20, 1).tobytes() == want.tobytes()
    with pytest.raises(TypeError, match="tail_of: x must be"):
        kernels.tail_of(x.astype(np.float64), codes, consts, 1)
    with pytest.raises(TypeError, match="prelu_rows: slope must be"):
        kernels.prelu_rows(x, np.ones(3), 40, 1)
    with pytest.raises(TypeError, match="tail_of: codes must be"):
        kernels.tail_of(x, object(), consts, 1)
    with pytest.raises(TypeError, match="sigmoid: x must be"):
        kernels.sigmoid(x.astype(np.float64), 1)


# PRelu with a slope along one run of x's axes (per channel): the native per-row PRelu (prelu_rows)
PRELU_ROWS = [((1, 64, 7, 7), (64, 1, 1)), ((2, 3, 5), (5,)), ((2, 3, 4, 5), (3, 4, 1)), ((4, 17), (17,)),
              ((2, 3, 40000), (3, 1)), ((1, 5, 2049), (1, 5, 1)), ((3, 1, 16), (1, 1, 16))]


def _prelu_bits(x: np.ndarray, slope: np.ndarray, *, constant: bool, threads: int = 1) -> None:
    from _sweep import native_vs_reference
    got, want, calls = native_vs_reference("PRelu", [("x", x, False), ("s", slope, constant)], threads=threads)
    assert "prelu_rows" in calls, f"PRelu {x.shape} {slope.shape}: the native per-row PRelu did not run ({calls})"
    g, w = got[0], want[0]
    nan = np.isnan(w)
    assert g.shape == w.shape and np.array_equal(np.isnan(g), nan)
    assert np.array_equal(g.view(np.uint32)[~nan], w.view(np.uint32)[~nan]), f"PRelu {x.shape} {slope.shape}"


@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("x_shape,slope_shape", PRELU_ROWS)
def test_prelu_per_channel_bit_for_bit(ew_isa, x_shape, slope_shape, constant):
    """Each row's slope (the task split cuts rows: 2x3x40000 in 2^16-float tasks), NaN/-0/denormals/huge kept
    as the reference's x < 0 ? x * slope : x, with two threads the same bits."""
    x = with_specials((RNG.standard_normal(x_shape) * 4).astype(np.float32), RNG, values=SPECIALS)
    slope = RNG.uniform(-1.5, 1.5, slope_shape).astype(np.float32)
    _prelu_bits(x, slope, constant=constant, threads=2)


@pytest.mark.parametrize("x_shape,slope_shape", [((2, 3, 5), (2, 1, 5)), ((2, 3), (2, 2, 3)), ((4, 1), (4, 5))])
def test_prelu_slopes_that_are_not_rows_stay_on_the_reference(x_shape, slope_shape):
    """A slope over axes that are not one run of x's (or that widens the output) is the reference's broadcast."""
    from _sweep import native_vs_reference
    x = (RNG.standard_normal(x_shape) * 4).astype(np.float32)
    slope = RNG.uniform(-1.5, 1.5, slope_shape).astype(np.float32)
    got, want, calls = native_vs_reference("PRelu", [("x", x, False), ("s", slope, True)])
    assert "prelu_rows" not in calls and np.array_equal(got[0], want[0])


def test_prelu_per_channel_session_after_a_conv_matches_cpu_ep():
    """Conv -> PRelu with a [C, 1, 1] slope (face and super-resolution nets) in a session: both nodes on NpuEP,
    the CPU EP's result within the conv tolerance."""
    rng = np.random.default_rng(44)
    inits = {"w": rng.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32),
             "s": rng.uniform(0.05, 0.4, (16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("PRelu", ["c", "s"], ["y"], "prelu")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 30, 30])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 30, 30])], inits)
    x = rng.standard_normal((1, 8, 30, 30)).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"conv": "NpuEP", "prelu": "NpuEP"}
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-4, atol=4e-4)


@pytest.mark.parametrize("case", CASES)
def test_float16_widens_around_the_engine_bit_for_bit(ew_isa, case):
    """Float16 x (and output) runs the engine natively (tail_of_f16: F16C or _Float16 conversions per chunk), widened
    to float32 and rounded once on store as the reference does: the same bits, including float16's overflow to Inf
    and its subnormals, on every ISA; the bound step too (native_vs_reference checks it)."""
    from _sweep import native_vs_reference
    op, domain, attrs, const, scale = CASES[case]
    for shape, threads in (((3, 2 * 1031), 1), ((2, TASK + 1001), 2)):  # chunk tails; the task split
        x = with_specials((RNG.standard_normal(shape) * scale).astype(np.float16), RNG,
                          values=(np.nan, np.inf, -np.inf, -0.0, 6.0e-8, -6.0e-5, 65504.0, -65504.0, 40.0))
        c = None if const is None else const.astype(np.float16)
        inputs = [("x", x, False)] + ([] if c is None else [("c", c, True)])
        got, want, calls = native_vs_reference(op, inputs, domain=domain, threads=threads, **attrs)
        assert "tail_of_f16" in calls, f"{case} float16: the engine did not run ({calls})"
        g, w = got[0], want[0]
        nan = np.isnan(w)
        assert g.dtype == w.dtype == np.float16 and np.array_equal(np.isnan(g), nan)
        assert np.array_equal(g.view(np.uint16)[~nan], w.view(np.uint16)[~nan]), f"{case} float16 {shape}"


@pytest.mark.parametrize("op", ["Max", "Add"])
def test_a_bound_ufunc_step_writes_the_partition_output_into_orts_buffer(op, monkeypatch):
    """A two-input Max (bound as its ufunc since issue 40) and Add whose result is the partition's output: the bound
    step calls the ufunc itself with ORT's buffer as ``out`` (the bridge then copies nothing), and the values are
    the CPU EP's."""
    from npu_ep.kernels import runtime

    fn = {"Max": np.maximum, "Add": np.add}[op]
    bound: list = []
    real = runtime.call_step

    def recording(p, call, args, inputs, outputs, guards=None, ort_outputs=None, fixed=None, keywords=()):
        bound.append((call, ort_outputs, keywords))
        return real(p, call, args, inputs, outputs, guards, ort_outputs, fixed, keywords)
    monkeypatch.setattr(runtime, "call_step", recording)
    model = _session_case(op, "", {}, np.array(0.25, np.float32), shape=(2, 64, 33))
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    x = RNG.standard_normal((2, 64, 33)).astype(np.float32)
    for _ in range(3):  # the first call binds the step, the next ones run it
        got = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, cpu_run(model, {"x": x})[0])
    assert bound and all(call is fn and keywords == ("out",) and ort and ort[0][1] == 0 and list(ort[0][2]) ==
                         [2, 64, 33] for call, ort, keywords in bound), bound


def test_pow_by_a_half_keeps_pows_special_cases_against_the_cpu_ep():
    """Pow(x, 0.5) on the engine is the correctly rounded sqrt with pow's own special cases, as ORT's std::pow:
    pow(-0, 0.5) = +0 (sqrt would keep -0), pow(-inf, 0.5) = +inf (sqrt: NaN), negative x NaN; exact here."""
    x = np.array([[-0.0, 0.0, -np.inf, np.inf, np.nan, -1.0, 4.0, 2.0, 1e-45, 3e38, 0.01, 7.0]], np.float32)
    model = _session_case("Pow", "", {}, np.array(0.5, np.float32), shape=x.shape)
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    for _ in range(2):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
        want = cpu_run(model, {"x": x})[0]
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan]), (got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_gelu_runs_its_gelu_in_place_on_the_engine(ew_isa, dtype):
    """com.microsoft BiasGelu: x + bias, then the engine's exact GELU in one native pass (tail_of_bias), bound as
    the step: the reference's bits, every ISA, around the lane tails, a bias row longer than the 2048-float chunk
    and the task split."""
    from _sweep import native_vs_reference
    for shape in [(3, 17), (2, 5, 33), (3, 2 * CHUNK + 5), (1, TASK // 96 + 3, 96)]:
        x = with_specials((RNG.standard_normal(shape) * 4).astype(dtype), RNG, values=(np.nan, np.inf, -np.inf, -0.0))
        bias = RNG.standard_normal(shape[-1]).astype(dtype)
        got, want, calls = native_vs_reference("BiasGelu", [("x", x, False), ("b", bias, True)], domain="com.microsoft",
                                               threads=2)
        assert "tail_of_bias" in calls
        g, w = got[0], want[0]
        nan = np.isnan(w)
        assert g.dtype == w.dtype and np.array_equal(np.isnan(g), nan)
        assert g[~nan].tobytes() == w[~nan].tobytes(), f"BiasGelu {shape} {dtype}"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fast_gelu_with_a_bias_runs_its_gelu_in_place_on_the_engine(dtype):
    """com.microsoft FastGelu with its bias: x + bias, then the engine's tanh GELU in one native pass
    (tail_of_bias), bound as the step: the reference's bits."""
    from _sweep import native_vs_reference
    for shape in [(3, 17), (1, TASK // 96 + 3, 96)]:
        x = with_specials((RNG.standard_normal(shape) * 4).astype(dtype), RNG, values=(np.nan, np.inf, -np.inf, -0.0))
        bias = RNG.standard_normal(shape[-1]).astype(dtype)
        got, want, calls = native_vs_reference("FastGelu", [("x", x, False), ("b", bias, True)], domain="com.microsoft",
                                               threads=2)
        assert "tail_of_bias" in calls
        g, w = got[0], want[0]
        nan = np.isnan(w)
        assert g.dtype == w.dtype and np.array_equal(np.isnan(g), nan)
        assert g[~nan].tobytes() == w[~nan].tobytes(), f"FastGelu {shape} {dtype}"


def test_sigmoid_writes_a_given_buffer_and_its_session_output_matches_the_cpu_ep():
    """The native sigmoid takes ORT's buffer as ``out`` as the engine does (same bits as into a new array); a
    session's Sigmoid output (the kernel's run, then its bound step) is ORT's within 1e-6 (MLAS's logistic is its
    own approximation, test_fusion_conv_tail's tolerance)."""
    kernels = runtime.native_module()
    x = (RNG.standard_normal((3, 77)) * 8).astype(np.float32)
    out = np.empty_like(x)
    got = kernels.sigmoid(x, 1, out)
    assert np.shares_memory(got, out) and out.tobytes() == kernels.sigmoid(x, 1).tobytes()
    with pytest.raises(ValueError, match="sigmoid: out must be"):
        kernels.sigmoid(x, 1, np.empty(5, np.float32))
    model = _session_case("Sigmoid", "", {}, None, shape=(1, 37, 1500))
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feed = (RNG.standard_normal((1, 37, 1500)) * 8).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": feed})[0], cpu_run(model, {"x": feed})[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32, np.uint8])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((2, 3, 4), ()), ((2, 0, 3), (1, 3))])
def test_two_input_min_max_bind_their_ufunc_also_for_float16(op, dtype, shapes):
    """Two-input Max/Min bind np.maximum/np.minimum (were Python folds), float16 too: its min/max is exact, so the
    ufunc on float16 is the kernel's widened fold rounded back; the bound step gives the kernel's values, NaN kept
    (a tie of -0 and +0 may pick either zero, as numpy's own maximum)."""
    from _sweep import kernel_and_bound_step
    dt = np.dtype(dtype)

    def values(shape):
        if dt.kind == "f":
            x = (RNG.standard_normal(shape) * 4).astype(dt)
            return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0), fraction=0.1) if x.size else x
        return RNG.integers(0, 200, shape).astype(dt)
    a, b = values(shapes[0]), values(shapes[1])
    got, bound = kernel_and_bound_step(op, [("a", a, False), ("b", b, False)])
    assert len(bound) == 1, f"{op} {dt} {shapes}: no bound step"
    assert bound[0].dtype == got[0].dtype == dt and bound[0].shape == got[0].shape
    np.testing.assert_array_equal(bound[0], got[0])


def test_tail_of_f16_refuses_other_dtypes_and_writes_a_given_buffer():
    kernels = runtime.native_module()
    codes, consts = np.array([11], np.int32), np.zeros((1, 2), np.float32)  # erf
    x = (RNG.standard_normal((4, 33)) * 2).astype(np.float16)
    out = np.empty(132, np.float16)
    got = kernels.tail_of_f16(x, codes, consts, 1, out)
    assert np.shares_memory(got, out) and out.tobytes() == erf_f32(x.astype(np.float32)).astype(np.float16).tobytes()
    with pytest.raises(ValueError, match="tail_of_f16: x must be"):
        kernels.tail_of_f16(x.astype(np.float32), codes, consts, 1)
    for bad in (np.empty(132, np.float32), np.empty(131, np.float16), [0.0] * 132):
        with pytest.raises(ValueError, match="tail_of_f16: out must be"):
            kernels.tail_of_f16(x, codes, consts, 1, bad)
