"""Differential sweep of the float npu::NormMatMul native call (kernels/native/norm_matmul.cc's RMS-norm
prologue and SwiGLU epilogue around the packed GEMM, float_matmul.cc's norm_matmul_float), issue 38, against the
same fused node on the reference model (numpy's prologue and matmul).

norm_matmul.cc's blocks: rows in tasks of 16 (two threads), the prologue's row loops scalar, SwiGLU 16 lanes at a
time on AVX-512 (the tail masked); the product's blocks are the packed GEMM's (test_sweep_float_matmul.py). Widths
cross 16 and 32 (K and the SwiGLU half), rows cross 16. Tolerances: the Skip* sum output is the prologue's adds,
bit for bit; the products sum in another order than numpy's BLAS, so they are compared within 1e-5 of the output's
scale as test_native_norm_matmul_float.py justifies (K * 2^-24 relative of the sum of magnitudes, 1e-4 at
K = 2048, far less at these widths), and SwiGLU's lane exp (2 ulp) is inside that. Special rows: all zeros (the
norm's eps), huge values (their squares overflow to +Inf: the row becomes 0, as the reference's), NaN."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from _sweep import native_calls
from test_native_norm_matmul import _model as _norm_model
from test_native_norm_matmul import _prepared
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.matmul import PACKED_ISAS
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from tests.npu_testing import F32

_NAT = runtime.native_module()
pytestmark = pytest.mark.skipif(_NAT is None or _NAT.isa() not in PACKED_ISAS,
                                reason="the float NormMatMul's native call runs on AVX-512 hosts")

RNG = np.random.default_rng(3808)
REF = Target.load("npu-ref")
WIDTHS = [15, 16, 17, 31, 32, 33]  # K: the prologue's rows; the SwiGLU half: its 16 lanes
ROWS = [1, 15, 16, 17, 33]         # tasks of 16 rows


def _model(d: int, rows: int, n: int, *, skip: bool, swiglu: bool):
    """norm (Skip* with its sum output, or Simplified) -> float MatMul(s) of n columns ({gate, up} + SwiGLU)."""
    return _norm_model(d, rows, skip=skip, mlp="swiglu" if swiglu else "single", level=None, n=n)


def _run_both(model, inputs):
    p = _prepared(model)
    kernel = kernel_for("npu", "NormMatMul")
    with np.errstate(all="ignore"):
        with native_calls() as calls:
            native = kernel.run(p, inputs)
        assert "norm_matmul_float" in calls, calls  # the one native call: prologue, packed GEMM, SwiGLU
        runtime.configure([p], "reference", 2)
        return native, kernel.run(p, inputs)


def _check(d, rows, n, skip, swiglu, special=False):
    model = _model(d, rows, n, skip=skip, swiglu=swiglu)
    inputs = [RNG.standard_normal((1, rows, d)).astype(np.float32) for _ in model.graph.input]
    if special:
        x = inputs[0]
        x[0, 0] = 0.0                       # a zero row (with a zero skip below): rms = sqrt(eps)
        if rows > 1:
            x[0, 1] = 3e30                  # squares overflow: rms = +Inf, the normalized row 0
        if rows > 2:
            x[0, 2, d // 2] = np.nan        # a NaN row
        if skip:
            inputs[1][0, 0] = 0.0
    native, want = _run_both(model, inputs)
    what = f"d={d} rows={rows} n={n} skip={skip} swiglu={swiglu}"
    assert len(native) == len(want), what
    if skip:
        np.testing.assert_array_equal(native[-1], want[-1], err_msg=f"{what}: the Skip* sum")
    for got, ref in zip(native[:-1] if skip else native, want[:-1] if skip else want):
        assert got.shape == ref.shape and got.dtype == ref.dtype == np.float32, what
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=what)
        finite = np.isfinite(ref)
        scale = float(np.abs(ref[finite]).max()) if finite.any() else 1.0
        np.testing.assert_allclose(got[finite], ref[finite], rtol=0, atol=1e-5 * scale, err_msg=what)


@pytest.mark.parametrize("skip", [False, True])
def test_widths_and_rows(skip):
    for d in WIDTHS:
        for rows in (1, 17):
            _check(d, rows, 33, skip, swiglu=False)
    for rows in ROWS:
        _check(32, rows, 17, skip, swiglu=True)


@pytest.mark.parametrize("skip", [False, True])
def test_swiglu_halves(skip):
    for half in (1, 15, 16, 17, 33):
        _check(24, 3, half, skip, swiglu=True)


@pytest.mark.parametrize("skip", [False, True])
def test_special_rows(skip):
    for d in (16, 33):
        _check(d, 4, 17, skip, swiglu=True, special=True)
        _check(d, 4, 32, skip, swiglu=False, special=True)


@pytest.mark.slow
@pytest.mark.parametrize("skip", [False, True])
def test_wide_grid(skip):
    for d in WIDTHS + [255, 256, 257]:
        for rows in ROWS:
            for half in (15, 16, 17, 32, 33):
                _check(d, rows, half, skip, swiglu=True)


def _group_model(rows: int, d: int, half: int):
    """{gate, up} MatMuls on one input + SiLU(gate) * up, without a norm: the compiler's MatMulGroup (SwiGLU)."""
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"], "gate"),
             helper.make_node("MatMul", ["x", "wu"], ["u"], "up"), helper.make_node("Sigmoid", ["g"], ["sg"], "sig"),
             helper.make_node("Mul", ["g", "sg"], ["si"], "m1"), helper.make_node("Mul", ["si", "u"], ["y"], "m2")]
    inits = {w: (RNG.standard_normal((d, half)) / np.sqrt(d)).astype(np.float32) for w in ("wg", "wu")}
    graph = helper.make_graph(nodes, "group", [helper.make_tensor_value_info("x", F32, [1, rows, d])],
                              [helper.make_tensor_value_info("y", F32, [1, rows, half])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_group_swiglu_halves_with_special_values():
    """A MatMulGroup's SwiGLU (norm_matmul.cc's SwiGlu after the packed GEMM, 16 lanes and a masked tail): within
    the products' tolerance of the reference; NaN and +-Inf in x give NaN / Inf in the same places."""
    for rows in (1, 17):
        for half in (1, 15, 16, 17, 33):
            model = _group_model(rows, 40, half)
            (node,) = fuse_partition(nodes_from_model(model), REF)
            assert node.op_type == "MatMulGroup"
            kernel = kernel_for(*node.key)
            x = RNG.standard_normal((1, rows, 40)).astype(np.float32)
            x[0, 0, :3] = [np.nan, np.inf, -np.inf]
            outs = {}
            for kernels in ("native", "reference"):
                p = kernel.prepare(node, REF)
                runtime.configure([p], kernels, 2)
                with native_calls() as calls, np.errstate(all="ignore"):
                    outs[kernels] = kernel.run(p, [x])[0]
                if kernels == "native":
                    assert "float_matmul_packed" in calls, calls
            got, want = outs["native"], outs["reference"]
            finite = np.isfinite(want)
            np.testing.assert_array_equal(got[~finite], want[~finite])
            scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
            np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=1e-5 * scale)
