"""NpuEP runs BLAS with one thread while its sessions are alive, and gives the host's setting back afterwards."""

from __future__ import annotations

import gc

import numpy as np
from onnx import helper
from npu_testing import F32, make_model, npu_session
from threadpoolctl import threadpool_info, threadpool_limits


def _blas_threads() -> int:
    return min(info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas")


def _model():
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [helper.make_tensor_value_info(
        "x", F32, [2, 4])], [helper.make_tensor_value_info("y", F32, [2, 4])])


def test_one_blas_thread_while_sessions_live_then_the_host_setting_returns():
    with threadpool_limits(limits=2, user_api="blas"):
        first, second = npu_session(_model()), npu_session(_model())
        assert _blas_threads() == 1
        first.run(None, {"x": np.ones((2, 4), np.float32)})
        del first
        gc.collect()
        assert _blas_threads() == 1  # the other session still holds it
        del second
        gc.collect()
        assert _blas_threads() == 2


def test_blas_threads_zero_leaves_the_process_setting_alone():
    with threadpool_limits(limits=2, user_api="blas"):
        sess = npu_session(_model(), {"blas_threads": "0"})
        assert _blas_threads() == 2
        del sess
        gc.collect()


def test_large_matmuls_get_the_host_threads_back_small_ones_do_not(monkeypatch):
    from npu_ep.kernels import host_blas

    seen = []
    real = np.matmul
    monkeypatch.setattr(host_blas.np, "matmul", lambda a, b: seen.append(_blas_threads()) or real(a, b))
    with threadpool_limits(limits=2, user_api="blas"):
        sess = npu_session(_model())
        host_blas.matmul(np.ones((256, 256), np.float32), np.ones((256, 512), np.float32))  # 33.5 M MACs
        host_blas.matmul(np.ones((1, 256), np.float32), np.ones((256, 512), np.float32))
        host_blas.matmul(np.ones((1, 1024), np.float32), np.ones((1024, 1024), np.float32))  # GEMV streaming 4 MiB
        assert seen == [2, 1, 2] and _blas_threads() == 1
        del sess
        gc.collect()
