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
