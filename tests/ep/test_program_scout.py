"""A new signature's first call scouted on the steps' latest native steps (``Program._scout``) keeps every step's
input shapes for the cost model, packed by the native loop (``StepLoop.scout``) until the cost is asked for: a bytes
object per step, the previous scout's when that step's shapes did not change."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.compiler import compile_partition
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.partition import boundary
from npu_ep.ep.program import _step_shapes
from npu_ep.kernels.target import Target
from tests.npu_testing import cpu_run, make_model

F32 = TensorProto.FLOAT


def plumbing_model():
    """y = relu(reshape(x, [shape(x)[0], -1])) + 1: rank-0, rank-1 and rank-3 step inputs and constant ones."""
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


def step_shapes(program, inputs):
    """Every step's input shapes (None: a constant, an omitted input) from a walk of the steps' kernels."""
    env = [None] * (program.n_slots + 1)  # the extra last slot stays None: in_slots -1 read it
    env[: len(inputs)] = inputs
    shapes = []
    with np.errstate(all="ignore"):
        for step in program.steps:
            args = tuple(env[s] for s in step.in_slots)
            shapes.append([a.shape if isinstance(a, np.ndarray) else None for a in args])
            for i, out in enumerate(step.kernel.run(step.prepared, args)):
                if step.out_slots[i] >= 0:
                    env[step.out_slots[i]] = out
    return shapes


def test_a_scouted_signature_keeps_the_step_shapes_an_observed_call_sees():
    model = plumbing_model()
    nodes = nodes_from_model(model)
    inputs, outputs = boundary(list(range(len(nodes))), nodes)
    program = compile_partition("p", nodes, inputs, outputs, Target.load("npu-ref"))
    rng = np.random.default_rng(0)
    kept = {}
    for batch in (2, 5, 1, 300, 301):  # the first observed, the others scouted (300: a dim beyond the small ints)
        x = rng.standard_normal((batch, 3, 4)).astype(np.float32)
        np.testing.assert_array_equal(program(x)[0], cpu_run(model, {"x": x})[0])
        state = program._signatures[((batch, 3, 4),)]
        want = step_shapes(program, (x,))
        if batch != 2:
            assert isinstance(state.step_shapes, tuple) and all(isinstance(s, bytes) for s in state.step_shapes)
            assert [_step_shapes(s) for s in state.step_shapes] == want
            kept[batch] = state.step_shapes
        assert program.cost_for(((batch, 3, 4),)).cycles == program._cost(want).cycles
        assert state.step_shapes is None  # unpacked once, then the cost is kept
    # a step whose input shapes did not change between two scouts has the same object (Concat's: [(1,), (1,)])
    ops = [st.op for st in program.steps]
    assert kept[300][ops.index("Concat")] is kept[301][ops.index("Concat")]
    assert kept[300][ops.index("Reshape")] is not kept[301][ops.index("Reshape")]


def test_evicted_scouted_signatures_are_priced_only_when_emulated_time_is_asked_for():
    """A decoder whose past grows beyond SIGNATURES_KEPT evicts a signature every token: its emulated time waits
    (per step and shapes) until asked for instead of running the cost model on the token's call."""
    from npu_ep.ep.program import SIGNATURES_KEPT

    model = plumbing_model()
    nodes = nodes_from_model(model)
    inputs, outputs = boundary(list(range(len(nodes))), nodes)
    program = compile_partition("p", nodes, inputs, outputs, Target.load("npu-ref"))
    priced = []
    step_cost = program._step_cost
    program._step_cost = lambda step, shapes: priced.append(step) or step_cost(step, shapes)
    xs = [np.full((batch, 3, 4), batch, np.float32) for batch in range(1, SIGNATURES_KEPT + 11)]
    for x in xs:
        program(x)
        program(x)  # a second, hot call: counted in the evicted totals too
    assert program.evicted_signatures == 10 and not priced and program._unpriced
    want = sum(program._cost(step_shapes(program, (x,))).seconds * 2 for x in xs)
    assert program.emulated_seconds() == pytest.approx(want, rel=1e-12)
    assert not program._unpriced and program.calls == 2 * len(xs)
