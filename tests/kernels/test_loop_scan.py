"""``Loop`` and ``Scan`` whose bodies run entirely on the NPU are claimed whole (kernels/ops/loop.py, scan.py): the
body is compiled into a program the node runs per iteration, the body graph claims nothing of its own, and ORT's
graph assignment shows the node on NpuEP. Outputs are compared with ORT's CPU EP on the same model. A body with an
op the NPU does not run keeps the node on the CPU EP with a reason naming that op."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from npu_testing import F32, assignment, count_kernel_runs, cpu_run, make_model, npu_partitions, npu_session

RNG = np.random.default_rng(31)
I64, BOOL = TensorProto.INT64, TensorProto.BOOL


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _graph(name, nodes, inputs, outputs, initializers=()):
    return helper.make_graph(nodes, name, inputs, outputs,
                             [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])


def counted_loop_model(body_op: str = "Tanh", *, with_cond: bool = False):
    """acc, ys = Loop(M, cond?, acc0): acc = body_op(acc * w + x) (x, w outer scope: graph input and initializer),
    ys stacks acc + i (the iteration number, cast) per iteration; with_cond: the body continues while
    sum(acc) < limit (limit an outer-scope graph input)."""
    nodes = [helper.make_node("Mul", ["acc_in", "w"], ["t0"], name="b_mul"),
             helper.make_node("Add", ["t0", "x"], ["t1"], name="b_add"),
             helper.make_node(body_op, ["t1"], ["acc_out"], name="b_act"),
             helper.make_node("Cast", ["i"], ["i_f"], to=F32, name="b_cast"),
             helper.make_node("Add", ["acc_out", "i_f"], ["y"], name="b_scan")]
    if with_cond:
        nodes += [helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0, name="b_sum"),
                  helper.make_node("Less", ["s", "limit"], ["cond_out"], name="b_less")]
    else:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond"))
    body = _graph("body", nodes, [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("acc_in", F32, [2, 3])],
                  [_vi("cond_out", BOOL, []), _vi("acc_out", F32, [2, 3]), _vi("y", F32, [2, 3])])
    inputs = [_vi("M", I64, []), _vi("acc0", F32, [2, 3]), _vi("x", F32, [2, 3])]
    if with_cond:
        inputs += [_vi("cond0", BOOL, []), _vi("limit", F32, [])]
    loop = helper.make_node("Loop", ["M", "cond0" if with_cond else "", "acc0"], ["acc", "ys"], name="loop", body=body)
    return make_model([loop], inputs, [_vi("acc", F32, [2, 3]), _vi("ys", F32, ["T", 2, 3])],
                      {"w": np.array([0.5, -1.0, 2.0], np.float32)}, opset=17)


def _feeds(m: int, **extra):
    return {"M": np.array(m, np.int64), "acc0": RNG.standard_normal((2, 3)).astype(np.float32),
            "x": RNG.standard_normal((2, 3)).astype(np.float32), **extra}


def _check(sess, model, feeds):
    got, want = sess.run(None, feeds), cpu_run(model, feeds)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.parametrize("m", [1, 5])
def test_counted_loop_with_scan_outputs_and_outer_scope_values(m):
    model = counted_loop_model()
    sess = npu_session(model)
    assert assignment(sess) == {"loop": "NpuEP"}  # the body graph claims nothing of its own
    assert len(npu_partitions(sess)) == 1
    got = _check(sess, model, _feeds(m))
    assert got[1].shape == (m, 2, 3)


def test_zero_iterations_return_the_initial_values_and_empty_scan_outputs():
    model = counted_loop_model()
    sess = npu_session(model)
    feeds = _feeds(0)
    acc, ys = _check(sess, model, feeds)
    np.testing.assert_array_equal(acc, feeds["acc0"])
    assert ys.shape == (0, 2, 3)


@pytest.mark.parametrize("limit, m", [(4.0, 50), (1e9, 7), (-1e9, 5)])  # cond ends it / M ends it / cond false
def test_while_loop_with_condition(limit, m):
    """The body's condition output decides the next iteration; M still bounds it; a false initial condition
    runs no iteration (-1e9: the feed's cond0 is False)."""
    model = counted_loop_model("Relu", with_cond=True)
    sess = npu_session(model)
    assert assignment(sess) == {"loop": "NpuEP"}
    feeds = _feeds(m, cond0=np.array(limit > -1e9), limit=np.array(limit, np.float32))
    feeds["x"] = np.abs(feeds["x"]) + 0.1  # Relu(acc * w + x) grows, so sum(acc) crosses the limit
    _check(sess, model, feeds)


def test_while_loop_without_trip_count():
    """M omitted: only the condition ends the loop (a constant True initial condition, stored with the node)."""
    body = _graph("body", [helper.make_node("Add", ["v_in", "step"], ["v_out"], name="b_add"),
                           helper.make_node("ReduceMax", ["v_out"], ["mx"], keepdims=0, name="b_max"),
                           helper.make_node("Less", ["mx", "stop"], ["cond_out"], name="b_less"),
                           helper.make_node("Mul", ["v_out", "v_out"], ["sq"], name="b_sq")],
                  [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("v_in", F32, [4])],
                  [_vi("cond_out", BOOL, []), _vi("v_out", F32, [4]), _vi("sq", F32, [4])],
                  [("step", np.array([1.0, 0.5, 0.25, 2.0], np.float32))])
    model = make_model([helper.make_node("Loop", ["", "true", "v0"], ["v", "sqs"], name="loop", body=body)],
                       [_vi("v0", F32, [4]), _vi("stop", F32, [])], [_vi("v", F32, [4]), _vi("sqs", F32, ["T", 4])],
                       {"true": np.array(True)})
    sess = npu_session(model)
    assert assignment(sess) == {"loop": "NpuEP"}
    got = _check(sess, model, {"v0": np.zeros(4, np.float32), "stop": np.array(9.0, np.float32)})
    assert got[1].shape == (5, 4)  # max grows by 2 per iteration: 2, 4, 6, 8, 10


def test_loop_with_nested_if_reading_outer_scope():
    """An If inside the body picks a branch per iteration (the first two take then); its branches read the
    loop-carried value and the outer-scope graph input x. Loop, body and If are all one NpuEP node."""
    then_b = _graph("then", [helper.make_node("Add", ["acc_in", "x"], ["t_out"], name="then_add")], [],
                    [_vi("t_out", F32, None)])
    else_b = _graph("else", [helper.make_node("Mul", ["acc_in", "x"], ["e_m"], name="else_mul"),
                             helper.make_node("Sub", ["e_m", "half"], ["e_out"], name="else_sub")], [],
                    [_vi("e_out", F32, None)], [("half", np.array(0.5, np.float32))])
    body = _graph("body", [helper.make_node("Cast", ["i"], ["i_f"], to=F32, name="b_cast"),
                           helper.make_node("Less", ["i_f", "two"], ["early"], name="b_early"),
                           helper.make_node("If", ["early"], ["acc_out"], name="b_if", then_branch=then_b,
                                            else_branch=else_b),
                           helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond")],
                  [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("acc_in", F32, [3])],
                  [_vi("cond_out", BOOL, []), _vi("acc_out", F32, [3])],
                  [("two", np.array(2.0, np.float32))])
    model = make_model([helper.make_node("Loop", ["M", "", "acc0"], ["acc"], name="loop", body=body)],
                       [_vi("M", I64, []), _vi("acc0", F32, [3]), _vi("x", F32, [3])], [_vi("acc", F32, [3])])
    sess = npu_session(model)
    assert assignment(sess) == {"loop": "NpuEP"}
    for m in (0, 1, 4):
        _check(sess, model, {"M": np.array(m, np.int64), "acc0": RNG.standard_normal(3).astype(np.float32),
                             "x": RNG.standard_normal(3).astype(np.float32)})


def test_body_with_unsupported_op_keeps_the_loop_on_cpu_with_a_reason():
    """Near miss: Tan is not on the target. The Loop stays on the CPU EP with a reason naming Tan; the body's other
    nodes are NpuEP partitions of their own, as for any subgraph."""
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    model = counted_loop_model("Tan")
    before = set(LIVE_SESSIONS)
    sess = npu_session(model)
    (ep,) = set(LIVE_SESSIONS) - before
    where = assignment(sess)
    assert where["loop"] == where["b_act"] == "CPUExecutionProvider", where
    assert where["b_mul"] == "NpuEP", where
    (loop,) = [d for _, cap in ep.capabilities for d in cap.decisions if d.node.name == "loop"]
    assert "its body holds a Tan node" in loop.reason and "stays on the CPU EP" in loop.reason, loop.reason
    _check(sess, model, _feeds(3))


def scan_model(in_axis: int = 0, in_dir: int = 0, out_axis: int = 0, out_dir: int = 0, *, length: int = 5):
    """state, ys = Scan(state0, xs): state = state * decay + x_t (decay outer scope), y_t = tanh(state) * x_t."""
    body = _graph("body", [helper.make_node("Mul", ["s_in", "decay"], ["t0"], name="b_mul"),
                           helper.make_node("Add", ["t0", "x_t"], ["s_out"], name="b_add"),
                           helper.make_node("Tanh", ["s_out"], ["t1"], name="b_tanh"),
                           helper.make_node("Mul", ["t1", "x_t"], ["y_t"], name="b_y")],
                  [_vi("s_in", F32, [4]), _vi("x_t", F32, [4])], [_vi("s_out", F32, [4]), _vi("y_t", F32, [4])])
    xs_shape = [length, 4] if in_axis in (0, -2) else [4, length]
    ys_shape = [length, 4] if out_axis in (0, -2) else [4, length]
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], name="scan", body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    return make_model([scan], [_vi("s0", F32, [4]), _vi("xs", F32, xs_shape), _vi("decay", F32, [4])],
                      [_vi("s", F32, [4]), _vi("ys", F32, ys_shape)]), xs_shape


@pytest.mark.parametrize("in_axis, in_dir, out_axis, out_dir", [
    (0, 0, 0, 0),      # forward
    (0, 1, 0, 0),      # reverse input
    (0, 1, 0, 1),      # reverse input and output
    (1, 0, 1, 1),      # scan along axis 1, output stacked on axis 1, reversed
    (-1, 1, -1, 0),    # negative axes
])
def test_scan_matches_cpu(in_axis, in_dir, out_axis, out_dir):
    model, xs_shape = scan_model(in_axis, in_dir, out_axis, out_dir)
    sess = npu_session(model)
    assert assignment(sess) == {"scan": "NpuEP"}
    feeds = {"s0": RNG.standard_normal(4).astype(np.float32), "xs": RNG.standard_normal(xs_shape).astype(np.float32),
             "decay": np.array([0.9, 0.5, -0.3, 1.0], np.float32)}
    _check(sess, model, feeds)


def test_scan_with_two_scanned_inputs_in_opposite_directions():
    """Two scanned inputs (one reversed) and no state: a bidirectional pairwise product per step."""
    body = _graph("body", [helper.make_node("Mul", ["a_t", "b_t"], ["p_t"], name="b_mul")],
                  [_vi("a_t", F32, [3]), _vi("b_t", F32, [3])], [_vi("p_t", F32, [3])])
    model = make_model([helper.make_node("Scan", ["a", "b"], ["p"], name="scan", body=body, num_scan_inputs=2,
                                         scan_input_directions=[0, 1])],
                       [_vi("a", F32, [6, 3]), _vi("b", F32, [6, 3])], [_vi("p", F32, [6, 3])], opset=17)
    sess = npu_session(model)
    assert assignment(sess) == {"scan": "NpuEP"}
    _check(sess, model, {"a": RNG.standard_normal((6, 3)).astype(np.float32),
                         "b": RNG.standard_normal((6, 3)).astype(np.float32)})


def test_scan_body_with_unsupported_op_keeps_the_scan_on_cpu():
    body = _graph("body", [helper.make_node("Tan", ["s_in"], ["t"], name="b_tan"),
                           helper.make_node("Add", ["t", "x_t"], ["s_out"], name="b_add")],
                  [_vi("s_in", F32, [4]), _vi("x_t", F32, [4])], [_vi("s_out", F32, [4])])
    model = make_model([helper.make_node("Scan", ["s0", "xs"], ["s"], name="scan", body=body, num_scan_inputs=1)],
                       [_vi("s0", F32, [4]), _vi("xs", F32, [3, 4])], [_vi("s", F32, [4])])
    sess = npu_session(model)
    where = assignment(sess)
    assert where["scan"] == where["b_tan"] == "CPUExecutionProvider" and where["b_add"] == "NpuEP", where
    _check(sess, model, {"s0": RNG.standard_normal(4).astype(np.float32),
                         "xs": RNG.standard_normal((3, 4)).astype(np.float32)})


def test_claimed_loop_loads_from_the_compile_cache(tmp_path):
    """The body program is stored in the Loop step as plain parts: a second session loads the partition from the
    cache without compiling and matches the CPU EP."""
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    model = counted_loop_model()
    sessions, stats = [], []
    for _ in range(2):
        before = set(LIVE_SESSIONS)
        sessions.append(npu_session(model, {"cache_dir": str(tmp_path)}))
        (ep,) = set(LIVE_SESSIONS) - before
        stats.append(dict(ep.compiled.stats))
    assert stats[0]["misses"] == 1 and stats[1]["hits"] == 1 and stats[1]["misses"] == 0, stats
    _check(sessions[1], model, _feeds(4))


def _onnx_cases():
    """ONNX's own Loop/Scan node test cases (onnx.backend.test.case.node: importing a module registers its cases)."""
    import onnx.backend.test.case.node as cases
    from onnx.backend.test.case.node import loop, scan  # noqa: F401 - importing registers the cases

    return {c.name: c for c in cases._NodeTestCases if c.name.startswith(("test_loop", "test_scan"))}


CLAIMED_CASES = ("test_loop11", "test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar")
DECLINED_CASES = {"test_loop13_seq": "is not a tensor of a known type", "test_loop16_seq_none": "is not a tensor",
                  "test_scan_sum": "Scan-8 (batch axis, sequence_lens) is not supported"}


@pytest.mark.parametrize("name", [*CLAIMED_CASES, *DECLINED_CASES])
def test_onnx_conformance_cases(name):
    """Tensor-only cases run on NpuEP and give ONNX's expected outputs; sequence-state Loops and Scan-8 stay on the
    CPU EP with their reason (and still give the expected outputs)."""
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    case = _onnx_cases()[name]
    inputs, expected = case.data_sets[0]
    feeds = {i.name: v if isinstance(v, list) else np.asarray(v) for i, v in zip(case.model.graph.input, inputs)}
    before = set(LIVE_SESSIONS)
    sess = npu_session(case.model)
    (ep,) = set(LIVE_SESSIONS) - before
    (node,) = [d for _, cap in ep.capabilities for d in cap.decisions if d.node.op_type in ("Loop", "Scan")]
    where = set(assignment(sess).values())
    if name in CLAIMED_CASES:
        assert node.claimed and where == {"NpuEP"}, (node.reason, where)
    else:
        assert not node.claimed and DECLINED_CASES[name] in node.reason, node.reason
    for got, want in zip(sess.run(None, feeds), expected):
        assert not isinstance(want, list) or len(got) == len(want)
        for g, w in (zip(got, want) if isinstance(want, list) else [(got, want)]):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_body_outputs_that_pass_inputs_through():
    """The body returns its condition input and a carried value unchanged, and a carried input as a scan output
    (no node computes them; ONNX forbids returning an outer-scope value): the body program hands its inputs back."""
    body = _graph("body", [helper.make_node("Add", ["a_in", "x"], ["a_out"], name="b_add")],
                  [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("a_in", F32, [3]), _vi("k_in", F32, [3])],
                  [_vi("cond_in", BOOL, []), _vi("a_out", F32, [3]), _vi("k_in", F32, [3]), _vi("a_in", F32, [3])])
    model = make_model([helper.make_node("Loop", ["M", "c0", "a0", "k0"], ["a", "k", "as"], name="loop", body=body)],
                       [_vi("M", I64, []), _vi("c0", BOOL, []), _vi("a0", F32, [3]), _vi("k0", F32, [3]),
                        _vi("x", F32, [3])],
                       [_vi("a", F32, [3]), _vi("k", F32, [3]), _vi("as", F32, ["T", 3])])
    sess = npu_session(model)
    assert assignment(sess) == {"loop": "NpuEP"}
    for m in (0, 3):
        _check(sess, model, {"M": np.array(m, np.int64), "c0": np.array(True),
                             **{n: RNG.standard_normal(3).astype(np.float32) for n in ("a0", "k0", "x")}})


def test_loop_nested_in_a_loop():
    """An inner Loop whose trip count is the outer iteration number: a triangular sum, all one NpuEP node."""
    inner = _graph("inner", [helper.make_node("Add", ["s_in", "x"], ["s_out"], name="in_add"),
                             helper.make_node("Identity", ["ic_in"], ["ic_out"], name="in_cond")],
                   [_vi("j", I64, []), _vi("ic_in", BOOL, []), _vi("s_in", F32, [2])],
                   [_vi("ic_out", BOOL, []), _vi("s_out", F32, [2])])
    outer = _graph("outer", [helper.make_node("Loop", ["i", "", "acc_in"], ["acc_out"], name="inner_loop",
                                              body=inner),
                             helper.make_node("Identity", ["oc_in"], ["oc_out"], name="out_cond"),
                             helper.make_node("Identity", ["acc_out"], ["trace"], name="out_trace")],
                   [_vi("i", I64, []), _vi("oc_in", BOOL, []), _vi("acc_in", F32, [2])],
                   [_vi("oc_out", BOOL, []), _vi("acc_out", F32, [2]), _vi("trace", F32, [2])])
    model = make_model([helper.make_node("Loop", ["M", "", "acc0"], ["acc", "traces"], name="outer_loop",
                                         body=outer)],
                       [_vi("M", I64, []), _vi("acc0", F32, [2]), _vi("x", F32, [2])],
                       [_vi("acc", F32, [2]), _vi("traces", F32, ["T", 2])])
    sess = npu_session(model)
    assert assignment(sess) == {"outer_loop": "NpuEP"}
    got = _check(sess, model, {"M": np.array(5, np.int64), "acc0": np.zeros(2, np.float32),
                               "x": np.array([1.0, 0.5], np.float32)})
    np.testing.assert_allclose(got[0], np.array([10.0, 5.0], np.float32))  # 0+1+2+3+4 additions of x


def test_body_returning_a_constant_keeps_the_loop_on_cpu():
    """Near miss: a body output that is one of its own constants (no node computes it) is declined with the reason."""
    from npu_ep.ep.entry_points import LIVE_SESSIONS

    body = _graph("body", [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond")],
                  [_vi("i", I64, []), _vi("cond_in", BOOL, [])], [_vi("cond_out", BOOL, []), _vi("k", F32, [2])],
                  [("k", np.array([1.0, 2.0], np.float32))])
    model = make_model([helper.make_node("Loop", ["M", ""], ["ks"], name="loop", body=body)],
                       [_vi("M", I64, [])], [_vi("ks", F32, ["T", 2])])
    before = set(LIVE_SESSIONS)
    sess = npu_session(model)
    (ep,) = set(LIVE_SESSIONS) - before
    (loop,) = [d for _, cap in ep.capabilities for d in cap.decisions if d.node.name == "loop"]
    assert assignment(sess)["loop"] == "CPUExecutionProvider"
    assert "its body returns the constant 'k'" in loop.reason, loop.reason
    _check(sess, model, {"M": np.array(2, np.int64)})


def test_body_condition_ends_the_loop_even_without_a_cond_input():
    """M given, cond omitted, the body's condition turns false at a = 3: ORT's CPU EP stops there (the ONNX text
    says the condition output is then ignored; ORT is the reference users compare with), and so does NpuEP."""
    body = _graph("body", [helper.make_node("Add", ["a_in", "one"], ["a_out"], name="b_add"),
                           helper.make_node("Less", ["a_out", "three"], ["cond_out"], name="b_less")],
                  [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("a_in", F32, [])],
                  [_vi("cond_out", BOOL, []), _vi("a_out", F32, [])],
                  [("one", np.array(1.0, np.float32)), ("three", np.array(3.0, np.float32))])
    model = make_model([helper.make_node("Loop", ["M", "", "a0"], ["a"], name="loop", body=body)],
                       [_vi("M", I64, []), _vi("a0", F32, [])], [_vi("a", F32, [])])
    sess = npu_session(model)
    assert assignment(sess) == {"loop": "NpuEP"}
    (a,) = _check(sess, model, {"M": np.array(10, np.int64), "a0": np.array(0.0, np.float32)})
    assert a == 3.0


def test_claimed_loop_round_trips_through_epcontext(tmp_path):
    """The Loop step's body program travels in the EPContext payload: the _ctx.onnx model runs it without the
    original graph and matches the CPU EP on the original model."""
    from npu_testing import save, session_options

    model = counted_loop_model()
    ctx = tmp_path / "loop_ctx.onnx"
    npu_session(save(model, tmp_path, "loop.onnx"), so=session_options(**{
        "ep.context_enable": "1", "ep.context_file_path": str(ctx), "ep.context_embed_mode": "1"}))
    sess = npu_session(str(ctx))
    assert set(assignment(sess).values()) == {"NpuEP"}
    _check(sess, model, _feeds(4))


def test_the_loop_is_a_native_step_over_any_trip_count():
    """After a signature's first call the Loop runs as a native step (ep/native/control_flow_steps.cc): the
    iterations call the body program from C++, for any trip count and condition, with the CPU EP's results; zero
    iterations (empty scan outputs, shaped by the kernel) decline to the Python kernel."""
    from npu_ep.ep.sessions import session_of, tag_session_options
    from tests.npu_testing import session_options

    model = counted_loop_model("Relu", with_cond=True)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"loop": "NpuEP"}
    (program,) = session_of(sess).programs.values()
    kernel_runs = count_kernel_runs(program)
    for m, limit in [(5, 1e9), (3, 1e9), (50, 4.0), (1, 1e9), (0, 1e9), (6, 1e9)]:
        feeds = _feeds(m, cond0=np.array(True), limit=np.array(limit, np.float32))
        feeds["x"] = np.abs(feeds["x"]) + 0.1
        got = _check(sess, model, feeds)
        assert got[1].shape[0] == (min(m, got[1].shape[0]) if limit < 1e9 else m)
    assert kernel_runs["Loop"] == 2  # the signature's first call and the zero-iteration call
    runs, declines = program.native_step_counts
    assert runs == 4 and declines == 1
