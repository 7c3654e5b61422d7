"""Differential sweep of the element-wise engine's transcendental and rounding instructions (issue 40): Reciprocal,
Elu, Selu, Softplus and Softsign in float32 and float16, Log in float32, and Sigmoid, Floor, Ceil, Round, Sign, Sin
and Cos in float16 (every instruction, exp, log and tanh too, also in element-wise chains; float16 Log alone runs
numpy's loop: test_sweep_ufunc_split.py; float16 Exp and Tanh alone ``exp_tanh``: test_sweep_exp_tanh.py), run
natively as engine programs (``tail_of`` and ``tail_of_f16``, kernels/native/conv_tail.cc with
kernels/native/engine_math.h) against the reference model (numpy, kernels/ops/elementwise.py and activation.py).

The engine's exp/log/expm1 are Cephes' float32 algorithms, not numpy's: each is measured against the exact function
(float64) over a grid of float32 bit patterns, and the ops against the reference within those bounds; the exact
instructions (reciprocal, softsign's abs/add/divide, floor, ceil, round, sign) give the reference's bits. Float16
widens each chunk, computes in float32 and rounds once, as the reference: at most one float16 ulp apart (where the
two float32 results straddle a float16 rounding boundary), bit for bit for the exact ops. Sizes cross the 8/16-lane
tails, the 2048-float chunk and the 2^16-float task split; NaN/+-Inf/-0/denormal/huge values are in every input."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, native_vs_reference, with_specials
from npu_ep.kernels import runtime
from npu_ep.kernels.tail_program import CODES
from npu_testing import assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4040)
TASK, CHUNK = 1 << 16, 2048
SIZES = around(8, 16, 32, CHUNK)
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0e-45, -1.0e-40, 1.17e-38, 3.0e38, -3.0e38, 88.7, -88.7, -104.0,
            0.5, -0.5, 2.5, -2.5, 4194304.5, 1e-20)
F16_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 6.0e-8, -6.0e-5, 65504.0, -65504.0, 11.0, -17.0, 0.5, -2.5)

# op -> (attrs, input scale, max ulp of the float32 result against the reference, float16 too: None = float16 only)
F32_CASES = {
    "Reciprocal": ({}, 5.0, 0),
    "Log": ({}, 30.0, 2),
    "Elu": ({"alpha": 0.7}, 5.0, 3),
    "Selu": ({}, 5.0, 4),
    "Softplus": ({}, 8.0, 4),
    "Softsign": ({}, 5.0, 0),
}
F16_CASES = {**{op: (attrs, scale) for op, (attrs, scale, _) in F32_CASES.items() if op != "Log"},
             "Sigmoid": ({}, 6.0), "Floor": ({}, 8.0),
             "Ceil": ({}, 8.0), "Round": ({}, 8.0), "Sign": ({}, 3.0), "Sin": ({}, 40.0), "Cos": ({}, 40.0)}
F16_EXACT = ("Reciprocal", "Softsign", "Floor", "Ceil", "Round", "Sign")


@pytest.fixture(params=host_isas(top="avx512"))
def ew_isa(request):
    yield from cap_isa(request.param)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of want's spacing (the smallest subnormal at least), both finite; NaN and infinities
    must sit at the same places (asserted)."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN positions differ"
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), "infinities differ"
    fin = np.isfinite(want)
    g, w = got[fin].astype(np.float64), want[fin].astype(np.float64)
    with np.errstate(over="ignore"):  # the largest finite value's spacing is inf: no ulp there
        spacing = np.spacing(np.abs(want[fin])).astype(np.float64)
    return np.abs(g - w) / np.maximum(spacing, float(np.finfo(want.dtype).smallest_subnormal))


def _engine_vs_reference(op: str, x: np.ndarray, attrs: dict, threads: int = 1):
    got, want, calls = native_vs_reference(op, [("x", x, False)], threads=threads, **attrs)
    fn = "tail_of" if x.dtype == np.float32 else "tail_of_f16"
    assert fn in calls, f"{op} {x.dtype}: the engine did not run ({calls})"
    assert got[0].dtype == want[0].dtype == x.dtype and got[0].shape == x.shape
    return got[0], want[0]


@pytest.mark.parametrize("op", F32_CASES)
def test_float32_sizes_and_specials_within_the_stated_ulp(ew_isa, op):
    attrs, scale, bound = F32_CASES[op]
    for n in SIZES:
        x = with_specials((RNG.standard_normal(n) * scale).astype(np.float32), RNG, values=SPECIALS)
        got, want = _engine_vs_reference(op, x, attrs)
        ulps = _ulps(got, want)
        assert ulps.max(initial=0) <= bound, f"{op} n={n}: {ulps.max()} ulp at {x[np.isfinite(want)][ulps.argmax()]}"
        if bound == 0:
            assert got.tobytes() == want.tobytes(), f"{op} n={n}: the exact op's bits differ"


@pytest.mark.parametrize("op", F16_CASES)
def test_float16_chunks_task_split_and_threads_within_one_ulp(ew_isa, op):
    attrs, scale = F16_CASES[op]
    for shape, threads in (((3, 2 * 1031), 1), ((2, TASK + 1001), 2)):
        x = with_specials((RNG.standard_normal(shape) * scale).astype(np.float16), RNG, values=F16_SPECIALS)
        if op == "Log":
            x = np.where(RNG.random(shape) < 0.9, np.abs(x), x)  # mostly in its domain, some NaN results
        got, want = _engine_vs_reference(op, x, attrs, threads)
        ulps = _ulps(got, want)
        assert ulps.max(initial=0) <= (0 if op in F16_EXACT else 1), f"{op} {shape}: {ulps.max()} float16 ulp"
        if op in F16_EXACT:
            assert got.tobytes() == want.tobytes(), f"{op} {shape}: the exact op's bits differ"


@pytest.mark.parametrize("op", ["Selu", "Softplus", "Elu"])
def test_threads_and_isas_give_the_same_bits(op):
    """The instructions are plain float32 operations in every instruction-set clone: the same bits on every
    dispatch level and thread count."""
    attrs = F32_CASES[op][0]
    x = with_specials(np.linspace(-90, 90, 2 * TASK + 38, dtype=np.float32), RNG, values=SPECIALS, fraction=0.001)
    outs = []
    for isa in host_isas(top="avx512"):
        for threads in (1, 2):
            gen = cap_isa(isa)
            next(gen)
            try:
                outs.append(_engine_vs_reference(op, x, attrs, threads)[0].tobytes())
            finally:
                next(gen, None)
    assert len(set(outs)) == 1


def _instruction(name: str, x: np.ndarray, a: float = 0.0) -> np.ndarray:
    kernels = runtime.native_module()
    kernels = getattr(kernels, "kernels", kernels)
    return kernels.tail_of(x, np.array([CODES[name]], np.int32), np.array([[a, 0.0]], np.float32), 1, None)


def _grid(lo: float, hi: float, step: int) -> np.ndarray:
    """Every ``step``-th float32 bit pattern of [lo, hi] (0 <= lo < hi), and their negatives."""
    pos = np.arange(np.float32(lo).view(np.uint32), np.float32(hi).view(np.uint32), step,
                    dtype=np.uint32).view(np.float32)
    return np.concatenate([pos, -pos])


def test_exp_is_within_1_ulp_of_the_exact_exp():
    """exp_tanh.cc's exp (Cody-Waite reduction with FMA, degree-6 polynomial, 2^n with one rounding): at most 1 ulp
    of the exact exp rounded over every 997th float32 pattern of [-104, 89] (also every 13th), subnormal results
    included; +inf above ln(FLT_MAX), 0 far below, NaN kept."""
    x = _grid(0.0, 104.0, 997)
    x = x[x < 89.0]
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64)).astype(np.float32)
    assert _ulps(_instruction("exp", x), exact).max() <= 1.0
    got = _instruction("exp", np.array([np.nan, np.inf, -np.inf, 89.0, -110.0, -0.0], np.float32))
    assert np.isnan(got[0]) and list(got[1:]) == [np.inf, 0.0, np.inf, 0.0, 1.0]


def test_exp_instruction_is_exp_tanhs_exp_on_every_isa_chunk_and_tail():
    """The engine's exp (and elu's, softplus's) is exp_tanh.cc's: the same bits as ``exp_tanh`` on every ISA path,
    around the vector tails, the 2048-float chunk and the task split, threads or not."""
    kernels = runtime.native_module()
    rng = np.random.default_rng(4041)  # its own: the module's draws for the other tests stay as they were
    big = with_specials((rng.standard_normal(TASK + 2 * CHUNK + 37) * 40).astype(np.float32), rng, values=SPECIALS)
    want = kernels.exp_tanh(0, big, None, 1)
    codes, consts = np.array([CODES["exp"]], np.int32), np.zeros((1, 2), np.float32)
    for isa in host_isas(top="avx512"):
        for _ in cap_isa(isa):
            for n in around(1, 15, 16, 17, CHUNK, TASK) + [len(big)]:
                for threads in (1, 2):
                    got = kernels.tail_of(big[:n], codes, consts, threads, None)
                    assert got.tobytes() == want[:n].tobytes(), f"{isa} n={n} threads={threads}"


def test_log_is_within_1_ulp_of_the_exact_log():
    """Cephes' logf (mantissa in [sqrt(1/2), sqrt 2), degree-9 polynomial, e ln 2 in two parts): at most 1 ulp over
    every 4999th positive float32 pattern, subnormals included (0.77 measured); log(0) = -inf, log(x < 0) = NaN."""
    x = np.arange(1, np.float32(np.finfo(np.float32).max).view(np.uint32), 4999, dtype=np.uint32).view(np.float32)
    exact = np.log(x.astype(np.float64)).astype(np.float32)
    assert _ulps(_instruction("log", x), exact).max() <= 1.0
    got = _instruction("log", np.array([0.0, -0.0, -1.0, np.inf, np.nan, 1.0], np.float32))
    assert list(got[:2]) == [-np.inf, -np.inf] and np.isnan(got[2]) and got[3] == np.inf and np.isnan(got[4])
    assert got[5] == 0.0


def test_elu_softplus_are_within_2_and_3_ulp_of_the_exact_functions():
    """Elu's expm1 (Taylor to x^9 below |x| = 0.5, exp(x) - 1 beyond, exp_tanh.cc's exp) within 2 ulp (1 measured
    against the exact value rounded), softplus max(x, 0) + log1p(exp(-|x|)) with Kahan's log1p within 3 ulp (3
    measured, also over every 13th pattern), over every 997th pattern of [-100, 100]."""
    x = _grid(0.0, 100.0, 997)
    x64 = x.astype(np.float64)
    elu = np.where(x64 >= 0, x64, np.expm1(x64)).astype(np.float32)
    assert _ulps(_instruction("elu", x, 1.0), elu).max() <= 2.0
    softplus = np.logaddexp(0.0, x64).astype(np.float32)
    assert _ulps(_instruction("softplus", x), softplus).max() <= 3.0


def test_sin_cos_instructions_are_within_8e_8_absolute():
    """sin/cos (Cephes: octant reduction in three exact parts for |x| < 8192, the C library's beyond): within
    8e-8 absolute of the exact value (near their zeros that is many ulp; float16 Sin/Cos round it once)."""
    x = np.concatenate([_grid(0.0, 8191.0, 4999), np.array([1e5, -3e7, np.inf, np.nan], np.float32)])
    for name, fn in (("sin", np.sin), ("cos", np.cos)):
        got = _instruction(name, x)
        with np.errstate(invalid="ignore"):
            exact = fn(x.astype(np.float64))
        fin = np.isfinite(exact)
        assert np.max(np.abs(got[fin] - exact[fin])) <= 8e-8, name
        assert np.all(np.isnan(got[~fin]))


SESSION_CASES = [(op, np.float32) for op in F32_CASES] + [(op, np.float16) for op in F16_CASES]


@pytest.mark.parametrize("op,dtype", SESSION_CASES, ids=[f"{o}-{np.dtype(d).name}" for o, d in SESSION_CASES])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(op, dtype):
    """One node in a session: NpuEP runs it (graph assignment) and matches ORT's CPU EP: float32 within 2e-6
    relative (both sides' float32 approximations) and 1e-7 absolute (ORT's Elu/Selu compute exp(x) - 1, 6e-8 off
    near 0), float16 within two float16 ulp (both round a float32 result; ORT's float16 Sigmoid is MLAS's rational
    logistic, up to 2 float16 ulp from the rounded exact value near 0)."""
    attrs, scale = F16_CASES[op] if dtype == np.float16 else F32_CASES[op][:2]
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    shape = [1, 37, 600]
    node = helper.make_node(op, ["x"], ["y"], name="the_op", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, shape)],
                       [helper.make_tensor_value_info("y", elem, shape)], opset=20)
    x = (RNG.standard_normal(shape) * scale).astype(dtype)
    if op == "Log":
        x = np.abs(x)
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    if dtype == np.float16:
        assert _ulps(got, want).max(initial=0) <= 2
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


BOUND_CASES = [("Exp", "", np.float16, None), ("Softplus", "", np.float16, None), ("Sign", "", np.float16, None),
               ("QuickGelu", "com.microsoft", np.float32, None), ("QuickGelu", "com.microsoft", np.float16, None),
               ("BiasGelu", "com.microsoft", np.float16, True), ("BiasGelu", "com.microsoft", np.float32, False),
               ("FastGelu", "com.microsoft", np.float32, True)]


@pytest.mark.parametrize("op,domain,dtype,bias_constant", BOUND_CASES)
def test_each_op_binds_one_native_step(op, domain, dtype, bias_constant):
    """The session runs these as a bound native step (no Python step), with the kernel's bits: a constant bias is
    held in the step, a runtime one passed in."""
    from _sweep import kernel_and_bound_step
    x = (RNG.standard_normal((2, 3, 40)) * 3).astype(dtype)
    inputs = [("x", x, False)]
    if bias_constant is not None:
        inputs.append(("b", RNG.standard_normal(40).astype(dtype), bias_constant))
    outs, bound = kernel_and_bound_step(op, inputs, domain=domain)
    assert len(bound) == 1, f"{op} {np.dtype(dtype).name}: no native step bound"
    assert bound[0].tobytes() == outs[0].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quick_gelu_sizes_and_specials(ew_isa, dtype):
    """QuickGelu x * sigmoid(alpha x) as save, mul alpha, sigmoid, mul_saved: the engine's sigmoid is within 4 ulp of
    the reference's (test_sweep_sigmoid: its exp within 2 of numpy's, the add and the divide half an ulp each; 4
    measured in the tail near x = -74), so the float32 product is within 4 * 2^-23 of the reference relative plus its
    own rounding (one ulp), which is up to 9 ulp where the product's binade is lower than sigmoid's (5 measured over
    seeds); float16 within one float16 ulp."""
    for n in SIZES + [TASK + 77]:
        x = with_specials((RNG.standard_normal(n) * 6).astype(dtype), RNG,
                          values=SPECIALS if dtype == np.float32 else F16_SPECIALS)
        got, want, calls = native_vs_reference("QuickGelu", [("x", x, False)], domain="com.microsoft", threads=2,
                                               alpha=1.5)
        assert ("tail_of" if dtype == np.float32 else "tail_of_f16") in calls
        if dtype == np.float16:
            assert _ulps(got[0], want[0]).max(initial=0) <= 1, f"QuickGelu n={n}"
            continue
        _ulps(got[0], want[0])  # NaN and infinities in the same places
        fin = np.isfinite(want[0])
        g, w = got[0][fin].astype(np.float64), want[0][fin].astype(np.float64)
        err = np.abs(g - w) - (4 * 2.0**-23 * np.abs(w) + np.spacing(np.abs(want[0][fin])))
        assert err.max(initial=-1.0) <= 0, f"QuickGelu n={n}: x={x[fin][err.argmax()]}"


def test_tail_of_bias_rejects_a_bias_that_is_not_the_last_axis():
    kernels = runtime.native_module()
    kernels = getattr(kernels, "kernels", kernels)
    codes, consts = np.array([CODES["erf"]], np.int32), np.zeros((1, 2), np.float32)
    x = np.ones((4, 6), np.float32)
    with pytest.raises(ValueError, match="last axis"):
        kernels.tail_of_bias(x, np.ones(4, np.float32), codes, consts)
    with pytest.raises(ValueError, match="one dtype"):
        kernels.tail_of_bias(x, np.ones(6, np.float16), codes, consts)
    out = np.empty_like(x)
    assert kernels.tail_of_bias(x, np.ones(6, np.float32), codes, consts, 1, out) is not None
    np.testing.assert_array_equal(out, np.full_like(x, _instruction("erf", np.array([2.0], np.float32))[0]))


def _gelu_family_model(op: str, dtype, bias: np.ndarray | None, shape: list[int]):
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    inits = {} if bias is None else {"b": bias.astype(dtype)}
    node = helper.make_node(op, ["x", *inits], ["y"], name="the_op", domain="com.microsoft")
    return make_model([node], [helper.make_tensor_value_info("x", elem, shape)],
                      [helper.make_tensor_value_info("y", elem, shape)], inits, opset=20,
                      extra_opsets=[("com.microsoft", 1)])


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in ("QuickGelu", "BiasGelu") for dt in (np.float32, np.float16)])
def test_gelu_family_session_matches_cpu_ep(op, dtype):
    """com.microsoft QuickGelu/BiasGelu in a session: NpuEP runs the node and matches ORT's CPU EP within its own
    approximations (float32 2e-6 relative and 3e-6 absolute: ORT's erf and logistic are MLAS's, coarse near 0, its
    BiasGelu gives -0 near x = -5 where the exact value is -1e-6). Float16 is compared with the CPU EP's float32
    result (one float16 ulp relative, the same 3e-6 absolute): ORT's
    float16 QuickGelu computes in float16 and is up to 18 float16 ulp off near its small negative outputs."""
    shape = [1, 50, 768]
    bias = RNG.standard_normal(768).astype(dtype) if op == "BiasGelu" else None
    model = _gelu_family_model(op, dtype, bias, shape)
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    got = sess.run(None, {"x": x})[0]
    if dtype == np.float16:
        model32 = _gelu_family_model(op, np.float32, bias, shape)
        want = cpu_run(model32, {"x": x.astype(np.float32)})[0]
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2.0**-10, atol=3e-6)
    else:
        np.testing.assert_allclose(got, cpu_run(model, {"x": x})[0], rtol=2e-6, atol=3e-6)


@pytest.mark.parametrize("op,attrs", [("IsNaN", {}), ("IsInf", {})])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_isnan_isinf_bind_one_step_also_for_float16(op, attrs, dtype):
    """IsNaN and IsInf (both signs) bind one step (float32: np.isnan/np.isinf, float16: the native bit test
    ``class_f16``, test_sweep_class_f16.py); the answers are the kernel's and the CPU EP's, NpuEP running the node."""
    from _sweep import kernel_and_bound_step
    x = with_specials((RNG.standard_normal((3, 700)) * 4).astype(dtype), RNG, values=F16_SPECIALS, fraction=0.2)
    outs, bound = kernel_and_bound_step(op, [("x", x, False)], **attrs)
    assert len(bound) == 1 and np.array_equal(bound[0], outs[0])
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    node = helper.make_node(op, ["x"], ["y"], name="the_op", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [3, 700])],
                       [helper.make_tensor_value_info("y", TensorProto.BOOL, [3, 700])], opset=20)
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])
