"""Native steps (ep/step_binding.py, ep/native/native_steps.cc): what they bind to, that they decline inputs they
were not bound for, and that a program running them gives the CPU EP's results, also when a shape depends on
data."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep import _native, step_binding
from npu_ep.ep.compiler import compile_partition
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.partition import boundary
from npu_ep.kernels.registry import KernelDef, Prepared
from npu_ep.kernels.target import Target
from tests.npu_testing import count_kernel_runs, cpu_run, make_model

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def bind(op, args, outs, shape_derived=True):
    """step_binding.bind for an op whose kernel has no binding of its own (Shape's attributes: the whole shape)."""
    prepared = Prepared({"start": 0, "end": None}) if op == "Shape" else None
    return step_binding.bind(op, _NO_BIND, prepared, args, outs, _native, shape_derived=shape_derived)


_NO_BIND = KernelDef("", "Test", None, None, None)


def read_only(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


# --- the native steps themselves -----------------------------------------------------------------------------

def test_memo_step_returns_its_outputs_only_for_the_inputs_it_was_bound_for():
    out = read_only(np.array([2, 3], np.int64))
    step = _native.MemoStep([("shape", np.dtype(np.float32), (2, 3)), ("value", np.array([1], np.int64)), None],
                            (out,))
    loop = _native.StepLoop([(lambda p, a: ["kernel"], None, (0, 1, 2), ((0, 3),), (), step)], 4, (3,), None)
    x = np.zeros((2, 3), np.float32)
    assert loop((x, np.array([1], np.int64), None))[0] is out
    assert loop((x + 5, np.array([1], np.int64), None))[0] is out  # a "shape" input: its values do not matter
    assert loop.native_counts == (2, 0)
    declined = [(np.zeros((3, 2), np.float32), np.array([1], np.int64), None),  # another shape
                (x.astype(np.float64), np.array([1], np.int64), None),  # another dtype
                (x, np.array([2], np.int64), None),  # another value
                (x, np.array([1], np.int32), None),  # the same value in another dtype
                (x, np.array([1], np.int64), np.zeros(1)),  # an input that was omitted
                (x, np.array([[1]], np.int64), None)]  # the same bytes in another shape
    for inputs in declined:
        assert loop(inputs)[0] == "kernel"
    assert loop.native_counts == (2, len(declined))


def test_memo_step_compares_values_of_non_contiguous_inputs_by_declining_them():
    step = _native.MemoStep([("value", np.array([1, 3], np.int64))], (read_only([0]),))
    loop = _native.StepLoop([(lambda p, a: ["kernel"], None, (0,), ((0, 1),), (), step)], 2, (1,), None)
    assert loop((np.array([1, 2, 3], np.int64)[::2],))[0] == "kernel"


def test_a_0d_value_input_is_held_as_0d():
    """A Range's bounds are 0-d values squeezed out of a shape: the bound step matches them on later calls (a 1-d
    copy of the bound value never matched, so the step declined every call)."""
    n = np.array(7, np.int64)
    step = bind("Range", [np.array(0, np.int64), n, None], [np.arange(7, dtype=np.int64)])
    loop = _native.StepLoop([(lambda p, a: ["kernel"], None, (0, 1, 2), ((0, 3),), (), step)], 4, (3,), None)
    np.testing.assert_array_equal(loop((np.array(0, np.int64), np.array(7, np.int64), None))[0], np.arange(7))
    assert loop((np.array(0, np.int64), np.array([7], np.int64), None))[0] == "kernel"  # the same bytes, 1-d
    assert loop.native_counts == (1, 1)


def test_memo_step_keeps_only_read_only_arrays():
    with pytest.raises(ValueError, match="read-only array"):
        _native.MemoStep([None], (np.zeros(2),))
    with pytest.raises(ValueError, match="expected input"):
        _native.MemoStep([("bytes", np.zeros(2))], (read_only([0]),))


def test_view_step_reshapes_inputs_of_its_shape_and_declines_others():
    step = _native.ViewStep((2, 3), (3, 2), 2)
    loop = _native.StepLoop([(lambda p, a: ["kernel"], None, (0, 1), ((0, 2),), (), step)], 3, (2,), None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = loop((x, None))[0]
    assert y.shape == (3, 2) and np.shares_memory(x, y)
    np.testing.assert_array_equal(y, x.reshape(3, 2))
    strided = np.arange(6, dtype=np.float32).reshape(3, 2).T
    y = loop((strided, None))[0]  # not C-contiguous: a copy, as the kernel's x.reshape makes
    assert not np.shares_memory(y, strided)
    np.testing.assert_array_equal(y, strided.reshape(3, 2))
    assert loop((np.zeros((3, 2), np.float32), None))[0] == "kernel"  # another shape
    assert loop((x, np.array([3, 2], np.int64)))[0] == "kernel"  # a runtime shape input it was not bound for
    assert loop.native_counts == (2, 2)


def test_view_step_with_a_runtime_shape_holds_it_to_the_bound_value():
    step = _native.ViewStep((2, 3), (3, 2), 2, [(1, np.array([3, 2], np.int64))])
    loop = _native.StepLoop([(lambda p, a: ["kernel"], None, (0, 1), ((0, 2),), (), step)], 3, (2,), None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert loop((x, np.array([3, 2], np.int64)))[0].shape == (3, 2)
    assert loop((x, np.array([3, -1], np.int64)))[0] == "kernel"  # the same result, another value: declined
    assert loop((x, np.array([3, 2], np.int32)))[0] == "kernel"  # another dtype
    assert loop((x, None))[0] == "kernel"  # omitted
    assert loop.native_counts == (1, 3)


# --- what a step binds to ------------------------------------------------------------------------------------

def test_shape_plumbing_binds_to_shape_and_memo_steps_data_movement_to_views_and_the_rest_to_nothing():
    big = np.zeros((64, 64), np.float32)
    idx = np.array([0], np.int64)
    shape = np.array([64, 64], np.int64)
    assert isinstance(bind("Shape", [big], [shape]), _native.ShapeStep)  # any input shape: nothing kept
    assert isinstance(bind("Gather", [shape, idx], [shape[:1]]), _native.MemoStep)
    assert isinstance(bind("Unsqueeze", [big, None], [big[None]]), _native.ViewStep)
    assert isinstance(bind("Identity", [big], [big]), _native.ViewStep)
    assert bind("Relu", [big], [big]) is None  # a large runtime input: not memoized
    assert isinstance(bind("Reshape", [big, shape], [big]), _native.ViewStep)  # held to the shape's value
    assert bind("Reshape", [big, big.reshape(-1)[:17]], [big]) is None  # a runtime operand too large for a shape
    assert bind("If", [np.array(True)], [idx]) is None  # never memoized: a branch may hold a random op
    assert bind("RandomUniformLike", [idx], [idx]) is None
    assert bind("Shape", [big], [[64, 64]]) is None  # outputs must be arrays
    assert isinstance(bind("Unsqueeze", [big.T, None], [big.T[None]]), _native.ViewStep)  # numpy's reshape
    # a small value computed from the data is never memoized, even if it repeats; Shape needs only the shape
    assert bind("Gather", [shape, idx], [shape[:1]], shape_derived=False) is None
    assert isinstance(bind("Shape", [big], [shape], shape_derived=False), _native.ShapeStep)
    # a shape-derived value a view also computes: the memo first, the view for the values it declines
    assert isinstance(bind("Squeeze", [shape[:1], None], [shape[:1].reshape(())]), _native.FirstOfSteps)


def test_a_range_of_positions_over_a_long_context_is_memoized_and_a_larger_output_is_not():
    limit = np.array(4097, np.int64)  # a decoder's positions at 4K tokens: 32 KB of int64
    zero, one = np.array(0, np.int64), np.array(1, np.int64)
    assert isinstance(bind("Range", [zero, limit, one], [np.arange(4097)]), _native.MemoStep)
    assert bind("Range", [zero, np.array(9000, np.int64), one], [np.arange(9000)]) is None  # over 64 KB kept


def test_a_memoized_output_is_a_read_only_copy():
    x = np.array([1.0, 2.0], np.float32)
    step = bind("Identity", [x[::-1]], [x[::-1]])  # not C-contiguous: memo, not a view
    loop = _native.StepLoop([(lambda p, a: ["kernel"], None, (0,), ((0, 1),), (), step)], 2, (1,), None)
    out = loop((np.array([2.0, 1.0], np.float32),))[0]
    assert not out.flags.writeable and not np.shares_memory(out, x)
    x[:] = 0  # the array the kernel returned changes: the kept copy does not
    np.testing.assert_array_equal(out, [2.0, 1.0])


# --- programs running them ----------------------------------------------------------------------------------

def compiled(model):
    nodes = nodes_from_model(model)
    inputs, outputs = boundary(list(range(len(nodes))), nodes)
    return compile_partition("p", nodes, inputs, outputs, Target.load("npu-ref"))


def plumbing_model():
    """y = relu(reshape(x, [shape(x)[0], -1])) + 1, the torch-export way of flattening."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"], name="reshape"),
             helper.make_node("Relu", ["flat"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "one"], ["y"], name="add")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["b", 3, 4])],
                      [helper.make_tensor_value_info("y", F32, ["b", 12])],
                      {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
                       "minus1": np.array([-1], np.int64), "one": np.array(1.0, np.float32)})


def test_a_program_runs_its_shape_plumbing_as_native_steps_with_the_cpu_eps_results():
    model = plumbing_model()
    program = compiled(model)
    rng = np.random.default_rng(0)
    for batch in (2, 5, 2):  # two signatures, each bound after its first call
        for _ in range(3):
            x = rng.standard_normal((batch, 3, 4)).astype(np.float32)
            np.testing.assert_array_equal(program(x)[0], cpu_run(model, {"x": x})[0])
    assert set(program._bound) == {((2, 3, 4),), ((5, 3, 4),)}
    loop = program._bound[((2, 3, 4),)]
    assert loop.native_steps >= 4  # Shape, Gather, Unsqueeze, Concat at least
    runs, declines = loop.native_counts
    assert runs >= 4 * 3 and declines == 0


def test_small_data_values_are_not_memoized_even_when_a_caller_repeats_them():
    """A chain of element-wise steps on a [1, 8] activation fed the same values on every call: the steps run."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), helper.make_node("Neg", ["a"], ["b"], name="n0"),
             helper.make_node("Shape", ["b"], ["s"], name="shape"), helper.make_node("Cast", ["s"], ["sf"], name="cast",
                                                                                    to=TensorProto.FLOAT)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 8])],
                       [helper.make_tensor_value_info("b", F32, [1, 8]), helper.make_tensor_value_info("sf", F32, [2])])
    program = compiled(model)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    for _ in range(3):
        program(x)
    (natives,) = program._bindings.values()
    kinds = {st.op: type(n).__name__ if n is not None else None for st, n in zip(program.steps, natives)}
    # Relu and Neg, one element-wise chain (kernels/fusion/eltwise_chain.py), call the engine on every call
    # (CallStep): it keeps no output; Shape reads the dims, the Cast of them is kept (then its kernel's step)
    assert kinds == {"npu::ElementwiseChain": "CallStep", "Shape": "ShapeStep", "Cast": "FirstOfSteps"}


def data_dependent_model():
    """y = x reshaped by a runtime shape input, and the shape of m[start:end] (runtime bounds): the same input
    shapes give other output shapes."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
             helper.make_node("Slice", ["m", "start", "end"], ["part"], name="slice"),
             helper.make_node("Shape", ["part"], ["count"], name="count")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 6]),
                              helper.make_tensor_value_info("shape", I64, [2]),
                              helper.make_tensor_value_info("m", F32, [32]),
                              helper.make_tensor_value_info("start", I64, [1]),
                              helper.make_tensor_value_info("end", I64, [1])],
                      [helper.make_tensor_value_info("y", F32, [None, None]),
                       helper.make_tensor_value_info("count", I64, [1])])


def test_bound_steps_decline_when_a_shape_depends_on_data():
    model = data_dependent_model()
    program = compiled(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    m = np.arange(32, dtype=np.float32)
    feeds = [{"x": x, "shape": np.array([3, 4], np.int64), "start": np.array([0]), "end": np.array([20])},
             {"x": x, "shape": np.array([4, 3], np.int64), "start": np.array([3]), "end": np.array([9])},
             {"x": x, "shape": np.array([3, 4], np.int64), "start": np.array([5]), "end": np.array([5])}]
    names = [io.name for io in program.inputs]
    for _ in range(2):
        for f in feeds:
            f = {**f, "m": m}
            got = dict(zip([io.name for io in program.outputs], program(*[f[n] for n in names])))
            want = dict(zip(["y", "count"], cpu_run(model, f)))
            for name, value in want.items():
                np.testing.assert_array_equal(got[name], value)
    loop = next(iter(program._bound.values()))
    assert loop.native_counts[1] > 0  # the bound Reshape and Shape declined the other values


def growing_past_model():
    """present = concat(past, relu(x)) along the sequence, y = -relu(x): a decoder's KV cache in miniature, whose
    past is one longer on every call (a new input-shape signature every token)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Neg", ["r"], ["y"], name="neg"),
             helper.make_node("Concat", ["past", "r"], ["present"], name="concat", axis=1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 1, 8]),
                              helper.make_tensor_value_info("past", F32, [1, "p", 8])],
                      [helper.make_tensor_value_info("y", F32, [1, 1, 8]),
                       helper.make_tensor_value_info("present", F32, [1, None, 8])])


def test_a_growing_past_reuses_the_native_steps_and_costs_of_steps_whose_inputs_did_not_change():
    """Each new past length is a first call. The first signature is observed and binds native steps; the later
    ones are scouted (``Program._scout``): the steps' latest native steps run them, so Relu and Neg, whose inputs
    did not change, run natively in that first call already, while Concat's native step declines the longer past
    and its kernel runs (the first such decline binds Concat for that past at once). A scouted signature with a
    decline observes on its second call and binds Concat for its own past; from the third call on no kernel runs.
    Results stay the CPU EP's, and no cost is computed until asked for."""
    model = growing_past_model()
    program = compiled(model)
    names = [io.name for io in program.inputs]
    kernel_runs = count_kernel_runs(program)
    rng = np.random.default_rng(0)
    feeds, past = [], np.zeros((1, 0, 8), np.float32)
    for _ in range(5):
        feeds.append({"x": rng.standard_normal((1, 1, 8)).astype(np.float32), "past": past})
        past = cpu_run(model, feeds[-1])[1]

    def one_pass():
        for f in feeds:
            for g, w in zip(program(*[f[n] for n in names]), cpu_run(model, f)):
                np.testing.assert_array_equal(g, w)

    one_pass()
    assert kernel_runs == {"Relu": 1, "Neg": 1, "Concat": 5}
    assert len(program._bindings) == 1 and len(program._pending) == 4  # Concat declined each longer past
    ops = [st.op for st in program.steps]
    sigs = list(program._signatures)
    # no signature's cost is computed until asked for (a growing past would pay it every token)
    assert all(st.cost is None and st.step_shapes is not None for st in program._signatures.values())
    cost_first, cost_last = program.cost_for(sigs[0]).steps, program.cost_for(sigs[-1]).steps
    assert cost_first[ops.index("Relu")] is cost_last[ops.index("Relu")]
    assert cost_first[ops.index("Concat")] is not cost_last[ops.index("Concat")]
    # the scouted signatures' second calls observe: the second past's Concat was bound in its scout (its first
    # decline), the later ones (declined in a row: inputs that change every call) run their kernel and are bound now
    one_pass()
    assert kernel_runs == {"Relu": 1, "Neg": 1, "Concat": 8}
    assert len(program._bindings) == 5 and not program._pending
    first, last = next(iter(program._bindings.values())), list(program._bindings.values())[-1]
    for op in ("Relu", "Neg"):
        assert first[ops.index(op)] is not None and first[ops.index(op)] is last[ops.index(op)]
    assert first[ops.index("Concat")] is not last[ops.index("Concat")]
    one_pass()
    assert kernel_runs == {"Relu": 1, "Neg": 1, "Concat": 8}


def test_a_session_whose_past_grows_every_call_runs_the_earlier_native_steps_on_npu_ep():
    """The same through ORT (its calls reach the program's C++ path, which observes each new signature): every
    node on NpuEP, the CPU EP's results, and Relu's Python kernel ran on the first call only."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from tests.npu_testing import assignment, npu_session, session_options

    model = growing_past_model()
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (program,) = session_of(sess).programs.values()
    kernel_runs = count_kernel_runs(program)
    rng = np.random.default_rng(1)
    past = np.zeros((1, 0, 8), np.float32)
    for _ in range(6):
        feeds = {"x": rng.standard_normal((1, 1, 8)).astype(np.float32), "past": past}
        want = cpu_run(model, feeds)
        for got, w in zip(sess.run(None, feeds), want):
            np.testing.assert_array_equal(got, w)
        past = want[1]
    assert len(program.signatures) == 6 and kernel_runs["Relu"] == 1


def growing_mask_model():
    """A decoder's attention-mask plumbing (what GroupQueryAttention reads), over a mask one longer every token:
    seqlens_k = int32(ReduceSum(mask, 1) - 1), past = int32(Shape(mask)[1] - 1), total = int32(Squeeze(Shape(mask,
    start=-1)))."""
    i32 = TensorProto.INT32
    nodes = [helper.make_node("ReduceSum", ["mask", "axis1"], ["sum"], name="sum", keepdims=0),
             helper.make_node("Sub", ["sum", "one"], ["seqlens"], name="sub_sum"),
             helper.make_node("Cast", ["seqlens"], ["seqlens_k"], name="cast_sum", to=i32),
             helper.make_node("Shape", ["mask"], ["dims"], name="shape"),
             helper.make_node("Gather", ["dims", "one_scalar"], ["length"], name="gather", axis=0),
             helper.make_node("Sub", ["length", "one_scalar"], ["past64"], name="sub_length"),
             helper.make_node("Cast", ["past64"], ["past"], name="cast_past", to=i32),
             helper.make_node("Shape", ["mask"], ["last"], name="shape_last", start=-1),
             helper.make_node("Squeeze", ["last", "axis0"], ["total64"], name="squeeze"),
             helper.make_node("Cast", ["total64"], ["total"], name="cast_total", to=i32)]
    return make_model(nodes, [helper.make_tensor_value_info("mask", I64, ["B", "L"])],
                      [helper.make_tensor_value_info("seqlens_k", i32, [1]),
                       helper.make_tensor_value_info("past", i32, []),
                       helper.make_tensor_value_info("total", i32, [])],
                      {"axis1": np.array([1], np.int64), "axis0": np.array([0], np.int64),
                       "one": np.array([1], np.int64), "one_scalar": np.array(1, np.int64)})


def test_a_mask_one_longer_every_call_runs_no_python_kernel_after_the_first_call():
    """Shape binds a step that reads any input's dims, ReduceSum one bound for the kept dims and any reduced length,
    and the memos of the values computed from the shape (Gather, Sub, Cast, Squeeze) fall through to the kernels'
    own steps (or a view) for values they were not bound for: a new mask length is a scouted first call in which
    every native step takes its inputs, so no kernel runs after the first call and no later call observes."""
    model = growing_mask_model()
    program = compiled(model)
    names = [io.name for io in program.outputs]
    kernel_runs = count_kernel_runs(program)
    for length in range(1, 9):
        mask = np.ones((1, length), np.int64)
        mask[0, :length // 3] = 0  # left padding: the sum is not the length
        got = dict(zip(names, program(mask)))
        for name, want in zip(["seqlens_k", "past", "total"], cpu_run(model, {"mask": mask})):
            assert got[name].dtype == want.dtype and got[name].shape == want.shape
            np.testing.assert_array_equal(got[name], want)
        if length == 1:
            first = sum(kernel_runs.values())
    assert sum(kernel_runs.values()) == first == len(program.steps)
    assert len(program._bindings) == 1 and not program._pending  # every later length was kept at its scout
    # the bound ReduceSum still declines another kept extent (two rows): its kernel runs, with the CPU EP's results
    mask = np.ones((2, 5), np.int64)
    assert program(mask)[0].tolist() == cpu_run(model, {"mask": mask})[0].tolist()
    assert kernel_runs["ReduceSum"] == 2


def test_a_shape_step_reads_the_dims_of_any_input_clamped_as_onnx_says():
    x = np.zeros((2, 3, 4), np.float32)
    for start, end in [(0, None), (1, None), (-2, None), (0, -1), (1, 2), (-9, 9), (2, 1), (3, None)]:
        (dims,) = _native.ShapeStep(start, end).run((x,))
        want = np.array(x.shape[slice(start, end)], np.int64)
        assert dims.dtype == np.int64 and dims.tolist() == want.tolist(), (start, end)
    assert _native.ShapeStep().run((np.zeros((), np.int8),))[0].shape == (0,)
    assert _native.ShapeStep().run((np.zeros((5, 0), np.float16)[:, ::1],))[0].tolist() == [5, 0]
    assert _native.ShapeStep().run((np.zeros(3), np.zeros(3))) is None  # Shape has one input


# --- a call step's call: keywords, no Python frame between the loop and a ufunc -----------------------------------

def _call_step(fn, args, inputs, keywords=()):
    counter = np.zeros(1, np.int64)
    return _native.CallStep(fn, args, inputs, [(-1, None)], [(counter, 0)], [], [], keywords)


def test_a_call_steps_last_arguments_go_by_their_keywords():
    x, y = np.array([1.0, -2.0, 3.0], np.float32), np.array([0.5, 0.5, 4.0], np.float32)
    step = _call_step(np.maximum, (None, None, None), [(0, 0, x.dtype, x.shape, None), (1, 1, y.dtype, y.shape, None)],
                      keywords=("out",))  # np.maximum deprecates a positional out
    (got,) = step.run((x, y))
    np.testing.assert_array_equal(got, np.maximum(x, y))
    assert got is not x and got is not y
    with pytest.raises(ValueError, match="more keywords than arguments"):
        _call_step(np.maximum, (None,), [], keywords=("a", "b"))
    with pytest.raises(TypeError, match="a keyword is a str"):
        _call_step(np.maximum, (None, None), [], keywords=(1,))


def _python_calls(fn) -> int:
    """Python functions entered while fn runs (a C function called from C, such as a ufunc from a step, is none)."""
    import sys

    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return len([c for c in calls if c != "<lambda>"])


@pytest.mark.parametrize("op", ["Add", "Abs", "Relu", "Clip"])
def test_a_bound_float32_ufunc_step_runs_no_python_and_gives_the_kernels_result(op):
    """Float32 Add/Abs bind their ufunc and Relu/Clip the clip ufunc with out= passed by keyword: the step calls the
    ufunc itself (a Python wrapper passing out= cost a frame per call, ~0.3 us of a one-node run)."""
    x = np.array([[1.5, -2.0, 0.0, np.inf, -np.inf, np.nan]], np.float32)
    args = [x, x] if op == "Add" else [x]
    names = ["a", "b"][:len(args)]
    bounds = {"lo": np.array(-1.0, np.float32), "hi": np.array(1.0, np.float32)} if op == "Clip" else {}
    node = helper.make_node(op, names + list(bounds), ["y"], name="n")
    model = make_model([node], [helper.make_tensor_value_info(n, F32, list(a.shape)) for n, a in zip(names, args)],
                       [helper.make_tensor_value_info("y", F32, list(x.shape))], bounds)
    program = compiled(model)
    program(*args)  # the first call binds
    (step,) = [s for s in program._bindings[tuple(a.shape for a in args)] if s is not None]
    assert _python_calls(lambda: step.run(tuple(args))) == 0
    np.testing.assert_array_equal(step.run(tuple(args))[0], cpu_run(model, dict(zip(names, args)))[0])


@pytest.mark.parametrize("op", ["Add", "Relu"])
def test_one_node_float32_sessions_on_the_keyword_steps_match_the_cpu_ep(op):
    """The steps write a partition output into ORT's buffer (out= by keyword); every run equals the CPU EP's, NaN,
    infinities and -0 included, and NpuEP ran the node."""
    from tests.npu_testing import assignment, npu_session

    x = np.array([[1.5, -2.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -1e-40]], np.float32)
    names = ["a", "b"] if op == "Add" else ["a"]
    model = make_model([helper.make_node(op, names, ["y"], name="n")],
                       [helper.make_tensor_value_info(n, F32, list(x.shape)) for n in names],
                       [helper.make_tensor_value_info("y", F32, list(x.shape))])
    feeds = {n: x if i == 0 else x[:, ::-1].copy() for i, n in enumerate(names)}
    sess = npu_session(model, cpu=False)
    assert assignment(sess) == {"n": "NpuEP"}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the first run binds, the others run the bound step into ORT's buffer
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)


def test_a_step_is_numpy_free_when_it_calls_a_cpp_kernel_given_no_callable():
    """ProgramCall sets numpy's error state only before a step that may reach numpy's arithmetic: a C++ kernel
    (a pybind11 function) given no callable, a view, kept values and a shape are numpy-free; a ufunc, a Python
    function, or a C++ kernel handed a ufunc to call (np.matmul) are not; FirstOfSteps only when all of its are."""
    from npu_ep.kernels.runtime import native_module

    nat = native_module()
    x = np.ones((2, 3), np.float32)
    ins = [(0, 0, x.dtype, x.shape, None)]
    cpp, ufunc = _call_step(nat.transpose, (None, (1, 0), None, 1), ins), _call_step(np.negative, (None,), ins)
    assert cpp.numpy_free and not ufunc.numpy_free
    assert not _call_step(lambda a: a, (None,), ins).numpy_free
    assert not _call_step(nat.float_matmul, (np.matmul, None, x.T.copy()), ins).numpy_free
    assert _native.ViewStep([2, 3], [6], 1).numpy_free and _native.ShapeStep().numpy_free
    assert _native.MemoStep([None], (read_only([1]),)).numpy_free
    assert _native.FirstOfSteps([cpp]).numpy_free and not _native.FirstOfSteps([cpp, ufunc]).numpy_free


def test_a_hot_call_sets_numpy_error_state_at_the_first_step_that_needs_it():
    """Transpose (a C++ kernel) runs before numpy's error state is set, Div (a ufunc) after it is: the caller's
    "raise" neither reaches the division by zero nor is lost, and the results are the CPU EP's."""
    nodes = [helper.make_node("Transpose", ["a"], ["t"], name="t", perm=[1, 0]),
             helper.make_node("Div", ["t", "b"], ["y"], name="d")]
    model = make_model(nodes, [helper.make_tensor_value_info("a", F32, [2, 2]),
                               helper.make_tensor_value_info("b", F32, [2, 2])],
                       [helper.make_tensor_value_info("y", F32, [2, 2])])
    feeds = {"a": np.array([[1.0, 0.0], [-1.0, 2.0]], np.float32), "b": np.array([[0.0, 0.0], [0.0, 4.0]], np.float32)}
    program = compiled(model)
    program(feeds["a"], feeds["b"])  # the first call binds: the next ones take the hot path
    steps = program._bindings[((2, 2), (2, 2))]
    assert [s.numpy_free for s in steps] == [True, False]
    with np.errstate(all="raise"):
        for _ in range(2):
            y = program(feeds["a"], feeds["b"])[0]
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
    np.testing.assert_array_equal(y, cpu_run(model, feeds)[0])
