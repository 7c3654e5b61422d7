"""Element-wise chains that no Conv feeds become one ``npu::ElementwiseChain`` (kernels/fusion/eltwise_chain.py),
run as one pass of the native element-wise engine (kernels/ops/elementwise_chain.py, ``tail_of``; issue 40).

The fused step equals the op-by-op steps: bit for bit where every link is exact float32 arithmetic, within the
stated ulp where a link is exp or log (the engine's Cephes exp/log against numpy's, 1 ulp each) or sigmoid (2 ulp).
Sessions run the chain on NpuEP (graph assignment, the fused step in the program) and match ORT's CPU EP on the
unfused graph; chains that stop say why (FusionMiss)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _single_op import run_nodes
from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.fusion.eltwise_chain import fuse_elementwise_chains
from npu_ep.kernels.ops.elementwise_chain import run_program
from npu_ep.kernels.target import Target
from npu_testing import assignment, cpu_run, make_model, npu_session

REF = Target.load("npu-ref")
RNG = np.random.default_rng(4042)
SHAPE = [1, 64, 384]
needs_native = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")


def _const(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def _model(nodes, inits, out="y"):
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                      [helper.make_tensor_value_info(out, TensorProto.FLOAT, SHAPE)], inits, opset=17)


def _silu_tanh_gelu():
    """SiLU x * sigmoid(x), a scale, then tanh-GELU written out as exporters do (0.5 x (1 + tanh(s (x + k x^3))))."""
    inits = {"three": _const(3.0), "k": _const(0.044715), "s": _const(np.sqrt(2 / np.pi)), "one": _const(1.0),
             "half": _const(0.5), "two": _const(2.0)}
    nodes = [helper.make_node("Sigmoid", ["x"], ["sg"], name="sig"),
             helper.make_node("Mul", ["x", "sg"], ["silu"], name="silu"),
             helper.make_node("Mul", ["silu", "two"], ["x2"], name="scale"),
             helper.make_node("Pow", ["x2", "three"], ["p3"], name="pow"),
             helper.make_node("Mul", ["p3", "k"], ["kp"], name="mulk"),
             helper.make_node("Add", ["x2", "kp"], ["inner"], name="addin"),
             helper.make_node("Mul", ["inner", "s"], ["si"], name="muls"),
             helper.make_node("Tanh", ["si"], ["th"], name="tanh"),
             helper.make_node("Add", ["th", "one"], ["t1"], name="add1"),
             helper.make_node("Mul", ["x2", "t1"], ["xt"], name="mulx"),
             helper.make_node("Mul", ["xt", "half"], ["y"], name="mulhalf")]
    return _model(nodes, inits)


def _softplus_written_out():
    """log(1 + exp(-|x|)) * 0.5, then Neg and a Reciprocal-free clip: Abs, Neg, Exp, Add, Log, Mul, Clip."""
    inits = {"one": _const(1.0), "half": _const(0.5), "lo": _const(-1.0), "hi": _const(0.3)}
    nodes = [helper.make_node("Abs", ["x"], ["a"], name="abs"),
             helper.make_node("Neg", ["a"], ["na"], name="neg"),
             helper.make_node("Exp", ["na"], ["e"], name="exp"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
             helper.make_node("Log", ["e1"], ["l"], name="log"),
             helper.make_node("Mul", ["l", "half"], ["m"], name="mul"),
             helper.make_node("Clip", ["m", "lo", "hi"], ["y"], name="clip")]
    return _model(nodes, inits)


def _exact_chain():
    """Only exact float32 links: Div, Sub (constant first), Relu, Max with a constant, Softsign, Floor."""
    inits = {"d": _const(3.0), "c": _const(0.25), "m": _const(-0.5)}
    nodes = [helper.make_node("Div", ["x", "d"], ["q"], name="div"),
             helper.make_node("Sub", ["c", "q"], ["r"], name="rsub"),
             helper.make_node("Softsign", ["r"], ["ss"], name="softsign"),
             helper.make_node("Max", ["ss", "m"], ["mx"], name="max"),
             helper.make_node("Mul", ["mx", "d"], ["big"], name="mul"),
             helper.make_node("Floor", ["big"], ["y"], name="floor")]
    return _model(nodes, inits)


def _chains(nodes):
    return [(nd.attrs["fused_nodes"], [t[0] for t in nd.attrs["program"]]) for nd in nodes
            if nd.op_type == "ElementwiseChain"]


def test_silu_and_tanh_gelu_written_out_form_chains():
    """SiLU is a diamond (save, sigmoid, mul_saved) continued by the scale; the written-out tanh-GELU's x has three
    readers, so it splits into two chains around the Add and the Muls that read x (each stop a FusionMiss)."""
    misses: list = []
    fused = fuse_elementwise_chains(nodes_from_model(_silu_tanh_gelu()), REF, misses)
    assert _chains(fused) == [(["sig", "silu", "scale"], ["save", "sigmoid", "mul_saved", "mul"]),
                              (["pow", "mulk"], ["save", "mul_saved", "mul_saved", "mul"]),
                              (["muls", "tanh", "add1"], ["mul", "tanh", "add"])]
    assert [nd.op_type for nd in fused].count("ElementwiseChain") == 3 and len(fused) == 6
    reasons = {m.node: m.reason for m in misses}
    assert "'x2'" in reasons["sig"] and "3 readers" in reasons["sig"]
    assert "ends" in reasons["pow"] and "Add 'addin'" in reasons["pow"]


def test_the_chain_pass_runs_last_in_the_compiler():
    """fuse_partition runs it after the other passes: a lone chain of unary ops is fused there too."""
    fused = fuse_partition(nodes_from_model(_softplus_written_out()), REF)
    assert _chains(fused) == [(["abs", "neg", "exp", "add1", "log", "mul", "clip"],
                               ["abs", "mul", "exp", "add", "log", "mul", "clip"])]


def test_graph_output_and_tensor_operands_stop_the_chain_with_a_reason():
    inits = {"two": _const(2.0), "t": RNG.standard_normal(SHAPE[-1]).astype(np.float32)}
    nodes = [helper.make_node("Exp", ["x"], ["e"], name="exp"),
             helper.make_node("Mul", ["e", "two"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "t"], ["y"], name="add_tensor")]
    misses: list = []
    fused = fuse_elementwise_chains(nodes_from_model(_model(nodes, inits)), REF, misses)
    assert _chains(fused) == [(["exp", "mul"], ["exp", "mul"])]
    assert "Add 'add_tensor'" in misses[0].reason and "scalar" in misses[0].reason
    model = make_model(nodes[:2], [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                       [helper.make_tensor_value_info("e", TensorProto.FLOAT, SHAPE),
                        helper.make_tensor_value_info("m", TensorProto.FLOAT, SHAPE)], inits, opset=17)
    misses = []
    assert _chains(fuse_elementwise_chains(nodes_from_model(model), REF, misses)) == []
    assert "graph output" in misses[0].reason


def test_a_chain_miss_names_the_chain_and_its_links_not_a_conv_tail():
    """The walker is the conv tail's; a standalone chain's miss names the chain's links (the engine's unary ops
    among them), not a conv's tail's."""
    inits = {"two": _const(2.0), "t": RNG.standard_normal(SHAPE[-1]).astype(np.float32)}
    nodes = [helper.make_node("Exp", ["x"], ["e"], name="exp"),
             helper.make_node("Mul", ["e", "two"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "t"], ["y"], name="add_tensor")]
    misses: list = []
    fuse_elementwise_chains(nodes_from_model(_model(nodes, inits)), REF, misses)
    assert len(misses) == 1 and misses[0].fusion == "eltwise_chain"
    assert "or a unary op" in misses[0].reason and "Softsign" in misses[0].reason, misses[0].reason
    assert "conv" not in misses[0].reason


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    spacing = np.maximum(np.spacing(np.abs(want[fin])), np.float32(1e-45)).astype(np.float64)
    return float(np.max(np.abs(got[fin].astype(np.float64) - want[fin]) / spacing, initial=0.0))


@needs_native
@pytest.mark.parametrize("build,ulp", [(_exact_chain, 0), (_silu_tanh_gelu, 4), (_softplus_written_out, 3)])
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_fused_steps_equal_the_op_by_op_steps(build, ulp, kernels):
    """The fused steps against the unfused ones, each on its own kernel: exact links bit for bit; sigmoid within 2
    ulp of numpy's as the ops alone (SiLU, then Pow/Mul/Tanh: 4 ulp), exp and log 1 ulp each (exp's carried
    through 1 + e and log: 3). The reference
    interpreter of the instruction list gives the op-by-op values the same way."""
    plain = nodes_from_model(build())
    fused = fuse_partition(plain, REF)
    assert len(fused) < len(plain)
    for seed in range(2):
        x = (np.random.default_rng(seed).standard_normal(SHAPE) * 4).astype(np.float32)
        x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 1e-42, 3e38]
        want = run_nodes(plain, {"x": x}, REF, kernels)["y"]
        got = run_nodes(fused, {"x": x}, REF, kernels)["y"]
        bound = 0 if kernels == "reference" and build is _exact_chain else ulp
        if build is _softplus_written_out and kernels == "native":
            # the chain's exp is the engine's, the lone Exp numpy's (float32): 1 ulp apart, e can round 1 + e the
            # other way, which log(.) * 0.5 turns into up to half an ulp of 1 (6e-8) plus the result's rounding
            far = np.abs(got.astype(np.float64) - want) > 1e-7
            got, want = got[far | np.isnan(want)], want[far | np.isnan(want)]
        assert _ulps(got, want) <= bound, build.__name__


def test_the_reference_interpreter_follows_each_instruction():
    x = np.array([-2.0, -0.0, 0.5, 3.0, np.nan], np.float32)
    program = [["save", 0, 0], ["abs", 0, 0], ["add", 1.0, 0], ["div_saved", 0, 0], ["sign", 0, 1.0]]
    np.testing.assert_array_equal(run_program(x, program), [-1.0, 0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(run_program(x, [["softsign", 0, 0]]), run_program(x, program[:4]))


def test_conv_tail_reference_is_the_chain_interpreter():
    """conv.tail_reference runs run_program over the codes' names (one interpreter for conv tails and chains): every
    engine instruction, a per-channel constant in place of one instruction's, and an unknown code named."""
    from npu_ep.kernels.ops.conv import tail_reference
    from npu_ep.kernels.tail_program import CODES
    y = (RNG.standard_normal((2, 3, 4, 5)) * 3).astype(np.float32)
    program = [("save", 0, 0), ("exp", 0, 0), ("div_saved", 0, 0), ("leaky_relu", 0.1, 0), ("softsign", 0, 0),
               ("clip", -0.5, 0.75)]
    codes = np.array([CODES[t[0]] for t in program], np.int32)
    consts = np.array([t[1:] for t in program], np.float32)
    np.testing.assert_array_equal(tail_reference(y.copy(), codes, consts), run_program(y, program))
    slopes = np.array([0.5, -2.0, 3.0], np.float32)
    per_channel = tail_reference(y.copy(), codes, consts, (3, slopes))
    np.testing.assert_array_equal(per_channel, run_program(y, program, (3, slopes.reshape(1, 3, 1, 1))))
    with pytest.raises(ValueError, match="unknown instruction code 99"):
        tail_reference(y.copy(), np.array([99], np.int32), np.zeros((1, 2), np.float32))


@needs_native
@pytest.mark.parametrize("build", [_silu_tanh_gelu, _softplus_written_out, _exact_chain])
def test_session_runs_the_chains_on_npu_ep_and_matches_the_cpu_ep(build):
    """NpuEP runs every node (assignment) with the chains as fused steps, and matches ORT's CPU EP on the unfused
    graph: rtol 1e-5 and atol 2e-6 (ORT's own sigmoid, tanh, exp and log approximations; Floor after the exact chain
    equal)."""
    model = build()
    LIVE_SESSIONS.clear()
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    ops = [s.op for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    assert "npu::ElementwiseChain" in ops
    x = (RNG.standard_normal(SHAPE) * 3).astype(np.float32)
    got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    if build is _exact_chain:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
