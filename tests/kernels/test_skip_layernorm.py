"""com.microsoft SkipLayerNormalization vs ORT's CPU EP, through the kernel and NpuEP sessions on both targets:
with/without bias and beta, skip broadcast over the batch, every optional output (mean, inv_std_var, the
input+skip+bias sum), epsilon, float16. Tolerances: float32 rtol=atol=1e-5, float16 2e-3 (``_vector_ortref.TOL``).
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import rand

BOTH = ("npu-ref", "npu-edge")
MS = "com.microsoft"


def _inputs(dtype, beta: bool, bias: bool, skip_shape=None, runtime_params=False):
    x = rand((2, 5, 64), dtype, seed=1)
    skip = rand(skip_shape or x.shape, dtype, seed=2)
    return [("x", x, False), ("skip", skip, False), ("gamma", rand((64,), dtype, seed=3, lo=0.5, hi=1.5),
                                                     not runtime_params),
            ("beta", rand((64,), dtype, seed=4, lo=-1, hi=1), True) if beta else None,
            ("bias", rand((64,), dtype, seed=5, lo=-1, hi=1), True) if bias else None]


@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layernorm_beta_bias(beta, bias, dtype):
    check_on_ep("SkipLayerNormalization", _inputs(dtype, beta, bias), [("y", dtype)], {"epsilon": 1e-5},
                domain=MS, targets=BOTH)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layernorm_all_outputs(dtype):
    outs = [("y", dtype), ("mean", np.float32), ("inv_std", np.float32), ("sum", dtype)]
    check_on_ep("SkipLayerNormalization", _inputs(dtype, True, True), outs, {"epsilon": 1e-3}, domain=MS,
                targets=BOTH)


def test_skip_layernorm_only_sum_output():
    outs = [("y", np.float32), ("", None), ("", None), ("sum", np.float32)]
    check_on_ep("SkipLayerNormalization", _inputs(np.float32, False, True), outs, domain=MS, targets=BOTH)


@pytest.mark.parametrize("skip_shape", [(5, 64), (1, 5, 64)])
def test_skip_broadcast_over_batch(skip_shape):
    check_on_ep("SkipLayerNormalization", _inputs(np.float32, True, False, skip_shape), [("y", np.float32)],
                domain=MS, targets=BOTH)


def test_skip_layernorm_runtime_gamma_default_epsilon():
    check_on_ep("SkipLayerNormalization", _inputs(np.float32, False, False, runtime_params=True),
                [("y", np.float32)], domain=MS)
