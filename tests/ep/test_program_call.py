"""Program.__call__: the hot path (a signature seen before) and the observing path (first call of a signature,
record=True) give the same results, count every call, keep numpy's error state to the program and restore the
caller's, also when a kernel fails."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.compiler import compile_partition
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.partition import boundary
from npu_ep.ep.program import NpuRuntimeError
from npu_ep.kernels.target import Target
from tests.loop_oracle import python_loop
from tests.npu_testing import cpu_run, make_model

F32 = TensorProto.FLOAT


def div_exp_model():
    """y = exp(a / b): b = 0 gives inf (a > 0) or nan (a = 0); a large quotient overflows exp."""
    nodes = [helper.make_node("Div", ["a", "b"], ["q"], name="div"), helper.make_node("Exp", ["q"], ["y"], name="exp")]
    return make_model(nodes, [helper.make_tensor_value_info("a", F32, ["n"]),
                              helper.make_tensor_value_info("b", F32, ["n"])],
                      [helper.make_tensor_value_info("y", F32, ["n"])])


def compiled(model, *, record: bool = False):
    nodes = nodes_from_model(model)
    inputs, outputs = boundary(list(range(len(nodes))), nodes)
    return compile_partition("p", nodes, inputs, outputs, Target.load("npu-ref"), record=record)


FEEDS = {"a": np.array([1.0, 0.0, 200.0, 2.0], np.float32), "b": np.array([0.0, 0.0, 1.0, 4.0], np.float32)}


def test_hot_and_first_calls_agree_with_the_cpu_ep_and_count_per_signature():
    model = div_exp_model()
    program = compiled(model)
    want = cpu_run(model, FEEDS)[0]
    first = program(FEEDS["a"], FEEDS["b"])[0]  # observing path: records the shapes for the cost model
    again = program(FEEDS["a"], FEEDS["b"])[0]  # hot path
    np.testing.assert_array_equal(first, want)  # inf, nan and the overflow to inf, as the CPU EP
    np.testing.assert_array_equal(again, want)
    short = {k: v[:2] for k, v in FEEDS.items()}
    program(short["a"], short["b"])
    assert program.signatures == {((4,), (4,)): 2, ((2,), (2,)): 1}
    assert program.calls == 3 and program.host_ns > 0
    assert program.cost_for(((4,), (4,))) is not None and program.cost_for(((2,), (2,))) is not None


@pytest.mark.parametrize("calls", [1, 2], ids=["first_call", "hot_path"])
def test_program_ignores_numpy_errors_and_restores_the_callers_state(calls):
    program = compiled(div_exp_model())
    with np.errstate(all="raise"):  # the caller's choice must neither leak into kernels nor be lost
        for _ in range(calls):
            y = program(FEEDS["a"], FEEDS["b"])[0]
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
    assert np.isinf(y[0]) and np.isnan(y[1]) and np.isinf(y[2])


def gather_model():
    nodes = [helper.make_node("Gather", ["data", "idx"], ["y"], name="gather")]
    return make_model(nodes, [helper.make_tensor_value_info("data", F32, [4]),
                              helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
                      [helper.make_tensor_value_info("y", F32, [1])])


@pytest.mark.parametrize("warm", [False, True], ids=["first_call", "hot_path"])
def test_failing_kernel_names_the_node_and_restores_the_callers_state(warm):
    program = compiled(gather_model())
    data = np.arange(4, dtype=np.float32)
    if warm:  # the failing call's signature is known: it takes the hot path
        assert program(data, np.array([1], np.int64))[0][0] == 1.0
    with np.errstate(all="raise"):
        with pytest.raises(NpuRuntimeError, match=r"node 'gather' \(Gather\) failed on inputs "
                                                  r"\(float32\[4\], int64\[1\]\)"):
            program(data, np.array([7], np.int64))  # index out of range
        assert np.geterr()["divide"] == "raise"


@pytest.mark.parametrize("fails", [False, True], ids=["ok", "failing_kernel"])
def test_a_hot_call_already_under_the_programs_error_state_keeps_it(fails):
    """A sub-program called from a running step (an If branch, a Loop body) finds numpy's error state already the
    program's "ignore all": its hot call runs as any other, overflow and division by zero giving inf and nan, and
    leaves the state as it found it, also when a kernel fails."""
    from npu_ep.ep.program import _ERRSTATE, _IGNORE_ALL

    model = gather_model() if fails else div_exp_model()
    program = compiled(model)
    data = np.arange(4, dtype=np.float32)
    feeds = (data, np.array([1], np.int64)) if fails else (FEEDS["a"], FEEDS["b"])
    program(*feeds)  # the first call binds the signature: the next one takes the hot path
    token = _ERRSTATE.set(_IGNORE_ALL)
    try:
        if fails:
            with pytest.raises(NpuRuntimeError, match=r"node 'gather' \(Gather\) failed"):
                program(data, np.array([7], np.int64))
        else:
            np.testing.assert_array_equal(program(*feeds)[0], cpu_run(model, dict(zip("ab", feeds)))[0])
        assert _ERRSTATE.get() is _IGNORE_ALL
    finally:
        _ERRSTATE.reset(token)
    assert program.calls == (1 if fails else 2)


def test_every_hot_call_runs_its_python_steps_quietly_and_a_step_changing_the_state_leaks_nowhere():
    """A hot call's Python steps run in a context of the program's own holding "ignore all" (entered, not set): on
    every call, also after a step left the state changed (np.seterr in a step stays in that call), while the
    caller's state and context variables stay as they were; the steps see the other variables' defaults."""
    import contextvars

    from npu_ep.ep import program as program_mod

    ext = program_mod._extension
    marker = contextvars.ContextVar("test_marker", default="default")
    seen = []

    def run(prepared, args):
        seen.append((np.geterr()["divide"], marker.get()))
        np.seterr(divide="raise")
        return (args[0] + 1,)

    loop = ext.StepLoop([(run, None, [0], ((0, 1),), [])], 2, (1,), lambda j, args, exc: exc)
    call = ext.ProgramCall(lambda inputs: None, program_mod._ERRSTATE, program_mod._IGNORE_ALL, loop, 4)
    assert call.track(((2,),), None) == []
    x = np.zeros(2, np.float32)
    token = marker.set("caller's")
    try:
        with np.errstate(divide="warn"):
            for _ in range(3):
                np.testing.assert_array_equal(call((x,))[0], x + 1)
            assert np.geterr()["divide"] == "warn" and marker.get() == "caller's"
    finally:
        marker.reset(token)
    assert seen == [("ignore", "default")] * 3


def test_record_keeps_every_intermediate_on_every_call():
    program = compiled(div_exp_model(), record=True)
    for scale in (1.0, 2.0):  # the second call has a known signature: recording must still observe it
        a = FEEDS["a"] * np.float32(scale)
        y = program(a, FEEDS["b"])[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.divide(a, FEEDS["b"])
        np.testing.assert_array_equal(program.recorded["div:0"], q)
        np.testing.assert_array_equal(program.recorded["exp:0"], y)
    assert program.calls == 2


def test_calls_from_many_threads_are_all_counted():
    """Hot-path calls count in the extension (kernels release the GIL mid-call), observed ones in Python; reading
    the counts while other threads keep calling loses none."""
    import threading

    program = compiled(div_exp_model())
    program(FEEDS["a"], FEEDS["b"])
    seen = []

    def work():
        for i in range(300):
            program(FEEDS["a"], FEEDS["b"])
            if i % 50 == 0:
                seen.append(program.calls)  # reads fold concurrently with other threads' appends

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert program.calls == 1 + 4 * 300 and program.signatures == {((4,), (4,)): 1201}
    assert all(1 <= c <= 1201 for c in seen)
    cost = program.cost_for(((4,), (4,)))
    assert program.emulated_seconds() == pytest.approx(cost.seconds * 1201)


def test_record_skips_omitted_outputs_a_kernel_did_not_compute():
    """SkipSimplifiedLayerNormalization with its optional mean/inv_std outputs omitted computes neither; recording
    keeps the two outputs that exist, equal to the CPU EP's."""
    x = np.random.default_rng(3).standard_normal((1, 1, 64)).astype(np.float32)
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "sum"],
                            name="sln", domain="com.microsoft", epsilon=1e-6)
    model = make_model([node], [helper.make_tensor_value_info("x", F32, [1, 1, 64]),
                                helper.make_tensor_value_info("skip", F32, [1, 1, 64])],
                       [helper.make_tensor_value_info("y", F32, [1, 1, 64]),
                        helper.make_tensor_value_info("sum", F32, [1, 1, 64])],
                       {"gamma": np.linspace(0.5, 1.5, 64, dtype=np.float32)}, extra_opsets=[("com.microsoft", 1)])
    program = compiled(model, record=True)
    feeds = {"x": x, "skip": x[..., ::-1].copy()}
    y, s = program(feeds["x"], feeds["skip"])
    want_y, want_s = cpu_run(model, feeds)
    np.testing.assert_allclose(y, want_y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s, want_s)
    assert sorted(program.recorded) == ["sln:0", "sln:3"]
    np.testing.assert_array_equal(program.recorded["sln:3"], s)


def test_partition_outputs_are_marked_on_the_steps_that_compute_them():
    """mark_partition_outputs tells each step which of its outputs ORT receives (ORT's output index), so a kernel
    can write them in place; a rebind to ORT's output order marks again."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Identity", ["y"], ["z"], name="id"),
             helper.make_node("Neg", ["y"], ["w"], name="neg")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, ["n"])],
                       [helper.make_tensor_value_info(o, F32, ["n"]) for o in ("y", "z", "w")])
    program = compiled(model)
    program.mark_partition_outputs()
    marks = {st.node_name: st.prepared.runtime.partition_outputs for st in program.steps}
    assert marks == {"relu": {0: 0}, "id": {0: 1}, "neg": {0: 2}}
    program.rebind(["x"], ["w", "z", "y"])
    marks = {st.node_name: st.prepared.runtime.partition_outputs for st in program.steps}
    assert marks == {"relu": {0: 2}, "id": {0: 1}, "neg": {0: 0}}
    x = np.array([-1.0, 2.0], np.float32)
    w, z, y = program(x)
    np.testing.assert_array_equal(y, [0.0, 2.0])
    np.testing.assert_array_equal(z, y)
    np.testing.assert_array_equal(w, [-0.0, -2.0])


def test_a_session_returning_an_output_that_another_step_reads_matches_the_cpu_ep():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Identity", ["y"], ["z"], name="id")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, ["n"])],
                       [helper.make_tensor_value_info(o, F32, ["n"]) for o in ("y", "z")])
    from tests.npu_testing import assignment, npu_session

    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    x = np.array([-1.0, 2.0, 3.0], np.float32)
    for got, want in zip(sess.run(None, {"x": x}), cpu_run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def sub_model():
    """y = a - b (the order of the inputs matters)."""
    nodes = [helper.make_node("Sub", ["a", "b"], ["y"], name="sub")]
    return make_model(nodes, [helper.make_tensor_value_info("a", F32, ["n"]),
                              helper.make_tensor_value_info("b", F32, ["n"])],
                      [helper.make_tensor_value_info("y", F32, ["n"])])


def test_a_rebind_of_the_inputs_reorders_them_on_both_paths():
    program = compiled(sub_model())
    a, b = np.array([5.0, 1.0], np.float32), np.array([2.0, 4.0], np.float32)
    program.rebind(["b", "a"], ["y"])
    first = program(b, a)[0]  # observing path
    hot = program(b, a)[0]  # C++ path
    np.testing.assert_array_equal(first, a - b)
    np.testing.assert_array_equal(hot, a - b)
    assert program._call.counts()[((2,), (2,))][0] == 1  # the second call ran in C++
    with pytest.raises(ValueError, match="the program takes 2 inputs, the call passed 1"):
        program(a)


def test_switching_record_on_sends_known_signatures_to_the_observing_path():
    program = compiled(div_exp_model())
    program(FEEDS["a"], FEEDS["b"])
    program(FEEDS["a"], FEEDS["b"])
    assert program.recorded == {}
    program.record = True
    y = program(FEEDS["a"], FEEDS["b"])[0]
    np.testing.assert_array_equal(program.recorded["exp:0"], y)
    assert program.calls == 3


def test_a_program_is_freed_once_nothing_holds_it():
    """The program's C++ loops and call hold no reference back to it: a cycle through extension objects would
    never be collected, and the program keeps the weights."""
    import gc
    import weakref

    program = compiled(div_exp_model())
    for _ in range(3):  # observed, then the C++ path with its bound loop
        program(FEEDS["a"], FEEDS["b"])
    assert program._bound and program._call is not None
    ref = weakref.ref(program)
    del program
    gc.collect()
    assert ref() is None


def test_ort_calls_the_programs_cpp_path_and_a_closed_session_frees_its_programs():
    import gc
    import weakref

    from npu_ep.ep.sessions import session_of, tag_session_options
    from npu_ep.kernels.runtime import extension
    from tests.npu_testing import assignment, npu_session, session_options

    model = sub_model()
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    feeds = {"a": np.array([3.0, 1.0], np.float32), "b": np.array([1.0, 5.0], np.float32)}
    for _ in range(5):
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
    (program,) = session_of(sess).programs.values()
    calls, ns = program._call.counts()[((2,), (2,))]
    assert calls == 4 and ns > 0  # the first call observed, the other four ran in C++
    assert program.calls == 5
    stats = [s for s in extension().partition_stats().values() if s["calls"]]
    assert stats and all(0 < s["program_ns"] <= s["total_ns"] for s in stats)  # the call times itself for the bridge
    ref = weakref.ref(program)
    del program, sess
    gc.collect()
    assert ref() is None


def plumbing_model():
    """y = Reshape(Relu(x * 2), Shape(x)) over a dynamic [1, S]: arithmetic steps and shape plumbing that binds
    native steps per signature (a memoized Shape, a view Reshape)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Mul", ["x", "two"], ["h"],
                                                                                    name="mul"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"), helper.make_node("Reshape", ["r", "s"], ["y"],
                                                                                   name="reshape")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, "S"])],
                      [helper.make_tensor_value_info("y", F32, [1, "S"])], {"two": np.float32(2.0)})


def _feed(width: int) -> np.ndarray:
    return (np.arange(width, dtype=np.float32) - width / 2).reshape(1, width)  # exact under * 2 and Relu


def _check_bounded(program, widths: list[int], outputs: dict[int, np.ndarray]) -> None:
    from npu_ep.ep.program import _BOUND_SIGNATURES, SIGNATURES_KEPT

    assert len(program.signatures) == SIGNATURES_KEPT, len(program.signatures)
    assert program._call is None or len(program._call) == SIGNATURES_KEPT  # the extension's entries too
    assert len(program._bound) <= _BOUND_SIGNATURES and len(program._bindings) <= _BOUND_SIGNATURES
    assert program.calls == len(widths)
    assert program.evicted_signatures == len(widths) - SIGNATURES_KEPT  # every call a first one: the last re-admitted
    assert program.signatures[((1, widths[-1]),)] == 1  # the shape seen, evicted and seen again is kept anew
    for width, got in outputs.items():
        np.testing.assert_array_equal(got, np.maximum(_feed(width) * 2, 0))


def _widths() -> list[int]:
    from npu_ep.ep.program import SIGNATURES_KEPT

    first = list(range(1, 3 * SIGNATURES_KEPT + 1))
    return first + [1]  # width 1 was evicted long ago: seen again


def test_a_session_over_many_input_shapes_keeps_a_bounded_number_of_signatures():
    """A decoder whose past grows gets a new signature every token; the per-signature state (cost, counts, the C++
    entry, native steps) used to grow without bound for the session's life. Outputs against the CPU EP's, also for
    a shape whose state was evicted (exact: x * 2 and Relu)."""
    import onnxruntime as ort

    from npu_ep.ep.sessions import session_of, tag_session_options
    from tests.npu_testing import assignment, npu_session, session_options

    model = plumbing_model()
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    widths, outputs = _widths(), {}
    for width in widths:
        got = sess.run(None, {"x": _feed(width)})[0]
        np.testing.assert_array_equal(got, cpu.run(None, {"x": _feed(width)})[0])
        outputs[width] = got
    (program,) = session_of(sess).programs.values()
    _check_bounded(program, widths, outputs)
    again = sess.run(None, {"x": _feed(1)})[0]  # now a hot-path call of the re-admitted signature
    np.testing.assert_array_equal(again, cpu.run(None, {"x": _feed(1)})[0])
    assert program.signatures[((1, 1),)] == 2 and program.emulated_seconds() > 0


def test_a_program_runs_on_the_extension_and_says_so_when_it_is_not_built(monkeypatch):
    """Every call runs in the extension (ProgramCall, StepLoop): there is no second, pure-Python way to run a
    program, so without the extension compiling one fails naming what to build."""
    from npu_ep.ep import program as program_mod

    program = compiled(plumbing_model())
    assert program._call is not None and program._loop is not None
    monkeypatch.setattr(program_mod, "_extension", None)
    with pytest.raises(ImportError, match=r"_native is not built.*build_ext"):
        compiled(plumbing_model())


def test_evicted_signatures_keep_their_calls_and_emulated_time_in_the_totals():
    from npu_ep.ep.program import SIGNATURES_KEPT

    program = compiled(plumbing_model())
    seconds = 0.0
    for width in range(1, SIGNATURES_KEPT + 2):
        for _ in range(3):  # observed once, then twice on the hot path
            program(_feed(width))
        seconds += program.cost_for(((1, width),)).seconds * 3
    assert program.evicted_signatures == 1 and program.cost_for(((1, 1),)) is None
    assert program.calls == 3 * (SIGNATURES_KEPT + 1)
    assert program.emulated_seconds() == pytest.approx(seconds)


def test_the_extension_evicts_the_least_recently_called_signature_and_hands_back_its_counts():
    """ProgramCall's own bound: a new signature beyond its capacity evicts the one whose latest hot-path call is
    oldest (not the oldest tracked), returns its counts, and sends its next call back to observe."""
    from npu_ep.ep import program as program_mod

    program = compiled(sub_model())
    observed = []

    def observe(inputs):
        observed.append(tuple(a.shape for a in inputs))
        return python_loop(program, inputs)

    call = program_mod._extension.ProgramCall(observe, program_mod._ERRSTATE, program_mod._IGNORE_ALL,
                                               program._loop, 2)
    feeds = {n: (np.arange(n, dtype=np.float32), np.ones(n, np.float32)) for n in (1, 2, 3)}
    assert call.track(((1,), (1,)), None) == [] and call.track(((2,), (2,)), None) == []
    np.testing.assert_array_equal(call(feeds[1])[0], feeds[1][0] - 1)  # hot path: 1 is now the latest used
    assert call.track(((3,), (3,)), None) == [(((2,), (2,)), 0, 0)]  # 2, tracked after 1 but never called
    assert len(call) == 2 and observed == []
    np.testing.assert_array_equal(call(feeds[2])[0], feeds[2][0] - 1)
    assert observed == [((2,), (2,))]  # evicted: observed again
    (evicted,) = call.track(((2,), (2,)), None)  # 1's call came before 3 was tracked
    assert evicted[:2] == (((1,), (1,)), 1) and evicted[2] > 0  # with its hot-path call and time
    assert call.counts() == {} and len(call) == 2  # neither kept signature ran on the hot path yet
