"""npu::NormMatMul over float32 weights as one native call (``norm_matmul_float``, AVX-512 hosts): the RMS-norm
prologue, the product on the packed GEMM (gamma folded into B, B packed once) with its bias, then a group's SwiGLU.

Against the reference model (the same compiled node with ``kernels=reference``: numpy's prologue, numpy's matmul):
the prologue has the reference's bits (the Skip* sum output is compared exactly), the product sums in the packed
GEMM's order, not numpy's BLAS's, so the outputs are compared within the float32 dot-product error bound. The
bound call step gives the kernel's bits, and a session at a decoder's width runs it on NpuEP against the CPU EP.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npu_ep.ep import _native as bridge
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.ops import _native
from npu_ep.kernels.ops.matmul import PACKED_B, PACKED_ISAS
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from tests.kernels.test_bound_native_calls import assert_same, one_step_loop
from tests.npu_testing import F32, assignment, cpu_run, npu_session, session_options

_NAT = _native.native_module()
pytestmark = pytest.mark.skipif(_NAT is None or _NAT.isa() not in PACKED_ISAS,
                                reason="the float NormMatMul's native call runs on AVX-512 hosts")

RNG = np.random.default_rng(11)
REF = Target.load("npu-ref")


def _float_model(d: int, rows: int, *, skip: bool, mlp: str):
    """norm -> float32 {gate, up} + silu(gate) * up ("swiglu"), {q, k} siblings ("pair") or one MatMul ("single")."""
    inits = {"gamma": (1 + 0.1 * RNG.standard_normal(d)).astype(np.float32)}
    ins = [helper.make_tensor_value_info("x", F32, [1, rows, d])]
    outs = []
    if skip:
        ins.append(helper.make_tensor_value_info("res", F32, [1, rows, d]))
        inits["nbias"] = (0.1 * RNG.standard_normal(d)).astype(np.float32)
        nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "res", "gamma", "nbias"],
                                  ["y", "", "", "sum"], "norm", domain="com.microsoft", epsilon=1e-6)]
        outs.append(helper.make_tensor_value_info("sum", F32, [1, rows, d]))
    else:
        nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], "norm", axis=-1,
                                  epsilon=1e-6)]
    names = {"swiglu": ("gate", "up"), "pair": ("q", "k"), "single": ("p",)}[mlp]
    n = 160
    for name in names:
        inits[f"{name}_W"] = (RNG.standard_normal((d, n)) / np.sqrt(d)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["y", f"{name}_W"], [name], name))
    if mlp == "swiglu":
        nodes += [helper.make_node("Sigmoid", ["gate"], ["sg"], "sig"), helper.make_node("Mul", ["gate", "sg"], ["si"], "m1"),
                  helper.make_node("Mul", ["si", "up"], ["act"], "m2")]
        outs.append(helper.make_tensor_value_info("act", F32, [1, rows, n]))
    else:
        outs += [helper.make_tensor_value_info(name, F32, [1, rows, n]) for name in names]
    graph = helper.make_graph(nodes, "norm_mm_f32", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()],
                              value_info=[helper.make_tensor_value_info("y", F32, [1, rows, d])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _prepared(model):
    """The model's one NormMatMul as the compiler fuses it (every fusion pass in order), on native kernels."""
    fused = [nd for nd in fuse_partition(nodes_from_model(model), REF) if nd.op_type == "NormMatMul"]
    assert len(fused) == 1, [nd.op_type for nd in fuse_partition(nodes_from_model(model), REF)]
    p = kernel_for(*fused[0].key).prepare(fused[0], REF)
    _native.configure([p], "native", 2)
    return p


def _feeds(model, rows, d):
    return [RNG.standard_normal((1, rows, d)).astype(np.float32) for _ in model.graph.input]


def _within_dot_bound(got, want):
    """|got - want| within 1e-5 of the output's scale: two summation orders of K products differ by a few ulps of
    the largest partial sums (the worst case, K * 2^-24 of the sum of |a||b|, is 1e-4 relative at K = 2048)."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("d,rows", [(2048, 1), (2048, 5), (96, 3), (256, 32)])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp", ["swiglu", "pair", "single"])
def test_one_call_matches_the_reference_model(d, rows, skip, mlp):
    model = _float_model(d, rows, skip=skip, mlp=mlp)
    p = _prepared(model)
    inputs = _feeds(model, rows, d)
    kernel = kernel_for("npu", "NormMatMul")
    native = kernel.run(p, inputs)
    assert PACKED_B in p.memo["inner"].memo  # the packed GEMM made the product
    _native.configure([p], "reference", 2)
    want = kernel.run(p, inputs)
    assert len(native) == len(want)
    if skip:  # the sum output: the prologue's adds, bit for bit
        np.testing.assert_array_equal(native[-1], want[-1])
    for got, ref in zip(native[:-1] if skip else native, want[:-1] if skip else want):
        _within_dot_bound(got, ref)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp", ["swiglu", "pair"])
def test_call_step_equals_the_kernel(rows, skip, mlp):
    """The bound step (what the program's C++ loop runs) gives the kernel's bits; a group's outputs are column views
    of one product; another shape is declined (the kernel runs)."""
    d = 96
    model = _float_model(d, rows, skip=skip, mlp=mlp)
    p = _prepared(model)
    kernel = kernel_for("npu", "NormMatMul")
    inputs = _feeds(model, rows, d)
    outs, step, loop = one_step_loop(kernel, p, inputs)
    assert isinstance(step, bridge.CallStep)
    got = loop(tuple(inputs))
    assert_same(got, outs)
    assert loop.native_counts == (1, 0)
    if mlp == "pair":
        assert got[0].base is not None and got[0].base is got[1].base
    other = tuple(np.zeros((1, rows + 1, d), np.float32) for _ in inputs)
    loop(other)
    assert loop.native_counts == (1, 1)


@pytest.mark.parametrize("skip", [False, True])
def test_session_runs_the_call_step_and_matches_the_cpu_ep(skip):
    d, rows = 2048, 4
    model = _float_model(d, rows, skip=skip, mlp="swiglu")
    feeds = {i.name: v for i, v in zip(model.graph.input, _feeds(model, rows, d))}
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    want = cpu_run(model, feeds)
    for _ in range(3):
        for got, ref in zip(sess.run(None, feeds), want):
            _within_dot_bound(got, ref)
    (program,) = session_of(sess).programs.values()
    runs, declines = program.native_step_counts
    assert runs >= 2 and declines == 0  # the two calls after the first ran the bound NormMatMul
