"""Capability never raises: every registered kernel's check, fed inputs of unknown rank, rank 0 or unknown dims,
answers None or a one-sentence reason. A decline shown to the user is a sentence, never a Python exception.

Through ORT: a MatMul whose input has unknown rank (a Reshape to a runtime shape of runtime length) used to raise
IndexError inside the check; it is now declined with a reason and the model still matches the CPU EP."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session, session_options

from npu_ep.ep.capability import analyze
from npu_ep.kernels.node import NodeInfo, ValueInfo
from npu_ep.kernels.registry import KERNELS, kernel_for
from npu_ep.kernels.support import why_not
from npu_ep.kernels.target import Target

kernel_for("", "MatMul")  # loads every kernel module
# The "npu" domain holds the compiler's fused kernels (made by fusion from claimed nodes): capability never sees them.
ALL_KERNELS = sorted(k for k in KERNELS if k[0] != "npu")
SHAPES = {"unknown rank": None, "rank 0": (), "unknown dims": (None, "S", None), "rank 1 symbolic": ("N",)}
DTYPES = [np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.int64)]


def _node(domain: str, op: str, shape, dtype, n_inputs: int) -> NodeInfo:
    inputs = tuple(ValueInfo(f"in{i}", dtype, shape) for i in range(n_inputs))
    outputs = (ValueInfo("out0", dtype, shape), ValueInfo("out1", dtype, shape), ValueInfo("out2", dtype, shape))
    return NodeInfo(0, f"{op}_probe", op, domain, inputs, outputs, {}, since_version=21)


@pytest.mark.parametrize("key", ALL_KERNELS, ids=lambda k: f"{k[0]}::{k[1]}" if k[0] else k[1])
@pytest.mark.parametrize("target", ["npu-ref", "npu-edge"])
def test_every_kernel_check_answers_a_sentence_on_unknown_shapes(key, target):
    t = Target.load(target)
    kernel = KERNELS[key]
    for label, shape in SHAPES.items():
        for dtype in DTYPES:
            for n_inputs in (9, 12):  # more than any op reads: a check never meets a missing required input
                node = _node(*key, shape, dtype, n_inputs)
                for check in (kernel.check, lambda n, tt: why_not(n, tt)):
                    try:
                        reason = check(node, t)
                    except Exception as exc:  # noqa: BLE001 - any raise is the failure reported
                        pytest.fail(f"{key} ({label}, {dtype}, {n_inputs} inputs) raised {type(exc).__name__}: {exc}")
                    assert reason is None or (isinstance(reason, str) and reason and "\n" not in reason), reason


def test_analyze_has_no_exception_reasons_for_unknown_rank_inputs():
    t = Target.load("npu-ref")
    nodes = [_node(*key, None, np.dtype(np.float32), 9) for key in ALL_KERNELS]
    nodes = [NodeInfo(i, n.name, n.op_type, n.domain, n.inputs, n.outputs, n.attrs, n.since_version)
             for i, n in enumerate(nodes)]
    failed = [d.reason for d in analyze(nodes, t).decisions if d.reason and "capability check failed" in d.reason]
    assert not failed, failed


def unknown_rank_matmul_model(op_type: str = "MatMul"):
    """y = op(Reshape(x, shape), W) where ``shape`` is a runtime input of runtime length: ORT cannot infer the rank."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node(op_type, ["r", "w"], ["y"], name="matmul"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 8]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, ["L"])],
                       [helper.make_tensor_value_info("z", F32, ["?"])],
                       {"w": np.random.default_rng(2).standard_normal((8, 3)).astype(np.float32)})
    model.graph.output[0].type.tensor_type.ClearField("shape")  # unknown rank (the checker wants a shape field)
    return model


def test_unknown_rank_matmul_runs_on_npuep_and_matches_cpu(caplog):
    """MatMul reads A's rank at run time (leading dims are rows or a batch; the plan is made per concrete shape)."""
    model = unknown_rank_matmul_model("MatMul")
    with caplog.at_level("DEBUG", logger="npu_ep"):
        sess = npu_session(model)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "IndexError" not in text and "capability check failed" not in text, text
    assert set(assignment(sess).values()) == {"NpuEP"}
    rng = np.random.default_rng(3)
    for shape in ([2, 2, 8], [4, 8], [1, 2, 2, 8]):
        feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "shape": np.array(shape, np.int64)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_unknown_rank_gemm_input_is_rank_2_by_the_spec_and_a_wrong_rank_is_a_clear_error(caplog):
    """ONNX fixes Gemm's A at rank 2 (KernelDef.spec_ranks), so A of unknown rank is claimed (ddddocr's CRNN head:
    a Reshape to a computed shape); a run whose A is not 2-D fails naming the op, as the CPU EP's run does."""
    model = unknown_rank_matmul_model("Gemm")
    with caplog.at_level("DEBUG", logger="npu_ep"):
        sess = npu_session(model)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "IndexError" not in text and "capability check failed" not in text, text
    assert set(assignment(sess).values()) == {"NpuEP"}
    rng = np.random.default_rng(3)
    for shape in ([4, 8], [-1, 8]):
        feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "shape": np.array(shape, np.int64)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-6, atol=1e-6)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "shape": np.array([2, 2, 8], np.int64)}
    with pytest.raises(Exception, match=r"Gemm: A has shape \[2, 2, 8\]; Gemm needs a 2-D A"):
        sess.run(None, feeds)
    with pytest.raises(Exception):  # noqa: B017 - the CPU EP refuses it too (its error classes are not public)
        cpu_run(model, feeds)


def unknown_rank_chain_model():
    """A Reshape to a runtime shape (ORT loses the rank) feeding the rank-free kernels of an attention-like block:
    element-wise, ReduceMean with a negative axis, Softmax, Transpose with and without perm, Cast, Identity, Slice,
    Concat, Squeeze/Unsqueeze and Shape -> Gather plumbing, then a MatMul (which reads A's rank at run time too)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("ReduceMean", ["r"], ["mean"], name="mean", axes=[-1], keepdims=1),
             helper.make_node("Sub", ["r", "mean"], ["centered"], name="sub"),
             helper.make_node("Mul", ["centered", "centered"], ["sq"], name="mul"),
             helper.make_node("Softmax", ["sq"], ["sm"], name="softmax", axis=-1),
             helper.make_node("Transpose", ["sm"], ["t"], name="transpose", perm=[1, 0, 2]),
             helper.make_node("Transpose", ["t"], ["tt"], name="transpose_reverse"),
             helper.make_node("Transpose", ["tt"], ["tb"], name="transpose_back"),
             helper.make_node("Cast", ["tb"], ["c"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Identity", ["c"], ["ident"], name="identity"),
             helper.make_node("Slice", ["ident", "starts", "ends", "axes"], ["sl"], name="slice"),
             helper.make_node("Concat", ["sl", "sl"], ["cat"], name="concat", axis=-1),
             helper.make_node("Unsqueeze", ["cat", "ax0"], ["u"], name="unsqueeze"),
             helper.make_node("Squeeze", ["u", "ax0"], ["sq2"], name="squeeze"),
             helper.make_node("Shape", ["sq2"], ["shp"], name="shape"),
             helper.make_node("Gather", ["shp", "last"], ["n"], name="gather", axis=0),
             helper.make_node("Cast", ["n"], ["nf"], name="cast_n", to=TensorProto.FLOAT),
             helper.make_node("Add", ["sq2", "nf"], ["y"], name="add"),
             helper.make_node("MatMul", ["y", "w"], ["z"], name="matmul")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4, 8]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, ["L"])],
                       [helper.make_tensor_value_info("z", F32, ["?"])],
                       {"w": np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32),
                        "starts": np.array([1], np.int64), "ends": np.array([4], np.int64),
                        "axes": np.array([-1], np.int64), "ax0": np.array([0], np.int64),
                        "last": np.array(-1, np.int64)})
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


RANK_FREE_NODES = ["reshape", "mean", "sub", "mul", "softmax", "transpose", "transpose_reverse", "transpose_back",
                   "cast", "identity", "slice", "concat", "unsqueeze", "squeeze", "shape", "gather", "cast_n", "add"]


def test_rank_free_kernels_take_unknown_rank_inputs_in_one_partition_and_match_cpu(caplog):
    model = unknown_rank_chain_model()
    so = session_options()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the no-op Cast and Identity
    with caplog.at_level("DEBUG", logger="npu_ep"):
        sess = npu_session(model, so=so)
    text = "\n".join(r.getMessage() for r in caplog.records)
    where = assignment(sess)
    assert {n: where[n] for n in RANK_FREE_NODES + ["matmul"]} == {n: "NpuEP" for n in RANK_FREE_NODES + ["matmul"]}
    assert len(npu_partitions(sess)) == 1
    assert "has unknown rank" not in text
    rng = np.random.default_rng(4)
    for shape in ([2, 2, 8], [1, 4, 8]):  # the runtime rank-3 shapes this model's Transpose perm allows
        feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "shape": np.array(shape, np.int64)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_unknown_rank_is_declined_where_the_target_needs_the_rank():
    """npu-edge compiles static shapes only, and a rule with max_rank below the default cannot be checked without
    the rank: both decline a rank-free kernel's unknown-rank input with the target's reason."""
    edge = Target.load("npu-edge")
    add = _node("", "Add", None, np.dtype(np.float32), 2)
    assert why_not(add, edge) == "node 'Add_probe' (Add): in0 has unknown rank; target npu-edge requires static shapes"
    ref = Target.load("npu-ref")
    assert why_not(add, ref) is None
    limited = Target.from_dict({**ref.raw, "ops": {**ref.raw["ops"], "Add": {"dtypes": ["float32"], "max_rank": 4}}})
    assert why_not(add, limited) == \
        "node 'Add_probe' (Add): in0 has unknown rank; target npu-ref limits this op to rank 4"


def test_unknown_rank_conv_input_runs_on_npuep_since_its_weight_fixes_the_rank():
    """A 1-D Conv reading a Reshape to a runtime shape (Silero VAD's Conv after an If): the constant weight
    [M, C, k] says the input is [N, C, L]."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Conv", ["r", "w"], ["y"], name="conv", pads=[1, 1])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4, 8]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, ["L"])],
                       [helper.make_tensor_value_info("y", F32, ["?"])],
                       {"w": np.random.default_rng(5).standard_normal((3, 4, 3)).astype(np.float32)})
    model.graph.output[0].type.tensor_type.ClearField("shape")
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    feeds = {"x": np.random.default_rng(6).standard_normal((2, 4, 8)).astype(np.float32),
             "shape": np.array([1, 4, 16], np.int64)}
    np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_unknown_rank_matmul_integer_runs_on_npuep_with_the_cpu_eps_bits():
    """MatMulInteger, like MatMul, reads A's rank at run time (ddddocr's int8 CRNN: a Reshape to a computed shape,
    then DynamicQuantizeLinear, then MatMulInteger)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("MatMulInteger", ["r", "w", "xz", "wz"], ["y"], name="matmul")]
    rng = np.random.default_rng(4)
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 8]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, ["L"])],
                       [helper.make_tensor_value_info("y", TensorProto.INT32, ["?"])],
                       {"w": rng.integers(0, 256, (8, 5)).astype(np.uint8), "xz": np.array(121, np.uint8),
                        "wz": np.array(3, np.uint8)}, opset=13)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for shape in ([4, 8], [2, 2, 8], [1, 2, 2, 8], [1, 1, 2, 2, 8]):
        feeds = {"x": rng.integers(0, 256, (4, 8)).astype(np.uint8), "shape": np.array(shape, np.int64)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu_run(model, feeds)[0])
