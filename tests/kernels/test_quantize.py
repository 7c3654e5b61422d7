"""QuantizeLinear (bit-exact vs ORT CPU) and DequantizeLinear (exact for fp32: one multiply) over int8/uint8/
int16/uint16/int4/uint4, per-tensor, per-axis and blocked, with ties (x/scale = k + 0.5) and saturation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import _single_op as so

RNG = np.random.default_rng(3)
ELEM = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
        "uint16": TensorProto.UINT16, "int4": TensorProto.INT4, "uint4": TensorProto.UINT4}
CONTAINER = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int4": np.int8,
             "uint4": np.uint8}
RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535), "int4": (-8, 7),
         "uint4": (0, 15)}


def _x(shape, qt):
    lo, hi = RANGE[qt]
    span = (hi - lo) * 0.6
    x = RNG.uniform(-span, span, shape).astype(np.float32)
    x.reshape(-1)[::7] = np.round(x.reshape(-1)[::7]) + 0.5  # exact ties with scale 1 cases below
    return x


def _params(qt, kind, shape, axis=1, block=2):
    lo, hi = RANGE[qt]
    if kind == "tensor":
        s, z = np.array(1.0 if qt.endswith("4") else 0.5, np.float32), np.array((lo + hi) // 2 + 1, CONTAINER[qt])
    elif kind == "axis":
        s = RNG.uniform(0.25, 2, shape[axis]).astype(np.float32)
        z = RNG.integers(lo, hi + 1, shape[axis]).astype(CONTAINER[qt])
    else:
        bshape = list(shape)
        bshape[axis] = -(-shape[axis] // block)
        s = RNG.uniform(0.25, 2, bshape).astype(np.float32)
        z = RNG.integers(lo, hi + 1, bshape).astype(CONTAINER[qt])
    return s, z


def _q_models(qt, x, s, z, **attrs):
    inputs = [("x", x, False), ("s", s, True), ("z", z, True, ELEM[qt])]
    q = so.model("QuantizeLinear", inputs, **attrs)
    ref_model = onnx.ModelProto.FromString(q.SerializeToString())  # Q -> Cast(int8/uint8...) for ORT's output
    g = ref_model.graph
    g.node[0].output[0] = "q"
    g.node.append(helper.make_node("Cast", ["q"], ["y0"], to=ELEM[qt] if not qt.endswith("4") else
                                   (TensorProto.INT8 if qt == "int4" else TensorProto.UINT8)))
    return inputs, q, ref_model


@pytest.mark.parametrize("qt", list(ELEM))
@pytest.mark.parametrize("kind", ["tensor", "axis", "blocked"])
def test_quantizelinear_bit_exact(qt, kind):
    shape = (3, 7, 5)
    x = _x(shape, qt)
    s, z = _params(qt, kind, shape)
    attrs = {"axis": 1} | ({"block_size": 2} if kind == "blocked" else {})
    inputs, q, ref_model = _q_models(qt, x, s, z, **attrs)
    ref = so.run_ort(ref_model, inputs)
    ours, _, cost = so.run_npu(q, inputs, "npu-ref", ref)
    assert ours[0].dtype == CONTAINER[qt]
    np.testing.assert_array_equal(ours[0], ref[0])
    assert cost.cycles > 0


# runtime int4 tensors cannot be fed through ORT's Python API (no numpy int4): int4 inputs are constants
@pytest.mark.parametrize("qt,const_x", [(q, c) for q in ELEM for c in (True, False) if c or not q.endswith("4")])
@pytest.mark.parametrize("kind", ["tensor", "axis", "blocked"])
def test_dequantizelinear_matches_cpu(qt, kind, const_x):
    shape = (4, 6, 3)
    lo, hi = RANGE[qt]
    x = RNG.integers(lo, hi + 1, shape).astype(CONTAINER[qt])
    s, z = _params(qt, kind, shape, axis=1, block=4)
    attrs = {"axis": 1} | ({"block_size": 4} if kind == "blocked" else {})
    inputs = [("x", x, const_x, ELEM[qt]), ("s", s, True), ("z", z, True, ELEM[qt])]
    ours, ref, _, _ = so.both("DequantizeLinear", inputs, **attrs)
    np.testing.assert_array_equal(ours[0], ref[0])


def test_quantize_default_uint8_and_fp16_dequant():
    x = _x((2, 9), "uint8")
    ours, ref, _, _ = so.both("QuantizeLinear", [("x", x, False), ("s", np.array(0.7, np.float32), True)])
    np.testing.assert_array_equal(ours[0], ref[0])
    q = RNG.integers(-128, 128, (2, 9)).astype(np.int8)
    ours, ref, _, _ = so.both("DequantizeLinear", [("x", q, False), ("s", np.array(0.1, np.float16), True),
                                                  ("z", np.array(-3, np.int8), True)])
    assert ours[0].dtype == np.float16
    np.testing.assert_array_equal(ours[0], ref[0])


def test_edge_declines_int16_dequant_naming_rule():
    q = RNG.integers(-100, 100, (2, 9)).astype(np.int16)
    reason = so.declined("DequantizeLinear", [("x", q, False), ("s", np.array(0.1, np.float32), True)], "npu-edge")
    assert "int16 not supported by target npu-edge" in reason


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_zero_d_quantize_dequantize_keep_their_shape_without_constant_folding(kernels):
    """QNN-style graphs quantize 0-d constants (scalar factors, mask values); with ORT_DISABLE_ALL nothing folds
    them, so the Q/DQ kernels see 0-d inputs: the result stays 0-d and equals the CPU EP's (native and reference)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from npu_testing import assignment, npu_session, session_options

    nodes = [helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], domain="com.microsoft"),
             helper.make_node("Mul", ["x", "d"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             (("c", 0.5, np.float32), ("s", 0.01, np.float32), ("z", 3, np.uint8))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("q", TensorProto.UINT8, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    opts = session_options()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.array(3.0, np.float32)
    want = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    sess = npu_session(model, {"kernels": kernels} if kernels == "reference" else None, cpu=False, so=opts)
    got = sess.run(None, {"x": x})
    assert set(assignment(sess).values()) == {"NpuEP"}
    for g, w in zip(got, want):
        assert g.shape == w.shape == () and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
