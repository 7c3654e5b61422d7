"""Determinism: the same inputs give the same bits whatever the host thread count and however busy the machine.

A large matmul may run as two halves on two host threads (kernels/host_blas.py). The halves used to be taken
over rows only when the helper thread was free, so a result depended on the moment: a product whose half held one
row ran as a GEMV and the whole one as a GEMM (different bits); with host_threads=2 an MLP's outputs differed in
the last bits between runs under contention. The chunks are now fixed by the shape alone.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, make_model, npu_session

from npu_ep.kernels import host_blas

RNG = np.random.default_rng(14)
K, HIDDEN = 256, 768


def _mlp(rows: int):
    w1 = (RNG.standard_normal((K, HIDDEN)) * 0.05).astype(np.float32)
    w2 = (RNG.standard_normal((HIDDEN, K)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="down")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [rows, K])],
                      [helper.make_tensor_value_info("y", F32, [rows, K])], {"w1": w1, "w2": w2})


def _busy_helper(stop: threading.Event) -> None:
    """Contention: keep taking the shared helper thread with split products of our own."""
    a = RNG.standard_normal((64, K)).astype(np.float32)
    b = RNG.standard_normal((K, HIDDEN)).astype(np.float32)
    while not stop.is_set():
        host_blas.matmul(a, b)


@pytest.mark.parametrize("rows", [2, 3, 64])  # 2 and 3: a row half of one row used to run as a GEMV
def test_same_bits_with_host_threads_1_and_2_under_contention(monkeypatch, rows):
    monkeypatch.setattr(host_blas, "SPLIT_MACS", 1 << 12)  # split these small products too (the mechanism)
    model = _mlp(rows)
    x = RNG.standard_normal((rows, K)).astype(np.float32)
    sessions = [npu_session(model, {"host_threads": n}) for n in ("1", "2", "2")]
    for s in sessions:
        assert set(assignment(s).values()) == {"NpuEP"}
    want = sessions[0].run(None, {"x": x})[0]
    stop = threading.Event()
    hogs = [threading.Thread(target=_busy_helper, args=(stop,)) for _ in range(2)]
    differing: list[str] = []

    def runner(i: int) -> None:
        for r in range(150):
            got = sessions[i].run(None, {"x": x})[0]  # noqa: F821 - ruff reads the del below as unbinding it
            if not np.array_equal(got, want):
                differing.append(f"session {i} run {r}: {int((got != want).sum())} of {got.size} outputs differ")

    runners = [threading.Thread(target=runner, args=(i,)) for i in range(len(sessions))]
    for t in hogs + runners:
        t.start()
    for t in runners:
        t.join()
    stop.set()
    for t in hogs:
        t.join()
    assert differing == []
    del sessions
    gc.collect()


def test_split_product_has_the_bits_of_its_chunks_on_one_thread(monkeypatch):
    """The product computed with the helper equals the same chunks computed on the calling thread alone."""
    monkeypatch.setattr(host_blas, "SPLIT_MACS", 1 << 12)
    sess = npu_session(_mlp(2))
    a = RNG.standard_normal((3, K)).astype(np.float32)
    b = RNG.standard_normal((K, HIDDEN)).astype(np.float32)
    with_helper = host_blas.matmul(a, b)
    monkeypatch.setattr(host_blas, "_split_enabled", 0)  # no session allows the helper: all on this thread
    assert np.array_equal(host_blas.matmul(a, b), with_helper)
    np.testing.assert_allclose(with_helper, a @ b, rtol=1e-5, atol=1e-5)
    del sess
    gc.collect()
