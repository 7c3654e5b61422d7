"""A node whose data input is a constant initializer, in a session ORT does not constant-fold (ORT_DISABLE_ALL; and
float16, whose nodes ORT's folding leaves alone at any level), vs ORT's CPU EP.

The kernel sees that input at compile time only (``node.inputs[i].value``) and gets ``None`` for it at run time, so
its ``prepare`` must keep it in ``Prepared.consts``; reductions, Softmax, pooling and Shape/Size kept nothing (and
Conv, ConvTranspose, ConvInteger and QLinearConv only their re-laid-out weights) and failed the run with
"'NoneType' object has no attribute 'ndim'" (issue 38 item 8, ONNX's ``test_attention_4d_fp16_expanded``). Each
case proves NpuEP ran the node (graph assignment).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from _vector_ortref import assert_close, make_model
from npu_testing import assignment, npu_session, session_options

I64 = np.int64

# op -> (further inputs, attrs, opset, output dtype or None for the input's)
CASES = {
    "ReduceMax": ([("axes", np.array([1], I64), True)], {"keepdims": 1}, 18, None),
    "ReduceSum": ([("axes", np.array([-1], I64), True)], {"keepdims": 0}, 18, None),
    "ReduceMean": ([], {"keepdims": 0}, 18, None),
    "ReduceMean(axes attribute)": ([], {"axes": [2, 3]}, 13, None),
    "Softmax": ([], {}, 18, None),
    "Softmax(opset 11)": ([], {"axis": 1}, 11, None),
    "MaxPool": ([], {"kernel_shape": [2, 2]}, 18, None),
    "AveragePool": ([], {"kernel_shape": [2, 2]}, 18, None),
    "GlobalAveragePool": ([], {}, 18, None),
    "Shape": ([], {"start": 1}, 18, I64),
    "Size": ([], {}, 18, I64),
    "ConvTranspose": ([("w", np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 2, 2, 2), True)], {}, 18, None),
    "Conv": ([("w", np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 2, 2), True)], {}, 18, None),
    "ArgMax": ([], {"axis": 3}, 18, I64),  # kernels that already kept their constants: they stay right
    "Relu": ([], {}, 18, None),
}


def _session_options(level: ort.GraphOptimizationLevel) -> ort.SessionOptions:
    so = session_options()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    return so


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_constant_data_input_runs_on_npu(case, dtype):
    op = case.split("(")[0]
    extra, attrs, opset, out_dtype = CASES[case]
    x = (np.arange(48, dtype=np.float32).reshape(2, 3, 2, 4) / 7 - 3).astype(dtype)
    extra = [(name, value.astype(dtype) if value.dtype.kind == "f" else value, const) for name, value, const in extra]
    model = make_model(op, [("x", x, True), *extra], [("y", out_dtype or dtype)], attrs, opset=opset)
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), _session_options(level),
                                providers=["CPUExecutionProvider"]).run(None, {})
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False, so=_session_options(level))
    assert set(assignment(sess).values()) == {"NpuEP"}
    for _ in range(2):  # the second run reads the same constants again
        (got,) = sess.run(None, {})
        assert got.shape == want[0].shape and got.dtype == want[0].dtype
        assert_close(got, want[0], None, f"{case} {np.dtype(dtype).name}")


@pytest.mark.parametrize("op", ["ReduceMax", "Softmax"])
def test_float16_constant_is_not_folded_by_ort_and_runs_on_npu(op):
    """float16 at ORT's default optimization level: ORT's folding leaves the node, NpuEP runs it."""
    extra, attrs, opset, _ = CASES[op]
    x = np.linspace(-2, 2, 24, dtype=np.float16).reshape(2, 3, 4)
    model = make_model(op, [("x", x, True), *extra], [("y", np.float16)], attrs, opset=opset)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    assert_close(sess.run(None, {})[0], want[0], None, op)


@pytest.mark.parametrize("op", ["ConvInteger", "QLinearConv"])
def test_constant_integer_conv_input_runs_on_npu(op):
    x = (np.arange(2 * 3 * 4 * 5) % 251).astype(np.uint8).reshape(2, 3, 4, 5)
    w = (np.arange(2 * 3 * 2 * 2) % 7 - 3).astype(np.int8).reshape(2, 3, 2, 2)
    if op == "ConvInteger":
        inputs = [("x", x, True), ("w", w, True), ("xz", np.array(7, np.uint8), True)]
        out = np.int32
    else:
        f, u8, i8 = np.float32, np.uint8, np.int8
        inputs = [("x", x, True), ("xs", np.array(0.05, f), True), ("xz", np.array(7, u8), True), ("w", w, True),
                  ("ws", np.array(0.1, f), True), ("wz", np.array(0, i8), True), ("ys", np.array(0.2, f), True),
                  ("yz", np.array(128, u8), True)]
        out = np.uint8
    model = make_model(op, inputs, [("y", out)], {}, opset=18)
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), _session_options(level),
                                providers=["CPUExecutionProvider"]).run(None, {})
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False, so=_session_options(level))
    assert set(assignment(sess).values()) == {"NpuEP"}
    assert_close(sess.run(None, {})[0], want[0], None, op)
