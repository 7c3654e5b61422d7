"""The qdq pass on a model quantized by ORT's own quantize_static (QDQ format, per-channel int8 weights, uint8
activations): it emits only ops the target lists, so NpuEP's coverage does not drop, and outputs stay within one
quantum of ORT's unoptimized QDQ execution (ORT_DISABLE_ALL: the default CPU EP fuses into MLAS kernels whose
rounding differs on their own)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from npu_testing import assignment, npu_session
from onnx import TensorProto, helper, numpy_helper

from npu_ep.kernels.target import Target
from npu_ep.rewriter import rewrite
from tests.rewriter.test_qdq import target_without_qlinear_binary

quantization = pytest.importorskip("onnxruntime.quantization")

RNG = np.random.default_rng(0)


def _float_net() -> onnx.ModelProto:
    """conv -> relu -> two convs -> Add -> Mul by the relu output -> conv: Conv, Add and Mul QDQ units."""
    nodes, inits = [], []

    def conv(name, cin, cout, x):
        inits.extend([numpy_helper.from_array((RNG.standard_normal((cout, cin, 3, 3)) * 0.2).astype(np.float32),
                                              f"{name}_w"),
                      numpy_helper.from_array((RNG.standard_normal(cout) * 0.1).astype(np.float32), f"{name}_b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_y"], name=name,
                                      pads=[1, 1, 1, 1]))
        return f"{name}_y"

    r1 = "r1"
    nodes.append(helper.make_node("Relu", [conv("c1", 3, 8, "x")], [r1], name="relu1"))
    s = "s"
    nodes.append(helper.make_node("Add", [conv("c2", 8, 8, r1), conv("c3", 8, 8, r1)], [s], name="add"))
    nodes.append(helper.make_node("Mul", [s, r1], ["m"], name="mul"))
    y = conv("c4", 8, 4, "m")
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self._feeds = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self._feeds, None)


@pytest.fixture(scope="module", params=[False, True], ids=["shared-qdq", "dedicated-qdq-pairs"])
def quantized(request, tmp_path_factory) -> onnx.ModelProto:
    """ORT's QDQ model; with DedicatedQDQPair every consumer gets its own DQ, so Add and Mul form node units."""
    folder = tmp_path_factory.mktemp("qdq")
    onnx.save(_float_net(), folder / "float.onnx")
    quantization.quantize_static(str(folder / "float.onnx"), str(folder / "qdq.onnx"), _Calibration(),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                 weight_type=quantization.QuantType.QInt8,
                                 activation_type=quantization.QuantType.QUInt8,
                                 extra_options={"DedicatedQDQPair": request.param})
    return onnx.load(str(folder / "qdq.onnx"))


def _coverage(model: onnx.ModelProto, target: str) -> float:
    ran = assignment(npu_session(model, {"target": target}))
    return sum(ep == "NpuEP" for ep in ran.values()) / len(ran)


def _unoptimized_cpu(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("lists_qlinear_binary", [True, False], ids=["npu-ref", "npu-ref-without-qlinear-add-mul"])
def test_qdq_pass_emits_only_listed_ops_and_keeps_coverage_and_numerics(quantized, lists_qlinear_binary, tmp_path):
    target_name = "npu-ref" if lists_qlinear_binary else target_without_qlinear_binary(tmp_path)
    result = rewrite(quantized, passes="qdq", target=target_name)
    rewritten = ir.serde.serialize_model(result.model)
    target = Target.load(target_name)
    emitted = {(n.domain, n.op_type) for n in rewritten.graph.node} - {(n.domain, n.op_type)
                                                                       for n in quantized.graph.node}
    assert emitted, "expected the pass to fuse some unit (QLinearConv)"
    assert all(target.rule(d, op) is not None for d, op in emitted), emitted
    binary = {op for _, op in emitted} & {"QLinearAdd", "QLinearMul"}
    reasons = " | ".join(f.reason for f in result.report.failures)
    if lists_qlinear_binary:
        assert binary, emitted
    else:
        assert not binary
        assert "com.microsoft::QLinearAdd is not in the ops table of target npu-ref-no-qlinear-binary" in reasons

    before, after = _coverage(quantized, target_name), _coverage(rewritten, target_name)
    assert after >= before, (before, after)

    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = _unoptimized_cpu(quantized, {"x": x})
    got = npu_session(rewritten, {"target": target_name}).run(None, {"x": x})[0]
    last_dq = next(n for n in quantized.graph.node if quantized.graph.output[0].name in n.output)
    assert last_dq.op_type == "DequantizeLinear"
    quantum = float(next(numpy_helper.to_array(t) for t in quantized.graph.initializer if t.name == last_dq.input[1]))
    assert np.abs(got - want).max() <= quantum * (1 + 1e-5), (np.abs(got - want).max(), quantum)
