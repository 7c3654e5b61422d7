"""Kernels that bind a native call (``KernelDef.bind``: Conv, QLinearConv, MaxPool, AveragePool, GlobalAveragePool,
Q/DQ, MatMulNBits, float MatMul / Gemm (constant or runtime B), npu::NormMatMul, element-wise ufuncs, ReduceSum /
ReduceMean, Softmax): the call step the program's C++ loop makes gives the kernel's own outputs bit for bit, declines
other shapes, DMA counting and another kernel choice, and runs inside real sessions (counted), whose results match
the CPU EP."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep import _native as extension
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.matmul import PACKED_ISAS
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.quantization import quantize_matmul_nbits
from tests.kernels.test_native_norm_matmul import _feeds, _model, _prepared
from tests.loop_oracle import python_loop
from tests.npu_testing import assignment, count_kernel_runs, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(11)
REF = Target.load("npu-ref")
F32 = TensorProto.FLOAT


def one_step_loop(kernel, p, inputs):
    """A loop of the one step bound after running it on ``inputs`` (as a program's first call does)."""
    outs = kernel.run(p, inputs)
    step = kernel.bind(p, inputs, outs)
    n_in = len(inputs)
    loop = extension.StepLoop([(kernel.run, p, tuple(range(n_in)), tuple((i, n_in + i) for i in range(len(outs))),
                             (), step)], n_in + len(outs), tuple(range(n_in, n_in + len(outs))), None)
    return outs, step, loop


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def prepared(model, op_type):
    node = next(n for n in nodes_from_model(model) if n.op_type == op_type)
    p = kernel_for(*node.key).prepare(node, REF)
    runtime.configure([p], "native", 2)
    return kernel_for(*node.key), p


def compiled(model):
    """The whole model as one compiled partition (the session's default kernel choice: native)."""
    from npu_ep.ep.compiler import compile_partition
    from npu_ep.ep.partition import boundary

    nodes = nodes_from_model(model)
    inputs, outputs = boundary(list(range(len(nodes))), nodes)
    return compile_partition("p", nodes, inputs, outputs, REF)


# --- Conv ------------------------------------------------------------------------------------------------------

def conv_model(x_shape, w_shape, **attrs):
    """Conv (+ bias) -> Relu: the Relu is fused into the conv as its tail."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", **attrs),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    rank = len(x_shape)
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, list(x_shape))],
                      [helper.make_tensor_value_info("y", F32, [None] * rank)],
                      {"w": RNG.standard_normal(w_shape).astype(np.float32),
                       "b": RNG.standard_normal(w_shape[0]).astype(np.float32)})


CONVS = {"1d": ((1, 24, 37), (16, 24, 3), {"pads": [1, 1]}),
         "1d_strided": ((2, 8, 64), (12, 8, 5), {"strides": [2], "pads": [2, 2]}),
         "2d": ((1, 6, 19, 23), (10, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
         "depthwise": ((1, 8, 16, 16), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]})}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv_call_step_equals_the_kernel_and_declines_other_shapes(name):
    x_shape, w_shape, attrs = CONVS[name]
    model = conv_model(x_shape, w_shape, **attrs)
    program = compiled(model)
    assert [st.op for st in program.steps] == ["Conv"]  # the Relu is the conv's fused tail
    x = RNG.standard_normal(x_shape).astype(np.float32)
    first = program(x)[0]
    loop = program._bound[(x_shape,)]
    assert loop.native_steps == 1
    assert_same(program(x), [first])
    assert_same([python_loop(program, (x,))[0]], [first])
    np.testing.assert_allclose(first, cpu_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert program.native_step_counts == (1, 0)
    # the same signature never reaches it with another shape here; a direct call does
    kernel, p = program.steps[0].kernel, program.steps[0].prepared
    other = np.ones((x_shape[0], x_shape[1], *[d + 1 for d in x_shape[2:]]), np.float32)
    step = program._bindings[(x_shape,)][0]
    solo = extension.StepLoop([(kernel.run, p, (0,), ((0, 1),), (), step)], 2, (1,), None)
    assert_same(solo((other,)), kernel.run(p, [other]))
    assert solo.native_counts == (0, 1)


@pytest.mark.parametrize("xs,ws,attrs", [((1, 3, 20, 18), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
                                         ((1, 4, 9, 9), (4, 1, 3, 3), {"group": 4}),  # depthwise
                                         ((1, 6, 17), (5, 6, 3), {"strides": [2]})])  # 1-D
def test_qlinearconv_call_step_equals_the_kernel_and_declines_other_shapes(xs, ws, attrs):
    from tests.kernels.test_conv_native import _prepared as conv_prepared
    from tests.kernels.test_conv_native import _qinputs

    kernel, p, args = conv_prepared("QLinearConv", _qinputs(xs, ws, np.uint8, np.int8, per_channel=True), **attrs)
    runtime.configure([p], "native", 2)
    outs, step, loop = one_step_loop(kernel, p, args)
    assert step is not None
    assert_same(loop(tuple(args)), outs)
    assert loop.native_counts == (1, 0)
    other = [np.full((*xs[:-1], xs[-1] + 3), 7, np.uint8), *args[1:]]
    assert_same(loop(tuple(other)), kernel.run(p, other))
    assert loop.native_counts == (1, 1)


@pytest.mark.parametrize("qt", [np.uint8, np.int8])
def test_per_tensor_quantize_and_dequantize_call_steps_equal_the_kernels(qt):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(qt))
    inits = {"s": np.array(0.05, np.float32), "z": np.array(3, qt)}
    q_model = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q")],
                         [helper.make_tensor_value_info("x", F32, [2, 3, 50])],
                         [helper.make_tensor_value_info("y", elem, [2, 3, 50])], inits)
    dq_model = make_model([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="dq")],
                          [helper.make_tensor_value_info("x", elem, [2, 3, 50])],
                          [helper.make_tensor_value_info("y", F32, [2, 3, 50])], inits)
    x = (RNG.standard_normal((2, 3, 50)) * 9).astype(np.float32)
    x.reshape(-1)[::7] = (np.arange(x.size)[::7] % 11 - 5 + 0.5) * 0.05  # ties
    xq = RNG.integers(np.iinfo(qt).min, np.iinfo(qt).max + 1, (2, 3, 50)).astype(qt)
    for model, op, arg in ((q_model, "QuantizeLinear", x), (dq_model, "DequantizeLinear", xq)):
        kernel, p = prepared(model, op)
        outs, step, loop = one_step_loop(kernel, p, [arg])
        assert step is not None
        assert_same(loop((arg,)), outs)
        np.testing.assert_array_equal(outs[0], cpu_run(model, {"x": arg})[0])
        other = arg[:, :2].copy()
        assert_same(loop((other,)), kernel.run(p, [other]))
        assert loop.native_counts == (1, 1)


# --- MaxPool ---------------------------------------------------------------------------------------------------

POOLS = {"2x2": ((1, 5, 12, 35), np.float32, {"kernel_shape": [2, 2], "strides": [2, 2]}),
         "padded": ((2, 3, 9, 10), np.float32, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
         "1d": ((1, 4, 15), np.float32, {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
         "uint8": ((1, 3, 8, 8), np.uint8, {"kernel_shape": [2, 2], "strides": [2, 2]})}


@pytest.mark.parametrize("name", list(POOLS))
def test_maxpool_call_step_equals_the_kernel_and_declines_other_shapes(name):
    shape, dt, attrs = POOLS[name]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)],
                       [helper.make_tensor_value_info("x", elem, list(shape))],
                       [helper.make_tensor_value_info("y", elem, [None] * len(shape))], {})
    kernel, p = prepared(model, "MaxPool")
    if dt == np.float32:
        x = RNG.standard_normal(shape).astype(dt)
        x.reshape(-1)[::13] = np.nan
    else:
        x = RNG.integers(0, 256, shape).astype(dt)
    outs, step, loop = one_step_loop(kernel, p, [x])
    assert step is not None
    assert_same(loop((x,)), outs)
    assert loop.native_counts == (1, 0)
    if dt != np.float32:
        np.testing.assert_array_equal(outs[0], cpu_run(model, {"x": x})[0])
    other = np.ones((*shape[:-1], shape[-1] + 2), dt)
    assert_same(loop((other,)), kernel.run(p, [other]))
    assert loop.native_counts == (1, 1)


@pytest.mark.parametrize("shape", [(1, 5, 7, 9), (2, 3, 4, 4, 4), (1, 8, 1, 1), (1, 4, 30)])
def test_global_average_pool_call_step_equals_the_kernel(shape):
    """numpy's float32 add-reduce (the kernel's own call) and one float32 division per channel: the same bits, a
    NaN channel and infinities included; other shapes run the kernel."""
    model = make_model([helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
                       [helper.make_tensor_value_info("x", F32, list(shape))],
                       [helper.make_tensor_value_info("y", F32, [*shape[:2], *(1,) * (len(shape) - 2)])], {})
    kernel, p = prepared(model, "GlobalAveragePool")
    x = (RNG.standard_normal(shape) * 100).astype(np.float32)
    x.reshape(shape[0], shape[1], -1)[0, 0, 0] = np.nan
    if shape[1] > 2:
        x.reshape(shape[0], shape[1], -1)[0, 2, 0] = np.inf
    outs, step, loop = one_step_loop(kernel, p, [x])
    assert isinstance(step, extension.CallStep)
    got = loop((x,))
    assert_same(got, outs)
    assert got[0].tobytes() == outs[0].tobytes() and loop.native_counts == (1, 0)
    np.testing.assert_allclose(got[0], cpu_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    other = np.ones((shape[0], shape[1] + 1, *shape[2:]), np.float32)
    assert_same(loop((other,)), kernel.run(p, [other]))
    assert loop.native_counts == (1, 1)
    half = x.astype(np.float16)  # float16 binds its own step (test_sweep_pool_half.py), not the float32 one
    assert isinstance(kernel.bind(p, [half], kernel.run(p, [half])), extension.CallStep)


@pytest.mark.parametrize("shape,attrs", [((1, 6, 3, 80), dict(kernel_shape=[3, 2], strides=[3, 2])),
                                         ((2, 3, 15), dict(kernel_shape=[4], strides=[3], pads=[2, 1],
                                                           count_include_pad=1))])
def test_average_pool_call_step_equals_the_kernel(shape, attrs):
    """A float32 AveragePool binds the native pool (its reference's sums and division): the same bits, matching
    the CPU EP; another shape runs the kernel; float16 binds its own step (test_sweep_pool_half.py)."""
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], name="ap", **attrs)],
                       [helper.make_tensor_value_info("x", F32, list(shape))],
                       [helper.make_tensor_value_info("y", F32, [None] * len(shape))], {})
    kernel, p = prepared(model, "AveragePool")
    x = RNG.standard_normal(shape).astype(np.float32)
    outs, step, loop = one_step_loop(kernel, p, [x])
    assert isinstance(step, extension.CallStep)
    got = loop((x,))
    assert got[0].tobytes() == outs[0].tobytes() and loop.native_counts == (1, 0)
    np.testing.assert_allclose(got[0], cpu_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
    other = RNG.standard_normal((shape[0], shape[1] + 1, *shape[2:])).astype(np.float32)
    assert_same(loop((other,)), kernel.run(p, [other]))
    assert loop.native_counts == (1, 1)
    half = x.astype(np.float16)
    assert isinstance(kernel.bind(p, [half], kernel.run(p, [half])), extension.CallStep)


# --- MatMulNBits -----------------------------------------------------------------------------------------------

def nbits_model(k, n, rows, *, level, bias):
    q = quantize_matmul_nbits(RNG.standard_normal((k, n)).astype(np.float32), 32, False)
    inits = {"B": q.B, "S": q.scales, "Z": q.zero_points}
    ins = ["a", "B", "S", "Z"]
    if bias:
        inits["bias"] = RNG.standard_normal(n).astype(np.float32)
        ins += ["", "bias"]
    nodes = [helper.make_node("MatMulNBits", ins, ["y"], "mm", domain="com.microsoft", K=k, N=n, bits=4,
                              block_size=32, accuracy_level=level)]
    return make_model(nodes, [helper.make_tensor_value_info("a", F32, [1, rows, k])],
                      [helper.make_tensor_value_info("y", F32, [1, rows, n])], inits,
                      extra_opsets=[("com.microsoft", 1)])


@pytest.mark.parametrize("k,n,rows", [(2048, 256, 1), (2048, 96, 17), (96, 40, 3)])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_nbits_call_step_equals_the_kernel(k, n, rows, level, bias):
    kernel, p = prepared(nbits_model(k, n, rows, level=level, bias=bias), "MatMulNBits")
    a = RNG.standard_normal((1, rows, k)).astype(np.float32)
    outs, step, loop = one_step_loop(kernel, p, [a])
    assert isinstance(step, extension.CallStep)
    assert_same(loop((a,)), outs)
    assert loop.native_counts == (1, 0)


def test_call_steps_decline_dma_counting_and_another_kernel_choice():
    kernel, p = prepared(nbits_model(96, 40, 2, level=0, bias=False), "MatMulNBits")
    a = RNG.standard_normal((1, 2, 96)).astype(np.float32)
    outs, _, loop = one_step_loop(kernel, p, [a])
    p.runtime.dma_counts = []  # a report counting DMA bytes: the kernel must run (it counts)
    assert_same(loop((a,)), outs)
    assert loop.native_counts == (0, 1) and len(p.runtime.dma_counts) == 1
    p.runtime.dma_counts = None
    runtime.configure([p], "reference", 1)  # the reference model: the kernel must run (numpy)
    np.testing.assert_allclose(loop((a,))[0], outs[0], rtol=1e-5, atol=1e-5)
    assert loop.native_counts == (0, 2)
    assert kernel.bind(p, [a], outs) is None  # and nothing binds under the reference model


def test_matmul_nbits_with_a_fused_bias_binds_its_native_step():
    """MatMulNBits then an Add of a constant bias (a decoder's biased projections: qwen2, GPT-J) fuse into one
    npu::MatMulEpilogue, which binds MatMulNBits' step with the bias folded in: its kernel runs on the first call
    only, and the outputs are the CPU EP's."""
    model = nbits_model(64, 32, 1, level=0, bias=False)
    model.graph.node[0].output[0] = "t"
    model.graph.node.append(helper.make_node("Add", ["t", "add_bias"], ["y"], name="add"))
    model.graph.initializer.append(numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "add_bias"))
    program = compiled(model)
    assert [st.op for st in program.steps] == ["npu::MatMulEpilogue"]
    kernel_runs = count_kernel_runs(program)
    for _ in range(3):
        a = RNG.standard_normal((1, 1, 64)).astype(np.float32)
        np.testing.assert_allclose(program(a)[0], cpu_run(model, {"a": a})[0], rtol=1e-4, atol=1e-4)
    assert kernel_runs == {"npu::MatMulEpilogue": 1}


@pytest.mark.parametrize("bias", [False, True])
def test_a_group_of_matmul_nbits_binds_one_native_step(bias):
    """Three MatMulNBits reading the same A (a decoder's q, k, v projections: GPT-J rewritten) are one
    npu::MatMulGroup; its native step makes the one product (with the members' biases) whose column slices are the
    outputs: the kernel runs on the first call only, and the outputs are the CPU EP's."""
    nodes, inits, outs = [], {}, []
    for i, n in enumerate((32, 32, 48)):
        q = quantize_matmul_nbits(RNG.standard_normal((64, n)).astype(np.float32), 32, False)
        inits.update({f"B{i}": q.B, f"S{i}": q.scales, f"Z{i}": q.zero_points})
        ins = ["a", f"B{i}", f"S{i}", f"Z{i}"]
        if bias and i != 1:  # one member without a bias: zeros in the group's
            inits[f"bias{i}"] = RNG.standard_normal(n).astype(np.float32)
            ins += ["", f"bias{i}"]
        nodes.append(helper.make_node("MatMulNBits", ins, [f"y{i}"], f"mm{i}", domain="com.microsoft", K=64, N=n,
                                      bits=4, block_size=32, accuracy_level=0))
        outs.append(helper.make_tensor_value_info(f"y{i}", F32, [1, 1, n]))
    model = make_model(nodes, [helper.make_tensor_value_info("a", F32, [1, 1, 64])], outs, inits,
                       extra_opsets=[("com.microsoft", 1)])
    program = compiled(model)
    assert [st.op for st in program.steps] == ["npu::MatMulGroup"]
    kernel_runs = count_kernel_runs(program)
    names = [io.name for io in program.outputs]
    for _ in range(3):
        a = RNG.standard_normal((1, 1, 64)).astype(np.float32)
        got = dict(zip(names, program(a)))
        for i, want in enumerate(cpu_run(model, {"a": a})):
            np.testing.assert_allclose(got[f"y{i}"], want, rtol=1e-4, atol=1e-4)
    assert kernel_runs == {"npu::MatMulGroup": 1}


# --- float MatMul / Gemm ----------------------------------------------------------------------------------------

def float_mm_model(a_shape, k, n, *, op="MatMul", tail=(), trans_b=False, bias_shape=None):
    """MatMul (or Gemm) with a constant B, then the ops named in ``tail`` (Add of a bias, Relu, QuantizeLinear
    uint8), which the compiler folds into the product as its epilogue."""
    b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = {"b": b}
    if op == "Gemm":
        inits["c"] = RNG.standard_normal(bias_shape or (n,)).astype(np.float32)
        nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["t0"], name="mm", transB=int(trans_b))]
    else:
        nodes = [helper.make_node("MatMul", ["a", "b"], ["t0"], name="mm")]
    out_type = F32
    for i, kind in enumerate(tail):
        src, dst = f"t{i}", f"t{i + 1}"
        if kind == "bias":
            inits["bias"] = RNG.standard_normal(n).astype(np.float32)
            nodes.append(helper.make_node("Add", [src, "bias"], [dst], name="add"))
        elif kind == "relu":
            nodes.append(helper.make_node("Relu", [src], [dst], name="relu"))
        else:
            inits.update(qs=np.array(0.03, np.float32), qz=np.array(120, np.uint8))
            nodes.append(helper.make_node("QuantizeLinear", [src, "qs", "qz"], [dst], name="q"))
            out_type = TensorProto.UINT8
    nodes[-1].output[0] = "y"
    out_shape = [*a_shape[:-1], n]
    return make_model(nodes, [helper.make_tensor_value_info("a", F32, list(a_shape))],
                      [helper.make_tensor_value_info("y", out_type, out_shape)], inits)


FLOAT_MMS = {
    "matmul": ((2, 5, 64), 64, 48, {}),
    "matmul_bias_relu": ((3, 17, 40), 40, 33, {"tail": ("bias", "relu")}),
    "matmul_bias_relu_quantize": ((1, 9, 72), 72, 20, {"tail": ("bias", "relu", "quantize")}),
    "gemm_row": ((1, 256), 256, 10, {"op": "Gemm", "trans_b": True}),  # a classifier head: one row (gemv)
    "gemm_scalar_c": ((4, 30), 30, 7, {"op": "Gemm", "bias_shape": (1,)}),
    "vector": ((50,), 50, 6, {}),  # a 1-D A
}


@pytest.mark.parametrize("name", list(FLOAT_MMS))
def test_float_matmul_call_step_equals_the_kernel_bit_for_bit(name):
    """numpy's own matmul inside the step, then the epilogue element by element: the same bits as the kernel's
    numpy passes, a NaN row and signed zeros included (ReLU as np.maximum: -0 becomes +0)."""
    a_shape, k, n, kw = FLOAT_MMS[name]
    model = float_mm_model(a_shape, k, n, **kw)
    program = compiled(model)
    assert len(program.steps) == 1 and program.steps[0].op.endswith(("MatMul", "Gemm", "MatMulEpilogue"))
    a = RNG.standard_normal(a_shape).astype(np.float32)
    if a.ndim > 1:
        a.reshape(-1, k)[0, 3] = np.nan
    first = program(a)[0]
    loop = program._bound[(a_shape,)]
    assert loop.native_steps == 1
    got = program(a)[0]
    assert got.dtype == first.dtype and got.tobytes() == first.tobytes()
    assert python_loop(program, (a,))[0].tobytes() == first.tobytes()
    assert program.native_step_counts == (1, 0)
    want = cpu_run(model, {"a": a})[0]
    if want.dtype == np.uint8:  # the CPU EP's float sums differ by ulps: a code may move by one at a tie
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if "relu" in kw.get("tail", ()):
        zeros = np.zeros_like(a)
        zeros[..., 0] = -0.0
        assert not np.signbit(program(zeros)[0]).any()


def test_a_product_of_two_runtime_operands_binds_numpys_matmul_in_any_layout():
    """Attention's scores (Q @ K^T with K^T a transposed view) and context: the step calls numpy's matmul on the
    operands as they are, the kernel's own call, so the bits are the kernel's; another shape declines."""
    model = make_model([helper.make_node("MatMul", ["q", "kt"], ["y"], name="mm")],
                       [helper.make_tensor_value_info("q", F32, [1, 4, 1, 16]),
                        helper.make_tensor_value_info("kt", F32, [1, 4, 16, 37])],
                       [helper.make_tensor_value_info("y", F32, [1, 4, 1, 37])])
    kernel, p = prepared(model, "MatMul")
    q = RNG.standard_normal((1, 4, 1, 16)).astype(np.float32)
    kt = RNG.standard_normal((1, 4, 37, 16)).astype(np.float32).transpose(0, 1, 3, 2)
    outs, step, loop = one_step_loop(kernel, p, [q, kt])
    assert isinstance(step, extension.CallStep)
    assert_same(loop((q, kt)), outs)
    kc = np.ascontiguousarray(kt)  # the same values in C order: bound too, with the kernel's bits for that layout
    assert_same(loop((q, kc)), kernel.run(p, [q, kc]))
    other = RNG.standard_normal((1, 4, 16, 30)).astype(np.float32)
    assert_same(loop((q, other)), kernel.run(p, [q, other]))
    assert loop.native_counts == (2, 1)
    np.testing.assert_allclose(outs[0], cpu_run(model, {"q": q, "kt": np.ascontiguousarray(kt)})[0], rtol=1e-5,
                               atol=1e-5)


def test_float_matmul_does_not_bind_what_the_kernel_does_more_of():
    """A transposed runtime B, an alpha that could not be folded, a product big enough for host_blas's column
    split (without the packed GEMM of AVX-512 hosts) and an A of another dtype run the kernel itself."""
    runtime_b = make_model([helper.make_node("Gemm", ["a", "b"], ["y"], name="mm", transB=1)],
                           [helper.make_tensor_value_info("a", F32, [3, 8]),
                            helper.make_tensor_value_info("b", F32, [5, 8])],
                           [helper.make_tensor_value_info("y", F32, [3, 5])])
    kernel, p = prepared(runtime_b, "Gemm")
    a, b = np.ones((3, 8), np.float32), np.ones((5, 8), np.float32)
    assert kernel.bind(p, [a, b], kernel.run(p, [a, b])) is None
    alpha = make_model([helper.make_node("Gemm", ["a", "b"], ["y"], name="mm", alpha=1e30)],
                       [helper.make_tensor_value_info("a", F32, [3, 8])],
                       [helper.make_tensor_value_info("y", F32, [3, 5])], {"b": np.full((8, 5), 1e20, np.float32)})
    kernel, p = prepared(alpha, "Gemm")
    with np.errstate(over="ignore"):  # 1e30 * 8e20 overflows to inf, as in ORT
        assert p.attrs["alpha"] != 1.0 and kernel.bind(p, [a], kernel.run(p, [a])) is None
    big = float_mm_model((256, 1024), 1024, 512)
    kernel, p = prepared(big, "MatMul")
    x = np.ones((256, 1024), np.float32)
    runtime.native_module().set_isa_cap(1)  # AVX2: no packed GEMM (test_native_packed_sgemm.py), host_blas's cut
    try:
        assert kernel.bind(p, [x], kernel.run(p, [x])) is None
    finally:
        runtime.native_module().set_isa_cap(-1)
    small = float_mm_model((4, 16), 16, 8)
    kernel, p = prepared(small, "MatMul")
    x64 = np.ones((4, 16), np.float64)
    assert kernel.bind(p, [x64], kernel.run(p, [x64])) is None


def test_sessions_run_the_float_matmul_step_and_match_the_cpu_ep():
    model = float_mm_model((1, 512), 512, 10, op="Gemm", trans_b=True, tail=("relu",))
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    a = RNG.standard_normal((1, 512)).astype(np.float32)
    want = cpu_run(model, {"a": a})[0]
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"a": a})[0], want, rtol=1e-5, atol=1e-5)
    (program,) = session_of(sess).programs.values()
    runs, declines = program.native_step_counts
    assert runs >= 2 and declines == 0


# --- int8 GEMM: QLinearMatMul, MatMulInteger ---------------------------------------------------------------------

def int8_mm_model(op, a_shape, k, n, *, runtime_scale=False, azp_rows=0):
    """QLinearMatMul (u8 x s8 -> u8) or MatMulInteger (u8 x s8 -> i32) with a constant B; ``runtime_scale``: A's
    scale a graph input; ``azp_rows``: a per-row A zero point of that many rows."""
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    azp = RNG.integers(100, 140, azp_rows).astype(np.uint8) if azp_rows else np.array(128, np.uint8)
    inits = {"b": b, "az": azp, "bz": np.array(0, np.int8)}
    ins = [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a_shape))]
    out_shape = [*a_shape[:-1], n]
    if op == "QLinearMatMul":
        inits.update({"bs": np.array(0.01, np.float32), "ys": np.array(0.5, np.float32),
                      "yz": np.array(120, np.uint8)})
        if runtime_scale:
            ins.append(helper.make_tensor_value_info("as", F32, []))
        else:
            inits["as"] = np.array(0.02, np.float32)
        node = helper.make_node(op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="mm")
        out = helper.make_tensor_value_info("y", TensorProto.UINT8, out_shape)
    else:
        node = helper.make_node(op, ["a", "b", "az", "bz"], ["y"], name="mm")
        out = helper.make_tensor_value_info("y", TensorProto.INT32, out_shape)
    return make_model([node], ins, [out], inits)


@pytest.mark.parametrize("op", ["QLinearMatMul", "MatMulInteger"])
@pytest.mark.parametrize("a_shape", [(3, 200), (1, 5, 64), (2, 33, 130)])
def test_int8_matmul_call_step_equals_the_kernel(op, a_shape):
    k, n = a_shape[-1], 48
    model = int8_mm_model(op, a_shape, k, n)
    kernel, p = prepared(model, op)
    a = RNG.integers(0, 256, a_shape).astype(np.uint8)
    inputs = [a] + [None] * (len(model.graph.node[0].input) - 1)
    outs, step, loop = one_step_loop(kernel, p, inputs)
    assert isinstance(step, extension.CallStep)
    assert_same(loop(tuple(inputs)), outs)
    assert loop.native_counts == (1, 0)
    other = RNG.integers(0, 256, (7, k)).astype(np.uint8)
    assert loop((other, *inputs[1:]))[0].shape == (7, n)
    assert loop.native_counts == (1, 1)  # another shape: declined, the kernel ran


def test_int8_matmul_does_not_bind_runtime_scales_or_per_row_zero_points():
    model = int8_mm_model("QLinearMatMul", (3, 64), 64, 16, runtime_scale=True)
    kernel, p = prepared(model, "QLinearMatMul")
    a = RNG.integers(0, 256, (3, 64)).astype(np.uint8)
    inputs = [a, np.array(0.02, np.float32)] + [None] * 6
    assert kernel.bind(p, inputs, kernel.run(p, inputs)) is None
    model = int8_mm_model("MatMulInteger", (3, 64), 64, 16, azp_rows=3)
    kernel, p = prepared(model, "MatMulInteger")
    inputs = [a, None, None, None]
    assert kernel.bind(p, inputs, kernel.run(p, inputs)) is None


def test_sessions_run_the_int8_matmul_step_into_orts_buffer_and_match_the_cpu_ep(monkeypatch):
    """The bound step passes ORT's output buffer (``out``), so the bridge copies nothing. MatMulInteger's int32
    sums are exact: equal to the CPU EP's; QLinearMatMul's codes within one of MLAS's at a rounding tie."""
    nat = runtime.native_module()
    seen = []
    real = nat.int8_matmul

    def spy(*args):
        y = real(*args)
        seen.append(len(args) > 13 and args[13] is not None and y is args[13])
        return y

    monkeypatch.setattr(nat, "int8_matmul", spy)
    for op in ("MatMulInteger", "QLinearMatMul"):
        seen.clear()
        model = int8_mm_model(op, (1, 64, 256), 256, 96)
        so = session_options()
        tag_session_options(so)
        sess = npu_session(model, cpu=False, so=so)
        assert set(assignment(sess).values()) == {"NpuEP"}
        a = RNG.integers(0, 256, (1, 64, 256)).astype(np.uint8)
        want = cpu_run(model, {"a": a})[0]
        for _ in range(3):
            got = sess.run(None, {"a": a})[0]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.abs(got.astype(np.int64) - want).max() <= (0 if op == "MatMulInteger" else 1)
        (program,) = session_of(sess).programs.values()
        assert program.native_step_counts[0] >= 2 and program.native_step_counts[1] == 0
        assert seen and seen[-1], op


# --- npu::NormMatMul -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d,rows", [(2048, 1), (96, 3)])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp", ["swiglu", "single"])
def test_norm_matmul_call_step_equals_the_kernel(d, rows, skip, mlp):
    model = _model(d, rows, skip=skip, mlp=mlp, level=0, bias=mlp == "single")
    p = _prepared(model)
    kernel = kernel_for("npu", "NormMatMul")
    inputs = _feeds(model, rows, d)
    outs, step, loop = one_step_loop(kernel, p, inputs)
    assert isinstance(step, extension.CallStep)
    assert_same(loop(tuple(inputs)), outs)
    assert loop.native_counts == (1, 0)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_group_cut_into_slices_binds_its_outputs_as_column_views(rows):
    """{q, k} siblings: one product, each output a column slice of it (as the kernel returns them), bit for bit."""
    model = _model(96, rows, skip=False, mlp="pair", level=0)
    p = _prepared(model)
    kernel = kernel_for("npu", "NormMatMul")
    inputs = _feeds(model, rows, 96)
    outs, step, loop = one_step_loop(kernel, p, inputs)
    assert isinstance(step, extension.CallStep) and len(outs) == 2
    got = loop(tuple(inputs))
    assert_same(got, outs)
    assert loop.native_counts == (1, 0)
    assert got[0].base is not None and got[0].base is got[1].base  # views of one product, not copies
    assert loop((np.zeros((1, rows + 1, 96), np.float32),))[0].shape == (1, rows + 1, outs[0].shape[-1])
    assert loop.native_counts == (1, 1)  # another shape: declined, the kernel ran


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("level", [0, None])  # None: float32 weights (norm_matmul_float, AVX-512 hosts)
def test_sessions_run_the_call_steps_and_match_the_cpu_ep(skip, level):
    if level is None and runtime.native_module().isa() not in PACKED_ISAS:
        pytest.skip("the float NormMatMul's native call runs on AVX-512 hosts")
    d, rows = 2048, 4
    model = _model(d, rows, skip=skip, mlp="swiglu", level=level)
    feeds = {i.name: v for i, v in zip(model.graph.input, _feeds(model, rows, d))}
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    want = cpu_run(model, feeds)
    for _ in range(3):
        for got, ref in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-6 * float(np.abs(ref).max()))
    (program,) = session_of(sess).programs.values()
    runs, declines = program.native_step_counts
    assert runs >= 2 and declines == 0  # the two calls after the first ran the bound NormMatMul


# --- binary element-wise ufuncs --------------------------------------------------------------------------------

@pytest.mark.parametrize("op, a, b", [
    ("Add", np.float32, (3, 1, 5)),  # a runtime input and a broadcast constant
    ("Mul", np.float32, None),  # two runtime inputs
    ("Sub", np.int64, (5,)),
    ("Equal", np.int64, None),
])
def test_binary_ufuncs_bind_to_the_ufunc_and_equal_the_kernel(op, a, b):
    x = (RNG.standard_normal((3, 4, 5)) * 10).astype(a)
    inits = {} if b is None else {"c": (RNG.standard_normal(b) * 10).astype(a)}
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT if a == np.float32 else TensorProto.INT64, [3, 4, 5])]
    if b is None:
        ins.append(helper.make_tensor_value_info("c", ins[0].type.tensor_type.elem_type, [3, 4, 5]))
    out_type = TensorProto.BOOL if op == "Equal" else ins[0].type.tensor_type.elem_type
    model = make_model([helper.make_node(op, ["x", "c"], ["y"], name="op")], ins,
                       [helper.make_tensor_value_info("y", out_type, [3, 4, 5])], inits)
    kernel, p = prepared(model, op)
    inputs = [x] if b is not None else [x, (RNG.standard_normal((3, 4, 5)) * 10).astype(a)]
    inputs += [None] * (2 - len(inputs))
    outs, step, loop = one_step_loop(kernel, p, inputs)
    assert isinstance(step, extension.CallStep)
    assert_same(loop(tuple(inputs)), outs)
    assert loop.native_counts == (1, 0)


@pytest.mark.parametrize("op, dtype", [("Add", np.float32), ("Sub", np.int64), ("Mul", np.int64)])
def test_binary_ufuncs_with_a_0d_result_bind_and_give_a_0d_array(op, dtype):
    """Shape arithmetic on scalars (a mask's length minus one) binds the ufunc too: its numpy scalar is returned as
    the kernel's 0-d array, for values other than the bound ones as well."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model([helper.make_node(op, ["x", "c"], ["y"], name="op")],
                       [helper.make_tensor_value_info("x", elem, [])],
                       [helper.make_tensor_value_info("y", elem, [])], {"c": np.array(2, dtype)})
    kernel, p = prepared(model, op)
    _, step, loop = one_step_loop(kernel, p, [np.array(7, dtype)])
    assert isinstance(step, extension.CallStep)
    for value in (7, 19, -3):
        x = np.array(value, dtype)
        (got,) = loop((x,))
        assert isinstance(got, np.ndarray)
        assert_same([got], kernel.run(p, [x]))
        assert_same([got], cpu_run(model, {"x": x}))
    assert loop.native_counts == (3, 0)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Exp", "Sqrt"])
def test_unary_ufuncs_bind_to_the_ufunc_and_equal_the_kernel(op):
    model = make_model([helper.make_node(op, ["x"], ["y"], name="op")],
                       [helper.make_tensor_value_info("x", F32, [7, 9])],
                       [helper.make_tensor_value_info("y", F32, [7, 9])])
    kernel, p = prepared(model, op)
    x = RNG.standard_normal((7, 9)).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    with np.errstate(all="ignore"):  # as a program call runs its steps
        outs, step, loop = one_step_loop(kernel, p, [x])
        assert isinstance(step, extension.CallStep)
        assert_same(loop((x,)), outs)
        half = x.astype(np.float16)  # Exp computed in float32 by the kernel: not bound; the others bind unary_f16
        assert (kernel.bind(p, [half], kernel.run(p, [half])) is None) == (op == "Exp")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_binds_its_clip_ufunc_and_equals_the_kernel(dtype):
    """Relu's kernel is one clip ufunc call (NaN kept, -0.0 kept, inf kept); the bound step makes that call."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="op")],
                       [helper.make_tensor_value_info("x", elem, [4, 5])],
                       [helper.make_tensor_value_info("y", elem, [4, 5])])
    kernel, p = prepared(model, "Relu")
    x = RNG.standard_normal((4, 5)).astype(dtype)
    x[0, :4] = [np.nan, -0.0, np.inf, -np.inf]
    outs, step, loop = one_step_loop(kernel, p, [x])
    assert isinstance(step, extension.CallStep)
    got = loop((x,))
    assert_same(got, outs)
    assert np.signbit(got[0][0, 1]) and loop.native_counts == (1, 0)
    ints = np.arange(-3, 3, dtype=np.int32)  # np.maximum against a zero: not bound
    assert kernel.bind(p, [ints], kernel.run(p, [ints])) is None


# --- integer ReduceSum -----------------------------------------------------------------------------------------

def reduce_model(dtype, shape, axes, keepdims, op="ReduceSum"):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["x", "axes"], ["y"], name="sum", keepdims=keepdims)
    out = list(np.sum(np.zeros(shape), axis=tuple(axes), keepdims=bool(keepdims)).shape)
    return make_model([node], [helper.make_tensor_value_info("x", elem, list(shape))],
                      [helper.make_tensor_value_info("y", elem, out)], {"axes": np.array(axes, np.int64)},
                      opset=18)


@pytest.mark.parametrize("dtype, shape, axes, keepdims", [
    (np.int64, (1, 513), [1], 0),  # a decoder's attention-mask sum
    (np.int64, (3, 4, 5), [-2, -1], 1),
    (np.int32, (2, 7), [1], 0),
])
def test_integer_reduce_sum_binds_one_exact_call(dtype, shape, axes, keepdims):
    """The call equals the kernel's float64 accumulation bit for bit, saturation included (int32 sums past the
    type's range clip as ORT's do), and declines the values where float64 could round (a row's sum of |x| of
    2^53 or more): the kernel runs those."""
    kernel, p = prepared(reduce_model(dtype, shape, axes, keepdims), "ReduceSum")
    x = RNG.integers(-1000, 1000, shape).astype(dtype)
    outs, step, loop = one_step_loop(kernel, p, [x, None])
    assert isinstance(step, extension.CallStep)
    assert_same(loop((x, None)), outs)
    info = np.iinfo(dtype)
    big = np.full(shape, info.max if dtype == np.int32 else 2**52, dtype)
    assert_same(loop((big, None)), kernel.run(p, [big, None]))
    assert loop.native_counts == (2, 0) if dtype == np.int32 else loop.native_counts == (1, 1)
    if dtype == np.int64:
        np.testing.assert_array_equal(cpu_run(reduce_model(dtype, shape, axes, keepdims), {"x": x})[0], outs[0])


def test_integer_reduce_sum_over_leading_axes_or_to_a_scalar_does_not_bind():
    """(float sums bind ``reduce_axis``: tests/kernels/test_sweep_reduce_axis.py)"""
    for axes, keepdims in (([0], 1), ([0, 1], 0)):
        kernel, p = prepared(reduce_model(np.int64, (3, 4), axes, keepdims), "ReduceSum")
        x = np.ones((3, 4), np.int64)
        assert kernel.bind(p, [x, None], kernel.run(p, [x, None])) is None


@pytest.mark.parametrize("dtype, shape, axes, keepdims", [
    (np.float64, (1, 1, 256), [-1], 1),  # float32 and float16 bind reduce_axis (test_sweep_reduce_axis.py)
    (np.float64, (2, 33, 300), [2], 1),  # rows longer than numpy's pairwise block of 128
    (np.float64, (3, 4, 5), [0, 2], 0),  # leading and trailing axes
])
def test_float_reduce_mean_binds_numpys_sums_scaled_in_place_with_the_kernels_bits(dtype, shape, axes, keepdims):
    model = reduce_model(dtype, shape, axes, keepdims, op="ReduceMean")
    kernel, p = prepared(model, "ReduceMean")
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    x.reshape(-1)[:3] = [np.inf, np.nan, -0.0]
    outs, step, loop = one_step_loop(kernel, p, [x, None])
    assert isinstance(step, extension.CallStep)
    assert_same(loop((x, None)), outs)
    strided = np.asfortranarray(x)  # numpy's sums in another layout: the kernel's call, the kernel's bits
    assert_same(loop((strided, None)), kernel.run(p, [strided, None]))
    assert loop.native_counts == (2, 0)
    y = x.copy()
    y.reshape(-1)[:3] = 1.0
    # another summation order than ORT's: within float32 rounding of the sum of magnitudes
    np.testing.assert_allclose(kernel.run(p, [y, None])[0], cpu_run(model, {"x": y})[0], rtol=1e-6,
                               atol=1e-6 * float(np.abs(y).mean()))


def test_float_reduce_mean_to_a_scalar_does_not_bind():
    for dtype in (np.float32, np.float16, np.float64):
        kernel, p = prepared(reduce_model(dtype, (3, 4), [0, 1], 0, op="ReduceMean"), "ReduceMean")
        x = np.ones((3, 4), dtype)
        assert kernel.bind(p, [x, None], kernel.run(p, [x, None])) is None  # 0-d: a call step reshapes to rank >= 1


# --- Softmax ---------------------------------------------------------------------------------------------------

def softmax_model(dtype, shape, opset=17, **attrs):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return make_model([helper.make_node("Softmax", ["x"], ["y"], name="sm", **attrs)],
                      [helper.make_tensor_value_info("x", elem, list(shape))],
                      [helper.make_tensor_value_info("y", elem, list(shape))], opset=opset)


@pytest.mark.parametrize("shape, opset", [
    ((1, 8, 1, 513), 17),  # decode attention scores over a 513-slot cache
    ((2, 3, 37, 37), 17),
    ((4, 300), 11),  # legacy opset, axis 1 = the last
    ((5, 1), 17),  # rows of one: 1.0
])
def test_native_softmax_is_the_reference_within_float_tolerance_and_binds_its_own_bits(shape, opset):
    """The native softmax (its own exp, one pass per row) against the reference model (numpy) within a few ulp of
    each value, NaN / inf / -inf rows as the reference's; the bound step gives the kernel's bits, and the bits do
    not depend on the thread count."""
    from npu_ep.kernels.ops.softmax import softmax

    model = softmax_model(np.float32, shape, opset, **({"axis": len(shape) - 1} if opset < 13 else {}))
    kernel, p = prepared(model, "Softmax")
    x = (RNG.standard_normal(shape) * 8).astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] > 4 and rows.shape[1] > 2:
        rows[0, 1], rows[1, :], rows[2, 0], rows[3, 2:] = np.nan, -np.inf, np.inf, -np.inf  # the last: masked
        rows[4, 0] = -200.0  # far below the rest: exp underflows to 0
    with np.errstate(all="ignore"):  # as a program call runs its steps
        outs, step, loop = one_step_loop(kernel, p, [x])
        assert isinstance(step, extension.CallStep)
        assert_same(loop((x,)), outs)
        want = softmax(x, -1)
    assert loop.native_counts == (1, 0)
    got = outs[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=4e-6, atol=1e-30)
    assert runtime.native_module().softmax_last_axis(x, 1).tobytes() == got.tobytes()
    assert runtime.native_module().softmax_last_axis(x, 2).tobytes() == got.tobytes()
    finite = (RNG.standard_normal(shape) * 8).astype(np.float32)
    np.testing.assert_allclose(kernel.run(p, [finite])[0], cpu_run(model, {"x": finite})[0], rtol=1e-5, atol=1e-7)


def test_softmax_over_another_axis_binds_softmax_axis_and_float64_stays_numpy():
    kernel, p = prepared(softmax_model(np.float32, (3, 4, 5), axis=1), "Softmax")
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    step = kernel.bind(p, [x], kernel.run(p, [x]))
    assert isinstance(step, extension.CallStep)  # softmax_axis over [3, 4, 5]'s columns (issue 40)
    kernel, p = prepared(softmax_model(np.float16, (3, 4)), "Softmax")
    v = np.ones((3, 4), np.float16)
    assert isinstance(kernel.bind(p, [v], kernel.run(p, [v])), extension.CallStep)  # widened rows (c3c30f5)
    kernel, p = prepared(softmax_model(np.float64, (3, 4)), "Softmax")
    v = np.ones((3, 4), np.float64)
    assert kernel.bind(p, [v], kernel.run(p, [v])) is None
    from npu_ep.kernels.ops.softmax import softmax

    kernel, p = prepared(softmax_model(np.float32, (6, 7)), "Softmax")
    runtime.configure([p], "reference", 2)  # the reference model: numpy's softmax
    x = RNG.standard_normal((6, 7)).astype(np.float32)
    assert kernel.run(p, [x])[0].tobytes() == softmax(x, -1).tobytes()


def test_native_softmax_scalar_tail_has_the_vector_lanes_bits():
    """A row's first eight values take the SSE2 lanes, the rest the scalar code (every lane on a host without
    SSE2): equal inputs at both places give equal bits."""
    v = (RNG.standard_normal(4) * 30).astype(np.float32)
    row = np.concatenate([v, v, v, v[:2], [-500.0]]).astype(np.float32)[None]  # 15 values: 8 in lanes, 7 in the tail
    y = runtime.native_module().softmax_last_axis(row, 1)[0]
    assert y[:4].tobytes() == y[8:12].tobytes() and y[:2].tobytes() == y[12:14].tobytes() and y[14] == 0.0
