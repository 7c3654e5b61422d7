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


def test_sessions_of_different_values_get_the_smallest_and_the_host_value_returns_in_creation_order():
    """BLAS has one setting per process: the smallest blas_threads among live sessions applies, and the host's
    value returns after the last release (creation order: the first session's release used to restore the host
    value under the second session, and the second's release left the first's value behind)."""
    with threadpool_limits(limits=2, user_api="blas"):
        a = npu_session(_model(), {"blas_threads": "1"})
        b = npu_session(_model(), {"blas_threads": "3"})
        assert _blas_threads() == 1
        del a
        gc.collect()
        assert _blas_threads() == 3  # b alone: its own value
        np.testing.assert_array_equal(b.run(None, {"x": -np.ones((2, 4), np.float32)})[0], np.zeros((2, 4)))
        del b
        gc.collect()
        assert _blas_threads() == 2


def test_sessions_of_different_values_released_in_reverse_order_give_the_host_value_back():
    with threadpool_limits(limits=2, user_api="blas"):
        a = npu_session(_model(), {"blas_threads": "3"})
        assert _blas_threads() == 3
        b = npu_session(_model(), {"blas_threads": "1"})
        assert _blas_threads() == 1
        del b
        gc.collect()
        assert _blas_threads() == 3
        del a
        gc.collect()
        assert _blas_threads() == 2


def test_a_session_released_by_the_garbage_collector_inside_hold_does_not_deadlock(monkeypatch):
    """A collected session's EP is destroyed by ORT, which calls back into Python to release its BLAS claim, on
    whatever thread the collection ran: here, inside another session's ``hold`` (a fake BLAS controller releases
    the first holder from within ``set_num_threads``, as a collection there did). A plain lock deadlocked the
    full suite this way; the setting must still end as the holders left say."""
    import threading

    from npu_ep.kernels import host_blas

    setting = host_blas._BlasSetting()

    class Controller:
        num_threads = 4
        releases = 1

        def set_num_threads(self, n):
            self.num_threads = n
            if Controller.releases and len(setting._held) == 2:
                Controller.releases = 0
                setting.release(3)  # the collected session's claim, released from inside hold's _apply

    controller = Controller()
    monkeypatch.setattr(host_blas, "_blas_controllers", lambda: (controller,))
    setting.hold(3)
    worker = threading.Thread(target=setting.hold, args=(2,), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "hold deadlocked on a release re-entered from inside it"
    assert setting._held == [2] and controller.num_threads == 2
