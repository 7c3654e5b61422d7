"""The program's loop in C++ (``_native.StepLoop``): the same slots, outputs, releases and errors as the
executor's test oracle (``tests/loop_oracle.python_loop``), on hand-made steps and on compiled programs."""

from __future__ import annotations

import gc
import sys
import time
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep import _native
from npu_ep.ep.compiler import compile_partition
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.partition import boundary
from npu_ep.ep.program import NpuRuntimeError
from npu_ep.kernels.target import Target
from tests.loop_oracle import python_loop
from tests.npu_testing import cpu_run, make_model

F32 = TensorProto.FLOAT


class Box:
    """A slot value that can be watched with a weak reference."""

    def __init__(self, v):
        self.v = v


def add(_p, args):
    return [Box(args[0].v + args[1].v)]


def fail_with(j, args, exc):
    return RuntimeError(f"step {j} failed on {len(args)} inputs: {exc}")


def test_steps_read_and_write_slots_and_none_for_minus_one():
    seen = []

    def probe(p, args):
        seen.append((p, args))
        return (args[0], "second")

    # slots: 0 a, 1 b, 2 a+b, 3 probe's first output; probe's second output is not kept (no slot)
    loop = _native.StepLoop([(add, None, (0, 1), ((0, 2),), ()),
                             (probe, "prep", (2, -1), ((0, 3),), (2,))], 4, (3, 2, 0), fail_with)
    out = loop((Box(1), Box(2)))
    assert len(loop) == 2
    assert out[0].v == 3 and out[1] is None and out[2].v == 1  # slot 2 was released by its last reader
    assert seen[0][0] == "prep" and seen[0][1][1] is None and isinstance(seen[0][1], tuple)


def test_profiling_sums_each_steps_time_over_calls_until_switched_off():
    def slow(_p, args):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2e-3:
            pass
        return [args[0]]

    loop = _native.StepLoop([(add, None, (0, 1), ((0, 2),), ()), (slow, None, (2,), ((0, 3),), (2,))], 4, (3,),
                            fail_with)
    assert loop.step_ns == []  # off: nothing is timed
    loop.set_profile(True)
    for _ in range(3):
        loop((Box(1), Box(2)))
    fast, slow_ns = loop.step_ns
    assert slow_ns >= 3 * 2e6 and 0 < fast < slow_ns / 10
    loop.set_profile(False)
    loop((Box(1), Box(2)))
    assert loop.step_ns == []


def test_a_released_value_is_freed_before_the_loop_returns():
    refs = []

    def keep_ref(_p, args):
        refs.append(weakref.ref(args[0]))
        return [Box(0)]

    def check_freed(_p, args):
        gc.collect()
        return [Box(refs[0]() is None)]

    loop = _native.StepLoop([(add, None, (0, 1), ((0, 2),), ()),
                             (keep_ref, None, (2,), ((0, 3),), (2,)),
                             (check_freed, None, (3,), ((0, 4),), (3,))], 5, (4,), fail_with)
    assert loop((Box(1), Box(2)))[0].v is True


def test_no_references_leak_across_calls():
    loop = _native.StepLoop([(add, None, (0, 1), ((0, 2),), (0, 1))], 3, (2,), fail_with)
    a, b = Box(1), Box(2)
    before = sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(100):
        out = loop((a, b))
    assert (sys.getrefcount(a), sys.getrefcount(b)) == before
    kept = weakref.ref(out[0])
    del out
    assert kept() is None  # the result tuple held the only reference


def test_a_failing_step_raises_the_fail_callbacks_error_chained_to_the_kernels():
    def boom(_p, args):
        raise KeyError("bad index")

    loop = _native.StepLoop([(add, None, (0, 1), ((0, 2),), ()), (boom, None, (2, 0), ((0, 3),), ())], 4, (3,),
                            fail_with)
    with pytest.raises(RuntimeError, match=r"step 1 failed on 2 inputs: 'bad index'") as info:
        loop((Box(1), Box(2)))
    assert isinstance(info.value.__cause__, KeyError) and info.value.__suppress_context__


def test_base_exceptions_pass_unchanged():
    def interrupt(_p, _args):
        raise KeyboardInterrupt

    loop = _native.StepLoop([(interrupt, None, (0,), ((0, 1),), ())], 2, (1,), fail_with)
    with pytest.raises(KeyboardInterrupt):
        loop((Box(1),))


def test_a_kernel_returning_too_few_outputs_is_a_named_failure():
    loop = _native.StepLoop([(lambda p, a: [a[0]], None, (0,), ((0, 1), (1, 2)), ())], 3, (2,), fail_with)
    with pytest.raises(RuntimeError, match=r"step 0 failed on 1 inputs: the kernel returned 1 outputs, the "
                                           r"node's output 1 is used"):
        loop((Box(1),))
    bad = _native.StepLoop([(lambda p, a: 7, None, (0,), ((0, 1),), ())], 2, (1,), fail_with)
    with pytest.raises(RuntimeError, match="must return a sequence of outputs"):
        bad((Box(1),))


@pytest.mark.parametrize("steps, why", [
    ([(add, None, (0, 5), ((0, 2),), ())], "slot 5 outside"),
    ([(add, None, (0, 1), ((0, -1),), ())], "slot -1 outside"),
    ([(add, None, (0, 1))], r"a step is \(run, prepared"),
])
def test_bad_plans_are_refused_when_built(steps, why):
    with pytest.raises(ValueError, match=why):
        _native.StepLoop(steps, 3, (2,), fail_with)


def mlp_model():
    """Slots released mid-program, an output read by a later step, and an output listed twice."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x"], ["y"], name="add"),
             helper.make_node("Mul", ["y", "r"], ["z"], name="mul")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 4])],
                      [helper.make_tensor_value_info("z", F32, ["n", 4]),
                       helper.make_tensor_value_info("r", F32, ["n", 4])],
                      {"w": np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)})


def compiled(model):
    nodes = nodes_from_model(model)
    inputs, outputs = boundary(list(range(len(nodes))), nodes)
    return compile_partition("p", nodes, inputs, outputs, Target.load("npu-ref"))


def test_the_program_hot_path_runs_the_native_loop_and_matches_the_oracle_and_the_cpu_ep():
    model = mlp_model()
    program = compiled(model)
    assert program._loop is not None  # the extension is built: the hot path is the C++ loop
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    first = program(x)  # the first call observes: it binds the native steps
    hot = program(x)
    python = python_loop(program, (x,))
    want = dict(zip(("z", "r"), cpu_run(model, {"x": x})))
    for a, b, io in zip(hot, python, program.outputs, strict=True):
        c = want[io.name]
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-6)
    for a, b in zip(first, hot):
        np.testing.assert_array_equal(a, b)


def test_the_native_loop_follows_a_rebind_of_the_outputs():
    program = compiled(mlp_model())
    x = np.ones((2, 4), np.float32)
    names = [io.name for io in program.outputs]
    before = dict(zip(names, program(x)))
    program(x)  # the hot path with the compiled order
    program.rebind([io.name for io in program.inputs], names[::-1])
    after = dict(zip(names[::-1], program(x)))
    for name in names:
        np.testing.assert_array_equal(before[name], after[name])


def test_a_failing_node_on_the_native_loop_is_named_with_its_input_shapes():
    nodes = [helper.make_node("Gather", ["data", "idx"], ["y"], name="gather")]
    model = make_model(nodes, [helper.make_tensor_value_info("data", F32, [4]),
                               helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
                       [helper.make_tensor_value_info("y", F32, [1])])
    program = compiled(model)
    data = np.arange(4, dtype=np.float32)
    program(data, np.array([1], np.int64))  # the signature is known: the next call takes the native loop
    with pytest.raises(NpuRuntimeError, match=r"node 'gather' \(Gather\) failed on inputs "
                                              r"\(float32\[4\], int64\[1\]\)") as info:
        program(data, np.array([7], np.int64))
    assert info.value.__cause__ is not None


def add_arrays(_p, args):
    return [args[0] + args[1]]


def test_an_observed_call_runs_the_native_step_its_observer_chooses_and_shows_every_result():
    """StepLoop.observe (a signature's first call): before(j, args) names the native step to try, after(j, args,
    outs, ran_native) sees each result; a native step that declines runs the kernel. The loop's own native-step
    counts are the hot path's only."""
    kept = np.array([7.0], np.float32)
    kept.flags.writeable = False
    memo = _native.MemoStep([("shape", np.float32, (1,)), ("shape", np.float32, (1,))], (kept,))
    loop = _native.StepLoop([(add_arrays, None, (0, 1), ((0, 2),), ()),
                             (add_arrays, None, (2, 2), ((0, 3),), (2,))], 4, (3,), fail_with)
    seen = []

    def before(j, args):
        return memo if j == 0 else None

    def after(j, args, outs, ran_native):
        seen.append((j, [a.tolist() for a in args], [o.tolist() for o in outs], ran_native))

    x = np.ones(1, np.float32)
    assert loop.observe((x, x), before, after)[0].tolist() == [14.0]
    assert seen == [(0, [[1.0], [1.0]], [[7.0]], True), (1, [[7.0], [7.0]], [[14.0]], False)]
    seen.clear()
    two = np.ones(2, np.float32)  # the memo declines another shape: the kernel runs
    assert loop.observe((two, two), before, after)[0].tolist() == [4.0, 4.0]
    assert [s[3] for s in seen] == [False, False]
    assert loop.native_counts == (0, 0)


def test_an_observed_call_fails_with_the_observers_error_or_the_named_step():
    loop = _native.StepLoop([(add_arrays, None, (0, 1), ((0, 2),), ())], 3, (2,), fail_with)
    x = np.ones(1, np.float32)

    def refuse(j, args):
        raise KeyError("the observer's own error")

    with pytest.raises(KeyError, match="the observer's own error"):
        loop.observe((x, x), refuse, lambda *a: None)
    with pytest.raises(RuntimeError, match=r"step 0 failed on 2 inputs: .*broadcast"):
        loop.observe((np.ones(2, np.float32), np.ones(3, np.float32)), lambda j, a: None, lambda *a: None)


def test_a_first_call_runs_on_the_native_loop_and_binds_for_the_next():
    """Every call runs on the extension's loop: the first with a new signature through StepLoop.observe (the
    program's observer binds native steps), the next on the bound loop; outputs equal the oracle's and the CPU
    EP's."""
    model = mlp_model()
    program = compiled(model)
    real, observed = program._loop, []

    class Spy:
        def observe(self, inputs, before, after):
            observed.append(tuple(a.shape for a in inputs))
            return real.observe(inputs, before, after)

    program._loop = Spy()
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    first = program(x)
    assert observed == [((2, 4),)] and program._bound  # observed once, native steps bound
    hot = program(x)
    assert observed == [((2, 4),)]  # the hot path: the signature's bound loop
    want = dict(zip(("z", "r"), cpu_run(model, {"x": x})))
    for a, b, c, io in zip(first, hot, python_loop(program, (x,)), program.outputs, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(a, want[io.name], rtol=1e-6)
