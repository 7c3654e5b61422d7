"""npu::NormMatMul over int4 weights as one native call (``norm_matmul_nbits``): the RMS-norm prologue, the
MatMulNBits / MatMulGroup GEMM with its bias and the SwiGLU epilogue.

Against the step-by-step path of the same compiled node (numpy prologue, the same native GEMM, numpy SwiGLU):
the prologue follows the reference's operations (Skip*: float32 sequential sum; Simplified: numpy's own BLAS
sdot), so the sum output and the matmul outputs are bit-identical; after a SwiGLU the kernel's exp (Cephes' expf
or the C library's) is within a few ulps of numpy's, so those outputs are compared with a tolerance of a few float32
ulps. Realistic widths (K of 2048) and odd ones (K = 96: a partial 128-element chunk) are both covered, and a
session at K = 2048 runs on NpuEP against the CPU EP.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.fusion.norm import fuse_norms
from npu_ep.kernels.fusion.siblings import fuse_siblings
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(7)
REF = Target.load("npu-ref")


def _model(d: int, rows: int, *, skip: bool, mlp: str, level: int | None, bias: bool = False, n: int = 160):
    """norm -> {gate, up} + silu(gate) * up ("swiglu"), {q, k} siblings ("pair") or one matmul ("single"): MatMulNBits
    at accuracy ``level``, or float32 MatMuls for ``level=None``."""
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
    for name in names:
        if level is None:
            inits[f"{name}_W"] = (RNG.standard_normal((d, n)) / np.sqrt(d)).astype(np.float32)
            nodes.append(helper.make_node("MatMul", ["y", f"{name}_W"], [name], name))
            continue
        q = quantize_matmul_nbits(RNG.standard_normal((d, n)).astype(np.float32), 32, False)
        ins_mm = ["y", f"{name}_B", f"{name}_S", f"{name}_Z"]
        if bias and mlp == "single":
            inits[f"{name}_bias"] = RNG.standard_normal(n).astype(np.float32)
            ins_mm += ["", f"{name}_bias"]
        nodes.append(helper.make_node("MatMulNBits", ins_mm, [name], name, domain="com.microsoft", K=d, N=n, bits=4,
                                      block_size=32, accuracy_level=level))
        inits.update({f"{name}_B": q.B, f"{name}_S": q.scales, f"{name}_Z": q.zero_points})
    if mlp == "swiglu":
        nodes += [helper.make_node("Sigmoid", ["gate"], ["sg"], "sig"),
                  helper.make_node("Mul", ["gate", "sg"], ["si"], "m1"),
                  helper.make_node("Mul", ["si", "up"], ["act"], "m2")]
        outs.append(helper.make_tensor_value_info("act", F32, [1, rows, n]))
    else:
        outs += [helper.make_tensor_value_info(name, F32, [1, rows, n]) for name in names]
    graph = helper.make_graph(nodes, "norm_mm", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()],
                              value_info=[helper.make_tensor_value_info("y", F32, [1, rows, d])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)], ir_version=10)


def _prepared(model):
    """The model's one NormMatMul as the compiler fuses it (every fusion pass in order), on native kernels."""
    fused = [nd for nd in fuse_partition(nodes_from_model(model), REF) if nd.op_type == "NormMatMul"]
    assert len(fused) == 1, [nd.op_type for nd in fused]
    p = kernel_for(*fused[0].key).prepare(fused[0], REF)
    runtime.configure([p], "native", 2)
    return p


def _feeds(model, rows, d, scale=1.0):
    return [(scale * RNG.standard_normal((1, rows, d))).astype(np.float32) for _ in model.graph.input]


def _both_paths(p, inputs):
    run = kernel_for("npu", "NormMatMul").run
    one = run(p, inputs)
    assert p.kernel_cache["one_call"] is True
    p.kernel_cache["one_call"] = False
    try:
        steps = run(p, inputs)
    finally:
        p.kernel_cache["one_call"] = True
    return one, steps


@pytest.mark.parametrize("d,rows", [(2048, 1), (2048, 5), (96, 3), (96, 17)])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp,level", [(mlp, level) for mlp in ("swiglu", "pair", "single") for level in (0, 1, 4)
                                       if (mlp, level) != ("swiglu", 4)])  # kernels.fusion.norm leaves it unfused
def test_one_call_equals_the_step_by_step_path(d, rows, skip, mlp, level):
    model = _model(d, rows, skip=skip, mlp=mlp, level=level, bias=mlp == "single")
    p = _prepared(model)
    one, steps = _both_paths(p, _feeds(model, rows, d))
    assert len(one) == len(steps)
    for got, want in zip(one, steps):
        assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    if mlp == "swiglu":  # exp differs by up to an ulp; the products around it add a few more roundings
        np.testing.assert_allclose(one[0], steps[0], rtol=4e-7 * 8, atol=1e-30)
        rest = zip(one[1:], steps[1:])
    else:
        rest = zip(one, steps)
    for got, want in rest:  # the prologue and the GEMM follow the reference bit for bit
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [5, 128])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp", ["pair", "single"])
@pytest.mark.parametrize("level", [0, 4])
def test_fused_equals_the_unfused_graph_bit_for_bit(rows, skip, mlp, level):
    """int4 weights: the fused norm scales A in the unfused kernel's order ((x * gamma) * inv for Simplified), so
    the product is the unfused graph's, bit for bit; at accuracy_level 4 A is quantized per block, where an ulp
    of A would move a code (a 0.05 difference in a 128-row product before the order was the same)."""
    from _single_op import run_nodes

    d = 2048
    model = _model(d, rows, skip=skip, mlp=mlp, level=level)
    feeds = {i.name: v for i, v in zip(model.graph.input, _feeds(model, rows, d))}
    unfused = fuse_siblings(nodes_from_model(model), REF)
    fused = fuse_norms(unfused, REF)
    assert [nd.op_type for nd in fused] == ["NormMatMul"]
    want, got = run_nodes(unfused, feeds, REF, "native"), run_nodes(fused, feeds, REF, "native")
    for name in {o.name for o in model.graph.output}:
        assert got[name].tobytes() == want[name].tobytes(), name


@pytest.mark.parametrize("skip", [False, True])
def test_prologue_and_swiglu_rows_split_over_threads_give_the_same_bits(skip):
    """64 rows of 2048: the prologue and the SwiGLU run in row tasks on two threads (norm_matmul.cc ForRows); a
    row's bits never depend on the thread that ran it, and the path still equals the step-by-step one."""
    d, rows = 2048, 64
    model = _model(d, rows, skip=skip, mlp="swiglu", level=0)
    inputs = _feeds(model, rows, d)
    run = kernel_for("npu", "NormMatMul").run
    p = _prepared(model)
    two = run(p, inputs)
    runtime.configure([p], "native", 1)
    for got, want in zip(run(p, inputs), two):
        np.testing.assert_array_equal(got, want)
    one, steps = _both_paths(p, inputs)
    np.testing.assert_allclose(one[0], steps[0], rtol=4e-7 * 8, atol=1e-30)
    for got, want in zip(one[1:], steps[1:]):
        np.testing.assert_array_equal(got, want)


def test_one_call_keeps_ieee_values():
    """Inf and NaN in a row give what the step path gives: the norm of that row is NaN, other rows are untouched."""
    d, rows = 96, 3
    model = _model(d, rows, skip=True, mlp="single", level=0)
    p = _prepared(model)
    x, res = _feeds(model, rows, d)
    x[0, 1, 5] = np.inf
    x[0, 2, 7] = np.nan
    with np.errstate(all="ignore"):  # as a program call runs its steps (ep/program.py)
        one, steps = _both_paths(p, [x, res])
    for got, want in zip(one, steps):
        np.testing.assert_array_equal(got, want)
    assert np.isnan(one[0][0, 1]).all() and np.isfinite(one[0][0, 0]).all()


def test_broadcast_skip_takes_the_step_path():
    d, rows = 96, 3
    model = _model(d, rows, skip=True, mlp="single", level=0)
    p = _prepared(model)
    x, _ = _feeds(model, rows, d)
    res = RNG.standard_normal((1, 1, d)).astype(np.float32)  # broadcast over rows: numpy's add handles it
    run = kernel_for("npu", "NormMatMul").run
    got = run(p, [x, res])
    p.kernel_cache["one_call"] = False
    want = run(p, [x, res])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("skip", [False, True])
def test_session_at_a_realistic_width_matches_the_cpu_ep(skip):
    d, rows = 2048, 4
    model = _model(d, rows, skip=skip, mlp="swiglu", level=0)
    feeds = {i.name: v for i, v in zip(model.graph.input, _feeds(model, rows, d))}
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds)):
        # K = 2048 float32 sums in a different order, and MLAS's approximate logistic in the CPU EP's SiLU: an
        # absolute error relative to the output's scale (values reach ~1e3 here)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6 * float(np.abs(want).max()))
