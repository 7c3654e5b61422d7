"""The native matrix kernels run the planner's tile plan and count the DMA of its execution model
(``kernels/planner.py``'s docstring; ``kernels/native/tile_dma.h``): the counted bytes per operand and the
number of transfers equal the plan's, which the cost model charges (``kernels/cost.py``), for every matrix kernel
that has a native implementation - MatMulNBits (decode GEMV and prefill GEMM, accuracy_level 0 and 4),
npu::MatMulGroup over MatMulNBits members, the int8 GEMM behind MatMulInteger, QLinearMatMul and
MatMulIntegerToFloat, and the packed-B float GEMM of large fp32 MatMul/Gemm products on AVX-512 hosts. (Smaller
fp32 products, and all of them elsewhere, QGemm and QdqMatMul run on numpy BLAS: no native kernel to count.)

Exactness: the kernels count half-bytes per transfer. The cost model rounds each whole pass over an operand up to
a byte (``ceil(k * n / 2)`` for int4 B, ``ceil(blocks * n * 4.5)`` for blockwise scales), so where such a product
is odd the model charges half a byte more per pass than moves; the shapes of the equality tests keep them even,
and ``test_odd_int4_operands_differ_by_the_models_byte_rounding_only`` pins that difference exactly.
Running the plan's tiles changes no bits (each output is computed whole, in the same order, by one task).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep import _native
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion.siblings import fuse_siblings
from npu_ep.kernels.ops._matrix import native_plan_args
from npu_ep.kernels.ops.matmul_nbits import level_layout
from npu_ep.kernels.planner import _evaluate, elem_bytes
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.quantization import quantize_matmul_nbits

NK = _native.kernels
RNG = np.random.default_rng(5)
F32 = TensorProto.FLOAT



def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _nbits_node(name, k, n, bs, level, zp):
    q = quantize_matmul_nbits(RNG.standard_normal((k, n)).astype(np.float32), bs, not zp)
    inits = {f"{name}_B": q.B, f"{name}_S": q.scales}
    ins = ["x", f"{name}_B", f"{name}_S"]
    if zp:
        inits[f"{name}_Z"] = q.zero_points
        ins.append(f"{name}_Z")
    node = helper.make_node("MatMulNBits", ins, [name], name, domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=bs, accuracy_level=level)
    return node, inits


def _counted_run(node, target, feeds):
    """Run one prepared node natively without and with DMA counting; returns (plan, counted, cost) of the one
    native call, after checking that the counted run (the plan's tiles) gave the same bits."""
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, target)
    args = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    plain = k.run(p, args)
    p.runtime.dma_counts = []
    tiled = k.run(p, args)
    for a, b in zip(plain, tiled):
        np.testing.assert_array_equal(a, b)
    ((plan, counted),) = p.runtime.dma_counts
    shapes = [None if v.missing else (tuple(v.value.shape) if v.value is not None else feeds[v.name].shape)
              for v in node.inputs]
    return plan, counted, k.cost(p, shapes)


def _assert_equal_to_model(plan, counted, cost):
    assert counted == {"a": plan.dma_a, "b": plan.dma_b, "scales": plan.dma_scales, "out": plan.dma_out,
                       "transfers": plan.transfers}, (plan, counted)
    assert counted["a"] + counted["b"] + counted["scales"] + counted["out"] == cost.dma_bytes


@pytest.mark.parametrize("m,k,n,bs,level,zp", [
    (1, 2048, 2048, 32, 4, False),  # the 1B decoder's GEMV
    (1, 512, 96, 16, 0, True),
    (1, 1000, 48, 64, 4, True),     # K not a multiple of the block: a partial last block and chunk
    (5, 512, 200, 64, 4, True),     # prefill tiles
    (37, 320, 130, 32, 0, False),
    (64, 2048, 256, 128, 4, True),
])
def test_matmul_nbits_counts_the_models_dma(m, k, n, bs, level, zp):
    node, inits = _nbits_node("y", k, n, bs, level, zp)
    model = _model([node], [helper.make_tensor_value_info("x", F32, [m, k])],
                   [helper.make_tensor_value_info("y", F32, [m, n])], inits)
    (nd,) = nodes_from_model(model)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    _assert_equal_to_model(*_counted_run(nd, Target.load("npu-ref"), {"x": x}))


@pytest.mark.parametrize("m,level", [(1, 4), (3, 0)])
def test_matmul_group_counts_the_models_dma(m, level):
    """A fused {gate, up} pair (SwiGLU epilogue) is one matmul over the concatenated packed weights: one plan,
    counted once."""
    k, n = 512, 176
    nodes, inits = [], {}
    for name in ("gate", "up"):
        nd, w = _nbits_node(name, k, n, 32, level, zp=True)
        nodes.append(nd)
        inits.update(w)
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"], "sigmoid"),
              helper.make_node("Mul", ["gate", "sig"], ["silu"], "mul_silu"),
              helper.make_node("Mul", ["silu", "up"], ["y"], "mul_up")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [m, k])],
                   [helper.make_tensor_value_info("y", F32, [m, n])], inits)
    target = Target.load("npu-ref")
    (group,) = [nd for nd in fuse_siblings(nodes_from_model(model), target) if nd.op_type == "MatMulGroup"]
    x = RNG.standard_normal((m, k)).astype(np.float32)
    plan, counted, cost = _counted_run(group, target, {"x": x})
    assert (plan.m, plan.n, plan.k) == (m, 2 * n, k)
    _assert_equal_to_model(plan, counted, cost)


def _int8_node(op, m, k, n, dta, dtb):
    a = RNG.integers(0, 256, (m, k)).astype(np.uint8) if dta == np.uint8 else \
        RNG.integers(-128, 128, (m, k)).astype(np.int8)
    b = RNG.integers(-128, 128, (k, n)).astype(dtb) if dtb == np.int8 else RNG.integers(0, 256, (k, n)).astype(dtb)
    inits = {"b": b, "az": np.array(3, dta), "bz": np.array(2, dtb)}
    if op == "MatMulInteger":
        ins, out = ["x", "b", "az", "bz"], TensorProto.INT32
    elif op == "QLinearMatMul":
        inits.update({"as": np.array(0.02, np.float32), "bs": np.array(0.01, np.float32),
                      "ys": np.array(2.0, np.float32), "yz": np.array(128, np.uint8)})
        ins, out = ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], TensorProto.UINT8
    else:
        inits.update({"as": np.array(0.02, np.float32), "bs": np.array(0.01, np.float32)})
        ins, out = ["x", "b", "as", "bs", "az", "bz"], F32
    node = helper.make_node(op, ins, ["y"], domain="com.microsoft" if op == "MatMulIntegerToFloat" else "")
    model = _model([node], [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(a.dtype), [m, k])],
                   [helper.make_tensor_value_info("y", out, [m, n])], inits)
    (nd,) = nodes_from_model(model)
    return nd, {"x": a}


@pytest.mark.parametrize("target", ["npu-ref", "npu-edge"])
@pytest.mark.parametrize("op,dta,dtb", [("MatMulInteger", np.uint8, np.int8), ("MatMulInteger", np.int8, np.int8),
                                        ("QLinearMatMul", np.uint8, np.int8),
                                        ("MatMulIntegerToFloat", np.uint8, np.uint8)])
@pytest.mark.parametrize("m,k,n", [(3, 200, 33), (128, 1024, 1024), (70, 300, 100)])
def test_int8_gemm_counts_the_models_dma(target, op, dta, dtb, m, k, n):
    node, feeds = _int8_node(op, m, k, n, dta, dtb)
    _assert_equal_to_model(*_counted_run(node, Target.load(target), feeds))


@pytest.mark.skipif(NK.isa() not in ("avx512", "avx512_vnni", "amx_int8"),
                    reason="the packed-B float GEMM is the native fp32 MatMul on AVX-512 hosts only")
@pytest.mark.parametrize("m,k,n", [(128, 1024, 1024), (70, 600, 520), (300, 256, 250)])
def test_packed_float_gemm_counts_the_models_dma(m, k, n):
    """Products host_blas would cut in two, with column tails (n = 250, 520). npu-ref only: npu-edge's matrix unit
    has no float mode."""
    b = RNG.standard_normal((k, n)).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["x", "b"], ["y"], "mm")],
                   [helper.make_tensor_value_info("x", F32, [m, k])],
                   [helper.make_tensor_value_info("y", F32, [m, n])], {"b": b})
    (nd,) = nodes_from_model(model)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    _assert_equal_to_model(*_counted_run(nd, Target.load("npu-ref"), {"x": x}))


# --- every residency of the execution model, on plans built directly (the planner picks only the fastest), on
# every instruction-set path of this host (each runs the tiles' row ranges) ------------------------------------------
@pytest.mark.parametrize("resident", ["none", "a", "b", "weights"])
@pytest.mark.parametrize("tiles", [(32, 64, 128), (64, 128, 256)])
@pytest.mark.parametrize("level", [0, 4])
def test_every_residency_counts_the_models_dma(isa, resident, tiles, level):
    target = Target.load("npu-ref")
    m, k, n, bs = 70, 520, 200, 64  # partial tiles along every dim, a partial last K tile of whole blocks
    tm, tn, tk = tiles
    plan = _evaluate(m, n, k, 1, "int4", tm, tn, tk, resident, True,
                     (elem_bytes("float32"), elem_bytes("int4"), elem_bytes("float32")), bs, target)
    w = quantize_matmul_nbits(RNG.standard_normal((k, n)).astype(np.float32), bs, False)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    args = (x, *level_layout(w, level), None, k, n, bs, level, 2)
    y, half = NK.matmul_nbits(*args, plan=native_plan_args(plan), count_dma=True)
    np.testing.assert_array_equal(y, NK.matmul_nbits(*args))
    assert {key: v if key == "transfers" else v / 2 for key, v in half.items()} == {
        "a": plan.dma_a, "b": plan.dma_b, "scales": plan.dma_scales, "out": plan.dma_out, "transfers": plan.transfers}

    ip = _evaluate(m, n, k, 1, "int8", tm, tn, tk, resident, True, (1.0, 1.0, 4.0), None, target)
    from npu_ep.kernels.ops.matmul_int import pack_b
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    pk = pack_b(b, np.zeros(1, np.int8))
    a = RNG.integers(0, 256, (m, k)).astype(np.uint8)
    iargs = (a, np.zeros(1, np.int32), pk["i8_bp"], pk["i8_bsum"], pk["i8_bzp"], k, n, 2)
    acc, half = NK.int8_matmul(*iargs, plan=native_plan_args(ip), count_dma=True)
    np.testing.assert_array_equal(acc, NK.int8_matmul(*iargs))
    assert {key: v if key == "transfers" else v / 2 for key, v in half.items()} == {
        "a": ip.dma_a, "b": ip.dma_b, "scales": ip.dma_scales, "out": ip.dma_out, "transfers": ip.transfers}


def test_odd_int4_operands_differ_by_the_models_byte_rounding_only():
    """k * n and blocks * n odd: each pass over int4 B and over the scales is charged ceil(half-bytes / 2) bytes by
    the model; the kernel counts the half-bytes that move. Passes: one per m strip (B is not resident here)."""
    m, k, n, bs = 1, 1001, 33, 16  # 1001 * 33 and ceil(1001 / 16) * 33 = 63 * 33 are odd
    node, inits = _nbits_node("y", k, n, bs, 4, zp=True)
    model = _model([node], [helper.make_tensor_value_info("x", F32, [m, k])],
                   [helper.make_tensor_value_info("y", F32, [m, n])], inits)
    (nd,) = nodes_from_model(model)
    plan, counted, _ = _counted_run(nd, Target.load("npu-ref"), {"x": RNG.standard_normal((m, k)).astype(np.float32)})
    passes = 1 if plan.resident in ("b", "weights") else -(-m // plan.tm)
    assert counted["b"] == plan.dma_b - 0.5 * passes
    assert counted["scales"] == plan.dma_scales - 0.5 * passes
    assert (counted["a"], counted["out"], counted["transfers"]) == (plan.dma_a, plan.dma_out, plan.transfers)


def test_bad_plans_raise_clear_errors():
    w = quantize_matmul_nbits(RNG.standard_normal((64, 8)).astype(np.float32), 32, True)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="plan must be a 9-tuple"):
        NK.matmul_nbits(x, *level_layout(w, 4), None, 64, 8, 32, 4, 1, plan=(32, 64))
    with pytest.raises(ValueError, match="plan tiles must be positive"):
        NK.matmul_nbits(x, *level_layout(w, 4), None, 64, 8, 32, 4, 1, plan=(0, 64, 128, 0, 8, 1, 8, 9, 32))
    from npu_ep.kernels.ops.matmul_int import pack_b
    pk = pack_b(np.zeros((64, 8), np.int8), None)
    with pytest.raises(ValueError, match="plan tile n 24 is not a multiple of 16"):
        NK.int8_matmul(np.zeros((1, 64), np.uint8), np.zeros(1, np.int32), pk["i8_bp"], pk["i8_bsum"], pk["i8_bzp"],
                       64, 8, 1, plan=(32, 24, 128, 0, 2, 2, 8, 16, 0))
