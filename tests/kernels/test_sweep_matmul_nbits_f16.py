"""Differential sweep of float16 MatMulNBits (float16 A, scales, bias and output: what ORT's quantizer and
onnxruntime-genai's fp16 int4 models hold) on its bound native step (BoundNBits.half, MatMulNBitsHalf in
kernels/native/matmul_nbits.cc) against the reference model (kernels/ops/matmul_nbits.py).

The reference's float16 path: A widened to float32 (exact), the float32 product (+ the bias widened), rounded once
to float16. The native step makes the same operations around the float32 kernel, so its output is bit for bit the
float32 native kernel's on the widened A, rounded (the kernel's own run: asserted byte-equal). Against the reference
model it is held to the float32 sweep's bound (test_sweep_matmul_nbits.py, the two sides' summation orders) plus
one float16 spacing of the reference's value (each side rounds once, to nearest); NaN exactly where the reference
has NaN, infinities equal. A session equals ORT's CPU EP within float16 tolerance, with no Python step.

Grid: block sizes 16..128 with K around one and two blocks and the 128-element chunk, N around 16 and 32, M of
the GEMV (1), the outer products (2..5) and the BLAS panels (16, 17); zero points and none, a bias and none,
accuracy_level 0 and 4; special values (NaN, +-Inf, -0, float16's largest and subnormal values) in A."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _single_op import run_ort
from _sweep import around, kernel_and_bound_step, node_model, run_kernel
from test_sweep_matmul_nbits import _bound
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.quantization import quantize_matmul_nbits
from npu_ep.tools.bench.ops import python_steps
from tests.npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

F16 = np.float16
EPS16 = np.finfo(F16).eps


def _weights(K, N, bs, symmetric, rng):
    """Weights with float16 scales (the fp16 model's), and so their exact float32 view."""
    w = quantize_matmul_nbits(rng.standard_normal((K, N)).astype(np.float32), bs, symmetric)
    return type(w)(B=w.B, scales=w.scales.astype(F16), zero_points=w.zero_points, K=K, N=N, block_size=bs)


def _inputs(a, w, bias):
    return [("a", a, False), ("B", w.B, True), ("scales", w.scales, True), ("zp", w.zero_points, True),
            ("g_idx", None, True), ("bias", bias, True)]


def _check(a, w, K, N, bs, level, bias=None, cpu=False):
    inputs = _inputs(a, w, bias)
    attrs = dict(domain="com.microsoft", K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
    (got,), bound = kernel_and_bound_step("MatMulNBits", inputs, **attrs)
    label = f"float16 MatMulNBits M={a.shape[0]} K={K} N={N} bs={bs} level={level} zp={w.zero_points is not None}"
    assert len(bound) == 1, f"{label}: no bound native step"
    step = bound[0]
    assert step.dtype == F16 and got.dtype == F16 and step.shape == (a.shape[0], N), label
    assert step.tobytes() == got.tobytes(), f"{label}: the bound step is not the float32 kernel's result rounded"
    (want,) = run_kernel(node_model("MatMulNBits", inputs, **attrs), {"a": a}, "reference")
    w32 = type(w)(B=w.B, scales=w.scales.astype(np.float32), zero_points=w.zero_points, K=K, N=N, block_size=bs)
    limit = _bound(a.astype(np.float32), w32, K, bs, level, None)
    if bias is not None:
        limit = limit + 2 * np.finfo(np.float32).eps * np.abs(bias.astype(np.float32))
    with np.errstate(all="ignore"):
        limit = limit + np.spacing(np.abs(want)).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(step), np.isnan(want), label)
    np.testing.assert_array_equal(np.isposinf(step), np.isposinf(want), label)
    np.testing.assert_array_equal(np.isneginf(step), np.isneginf(want), label)
    finite = np.isfinite(want) & np.isfinite(limit)
    excess = np.abs(step[finite].astype(np.float64) - want[finite]) - limit[finite]
    assert (excess <= 0).all(), f"{label}: {excess.max()} over the bound"
    if cpu:
        (ort,) = run_ort(node_model("MatMulNBits", inputs, **attrs), inputs)
        assert ort.dtype == F16
        np.testing.assert_allclose(step.astype(np.float32), ort.astype(np.float32), rtol=4 * EPS16,
                                   atol=4 * EPS16 * np.abs(ort.astype(np.float32)).max(), err_msg=label + " vs CPU EP")
    return step


BLOCKS = [16, 32, 64, 128]


def _ks(bs: int) -> list[int]:
    return sorted({k for k in (1, *around(bs, 2 * bs), *around(128)) if k >= 1})


GRID = [(m, k, n, bs, level, sym) for bs in BLOCKS for k in _ks(bs) for n in (1, *around(16, 32))
        for m in (1, 2, 5, 16, 17) for level in (0, 4) for sym in (True, False)]


def _sample(cases: list, n: int, seed: int) -> list:
    idx = np.random.default_rng(seed).choice(len(cases), size=n, replace=False)
    return [cases[i] for i in sorted(idx)]


def _grid_case(m, k, n, bs, level, sym):
    rng = np.random.default_rng(abs(hash((m, k, n, bs, level, sym))) % 2**32)
    w = _weights(k, n, bs, sym, rng)
    bias = rng.standard_normal(n).astype(F16) if (m + k) % 2 else None
    _check(rng.standard_normal((m, k)).astype(F16), w, k, n, bs, level, bias)


@pytest.mark.parametrize("case", _sample(GRID, 40, 21))
def test_shapes_around_blocks_and_row_passes(isa, case):
    _grid_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("bs", BLOCKS)
def test_shapes_around_blocks_and_row_passes_wide(isa, bs):
    for case in GRID:
        if case[3] == bs:
            _grid_case(*case)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("bs", BLOCKS)
@pytest.mark.parametrize("m", [1, 5, 17])
def test_special_values_in_a(isa, level, bs, m):
    rng = np.random.default_rng(bs * 10 + m + level)
    k, n = 2 * bs + 16 + 1, 33
    a = rng.standard_normal((m, k)).astype(F16)
    for r, v in zip(range(m), (np.nan, np.inf, -np.inf, -0.0, 65504.0, 6e-8, np.nan)):
        if r % 2 == 0 or m == 1:
            a[r, rng.integers(0, k)] = v
    _check(a, _weights(k, n, bs, False, rng), k, n, bs, level, rng.standard_normal(n).astype(F16))


@pytest.mark.parametrize("case", [(1, 65, 17, 16), (3, 127, 33, 32), (5, 129, 31, 64), (16, 255, 16, 128),
                                  (17, 200, 15, 32)])
def test_against_the_cpu_ep(case):
    m, k, n, bs = case
    rng = np.random.default_rng(k)
    w = _weights(k, n, bs, m % 2 == 0, rng)
    _check((rng.standard_normal((m, k)) * 0.5).astype(F16), w, k, n, bs, 0, rng.standard_normal(n).astype(F16),
           cpu=True)


def test_threads_change_no_bits():
    rng = np.random.default_rng(3)
    k, n = 300, 97
    w = _weights(k, n, 32, False, rng)
    inputs = _inputs(rng.standard_normal((17, k)).astype(F16), w, None)
    m = node_model("MatMulNBits", inputs, domain="com.microsoft", K=k, N=n, bits=4, block_size=32)
    one, three = [], []
    run_kernel(m, {"a": inputs[0][1]}, "native", 1, one)
    run_kernel(m, {"a": inputs[0][1]}, "native", 3, three)
    assert len(one) == len(three) == 1 and one[0].tobytes() == three[0].tobytes()


@pytest.mark.parametrize("m,level", [(1, 4), (7, 0), (20, 4)])
def test_session_runs_natively_and_matches_the_cpu_ep(m, level):
    """A float16 node in an NpuEP session: its bound native step runs (no Python step), within float16 tolerance
    of ORT's CPU EP (other summation orders; at level 4 ORT's int8 A as ours)."""
    rng = np.random.default_rng(m)
    k, n, bs = 256, 96, 32
    w = _weights(k, n, bs, False, rng)
    bias = rng.standard_normal(n).astype(F16)
    node = helper.make_node("MatMulNBits", ["x", "B", "S", "Z", "", "bias"], ["y"], "nbits", domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=bs, accuracy_level=level)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, m, k])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, m, n])],
                       {"B": w.B, "S": w.scales, "Z": w.zero_points, "bias": bias}, opset=21,
                       extra_opsets=[("com.microsoft", 1)])
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so, cpu=False)
    assert assignment(sess) == {"nbits": "NpuEP"}
    x = (rng.standard_normal((1, m, k)) * 0.5).astype(F16)
    want = cpu_run(model, {"x": x})[0].astype(np.float32)
    for _ in range(3):
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == F16 and got.shape == (1, m, n)
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=4 * EPS16,
                                   atol=(4 if level == 0 else 16) * EPS16 * np.abs(want).max())
    assert python_steps(sess) == [], "the float16 node ran its Python kernel instead of the bound native step"
