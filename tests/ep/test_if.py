"""An ``If`` with a branch the NPU cannot run entirely (here a Tan in the nested If's then branch) runs on the CPU
EP, and ORT hands each branch to NpuEP as a graph of its own: the branch nodes are compiled as NpuEP partitions,
whichever branch is taken (Ifs whose branches all run on the NPU are claimed whole: test_if_claimed.py). Exporter
branches are full of scalars (a Gather with a 0-d index, 0-d constants), outer-scope values, branch-local
initializers and nested Ifs."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from onnx import helper, numpy_helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session

RNG = np.random.default_rng(13)


def _branch(name: str, nodes, out: str, initializers=()):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F32, None)],
                             [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])


def if_model(unsupported: bool = True):
    """cond = sum(x) > 0; then: x[:, 0] * 2 + local bias (0-d index and constant, a branch-local initializer);
    else: a nested If on the same cond (then: x[:, 1] - h, else: Relu(h)), h computed outside on NpuEP."""
    inner = helper.make_node(
        "If", ["c"], ["e_out"], name="inner_if",
        then_branch=_branch("inner_then", [
            helper.make_node("Gather", ["x", "one_i"], ["it_g"], axis=1, name="inner_gather"),
            helper.make_node("Sub", ["it_g", "h"], ["it_s" if unsupported else "it_out"], name="inner_sub"),
            *([helper.make_node("Tan", ["it_s"], ["it_out"], name="inner_tan")] if unsupported else [])],
            "it_out", [("one_i", np.array(1))]),
        else_branch=_branch("inner_else", [helper.make_node("Relu", ["h"], ["ie_out"], name="inner_relu")], "ie_out"))
    then_branch = _branch("then", [
        helper.make_node("Gather", ["x", "zero_i"], ["t_g"], axis=1, name="then_gather"),
        helper.make_node("Mul", ["t_g", "two"], ["t_m"], name="then_mul"),
        helper.make_node("Add", ["t_m", "bias"], ["t_out"], name="then_add")], "t_out",
        [("zero_i", np.array(0)), ("two", np.array(2.0, np.float32)), ("bias", np.array([0.5], np.float32))])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
             helper.make_node("ReduceMean", ["x"], ["h"], axes=[1], keepdims=0, name="mean"),
             helper.make_node("If", ["c"], ["y0"], name="outer_if", then_branch=then_branch,
                              else_branch=_branch("else", [inner], "e_out")),
             helper.make_node("Mul", ["y0", "scale"], ["y"], name="post")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 8])],
                      [helper.make_tensor_value_info("y", F32, ["N"])],
                      {"zero": np.array(0.0, np.float32), "scale": np.array(3.0, np.float32)}, opset=17)


BRANCH_NODES = {"then_gather", "then_mul", "then_add", "inner_gather", "inner_sub", "inner_relu"}


@pytest.mark.parametrize("sign", [1.0, -1.0])  # +: the then branch runs; -: the nested If's then branch
def test_if_branches_run_on_npu_and_match_cpu(sign):
    model = if_model()
    sess = npu_session(model)
    where = assignment(sess)
    assert {n for n in BRANCH_NODES if where.get(n) == "NpuEP"} == BRANCH_NODES, where
    assert where["outer_if"] == where["inner_if"] == "CPUExecutionProvider"  # control flow stays on the CPU EP
    x = (np.abs(RNG.standard_normal((3, 8))) * sign).astype(np.float32)
    got, ref = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    assert got.shape == ref.shape == (3,)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_if_decline_is_one_reason_per_session(caplog):
    """The If nodes' decline appears once in the session's report, with both names, not once per branch graph."""
    with caplog.at_level("WARNING", logger="npu_ep"):
        npu_session(if_model())
    reports = [r.getMessage() for r in caplog.records if "stay on the CPU" in r.getMessage()]
    assert len(reports) == 1, reports
    assert "outer_if" in reports[0] and "inner_if" in reports[0] and "inner_tan" in reports[0]
    assert "the If stays on the CPU EP" in reports[0]


SILERO = importlib.util.find_spec("silero_vad")


@pytest.mark.skipif(SILERO is None, reason="silero_vad is not installed")
def test_silero_vad_if_branch_matches_cpu():
    """The speech model of issue 13: its sample-rate If (branches full of scalar plumbing) is claimed whole, so
    the model is one NpuEP partition."""
    path = os.path.join(os.path.dirname(SILERO.origin), "data", "silero_vad.onnx")
    feeds = {"input": (RNG.standard_normal((1, 512)) * 0.1).astype(np.float32),
             "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    sess = npu_session(path)
    assert set(assignment(sess).values()) == {"NpuEP"}, assignment(sess)
    assert len(npu_partitions(sess)) == 1
    for got, ref in zip(sess.run(None, feeds), cpu_run(path, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
