"""ConvInteger (kernels/ops/conv_integer.py): integer sums are exact, so the native int8 GEMM, the reference model and
ORT's CPU EP agree bit for bit; a runtime x_zero_point (DynamicQuantizeLinear's) and per-channel w_zero_point; a
conv ORT's own dynamic quantizer wrote runs wholly on NpuEP with the CPU EP's bits. The kernel binds its native call
as the step (the runtime x_zero_point passed in as its byte), and sessions run that step, no Python kernel."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from _sweep import bound_step_outputs
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, make_model, npu_session, session_options

U8, I8 = TensorProto.UINT8, TensorProto.INT8
# x shape, w shape, attrs
SHAPES = [
    ((1, 3, 11, 9), (8, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 4, 10, 10), (6, 2, 3, 2), dict(group=2, strides=[2, 1], dilations=[1, 2])),
    ((1, 6, 7, 8), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1], strides=[2, 2])),  # depthwise
    ((1, 5, 9, 6), (7, 5, 1, 1), dict()),  # pointwise
    ((2, 4, 17), (6, 4, 3), dict(pads=[1, 1])),  # 1-D
    ((1, 96, 8, 20), (24, 96, 3, 3), dict(pads=[1, 1, 1, 1])),  # K = 864: sums past float32's exact range
    ((2, 1, 13, 22), (8, 1, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),  # one channel, 8 outputs (ddddocr's first)
    ((1, 3, 9, 12), (6, 1, 3, 3), dict(group=3, pads=[1, 1, 1, 1])),  # depth multiplier 2
]


def _model(xs, ws, attrs, *, wdt=U8, runtime_xzp=True, per_channel=False, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, ws).astype(np.uint8) if wdt == U8 else rng.integers(-128, 128, ws).astype(np.int8)
    inits = {"w": w}
    if per_channel:
        inits["wz"] = rng.integers(0, 256, ws[0]).astype(np.uint8) if wdt == U8 else np.zeros(ws[0], np.int8)
    else:
        inits["wz"] = np.array(131 if wdt == U8 else 0, np.uint8 if wdt == U8 else np.int8)
    ins = [helper.make_tensor_value_info("x", U8, list(xs))]
    if runtime_xzp:
        ins.append(helper.make_tensor_value_info("xz", U8, []))
    else:
        inits["xz"] = np.array(119, np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="conv", **attrs)
    out = helper.make_tensor_value_info("y", TensorProto.INT32, [None] * len(xs))
    model = make_model([node], ins, [out], inits, opset=10)
    feeds = {"x": rng.integers(0, 256, xs).astype(np.uint8)}
    if runtime_xzp:
        feeds["xz"] = np.array(rng.integers(0, 256), np.uint8)
    return model, feeds


def _kernel_run(model, feeds, kernels, bound: list | None = None):
    """The kernel's output; with ``bound``, also its bound native step's outputs on the same inputs appended."""
    (node,) = nodes_from_model(model)
    k = kernel_for("", "ConvInteger")
    p = k.prepare(node, Target.load("npu-ref"))
    runtime.configure([p], kernels, 2)
    args = [feeds.get(v.name) if not v.missing and not v.is_constant else None for v in node.inputs]
    outs = k.run(p, args)
    if bound is not None:
        bound.extend(bound_step_outputs(k, p, args, outs))
    return outs[0]


def _tagged_session(model):
    so = session_options()
    tag_session_options(so)  # so python_steps finds the session's programs
    return npu_session(model, so=so)


@pytest.mark.parametrize("xs,ws,attrs", SHAPES)
@pytest.mark.parametrize("wdt,per_channel", [(U8, False), (U8, True), (I8, False)])
def test_native_equals_reference_bit_for_bit(isa, xs, ws, attrs, wdt, per_channel):
    model, feeds = _model(xs, ws, attrs, wdt=wdt, per_channel=per_channel, seed=len(xs) + ws[0])
    bound: list = []
    got, want = _kernel_run(model, feeds, "native", bound), _kernel_run(model, feeds, "reference")
    assert got.dtype == want.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert len(bound) == 1, "the kernel bound no native step"
    assert bound[0].shape == got.shape and bound[0].tobytes() == got.tobytes()


@pytest.mark.parametrize("xs,ws,attrs", SHAPES)
@pytest.mark.parametrize("runtime_xzp", [True, False])
def test_session_equals_cpu_ep(xs, ws, attrs, runtime_xzp):
    """uint8 x and w with one w_zero_point, what ORT's CPU ConvInteger takes (the spec's per-channel zero points:
    against the reference above)."""
    model, feeds = _model(xs, ws, attrs, runtime_xzp=runtime_xzp, seed=ws[1])
    sess = _tagged_session(model)
    assert assignment(sess) == {"conv": "NpuEP"}
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i in range(3):  # the kernel's first call, then the bound step's (a new x_zero_point each call)
        if runtime_xzp:
            feeds["xz"] = np.array(60 * i + 7, np.uint8)
        np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu.run(None, feeds)[0])
    assert python_steps(sess) == [], "ConvInteger ran its Python kernel instead of the bound native step"


def test_a_non_scalar_x_zero_point_is_declined_with_a_reason():
    model, _ = _model(*SHAPES[0])
    model.graph.input[1].type.tensor_type.shape.dim.add().dim_value = 2
    from npu_ep.kernels.support import why_not

    (node,) = nodes_from_model(model)
    assert "x_zero_point" in why_not(node, Target.load("npu-ref")) and "scalar" in why_not(node, Target.load("npu-ref"))


def test_a_conv_net_from_orts_dynamic_quantizer_runs_on_npuep_with_the_cpu_eps_bits(tmp_path):
    """DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul, as quantize_dynamic writes it (ddddocr's older
    recognizer is such a model): every node on NpuEP; each op's result is exact or one float32 operation, so the
    outputs are the CPU EP's bits."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(5)
    inits = {"w1": rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32),
             "b1": rng.normal(0, 0.1, 16).astype(np.float32),
             "w2": rng.normal(0, 0.2, (8, 16, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", strides=[2, 2])]
    src = tmp_path / "float.onnx"
    onnx.save(make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 24, 40])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], inits, opset=13), src)
    dst = tmp_path / "dynamic.onnx"
    quantize_dynamic(str(src), str(dst), op_types_to_quantize=["Conv"], weight_type=QuantType.QUInt8)
    ops = {n.op_type for n in onnx.load(dst).graph.node}
    assert {"DynamicQuantizeLinear", "ConvInteger"} <= ops, ops
    sess = _tagged_session(str(dst))
    assert set(assignment(sess).values()) == {"NpuEP"}
    feeds = {"x": rng.normal(0, 1, (1, 3, 24, 40)).astype(np.float32)}
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    assert python_steps(sess) == [], "a step of the quantized net ran its Python kernel"


# weight shape, group, an input channel count that does not match (the native weights pad C/group up to 4)
MISMATCHED_CHANNELS = [((6, 4, 3, 3), 1, 2), ((6, 4, 3, 3), 1, 3), ((6, 8, 3, 3), 1, 5), ((6, 2, 3, 3), 2, 2)]


@pytest.mark.parametrize("ws,group,c", MISMATCHED_CHANNELS)
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_a_symbolic_channel_dim_that_does_not_match_the_weights_is_refused(ws, group, c, kernels):
    """Issue 38: x [1, "C", 5, 5] fed with C = 2 or 3 against 4 weight channels (or 5 against 8) ran natively,
    reading the padded weight channels as zero-point input. The CPU EP refuses it; NpuEP must too, naming the
    node, the op and both shapes."""
    rng = np.random.default_rng(7)
    inits = {"w": rng.integers(0, 256, ws).astype(np.uint8), "xz": np.array(3, np.uint8)}
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], name="conv", group=group, pads=[1, 1, 1, 1])
    model = make_model([node], [helper.make_tensor_value_info("x", U8, [1, "C", 5, 5])],
                       [helper.make_tensor_value_info("y", TensorProto.INT32, [1, ws[0], 5, 5])], inits, opset=10)
    sess = npu_session(model, {"kernels": kernels})
    assert assignment(sess) == {"conv": "NpuEP"}
    good = {"x": rng.integers(0, 256, (1, ws[1] * group, 5, 5)).astype(np.uint8)}
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, good)[0], cpu.run(None, good)[0])
    bad = {"x": rng.integers(0, 256, (1, c, 5, 5)).astype(np.uint8)}
    with pytest.raises(Exception):  # noqa: B017 - ORT's error classes are not public
        cpu.run(None, bad)
    wshape = ", ".join(map(str, ws))
    with pytest.raises(Exception, match=rf"node 'conv' \(ConvInteger\).*ConvInteger: input X \[1, {c}, 5, 5\] has "
                                        rf"{c} channels; weights \[{wshape}\] with group {group} need {ws[1] * group}"):
        sess.run(None, bad)
