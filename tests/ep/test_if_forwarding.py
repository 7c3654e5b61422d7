"""An ``If`` branch that only forwards outer-scope values (Identity nodes, as exporters write pass-through branches)
is answered by the If step without a program call; the other branch still runs its program. Outputs equal the CPU
EP's either way, forwarded values reaching ORT directly and feeding later nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session

from npu_ep.ep.program import Program
from npu_ep.kernels.ops.control_flow import forwarded_inputs

RNG = np.random.default_rng(21)


def _graph(name, nodes, outs):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, F32, None) for o in outs])


def forwarding_model():
    """(y1, y2) = If(cond, then: (Identity(Identity(w)), Identity(x)), else: (Neg(w), Relu(x))); z = y2 + y1."""
    then_b = _graph("fwd_then", [helper.make_node("Identity", ["w"], ["t0"], name="id0"),
                                 helper.make_node("Identity", ["t0"], ["t1"], name="id1"),
                                 helper.make_node("Identity", ["x"], ["t2"], name="id2")], ["t1", "t2"])
    else_b = _graph("fwd_else", [helper.make_node("Neg", ["w"], ["e1"], name="neg"),
                                 helper.make_node("Relu", ["x"], ["e2"], name="relu")], ["e1", "e2"])
    nodes = [helper.make_node("If", ["cond"], ["y1", "y2"], name="the_if", then_branch=then_b, else_branch=else_b),
             helper.make_node("Add", ["y2", "y1"], ["z"], name="add")]
    return make_model(nodes, [helper.make_tensor_value_info("cond", 9, []),
                              helper.make_tensor_value_info("x", F32, [3, 5]),
                              helper.make_tensor_value_info("w", F32, [5])],
                      [helper.make_tensor_value_info("y1", F32, [5]), helper.make_tensor_value_info("z", F32, [3, 5])])


@pytest.mark.parametrize("cond", [True, False])
def test_forwarding_branch_skips_its_program_and_matches_cpu(cond, monkeypatch):
    model = forwarding_model()
    sess = npu_session(model)
    assert assignment(sess) == {"the_if": "NpuEP", "add": "NpuEP"}
    called: list[str] = []
    real = Program.__call__
    monkeypatch.setattr(Program, "__call__", lambda self, *a: called.append(self.name) or real(self, *a))
    feeds = {"cond": np.array(cond), "x": RNG.standard_normal((3, 5)).astype(np.float32),
             "w": RNG.standard_normal(5).astype(np.float32)}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)
    branch_calls = [n for n in called if "fwd_" in n or "branch" in n]
    if cond:
        assert branch_calls == [], f"the forwarding branch ran a program: {branch_calls}"
    else:
        assert len(branch_calls) == 1 and "else" in branch_calls[0], called


class _Step:
    def __init__(self, op, ins, outs):
        self.op, self.in_slots, self.out_slots = op, ins, outs


class _Program:
    def __init__(self, n_inputs, steps, outputs):
        self.inputs, self.steps, self.output_slots = [None] * n_inputs, steps, outputs


def test_forwarded_inputs_traces_identity_chains_and_refuses_compute():
    assert forwarded_inputs(_Program(2, [_Step("Identity", (1,), (2,)), _Step("Identity", (2,), (3,))],
                                     (3, 0, 3))) == (1, 0, 1)
    assert forwarded_inputs(_Program(1, [], (0,))) == (0,)
    assert forwarded_inputs(_Program(1, [_Step("Relu", (0,), (1,))], (1,))) is None
    assert forwarded_inputs(_Program(1, [_Step("Identity", (0,), (1,)), _Step("Neg", (1,), (2,))], (1,))) is None
    assert forwarded_inputs(_Program(1, [_Step("Identity", (-1,), (1,))], (1,))) is None  # a constant
