"""Normalization kernels vs ORT CPU: LayerNormalization, RMSNormalization (opset 23), SimplifiedLayerNormalization
(default domain, as ORT registers it) and com.microsoft SkipSimplifiedLayerNormalization with optional outputs.

Tolerances: float32 rtol=atol=1e-5 (statistics in fp32, as ORT), float16 2e-3 (one fp16 rounding).
The RMS kernels have a scalar fast path for a single row (a decode step); it must agree bit for bit with the
multi-row path, and a second call (constants converted once, kept in ``Prepared.kernel_cache``) with the first.
"""

from __future__ import annotations

import numpy as np
import pytest

from _vector_ortref import check_against_ort, make_model, rand, run_npu
from npu_ep.kernels.registry import kernel_for

F32_TOL = (1e-5, 2e-5)


def _tol(dtype):
    return F32_TOL if dtype == np.float32 else (4e-3, 4e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_with_statistics(dtype, axis, with_bias):
    x = rand((2, 5, 48), dtype, seed=1, lo=-4, hi=4)
    norm_shape = x.shape[axis:]
    inputs = [("x", x, False), ("scale", rand(norm_shape, dtype, seed=2), True)]
    if with_bias:
        inputs.append(("bias", rand(norm_shape, dtype, seed=3), True))
    check_against_ort("LayerNormalization", inputs, [("y", dtype), ("mean", np.float32), ("inv_std", np.float32)],
                      {"axis": axis, "epsilon": 1e-5}, opset=17, tol=_tol(dtype))


def test_layer_norm_runtime_scale_odd_width():
    x = rand((7, 33), np.float32, seed=4)
    check_against_ort("LayerNormalization", [("x", x, False), ("scale", rand((33,), np.float32, seed=5), False)],
                      [("y", np.float32)], opset=17, tol=F32_TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axis", [-1, 2])
def test_rms_normalization_opset23(dtype, axis):
    x = rand((2, 3, 4, 32), dtype, seed=6)
    check_against_ort("RMSNormalization", [("x", x, False), ("scale", rand(x.shape[axis:], dtype, seed=7), True)],
                      [("y", dtype)], {"axis": axis, "epsilon": 1e-6}, opset=23, tol=_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_simplified_layer_norm_default_domain(dtype):
    x = rand((2, 9, 64), dtype, seed=8)
    check_against_ort("SimplifiedLayerNormalization", [("x", x, False), ("g", rand((64,), dtype, seed=9), True)],
                      [("y", dtype), ("inv_std", np.float32)], {"epsilon": 1e-6}, opset=17, tol=_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm_all_outputs(dtype, with_bias):
    x = rand((2, 7, 64), dtype, seed=10)
    inputs = [("x", x, False), ("skip", rand((2, 7, 64), dtype, seed=11), False),
              ("gamma", rand((64,), dtype, seed=12), True)]
    if with_bias:
        inputs.append(("bias", rand((64,), dtype, seed=13), True))
    check_against_ort("SkipSimplifiedLayerNormalization", inputs,
                      [("y", dtype), ("mean", np.float32), ("inv_std", np.float32), ("sum", dtype)],
                      {"epsilon": 1e-6}, domain="com.microsoft", tol=_tol(dtype))


def test_skip_simplified_layer_norm_only_sum_output_and_2d_skip():
    x = rand((3, 5, 32), np.float32, seed=14)
    check_against_ort("SkipSimplifiedLayerNormalization",
                      [("x", x, False), ("skip", rand((5, 32), np.float32, seed=15), False),
                       ("gamma", rand((32,), np.float32, seed=16), True)],
                      [("y", np.float32), ("", np.float32), ("", np.float32), ("sum", np.float32)],
                      domain="com.microsoft", tol=F32_TOL)


def _rows_one_by_one(op, inputs, outputs, attrs=None, domain=""):
    """Run the kernel on the whole batch, then row by row on the same (kernel_cache-warm) Prepared: every output of each
    single-row call must equal that row of the batch call exactly."""
    model = make_model(op, inputs, outputs, attrs, domain=domain, opset=17)
    feeds = {s[0]: s[1] for s in inputs if not s[2]}
    batch, prepared, _ = run_npu(model, feeds)
    kernel = kernel_for(domain, op)
    names = [s[0] for s in inputs]
    for r in range(inputs[0][1].shape[1]):
        row = [feeds[n][:, r:r + 1] if n in feeds else None for n in names]
        got = kernel.run(prepared, row)
        for i, (g, b) in enumerate(zip(got, batch)):
            np.testing.assert_array_equal(g, b[:, r:r + 1], err_msg=f"{op} output {i} row {r}")
    assert prepared.kernel_cache, "constants and per-rank setup are kept in the kernel_cache"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_simplified_layer_norm_single_row_path_matches_batch(dtype):
    x = rand((1, 6, 256), dtype, seed=20)
    _rows_one_by_one("SimplifiedLayerNormalization", [("x", x, False), ("g", rand((256,), dtype, seed=21), True)],
                     [("y", dtype), ("inv_std", np.float32)], {"epsilon": 1e-6})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_simplified_layer_norm_single_row_path_matches_batch(dtype):
    x = rand((1, 5, 128), dtype, seed=22)
    _rows_one_by_one("SkipSimplifiedLayerNormalization",
                     [("x", x, False), ("skip", rand(x.shape, dtype, seed=23), False),
                      ("gamma", rand((128,), dtype, seed=24), True), ("bias", rand((128,), dtype, seed=25), True)],
                     [("y", dtype), ("mean", np.float32), ("inv_std", np.float32), ("sum", dtype)],
                     {"epsilon": 1e-6}, domain="com.microsoft")


@pytest.mark.parametrize("rows", [1, 3])
def test_rms_norm_zero_input_without_epsilon_is_nan_like_numpy(rows):
    """rsqrt(0) is inf, so 0 * inf = nan: the scalar path must not raise where numpy would not."""
    x = np.zeros((1, rows, 16), np.float32)
    model = make_model("SimplifiedLayerNormalization", [("x", x, False), ("g", np.ones(16, np.float32), True)],
                       [("y", np.float32), ("inv_std", np.float32)], {"epsilon": 0.0}, opset=17)
    with np.errstate(invalid="ignore", divide="ignore"):
        (y, inv), _, _ = run_npu(model, {"x": x})
    assert np.isinf(inv).all() and np.isnan(y).all()


@pytest.mark.parametrize("rows", [1, 4])
def test_layer_norm_multi_axis_single_and_many_rows(rows):
    x = rand((rows, 3, 40), np.float32, seed=26)
    check_against_ort("LayerNormalization", [("x", x, False), ("scale", rand((3, 40), np.float32, seed=27), True)],
                      [("y", np.float32), ("mean", np.float32), ("inv_std", np.float32)], {"axis": 1}, opset=17,
                      tol=F32_TOL)


@pytest.mark.parametrize("rows", [1, 4])
def test_rms_normalization_multi_axis_single_and_many_rows(rows):
    x = rand((rows, 3, 40), np.float32, seed=28)
    check_against_ort("RMSNormalization", [("x", x, False), ("scale", rand((3, 40), np.float32, seed=29), True)],
                      [("y", np.float32)], {"axis": 1, "epsilon": 1e-6}, opset=23, tol=F32_TOL)


@pytest.mark.parametrize("eps", [1e-6, 0.0, -1.0])
def test_skip_rms_single_row_scalar_tail_has_the_array_paths_bits(eps):
    """skip_rms's one-row path does the tail (/ D, + eps, sqrt) on a float32 scalar; every row alone must give the
    bits of the many-row array path, also for tiny, huge, NaN and Inf values and an epsilon that makes it NaN."""
    from npu_ep.kernels.ops.norm import skip_rms

    rng = np.random.default_rng(26)
    for d in (1, 7, 256):
        rows = np.concatenate([(rng.standard_normal((8, d)) * scale).astype(np.float32)
                               for scale in (1e-30, 1e-20, 1e-3, 1.0, 1e17, 1e19, 1e30)])
        rows[0, 0], rows[1, -1], rows[2, 0] = np.nan, np.inf, -np.inf
        with np.errstate(all="ignore"):
            many = skip_rms(rows[None], eps)
            for i in range(len(rows)):
                one = skip_rms(rows[None, i:i + 1], eps)
                assert one.shape == (1, 1, 1) and one.dtype == np.float32
                assert one.view(np.int32)[0, 0, 0] == many.view(np.int32)[0, i, 0], (d, i, one, many[0, i])
