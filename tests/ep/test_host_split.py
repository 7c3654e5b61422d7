"""Large matmuls run as two halves on two host threads while a session allows it (provider option host_threads),
with the same result as one np.matmul; small ones and one-row products stay on the calling thread; host_threads=1
sessions do not allow it."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, make_model, npu_session

from npu_ep.kernels import host_blas

RNG = np.random.default_rng(3)


def _model():
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F32, [2])],
                      [helper.make_tensor_value_info("y", F32, [2])])


def _threads_used(monkeypatch, a, b) -> tuple[set[str], np.ndarray]:
    seen, real = set(), np.matmul

    def spy(x, y, **kw):
        seen.add(threading.current_thread().name)
        return real(x, y, **kw)

    monkeypatch.setattr(host_blas.np, "matmul", spy)
    out = host_blas.matmul(a, b)
    monkeypatch.setattr(host_blas.np, "matmul", real)
    return seen, out


@pytest.mark.parametrize("a_shape,b_shape", [((1, 256, 512), (512, 640)),  # 84 M MACs
                                             ((3, 64, 512), (512, 1024))])  # batched A: 100 M MACs
def test_large_products_split_over_two_threads_same_result(monkeypatch, a_shape, b_shape):
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    sess = npu_session(_model())
    seen, out = _threads_used(monkeypatch, a, b)
    assert len(seen) == 2 and any(n.startswith("npu_ep-matmul") for n in seen)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-4)
    seen, _ = _threads_used(monkeypatch, a[..., :8, :], b[:, :64])  # small: one call on this thread
    assert seen == {threading.current_thread().name}
    monkeypatch.setattr(host_blas, "SPLIT_MACS", 1)
    seen, _ = _threads_used(monkeypatch, a[..., :1, :], b)  # one row (a GEMV): never split, however large
    assert seen == {threading.current_thread().name}
    del sess
    gc.collect()


def test_sessions_count_in_and_out_and_host_threads_1_does_not_allow_it():
    before = host_blas._split_enabled
    one = npu_session(_model(), {"host_threads": "1"})
    assert host_blas._split_enabled == before
    two = npu_session(_model())
    assert host_blas._split_enabled == before + 1
    del one, two
    gc.collect()
    assert host_blas._split_enabled == before


def test_concurrent_callers_share_the_helper_and_all_get_their_own_result():
    sess = npu_session(_model())
    a = [RNG.standard_normal((1, 128, 512)).astype(np.float32) for _ in range(4)]
    b = RNG.standard_normal((512, 1100)).astype(np.float32)  # 72 M MACs: splits when the helper is free
    want = [np.matmul(x, b) for x in a]
    errors = []

    def work(i):
        for _ in range(10):
            got = host_blas.matmul(a[i], b)
            if not np.allclose(got, want[i], rtol=1e-5, atol=1e-4):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    del sess
    gc.collect()


@pytest.mark.parametrize("a_shape,b_shape", [((128, 1024), (1024, 1024)), ((1, 300, 517), (517, 777)),
                                             ((3, 64, 512), (512, 1024))])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_native_halves_equal_the_numpy_halves_bit_for_bit(a_shape, b_shape, threads):
    """kernels.sgemm_columns runs the same two sgemm calls numpy's halves make (a batched A as one [rows, K]), on
    one thread or two: the bits do not depend on the thread count or on which path ran."""
    from npu_ep.ep._native import kernels as native

    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    got = host_blas.matmul(a, b, native, threads)
    assert got.shape == (*a_shape[:-1], b_shape[1])
    want = host_blas.matmul(a.reshape(-1, a_shape[-1]), b).reshape(got.shape)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4, atol=1e-3)


def test_the_native_halves_refuse_what_they_cannot_multiply():
    from npu_ep.ep._native import kernels as native

    a, b = np.ones((4, 8), np.float32), np.ones((8, 6), np.float32)
    sgemm = host_blas.sgemm_address()
    with pytest.raises(ValueError, match="b has 7 rows"):
        native.sgemm_columns(a, np.ones((7, 6), np.float32), 3, sgemm)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        native.sgemm_columns(a.astype(np.float64), b, 3, sgemm)
    with pytest.raises(ValueError, match="split must be inside"):
        native.sgemm_columns(a, b, 6, sgemm)
    with pytest.raises(ValueError, match="no sgemm address"):
        native.sgemm_columns(a, b, 3, 0)


def test_a_large_matmul_runs_its_native_halves_on_npu_ep_and_matches_the_cpu_ep(monkeypatch):
    from npu_ep.ep._native import kernels as native
    from npu_testing import assignment, cpu_run

    calls = []
    real = native.sgemm_columns
    monkeypatch.setattr(native, "sgemm_columns", lambda *a: calls.append(a[2:]) or real(*a))
    w = RNG.standard_normal((512, 768)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       [helper.make_tensor_value_info("x", F32, [1, 256, 512])],
                       [helper.make_tensor_value_info("y", F32, [1, 256, 768])], {"w": w})
    x = RNG.standard_normal((1, 256, 512)).astype(np.float32)  # 100 M MACs: split
    sess = npu_session(model)
    assert assignment(sess) == {"mm": "NpuEP"}
    native.set_isa_cap(1)  # AVX2: an AVX-512 host runs this product on the packed GEMM instead (matmul.py)
    try:
        for _ in range(2):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-4,
                                       atol=1e-3)
    finally:
        native.set_isa_cap(-1)
    assert [(split, threads) for split, _, threads in calls] == [(384, 2), (384, 2)]
