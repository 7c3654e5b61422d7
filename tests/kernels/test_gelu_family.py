"""The GELU family of encoder models vs ORT's CPU EP, through the kernel and through NpuEP sessions on both targets
(ORT's assignment shows NpuEP ran the node): com.microsoft BiasGelu, QuickGelu (alpha), Gelu, FastGelu (with and
without bias) and ONNX opset-20 Gelu (approximate none/tanh).

Tolerances: float32 rtol=atol=1e-5 (FastGelu/tanh Gelu atol 2e-5: ORT's MLAS tanh), float16 2e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import rand

BOTH = ("npu-ref", "npu-edge")
MS = "com.microsoft"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias_const", [True, False])
def test_bias_gelu(dtype, bias_const):
    x = rand((2, 7, 48), dtype, seed=1, lo=-5, hi=5)
    b = rand((48,), dtype, seed=2, lo=-1, hi=1)
    check_on_ep("BiasGelu", [("x", x, False), ("b", b, bias_const)], [("y", dtype)], domain=MS, targets=BOTH)


@pytest.mark.parametrize("alpha", [None, 1.0, -0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quick_gelu_alpha(alpha, dtype):
    x = rand((3, 5, 40), dtype, seed=3, lo=-12, hi=12)
    x.reshape(-1)[:3] = [0.0, -100.0, 100.0] if dtype == np.float32 else [0.0, -60.0, 60.0]  # sigmoid saturation
    attrs = {} if alpha is None else {"alpha": alpha}
    check_on_ep("QuickGelu", [("x", x, False)], [("y", dtype)], attrs, domain=MS, targets=BOTH)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_onnx_gelu_opset20_on_ep(approximate, dtype):
    x = rand((2, 9, 33), dtype, seed=4, lo=-6, hi=6)
    tol = (1e-5, 2e-5) if dtype == np.float32 else None
    check_on_ep("Gelu", [("x", x, False)], [("y", dtype)], {"approximate": approximate}, opset=20, tol=tol,
                targets=BOTH)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_ms_gelu_on_ep(dtype):
    x = rand((4, 65), dtype, seed=5, lo=-6, hi=6)
    check_on_ep("Gelu", [("x", x, False)], [("y", dtype)], domain=MS, targets=BOTH)


@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_gelu_on_ep(with_bias):
    x = rand((2, 6, 64), np.float32, seed=6, lo=-6, hi=6)
    inputs = [("x", x, False)] + ([("b", rand((64,), np.float32, seed=7, lo=-1, hi=1), True)] if with_bias else [])
    check_on_ep("FastGelu", inputs, [("y", np.float32)], domain=MS, tol=(1e-5, 2e-5), targets=BOTH)
