"""BatchNormalization (inference), InstanceNormalization and GroupNormalization (opsets 18 and 21) vs ORT CPU,
through the kernel and NpuEP sessions on both targets. float32 rtol/atol 1e-4 (BatchNorm folded to x * a + b
rounds differently from ORT's (x - mean) * inv_std * scale + bias), float16 2e-3."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep, declined_by
from _vector_ortref import rand

BOTH = ("npu-ref", "npu-edge")


def _tol(dtype):
    return (1e-4, 1e-4) if dtype == np.float32 else (3e-3, 3e-3)


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (3, 8), (1, 3, 17), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batch_norm_inference_folded(shape, dtype, eps):
    c = shape[1]
    params = [("scale", rand((c,), dtype, seed=2)), ("bias", rand((c,), dtype, seed=3)),
              ("mean", rand((c,), dtype, seed=4)), ("var", rand((c,), dtype, seed=5, lo=0.1, hi=2.0))]
    inputs = [("x", rand(shape, dtype, seed=1), False)] + [(n, v, True) for n, v in params]
    check_on_ep("BatchNormalization", inputs, [("y", dtype)], {"epsilon": eps}, tol=_tol(dtype), targets=BOTH)


def test_batch_norm_runtime_parameters():
    c = 3
    inputs = [("x", rand((2, c, 4, 4), np.float32, seed=1), False), ("scale", rand((c,), seed=2), False),
              ("bias", rand((c,), seed=3), False), ("mean", rand((c,), seed=4), False),
              ("var", rand((c,), seed=5, lo=0.1, hi=2.0), False)]
    check_on_ep("BatchNormalization", inputs, [("y", np.float32)], tol=_tol(np.float32))


def test_batch_norm_training_mode_declined():
    c = 3
    inputs = [("x", rand((2, c, 4), np.float32), False)] + [
        (n, rand((c,), np.float32, seed=i, lo=0.1), True) for i, n in enumerate(("s", "b", "m", "v"))]
    reason = declined_by("BatchNormalization", inputs, [("y", np.float32)], {"training_mode": 1}, target="npu-ref")
    assert reason is not None and "training mode" in reason


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (1, 3, 17), (2, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_instance_norm(shape, dtype):
    c = shape[1]
    inputs = [("x", rand(shape, dtype, seed=1), False), ("scale", rand((c,), dtype, seed=2), True),
              ("bias", rand((c,), dtype, seed=3), True)]
    check_on_ep("InstanceNormalization", inputs, [("y", dtype)], {"epsilon": 1e-4}, tol=_tol(dtype), targets=BOTH)


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(2, 8, 5, 6), (1, 8, 33)])
def test_group_norm_opset21_per_channel(groups, shape):
    c = shape[1]
    inputs = [("x", rand(shape, np.float32, seed=1), False), ("scale", rand((c,), seed=2), True),
              ("bias", rand((c,), seed=3), True)]
    check_on_ep("GroupNormalization", inputs, [("y", np.float32)], {"num_groups": groups, "epsilon": 1e-5},
                tol=_tol(np.float32), opset=21, targets=BOTH)


def test_group_norm_opset18_per_group():
    inputs = [("x", rand((2, 6, 4, 4), np.float32, seed=1), False), ("scale", rand((3,), seed=2), True),
              ("bias", rand((3,), seed=3), True)]
    check_on_ep("GroupNormalization", inputs, [("y", np.float32)], {"num_groups": 3}, tol=_tol(np.float32), opset=18)
