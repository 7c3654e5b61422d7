"""Failures inside NpuEP surface as ORT errors naming the node; concurrent runs on one session agree."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, make_model, npu_session

from npu_ep.kernels import registry

RNG = np.random.default_rng(1)


def small_model():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="the_matmul"),
             helper.make_node("Relu", ["h"], ["r"], name="the_relu"),
             helper.make_node("Tanh", ["r"], ["y"], name="the_tanh")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                      [helper.make_tensor_value_info("y", F32, ["N", 8])],
                      {"W": RNG.standard_normal((16, 8)).astype(np.float32)})


def _patched(monkeypatch, op: str, **fields):
    import dataclasses

    registry._load_ops()
    key = ("", op)
    monkeypatch.setitem(registry.KERNELS, key, dataclasses.replace(registry.KERNELS[key], **fields))


def test_exception_in_compute_names_the_node(monkeypatch):
    def boom(p, inputs):
        raise ValueError("injected kernel failure")

    _patched(monkeypatch, "Tanh", run=boom)  # (Relu may be fused into the MatMul's epilogue)
    sess = npu_session(small_model())
    with pytest.raises(Exception) as info:
        sess.run(None, {"x": np.ones((2, 16), np.float32)})
    msg = str(info.value)
    assert "node 'the_tanh' (Tanh)" in msg and "injected kernel failure" in msg and "float32[2, 8]" in msg


def _failing_run_message(monkeypatch, provider_options=None) -> str:
    def boom(p, inputs):
        raise ValueError("injected kernel failure")

    _patched(monkeypatch, "Tanh", run=boom)
    sess = npu_session(small_model(), provider_options)
    with pytest.raises(Exception) as info:
        sess.run(None, {"x": np.ones((2, 16), np.float32)})
    return str(info.value)


def test_error_texts_carry_no_python_frames(monkeypatch):
    """pybind11's text ended every error with an 'At:' block: NpuEP's internal paths and this script's lines."""
    msg = _failing_run_message(monkeypatch)
    assert "injected kernel failure" in msg and "node 'the_tanh' (Tanh)" in msg, msg
    assert "At:" not in msg and "Traceback" not in msg and __file__ not in msg, msg
    assert "/ep/" not in msg and "/kernels/" not in msg, msg


@pytest.fixture
def restore_log_level():
    """log_level sets the process-wide npu_ep logger: give the next tests the level they had."""
    from npu_ep.log import FALLBACK, logger

    levels = logger.level, FALLBACK.level
    yield
    logger.setLevel(levels[0])  # setLevel, not the attribute: it also clears the logger's isEnabledFor cache
    FALLBACK.setLevel(levels[1])


def test_log_level_debug_keeps_the_traceback_in_error_texts(monkeypatch, restore_log_level):
    msg = _failing_run_message(monkeypatch, {"log_level": "debug"})
    assert "Traceback (most recent call last)" in msg and "injected kernel failure" in msg, msg
    assert "program.py" in msg, msg  # NpuEP's own frames, for whoever debugs it


def test_exception_in_compile_names_the_node(monkeypatch):
    def boom(node, target):
        raise RuntimeError("injected compile failure")

    _patched(monkeypatch, "Tanh", prepare=boom)
    with pytest.raises(Exception) as info:
        npu_session(small_model())
    msg = str(info.value)
    assert "node 'the_tanh' (Tanh)" in msg and "injected compile failure" in msg
    assert "At:" not in msg and __file__ not in msg, msg


def test_crashing_capability_check_declines_the_node_loudly(monkeypatch, caplog):
    def boom(node, target):
        raise KeyError("bad attribute table")

    _patched(monkeypatch, "Tanh", check=boom)
    sess = npu_session(small_model())
    where = assignment(sess)
    assert where["the_tanh"] == "CPUExecutionProvider" and where["the_matmul"] == "NpuEP"
    assert "capability check failed" in "\n".join(r.getMessage() for r in caplog.records if r.name == "npu_ep")


def test_wrong_dtype_from_a_kernel_is_an_error_not_a_silent_cast(monkeypatch):
    _patched(monkeypatch, "Tanh", run=lambda p, inputs: [np.tanh(inputs[0]).astype(np.float64)])
    sess = npu_session(small_model())
    with pytest.raises(Exception, match="float64"):
        sess.run(None, {"x": np.ones((2, 16), np.float32)})


def test_eight_threads_times_200_runs_give_identical_results():
    sess = npu_session(small_model())
    inputs = [RNG.standard_normal((3, 16)).astype(np.float32) for _ in range(8)]
    expected = [sess.run(None, {"x": x})[0] for x in inputs]
    failures: list[str] = []

    def worker(i: int) -> None:
        for _ in range(200):
            got = sess.run(None, {"x": inputs[i]})[0]
            if not np.array_equal(got, expected[i]):
                failures.append(f"thread {i}: result differs")
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert set(assignment(sess).values()) == {"NpuEP"}
