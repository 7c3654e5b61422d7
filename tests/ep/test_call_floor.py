"""What a call reuses to keep its fixed cost down: a step's argument tuple (emptied and kept when nothing else held it),
the partition's input tuple (the same), the latest signature, and a one-output native step's output without a tuple.
Results stay the CPU EP's and the oracle's when steps keep their arguments, fail, or run on several threads at once."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep import _native
from npu_ep.ep.program import Program
from tests.npu_testing import assignment, cpu_run, make_model, npu_session

F32 = TensorProto.FLOAT


class Box:
    def __init__(self, v):
        self.v = v


def fail_with(j, args, exc):
    return RuntimeError(f"step {j} failed on {len(args)} inputs: {exc}")


def test_a_step_that_keeps_its_args_keeps_them_as_they_were():
    kept = []

    def keep(_p, args):
        kept.append(args)
        return [Box(args[0].v * 2)]

    loop = _native.StepLoop([(keep, None, (0,), ((0, 1),), ())], 2, (1,), fail_with)
    for v in range(5):
        assert loop((Box(v),))[0].v == 2 * v
    assert [a[0].v for a in kept] == [0, 1, 2, 3, 4]  # no later call emptied or refilled a kept tuple
    assert len({id(a) for a in kept}) == 5


def test_a_reused_args_tuple_holds_no_value_between_calls():
    def double(_p, args):
        return [Box(args[0].v * 2)]

    loop = _native.StepLoop([(double, None, (0,), ((0, 1),), ()), (double, None, (1,), ((0, 2),), (1,))], 3, (2,),
                            fail_with)
    for v in range(3):
        x = Box(v)
        ref = weakref.ref(x)
        assert loop((x,))[0].v == 4 * v
        del x
        gc.collect()
        assert ref() is None  # the emptied spare tuples do not keep the input alive
    before = sys.getrefcount(Box)
    loop((Box(1),))
    assert sys.getrefcount(Box) == before


def test_a_step_failing_after_its_args_were_reused_is_named_and_the_next_call_works():
    def strict(_p, args):
        if args[0].v < 0:
            raise ValueError("negative")
        return [Box(args[0].v + 1)]

    loop = _native.StepLoop([(strict, None, (0,), ((0, 1),), ())], 2, (1,), fail_with)
    assert loop((Box(1),))[0].v == 2
    with pytest.raises(RuntimeError, match="step 0 failed on 1 inputs: negative") as info:
        loop((Box(-1),))
    assert isinstance(info.value.__cause__, ValueError)
    assert loop((Box(5),))[0].v == 6


def test_one_output_native_steps_give_tuples_to_python_and_to_the_observer():
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    view = _native.ViewStep((1, 6), (2, 3), 1)
    shape = _native.ShapeStep()
    assert isinstance(view.run((x,)), tuple) and view.run((x,))[0].shape == (2, 3)
    assert isinstance(shape.run((x,)), tuple) and shape.run((x,))[0].tolist() == [1, 6]

    def kernel(_p, args):
        raise AssertionError("the native step runs")

    loop = _native.StepLoop([(kernel, None, (0,), ((0, 1),), (), view), (kernel, None, (1,), ((0, 2),), (), shape)],
                            3, (1, 2), fail_with)
    y, s = loop((x,))
    assert y.shape == (2, 3) and np.shares_memory(y, x) and s.tolist() == [2, 3]
    seen = []
    natives = [view, shape]
    loop.observe((x,), lambda j, args: natives[j], lambda j, args, outs, ran: seen.append((type(outs), ran)))
    assert seen == [(tuple, True), (tuple, True)]
    y, s = loop.scout((x,))[0]
    assert y.shape == (2, 3) and s.tolist() == [2, 3]


def _chain(n: int):
    """Abs -> Neg on [b, n] float32 (two bound ufunc steps, the second into ORT's buffer), with Shape and Reshape of
    the input as two more outputs."""
    x = helper.make_tensor_value_info("x", F32, ["b", n])  # a symbolic batch: ORT does not fold the Shape
    nodes = [helper.make_node("Abs", ["x"], ["t"], name="abs"), helper.make_node("Neg", ["t"], ["y"], name="neg"),
             helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Reshape", ["x", "r"], ["z"], name="reshape")]
    outs = [helper.make_tensor_value_info("y", F32, ["b", n]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("z", F32, ["h", 2])]
    return make_model(nodes, [x], outs, {"r": np.array([-1, 2], np.int64)})


def _special(rng, n):
    x = rng.standard_normal((1, n)).astype(np.float32)
    x[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 1e-40, -1e-40]
    return x


@pytest.mark.parametrize("n", [64, 4096])  # 4096: the ufunc loop releases the GIL, so the threads' steps overlap
def test_concurrent_calls_of_one_session_give_the_cpu_eps_results(n):
    model = _chain(n)
    sess = npu_session(model, cpu=False)
    assert assignment(sess) == {"abs": "NpuEP", "neg": "NpuEP", "shape": "NpuEP", "reshape": "NpuEP"}
    rng = np.random.default_rng(0)
    feeds = [_special(rng, n) for _ in range(4)]
    wants = [cpu_run(model, {"x": f}) for f in feeds]
    sess.run(None, {"x": feeds[0]})  # binds
    errors = []

    def worker(t):
        try:
            for i in range(150):
                k = (t + i) % 4
                got = sess.run(None, {"x": feeds[k]})
                for g, w in zip(got, wants[k]):
                    np.testing.assert_array_equal(g, w)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_caller_that_keeps_the_partitions_inputs_sees_them_unchanged(monkeypatch):
    """The partition's input tuple is reused only when nothing else holds it: an observing call that keeps it (as a
    Python kernel may) keeps the arrays of its own call."""
    held = []
    real_observe = Program._observe

    def spy(self, inputs):
        held.append(inputs)
        return real_observe(self, inputs)

    monkeypatch.setattr(Program, "_observe", spy)
    model = _chain(64)
    sess = npu_session(model, cpu=False)
    rng = np.random.default_rng(1)
    feeds = [_special(rng, 64), np.concatenate([_special(rng, 64)] * 2)]
    for f in feeds:
        sess.run(None, {"x": f})
    assert len(held) >= 2
    for h in held:  # every kept tuple still holds its own call's input
        assert len(h) == 1
        np.testing.assert_array_equal(h[0], feeds[0] if h[0].shape == (1, 64) else feeds[1])
    for _ in range(3):  # known signatures, alternating: the latest-signature shortcut and the lookup
        for f in feeds:
            for g, w in zip(sess.run(None, {"x": f}), cpu_run(model, {"x": f})):
                np.testing.assert_array_equal(g, w)
    for h in held:
        np.testing.assert_array_equal(h[0], feeds[0] if h[0].shape == (1, 64) else feeds[1])


def test_a_failing_node_after_reused_calls_is_named_in_the_session_error():
    x = helper.make_tensor_value_info("data", F32, [4])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [1])
    model = make_model([helper.make_node("Gather", ["data", "idx"], ["y"], name="gather")], [x, idx],
                       [helper.make_tensor_value_info("y", F32, [1])])
    sess = npu_session(model, cpu=False)
    data = np.arange(4, dtype=np.float32)
    for i in range(3):
        assert sess.run(None, {"data": data, "idx": np.array([i], np.int64)})[0].tolist() == [float(i)]
    with pytest.raises(Exception, match=r"node 'gather' \(Gather\)"):
        sess.run(None, {"data": data, "idx": np.array([7], np.int64)})
    assert sess.run(None, {"data": data, "idx": np.array([3], np.int64)})[0].tolist() == [3.0]
    assert assignment(sess) == {"gather": "NpuEP"}


def _kernel_step(fn, args, inputs):
    counter = np.zeros(1, np.int64)
    return _native.CallStep(fn, tuple(args), inputs, [(-1, None)], [(counter, 0)], [], [], ())


def test_a_bound_method_and_a_callable_instance_count_as_numpy_free_and_give_the_kernels_bits():
    """BoundNBits.__call__ (a MatMulNBits step's fn), the instance itself (npu::NormMatMul's) and .half are C++ code:
    no numpy error state is entered for them; a lambda is not; the results are the kernel's bit for bit."""
    k = _native.kernels
    rng = np.random.default_rng(5)
    K, N = 64, 8
    b = rng.integers(0, 256, N * K // 2, dtype=np.uint8)
    scales = rng.standard_normal(N * K // 32).astype(np.float32)
    bound = k.BoundNBits(b, scales, None, None, K, N, 32, 0, 1, 0, None)
    x = rng.standard_normal((3, K)).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -0.0, 1e-40]
    ins = [(0, 0, x.dtype, x.shape, None)]
    method = _kernel_step(bound.__call__, (None, None, None), ins)
    instance = _kernel_step(bound, (None,), ins)
    assert method.numpy_free and instance.numpy_free
    assert not _kernel_step(lambda a: bound(a), (None,), ins).numpy_free
    assert method.run((x,))[0].tobytes() == bound(x).tobytes()
    assert instance.run((x,))[0].tobytes() == bound(x).tobytes()
    h = x.astype(np.float16)
    half = _kernel_step(bound.half, (None,), [(0, 0, h.dtype, h.shape, None)])
    assert half.numpy_free and half.run((h,))[0].tobytes() == bound.half(h).tobytes()
