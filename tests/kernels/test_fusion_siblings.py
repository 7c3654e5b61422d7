"""Sibling fusion: matmuls sharing input A become one npu::MatMulGroup (q/k/v), and {gate, up} followed by
silu(gate) * up becomes one group with the SwiGLU epilogue. Positive cases run through a real NpuEP session
(graph assignment checked, compiled program inspected) against the CPU EP on the unfused graph; near misses must
stay unfused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.fusion.siblings import fuse_siblings
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

RNG = np.random.default_rng(11)
REF = Target.load("npu-ref")
MS = [("com.microsoft", 1)]


def _nbits(name, a, k, n, block=32, level=0, zp=True):
    q = quantize_matmul_nbits(RNG.standard_normal((k, n)).astype(np.float32), block, not zp)
    inits = {f"{name}_B": q.B, f"{name}_S": q.scales}
    ins = [a, f"{name}_B", f"{name}_S"]
    if zp:
        inits[f"{name}_Z"] = q.zero_points
        ins.append(f"{name}_Z")
    node = helper.make_node("MatMulNBits", ins, [name], name, domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=level)
    return node, inits


def _qkv_model(m=3, k=64, ns=(64, 16, 16), blocks=(32, 32, 32), second_input=False, level=0):
    nodes, inits = [], {}
    for i, (n, b) in enumerate(zip(ns, blocks)):
        a = "x2" if second_input and i == 2 else "x"
        nd, w = _nbits(f"p{i}", a, k, n, b, level)
        nodes.append(nd)
        inits.update(w)
    # one consumer joins the projections (as attention does), so they form one partition
    nodes.append(helper.make_node("Concat", [f"p{i}" for i in range(len(ns))], ["cat"], "cat", axis=-1))
    outs = [helper.make_tensor_value_info("cat", F32, [1, m, sum(ns)]),
            helper.make_tensor_value_info("p1", F32, [1, m, ns[1]])]  # a member output that is also a graph output
    ins = [helper.make_tensor_value_info("x", F32, [1, m, k])]
    if second_input:
        ins.append(helper.make_tensor_value_info("x2", F32, [1, m, k]))
    return make_model(nodes, ins, outs, inits, opset=21, extra_opsets=MS)


def _swiglu_model(m=3, k=64, n=48, swap_mul=False, sigmoid_on_up=False, gate_is_output=False, float_mm=False):
    nodes, inits = [], {}
    for name in ("gate", "up"):
        if float_mm:
            inits[f"{name}_W"] = RNG.standard_normal((k, n)).astype(np.float32)
            nodes.append(helper.make_node("MatMul", ["x", f"{name}_W"], [name], name))
        else:
            nd, w = _nbits(name, "x", k, n)
            nodes.append(nd)
            inits.update(w)
    g, u = ("up", "gate") if sigmoid_on_up else ("gate", "up")
    nodes.append(helper.make_node("Sigmoid", [g], ["sig"], "sigmoid"))
    nodes.append(helper.make_node("Mul", ["sig", g] if swap_mul else [g, "sig"], ["silu"], "mul_silu"))
    nodes.append(helper.make_node("Mul", [u, "silu"] if swap_mul else ["silu", u], ["y"], "mul_up"))
    outs = [helper.make_tensor_value_info("y", F32, [1, m, n])]
    if gate_is_output:
        outs.append(helper.make_tensor_value_info(g, F32, [1, m, n]))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, m, k])], outs, inits, opset=21,
                      extra_opsets=MS)


def _compiled_steps(node_name: str) -> list[str]:
    """Ops of the live compiled programs' steps that fused exactly the nodes of ``node_name`` ("a+b+c"; ORT may
    hand the nodes over in another order)."""
    want = set(node_name.split("+"))
    return [s.op for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps
            if set(s.node_name.split("+")) == want]


def _check_on_npu(model, m=3, k=64):
    x = RNG.standard_normal((1, m, k)).astype(np.float32)
    feeds = {i.name: x for i in model.graph.input}
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    ours = sess.run(None, feeds)
    for got, ref in zip(ours, cpu_run(model, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    return sess


@pytest.mark.parametrize("level", [0, 4])
def test_qkv_siblings_become_one_group_matching_cpu(level):
    model = _qkv_model(level=level)
    fused = fuse_siblings(nodes_from_model(model), REF)
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "Concat"]
    assert fused[0].attrs["splits"] == [64, 16, 16] and fused[0].attrs["epilogue"] == {}
    sess = _check_on_npu(model)
    assert _compiled_steps("p0+p1+p2") == ["npu::MatMulGroup"], "the session did not compile the group"
    del sess


@pytest.mark.parametrize("swap_mul,sigmoid_on_up,float_mm", [(False, False, False), (True, False, False),
                                                             (False, True, False), (False, False, True)])
def test_gate_up_silu_becomes_one_swiglu_group_matching_cpu(swap_mul, sigmoid_on_up, float_mm):
    model = _swiglu_model(swap_mul=swap_mul, sigmoid_on_up=sigmoid_on_up, float_mm=float_mm)
    fused = fuse_siblings(nodes_from_model(model), REF)
    assert [nd.op_type for nd in fused] == ["MatMulGroup"]
    assert fused[0].attrs["epilogue"] == {"swiglu": True}
    assert fused[0].attrs["members"][0].name == ("up" if sigmoid_on_up else "gate")  # gated columns first
    assert [o.name for o in fused[0].outputs] == ["y"]
    sess = _check_on_npu(model)
    assert _compiled_steps(fused[0].name) == ["npu::MatMulGroup"]
    del sess


def test_near_misses_stay_unfused():
    # different A, different block sizes: no group (only the two that agree fuse)
    fused = fuse_siblings(nodes_from_model(_qkv_model(second_input=True)), REF)
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "MatMulNBits", "Concat"]
    fused = fuse_siblings(nodes_from_model(_qkv_model(blocks=(32, 32, 16))), REF)
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "MatMulNBits", "Concat"]
    fused = fuse_siblings(nodes_from_model(_qkv_model(blocks=(32, 16, 64))), REF)
    assert [nd.op_type for nd in fused] == ["MatMulNBits"] * 3 + ["Concat"]
    # the gate's output is also a graph output: the group keeps both outputs, the SiLU stays separate
    model = _swiglu_model(gate_is_output=True)
    fused = fuse_siblings(nodes_from_model(model), REF)
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "Sigmoid", "Mul", "Mul"]
    assert fused[0].attrs["epilogue"] == {}
    _check_on_npu(model)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(second_input=True), "no other matmul with constant weights reads its A 'x2' (each reads a "
                              "different activation)"),
    (dict(blocks=(32, 32, 16)), "the other matmuls reading A 'x' (p0, p1) differ in kind, K, "
                                "block_size, accuracy_level or bits")])
def test_a_matmul_left_out_of_every_group_says_why(kwargs, reason):
    """The pass's candidate (a matmul) that joins no group leaves a FusionMiss with the reason
    (npu-report --explain-fusions); the two that agree still group."""
    misses = []
    fused = fuse_siblings(nodes_from_model(_qkv_model(**kwargs)), REF, misses)
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "MatMulNBits", "Concat"]
    assert [(m.fusion, m.node, m.reason) for m in misses] == [("siblings", "p2", reason)]


def test_target_decides():
    raw = dict(REF.raw)
    raw["fusion"] = {"epilogues": ["bias", "relu", "quantize"]}
    fused = fuse_siblings(nodes_from_model(_swiglu_model()), Target.from_dict(raw))
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "Sigmoid", "Mul", "Mul"]
    raw["ops"] = {k: v for k, v in REF.raw["ops"].items() if k != "npu::MatMulGroup"}
    fused = fuse_siblings(nodes_from_model(_qkv_model()), Target.from_dict(raw))
    assert [nd.op_type for nd in fused] == ["MatMulNBits"] * 3 + ["Concat"]


def test_group_costs_less_than_its_members():
    """One launch, A loaded once: the group's emulated cycles and DMA bytes are below the members' sum."""
    m, k = 1, 256
    nodes = nodes_from_model(_qkv_model(m=m, k=k, ns=(256, 64, 64)))
    group, _ = fuse_siblings(nodes, REF)
    shapes = [(1, m, k)] + [None] * (len(group.inputs) - 1)
    kg = kernel_for(group.domain, group.op_type)
    cost = kg.cost(kg.prepare(group, REF), shapes)
    parts = []
    for nd in nodes[:3]:
        kd = kernel_for(nd.domain, nd.op_type)
        parts.append(kd.cost(kd.prepare(nd, REF), [(1, m, k)] + [None] * (len(nd.inputs) - 1)))
    assert cost.cycles < sum(c.cycles for c in parts)
    assert cost.dma_bytes <= sum(c.dma_bytes for c in parts)
    assert cost.macs == sum(c.macs for c in parts)


# --- projections with a bias (Qwen2's q/k/v): MatMul + Add become MatMulEpilogue steps, which group too ---

def _biased_qkv_model(biased=(True, True, True), relu_on=None, norm=False, k=64, ns=(64, 16, 16)):
    """x [-> an RMS norm written out, as Qwen2 exports have it] -> MatMul_i [+ bias_i] [-> Relu on member relu_on]
    -> Concat."""
    rng = np.random.default_rng(17)
    inits, nodes, a = {}, [], "x"
    if norm:
        inits.update({"gamma": (1 + 0.1 * rng.standard_normal(k)).astype(np.float32),
                      "two": np.array(2.0, np.float32), "axes": np.array([-1], np.int64),
                      "eps": np.array(1e-6, np.float32)})
        nodes += [helper.make_node("Pow", ["x", "two"], ["sq"], "pow"),
                  helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], "mean"),
                  helper.make_node("Add", ["ms", "eps"], ["mse"], "add_eps"),
                  helper.make_node("Sqrt", ["mse"], ["rms"], "sqrt"),
                  helper.make_node("Div", ["x", "rms"], ["xr"], "div"),
                  helper.make_node("Mul", ["xr", "gamma"], ["xn"], "gamma")]
        a = "xn"
    outs = []
    for i, n in enumerate(ns):
        inits[f"w{i}"] = (rng.standard_normal((k, n)) / 8).astype(np.float32)
        nodes.append(helper.make_node("MatMul", [a, f"w{i}"], [f"m{i}"], f"p{i}"))
        y = f"m{i}"
        if biased[i]:
            inits[f"b{i}"] = rng.standard_normal(n).astype(np.float32)
            nodes.append(helper.make_node("Add", [y, f"b{i}"], [f"y{i}"], f"bias{i}"))
            y = f"y{i}"
        if relu_on == i:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"], f"relu{i}"))
            y = f"r{i}"
        outs.append(y)
    nodes.append(helper.make_node("Concat", outs, ["cat"], "cat", axis=-1))
    # symbolic rows, as an exported decoder has them: with static ones ORT's level-1 optimizer makes each MatMul +
    # Add a Reshape -> Gemm -> Reshape before NpuEP sees the graph
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", "seq", k])],
                      [helper.make_tensor_value_info("cat", F32, ["batch", "seq", sum(ns)])], inits, opset=21)


def _program_on_npu(model):
    """The program NpuEP compiled for ``model``, after a run matching the CPU EP's (``_check_on_npu``)."""
    LIVE_SESSIONS.clear()
    sess = _check_on_npu(model)
    (program,) = [prog for ep in LIVE_SESSIONS for prog in ep.programs.values()]
    del sess
    return program


@pytest.mark.parametrize("biased", [(True, True, True), (False, True, True)])
def test_projections_with_a_bias_group_with_the_biases_as_the_groups(biased):
    """The group's bias holds each member's, zeros for a member without; on NpuEP one native step, the CPU EP's
    results within float tolerance."""
    model = _biased_qkv_model(biased)
    fused = fuse_partition(nodes_from_model(model), REF)
    assert [nd.op_type for nd in fused] == ["MatMulGroup", "Concat"]
    program = _program_on_npu(model)
    assert [s.op for s in program.steps] == ["npu::MatMulGroup", "Concat"]
    assert program.steps[0].prepared.attrs["epilogue"] == {"bias": True}


def test_a_normalized_input_folds_into_the_biased_group():
    """Qwen2's attention input: the RMS norm becomes one norm (the rms pass), folded into the biased q/k/v group."""
    model = _biased_qkv_model(norm=True)
    assert [nd.op_type for nd in fuse_partition(nodes_from_model(model), REF)] == ["NormMatMul", "Concat"]
    assert [s.op for s in _program_on_npu(model).steps] == ["npu::NormMatMul", "Concat"]


def test_a_member_with_more_than_a_bias_stays_out():
    """A bias then Relu is an epilogue the group does not hold per member: that projection stays its own step."""
    ops = [nd.op_type for nd in fuse_partition(nodes_from_model(_biased_qkv_model(relu_on=0)), REF)]
    assert ops.count("MatMulEpilogue") == 1 and ops.count("MatMulGroup") == 1, ops


def test_a_normalized_input_folds_into_one_biased_projection():
    model = _biased_qkv_model(biased=(True,), norm=True, ns=(48,))
    assert [nd.op_type for nd in fuse_partition(nodes_from_model(model), REF)] == ["NormMatMul", "Concat"]
    assert [s.op for s in _program_on_npu(model).steps] == ["npu::NormMatMul", "Concat"]
