"""Differential sweep of the element-wise engine's register interpreter (kernels/native/conv_tail_registers.cc):
a program whose instructions it knows (HardSwish, HardSigmoid, SiLU, Relu/Clip, LeakyRelu, exact and tanh GELU,
Pow by 3 and 0.5, Softsign, the saved-value diamonds) runs on a block of vectors in registers, one pass over the
data, where the chunk interpreter makes one pass per instruction. Both compute the same float32 operations, so
every entry point (conv_tail in place, tail_of into a new array, tail_of_f16, tail_of_bias, prelu_rows, sigmoid,
and a conv's fused tail) must give the chunk interpreter's bits (``conv_tail(..., per_instruction=True)``) on every
ISA, with lengths around the 8/16-lane vectors, the 32/64-float blocks, the 2048-float chunk and the 2^16-float
task, and NaN/+-Inf/-0/denormals among the values. Programs without a sigmoid are also the numpy reference's
bits (``conv.tail_reference``)."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import around, with_specials
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.conv import tail_reference
from npu_ep.kernels.tail_program import CODES, CUBE, GELU_ERF, GELU_TANH

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4027)
SIXTH = float(np.float32(1.0 / 6.0))
CHUNK = 2048
SIZES = around(8, 16, 32, 64, 128, CHUNK)
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0e-45, -1.0e-40, 1.17e-38, 3.0e38, -3.0e38, 3.0, -3.0, 4.0, 9.5)

PROGRAMS = {  # name: instructions (CODES name, a, b)
    "hardswish_lcnet": [("save", 0, 0), ("add", 3, 0), ("mul", SIXTH, 0), ("clip", 0, 1), ("mul_saved", 0, 0)],
    "hardswish": [("save", 0, 0), ("mul", SIXTH, 0), ("add", 0.5, 0), ("clip", 0, 1), ("mul_saved", 0, 0)],
    "hardsigmoid": [("mul", 0.2, 0), ("add", 0.5, 0), ("clip", 0, 1)],
    "silu": [("save", 0, 0), ("sigmoid", 0, 0), ("mul_saved", 0, 0)],
    "relu": [("clip", 0, np.inf)],
    "clip_crossed": [("clip", 1, -1), ("clip", -np.inf, -2)],  # lo > hi: not max(lo, min(hi, v))
    "relu6_affine": [("mul", 1.3, 0), ("sub", 0.2, 0), ("clip", 0, 6), ("div", 6, 0)],
    "leaky_relu": [("leaky_relu", 0.1, 0)],
    "gelu_erf": GELU_ERF,
    "gelu_tanh": GELU_TANH,
    "cube": CUBE,
    "pow_half": [("pow_half", 0, 0)],
    "softsign": [("softsign", 0, 0)],
    "reversed_ops": [("save", 0, 0), ("rsub", 2, 0), ("rdiv", 3, 0), ("abs", 0, 0), ("div_saved", 0, 0),
                     ("add_saved", 0, 0)],
    "exp_fallback": [("save", 0, 0), ("exp", 0, 0), ("mul_saved", 0, 0)],  # the chunk interpreter's alone
}


@pytest.fixture(params=host_isas(top="avx512"))
def isa(request):
    yield from cap_isa(request.param)


def _arrays(program) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([CODES[name] for name, *_ in program], np.int32),
            np.array([[a, b] for _, a, b in program], np.float32).reshape(-1, 2))


def _values(n: int, scale: float = 5.0) -> np.ndarray:
    return with_specials((RNG.standard_normal(n) * scale).astype(np.float32), RNG, values=SPECIALS)


def _per_instruction(x: np.ndarray, codes, consts) -> np.ndarray:
    y = np.array(x, np.float32, copy=True)
    runtime.native_module().conv_tail(y, codes, consts, 1, per_instruction=True)
    return y


def _assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same bits, but for NaN payloads (NaN positions must agree)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN positions differ"
    bits = got.view(np.uint32 if got.dtype == np.float32 else np.uint16)
    wbits = want.view(bits.dtype)
    bad = np.flatnonzero((bits != wbits) & ~nan.reshape(bits.shape))
    assert bad.size == 0, f"{what}: bits differ at {bad[:5]}: {got.reshape(-1)[bad[:3]]} vs {want.reshape(-1)[bad[:3]]}"


@pytest.mark.parametrize("name", PROGRAMS)
def test_registers_give_the_chunk_interpreters_bits(isa, name):
    nat = runtime.native_module()
    codes, consts = _arrays(PROGRAMS[name])
    for n in SIZES + [(1 << 16) + 33]:
        x = _values(n)
        want = _per_instruction(x, codes, consts)
        in_place = x.copy()
        nat.conv_tail(in_place, codes, consts, 1)
        _assert_bits(in_place, want, f"{name} conv_tail n={n} {isa}")
        _assert_bits(nat.tail_of(x, codes, consts, 2), want, f"{name} tail_of n={n} {isa}")
        out = np.empty_like(x)
        nat.tail_of(x, codes, consts, 1, out)
        _assert_bits(out, want, f"{name} tail_of(out) n={n} {isa}")
        if "sigmoid" not in [ins[0] for ins in PROGRAMS[name]] and name != "exp_fallback":
            ref = tail_reference(x.reshape(1, 1, -1).copy(), codes, consts).reshape(-1)
            _assert_bits(in_place, ref, f"{name} vs the numpy reference n={n} {isa}")


def test_which_programs_run_in_registers(isa):
    """The sweep above compares two paths only if the register one runs: every program but the exp one takes it on
    AVX2 and AVX-512, none on the scalar path (the chunk interpreter is the scalar fallback, aarch64's too)."""
    nat = runtime.native_module()
    for name, program in PROGRAMS.items():
        want = isa != "scalar" and name != "exp_fallback"
        assert nat.tail_in_registers(_arrays(program)[0]) == want, f"{name} at {isa}"


@pytest.mark.parametrize("name", ["hardswish", "gelu_erf", "silu"])
def test_float16_and_bias_entry_points(isa, name):
    nat = runtime.native_module()
    codes, consts = _arrays(PROGRAMS[name])
    for n in (37, 2048 + 5, 3 * 2048 + 64):
        x = _values(n, 3.0)
        with np.errstate(over="ignore"):  # +-3e38 among the specials: +-inf in float16
            half = x.astype(np.float16)
        want16 = _per_instruction(half.astype(np.float32), codes, consts).astype(np.float16)
        _assert_bits(nat.tail_of_f16(half, codes, consts, 1), want16, f"{name} tail_of_f16 n={n} {isa}")
        d = 37 if n % 37 == 0 else n
        bias = (RNG.standard_normal(d) * 2).astype(np.float32)
        xb = x.reshape(-1, d)
        want = _per_instruction(xb + bias, codes, consts)
        _assert_bits(nat.tail_of_bias(xb, bias, codes, consts, 1), want, f"{name} tail_of_bias n={n} {isa}")


def test_prelu_rows_and_sigmoid(isa):
    nat = runtime.native_module()
    x = _values(3 * 5 * 67).reshape(3, 5, 67)
    slope = np.array([0.25, -0.5, 2.0, 0.0, 1e-3], np.float32)
    want = np.concatenate([_per_instruction(row, *_arrays([("leaky_relu", float(slope[r % 5]), 0)]))
                           for r, row in enumerate(x.reshape(-1, 67))]).reshape(x.shape)
    _assert_bits(nat.prelu_rows(x, slope, 67, 1), want, f"prelu_rows {isa}")
    for n in (5, 64, 65, 2049):
        v = _values(n)
        _assert_bits(nat.sigmoid(v, 1), _per_instruction(v, *_arrays([("sigmoid", 0, 0)])), f"sigmoid n={n} {isa}")


@pytest.mark.parametrize("kind", ["pointwise", "depthwise"])
def test_conv_tails_in_registers(isa, kind):
    """A conv's fused tail (ApplyTail / ApplyChannelTail on each finished output run) gives the conv's output with
    the chunk interpreter's tail applied."""
    nat = runtime.native_module()
    from npu_ep.kernels import host_blas
    codes, consts = _arrays(PROGRAMS["hardswish_lcnet"])
    c, m, h = 6, 6, 13
    x = RNG.standard_normal((1, c, h, h)).astype(np.float32) * 3
    if kind == "pointwise":
        w = RNG.standard_normal((1, c, m)).astype(np.float32)
        b = RNG.standard_normal(m).astype(np.float32)
        args = (x, w, b, [m, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0], host_blas.sgemm_address(), 1)
        plain, fused = nat.conv_dense(*args), nat.conv_dense(*args, codes, consts)
    else:
        w = RNG.standard_normal((c, 9, 1)).astype(np.float32)
        b = RNG.standard_normal(c).astype(np.float32)
        args = (x, w, b, [c, c, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1], 1)
        plain, fused = nat.conv_depthwise(*args), nat.conv_depthwise(*args, codes, consts)
    _assert_bits(fused, _per_instruction(plain, codes, consts), f"{kind} conv + hardswish {isa}")


SPECIALS_F16 = (np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0e-8, -3.0e-5, 6.1e-5, 65504.0, -65504.0, 3.0, -4.0)


def _bias_want(x: np.ndarray, bias: np.ndarray, codes, consts) -> np.ndarray:
    """x + bias in float32 (float16 widened first), the chunk interpreter, float16 rounded once at the end."""
    s = x.astype(np.float32) + bias.astype(np.float32)
    return _per_instruction(s.reshape(-1), codes, consts).reshape(x.shape).astype(x.dtype)


def _bias_rows(d: int) -> list[int]:
    """Row counts whose totals reach around the 64-float block, the 2048-float chunk, GELU's two-task threshold
    (~29k elements) and the 2^16-float task."""
    return sorted({1, 2, 3} | {max(1, -(-n // d)) for n in (64, CHUNK + 1, 29127, 49152, (1 << 16) + 77)})



@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["gelu_erf", "hardswish", "exp_fallback"])
def test_bias_entry_point_sweep(isa, name, dtype):
    """tail_of_bias: the bias added in the register interpreter's loads (float32 straight from x into y, float16 on
    the widened chunk), or before the chunk interpreter (exp): the bits of x + bias then the program, for bias rows
    shorter and longer than the 2048-float chunk, totals across block, chunk and task boundaries, special values in
    x and in the bias, into a new array, a given one and x itself; one and two threads the same bits."""
    nat = runtime.native_module()
    codes, consts = _arrays(PROGRAMS[name])
    specials = SPECIALS if dtype == np.float32 else SPECIALS_F16
    for d in (1, 15, 16, 17, 64, 384, CHUNK + 3):
        bias = with_specials((RNG.standard_normal(d) * 2).astype(dtype), RNG, values=specials[:4], fraction=0.01)
        for rows in _bias_rows(d):
            x = with_specials((RNG.standard_normal((rows, d)) * 3).astype(dtype), RNG, values=specials, fraction=0.01)
            want = _bias_want(x, bias, codes, consts)
            what = f"{name} {np.dtype(dtype).name} d={d} rows={rows} {isa}"
            _assert_bits(nat.tail_of_bias(x, bias, codes, consts, 1), want, what)
            out = np.empty_like(x)
            nat.tail_of_bias(x, bias, codes, consts, 2, out)
            _assert_bits(out, want, what + " threads=2 out")
            in_place = x.copy()
            nat.tail_of_bias(in_place, bias, codes, consts, 2, in_place)
            _assert_bits(in_place, want, what + " in place")

