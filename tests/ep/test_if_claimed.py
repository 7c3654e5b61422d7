"""An ``If`` whose branches run entirely on the NPU is claimed in the graph holding it and its branches are
compiled into programs the If step selects at run time (kernels/ops/control_flow.py): the branch graphs claim
nothing of their own, and the model stays one partition. A branch with an op the NPU does not run keeps the old
split (test_if.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from npu_testing import F32, assignment, count_kernel_runs, cpu_run, make_model, npu_partitions, npu_session
from test_if import if_model

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("sign", [1.0, -1.0])  # +: then branch; -: else branch, the nested If's else branch
def test_nested_if_with_outer_scope_values_is_one_partition(sign):
    """Outer If + nested If, branches reading outer-scope x and h (h computed in the same partition) and
    branch-local 0-d initializers: one partition, both Ifs inside it, outputs equal to the CPU EP's."""
    model = if_model(unsupported=False)
    sess = npu_session(model)
    where = assignment(sess)
    assert where == {n: "NpuEP" for n in ("sum", "greater", "mean", "outer_if", "post")}, where
    assert len(npu_partitions(sess)) == 1
    x = (np.abs(RNG.standard_normal((3, 8))) * sign).astype(np.float32)
    got, ref = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def _branch(name, nodes, out):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F32, None)])


def _select_model(then_op: str):
    """y = If(cond, then: then_op(x) * w, else: x - w); cond and the outer-scope weight w are graph inputs."""
    nodes = [helper.make_node("If", ["cond"], ["y"], name="the_if",
                              then_branch=_branch("then", [helper.make_node(then_op, ["x"], ["t"], name="then_op"),
                                                           helper.make_node("Mul", ["t", "w"], ["t_out"],
                                                                            name="then_mul")], "t_out"),
                              else_branch=_branch("else", [helper.make_node("Sub", ["x", "w"], ["e_out"],
                                                                            name="else_sub")], "e_out"))]
    return make_model(nodes, [helper.make_tensor_value_info("cond", 9, []),
                              helper.make_tensor_value_info("x", F32, [2, 5]),
                              helper.make_tensor_value_info("w", F32, [5])],
                      [helper.make_tensor_value_info("y", F32, [2, 5])])


@pytest.mark.parametrize("cond", [True, False])
def test_graph_input_condition_and_outer_scope_inputs(cond):
    model = _select_model("Relu")
    sess = npu_session(model)
    assert assignment(sess) == {"the_if": "NpuEP"}
    feeds = {"cond": np.array(cond), "x": RNG.standard_normal((2, 5)).astype(np.float32),
             "w": RNG.standard_normal(5).astype(np.float32)}
    np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_branch_with_unsupported_op_keeps_the_if_on_cpu():
    """Near miss: Tan is not on the target, so the If stays on the CPU EP and the branches' supported nodes are
    NpuEP partitions of their own, as before."""
    model = _select_model("Tan")
    sess = npu_session(model)
    where = assignment(sess)
    assert where["the_if"] == where["then_op"] == "CPUExecutionProvider", where
    assert where["then_mul"] == where["else_sub"] == "NpuEP", where
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": RNG.standard_normal((2, 5)).astype(np.float32),
                 "w": RNG.standard_normal(5).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_claimed_if_loads_from_the_compile_cache(tmp_path):
    """The branch programs are stored inside the If step (plain parts): a second session loads the partition from
    the cache without compiling, takes either branch and matches the CPU EP; a changed branch constant misses."""
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    model = if_model(unsupported=False)
    sessions, stats = [], []
    for _ in range(2):
        before = set(LIVE_SESSIONS)
        sessions.append(npu_session(model, {"cache_dir": str(tmp_path)}))
        (ep,) = set(LIVE_SESSIONS) - before
        stats.append(dict(ep.compiled.stats))
    assert stats[0]["misses"] == 1 and stats[1]["hits"] == 1 and stats[1]["misses"] == 0, stats
    for sign in (1.0, -1.0):
        x = (np.abs(RNG.standard_normal((3, 8))) * sign).astype(np.float32)
        np.testing.assert_allclose(sessions[1].run(None, {"x": x})[0], cpu_run(model, {"x": x})[0],
                                   rtol=1e-6, atol=1e-6)
    changed = if_model(unsupported=False)
    then = next(a.g for a in changed.graph.node[3].attribute if a.name == "then_branch")  # outer_if's
    bias = next(t for t in then.initializer if t.name == "bias")
    bias.raw_data = np.array([1.5], np.float32).tobytes()
    before = set(LIVE_SESSIONS)
    sess = npu_session(changed, {"cache_dir": str(tmp_path)})  # noqa: F841 (keeps its EP alive)
    (ep,) = set(LIVE_SESSIONS) - before
    assert ep.compiled.stats["misses"] == 1, ep.compiled.stats


def test_branches_compiled_with_their_if_are_not_reported_as_declined(caplog):
    """Branch nodes compiled inside a claimed If run on NpuEP: no decline warning, no declined decision."""
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    before = set(LIVE_SESSIONS)
    with caplog.at_level("WARNING", logger="npu_ep"):
        sess = npu_session(if_model(unsupported=False))  # noqa: F841 (keeps its EP alive)
    assert not [r.getMessage() for r in caplog.records if "stay on the CPU" in r.getMessage()]
    (ep,) = set(LIVE_SESSIONS) - before
    assert len(ep.capabilities) == 5  # the four branch graphs (nested ones first), then the main graph
    assert all(not cap.declined for _, cap in ep.capabilities)
    assert all(not cap.partitions for graph, cap in ep.capabilities if graph["is_subgraph"])


@pytest.mark.parametrize("forwarding", [False, True])
def test_the_if_is_a_native_step_that_picks_either_branch(forwarding):
    """After a signature's first call the If runs as a native step (ep/native/control_flow_steps.cc): the C++ loop picks
    the branch and calls its program, so later calls of either branch run no If kernel in Python, and give the CPU
    EP's results. ``forwarding``: the else branch only returns an outer value (an exporter's pass-through)."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from tests.npu_testing import session_options

    model = _select_model("Relu")
    if forwarding:
        else_branch = next(a for a in model.graph.node[0].attribute if a.name == "else_branch")
        else_branch.g.CopyFrom(_branch("else", [helper.make_node("Identity", ["x"], ["e_out"], name="else_id")],
                                       "e_out"))
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_if": "NpuEP"}
    (program,) = session_of(sess).programs.values()
    kernel_runs = count_kernel_runs(program)
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    w = RNG.standard_normal(5).astype(np.float32)
    for cond in (True, False, True, False):
        feeds = {"cond": np.array(cond), "x": x, "w": w}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
    assert kernel_runs["If"] == 1  # the signature's first call; then the native step, either branch
    runs, declines = program.native_step_counts
    assert runs >= 3 and declines == 0


def test_a_new_signature_that_every_native_step_takes_is_kept_without_observing():
    """The If's native step takes inputs of any shape (each branch program keeps its own signatures), so a call with
    a new batch size is scouted (``Program._scout``): the program's latest native steps run it and the signature
    is kept on them at once; no call after the first observes, and no If kernel runs after the first call."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from tests.npu_testing import session_options

    model = _select_model("Relu")
    for vi in (model.graph.input[1], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_if": "NpuEP"}
    (program,) = session_of(sess).programs.values()
    kernel_runs, observed = count_kernel_runs(program), [0]
    observe = program._observe
    program._observe = lambda inputs: (observed.__setitem__(0, observed[0] + 1), observe(inputs))[1]
    program.rebind([io.name for io in program.inputs], [io.name for io in program.outputs])  # the hook's call
    w = RNG.standard_normal(5).astype(np.float32)
    for batch in (2, 3, 4, 3, 2, 4):
        for cond in (True, False):
            feeds = {"cond": np.array(cond), "x": RNG.standard_normal((batch, 5)).astype(np.float32), "w": w}
            np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
    assert kernel_runs["If"] == 1 and observed == [3]  # one observed call; batches 3 and 4 scouted once each
    assert len(program.signatures) == 3 and not program._pending


def test_a_branch_computes_the_partition_output_in_orts_buffer():
    """The If's output is the partition's: each branch's step computing it is marked with the If's ORT output (its
    kernel writes in place, the bridge copies nothing), the other steps are not; either branch gives the CPU EP's
    bits. An If whose output feeds another node of the partition marks no branch step."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from npu_ep.kernels import subprograms
    from tests.npu_testing import session_options

    def tagged(model):
        so = session_options()
        tag_session_options(so)
        return npu_session(model, so=so)

    def marks(program):
        (st,) = [st for st in program.steps if st.op == "If"]
        return {attr: {s.node_name: s.prepared.runtime.partition_outputs
                       for s in subprograms.program(st.prepared, attr).steps}
                for attr in ("then_branch", "else_branch")}

    model = _select_model("Relu")
    sess = tagged(model)
    (program,) = session_of(sess).programs.values()
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    w = RNG.standard_normal(5).astype(np.float32)
    for cond in (True, False, True, False):
        feeds = {"cond": np.array(cond), "x": x, "w": w}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
    assert marks(program) == {"then_branch": {"then_op": None, "then_mul": {0: 0}},
                              "else_branch": {"else_sub": {0: 0}}}
    model = if_model(unsupported=False)
    sess = tagged(model)
    (program,) = session_of(sess).programs.values()
    for sign in (1.0, -1.0):
        x = (np.abs(RNG.standard_normal((3, 8))) * sign).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert all(m is None for branch in marks(program).values() for m in branch.values())
