"""Numerics where NpuEP used to differ from ORT's CPU EP (issue 14 item 9), each checked against the CPU EP through
a real NpuEP session (graph assignment proves NpuEP ran the node):

- Gemm with beta = 0 ignores C, NaN and Inf included;
- QuantizeLinear of NaN gives the output type's lowest value (ORT's MLAS, every type: int8/uint8/int16/uint16/
  int4/uint4, any zero point; com.microsoft's QuantizeLinear gives the same on the CPU EP);
- a reduction over an empty axis gives its identity (ReduceMax: -inf or the integer minimum; Sum/Mean: 0) instead
  of raising;
- integer ReduceSum saturates at the type's limits (ORT accumulates in float64) instead of wrapping.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from npu_testing import assignment, cpu_run, npu_session

NAN, INF = np.float32(np.nan), np.float32(np.inf)


def _model(nodes, inputs, outputs, inits=(), opset=21, extra=()):
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] +
                              [helper.make_opsetid(d, 1) for d in extra])
    model.ir_version = 10
    return model


def _run_both(model, feeds, on_npu: list[str]):
    sess = npu_session(model)
    where = assignment(sess)
    for name in on_npu:
        assert where[name] == "NpuEP", where
    return sess.run(None, feeds), cpu_run(model, feeds)


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # NaN == NaN here; bit-exact otherwise


# --- Gemm, beta = 0 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (2.0, 0.0), (0.0, 0.0), (0.5, 1.0)])
@pytest.mark.parametrize("c_constant", [True, False])
def test_gemm_beta_zero_ignores_nan_and_inf_in_c(alpha, beta, c_constant):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    a[0, 0] = INF  # alpha = 0 still multiplies: 0 * inf = nan in that row, as on the CPU EP
    b = rng.standard_normal((8, 5)).astype(np.float32)
    c = np.full((5,), NAN, np.float32)
    c[1], c[2] = INF, -INF
    inputs = [helper.make_tensor_value_info("a", TP.FLOAT, [4, 8])]
    inits = [numpy_helper.from_array(b, "b")]
    if c_constant:
        inits.append(numpy_helper.from_array(c, "c"))
    else:
        inputs.append(helper.make_tensor_value_info("c", TP.FLOAT, [5]))
    model = _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm", alpha=alpha, beta=beta)],
                   inputs, [helper.make_tensor_value_info("y", TP.FLOAT, [4, 5])], inits, opset=17)
    feeds = {"a": a} if c_constant else {"a": a, "c": c}
    got, want = _run_both(model, feeds, ["gemm"])
    if beta == 0.0:
        assert np.isfinite(want[0][1:]).all()  # the point: C's NaN/Inf do not reach the result
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5, equal_nan=True)
    assert (np.isnan(got[0]) == np.isnan(want[0])).all() and (np.isinf(got[0]) == np.isinf(want[0])).all()


# --- QuantizeLinear of special values ---------------------------------------------------------------------------
SPECIAL = np.array([[NAN, INF, -INF, 1e30, -1e30, 2.5, -2.5, 0.0, -0.0, 3e9, -3e9, 1e-45, 7.5, -7.5, 300, -300]],
                   np.float32)
QTYPES = {"int8": (TP.INT8, [0, 5, -7]), "uint8": (TP.UINT8, [0, 128, 255]), "int16": (TP.INT16, [0, 100]),
          "uint16": (TP.UINT16, [0, 30000]), "int4": (TP.INT4, [0, 3, -8]), "uint4": (TP.UINT4, [0, 8, 15])}


@pytest.mark.parametrize("qtype,zp", [(q, z) for q, (_, zps) in QTYPES.items() for z in zps])
def test_quantize_linear_of_nan_and_inf_matches_ort(qtype, zp):
    onnx_type = QTYPES[qtype][0]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant")]
    out_type = onnx_type
    if qtype in ("int4", "uint4"):
        # numpy has no int4 and an int4 tensor cannot cross a partition boundary: dequantize on the NPU, which
        # maps each q to a distinct float, so the float output still compares q exactly
        out_type = TP.FLOAT
        nodes.append(helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequant"))
    else:
        nodes.append(helper.make_node("Identity", ["q"], ["y"], name="out"))
    inits = [helper.make_tensor("s", TP.FLOAT, [], [0.5]), helper.make_tensor("z", onnx_type, [], [zp])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, list(SPECIAL.shape))],
                   [helper.make_tensor_value_info("y", out_type, list(SPECIAL.shape))], inits)
    got, want = _run_both(model, {"x": SPECIAL}, ["quant"])
    lowest = {"int8": -128, "uint8": 0, "int16": -32768, "uint16": 0, "int4": -8, "uint4": 0}[qtype]
    q_of_nan = want[0][0, 0] / 0.5 + zp if qtype in ("int4", "uint4") else want[0][0, 0]
    assert q_of_nan == lowest  # ORT: NaN -> the type's lowest value, whatever the zero point
    _assert_same(got, want)


def test_com_microsoft_quantize_linear_gives_the_same_for_nan_on_the_cpu_ep():
    """NpuEP has no com.microsoft QuantizeLinear kernel; this pins that ORT's two ops agree on NaN, so the ONNX
    kernel's rule is the one rule."""
    for qtype, (onnx_type, _) in QTYPES.items():
        if qtype in ("int4", "uint4"):
            continue
        outs = []
        for domain in ("", "com.microsoft"):
            node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], domain=domain)
            inits = [helper.make_tensor("s", TP.FLOAT, [], [0.5]), helper.make_tensor("z", onnx_type, [], [0])]
            model = _model([node], [helper.make_tensor_value_info("x", TP.FLOAT, list(SPECIAL.shape))],
                           [helper.make_tensor_value_info("y", onnx_type, list(SPECIAL.shape))], inits,
                           extra=("com.microsoft",) if domain else ())
            outs.append(cpu_run(model, {"x": SPECIAL})[0])
        np.testing.assert_array_equal(outs[0], outs[1])


def test_matmul_with_fused_quantize_epilogue_maps_nan_like_ort():
    a = np.array([[NAN, 1.0], [1.0, 2.0], [INF, 0.0]], np.float32)
    w = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"], name="mm"),
             helper.make_node("QuantizeLinear", ["m", "s", "z"], ["y"], name="quant")]
    inits = [numpy_helper.from_array(w, "w"), helper.make_tensor("s", TP.FLOAT, [], [0.25]),
             helper.make_tensor("z", TP.INT8, [], [3])]
    model = _model(nodes, [helper.make_tensor_value_info("a", TP.FLOAT, [3, 2])],
                   [helper.make_tensor_value_info("y", TP.INT8, [3, 2])], inits)
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    got = sess.run(None, {"a": a})[0]
    want = cpu_run(model, {"a": a})[0]
    np.testing.assert_array_equal(got, want)


# --- reductions over an empty axis ----------------------------------------------------------------------------
REDUCE_DTYPES = {"ReduceSum": [np.float32, np.int32, np.int64], "ReduceMean": [np.float32],
                 "ReduceMax": [np.float32, np.int32, np.int64]}


@pytest.mark.parametrize("op,dtype", [(op, dt) for op, dts in REDUCE_DTYPES.items() for dt in dts])
@pytest.mark.parametrize("axes", [[1], [0, 1], None, [0], [2]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduction_over_an_empty_axis_gives_the_identity_like_ort(op, dtype, axes, keepdims):
    x = np.zeros((2, 0, 3), dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs, inits = ["x"], []
    if axes is not None:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    model = _model([helper.make_node(op, inputs, ["y"], name="reduce", keepdims=keepdims)],
                   [helper.make_tensor_value_info("x", elem, [2, 0, 3])],
                   [helper.make_tensor_value_info("y", elem, None)], inits, opset=18)
    got, want = _run_both(model, {"x": x}, ["reduce"])
    _assert_same(got, want)


# --- integer ReduceSum saturates ----------------------------------------------------------------------------------
def _sum_cases(dtype):
    top, low = np.iinfo(dtype).max, np.iinfo(dtype).min
    rows = [[top, 1, 5, 0], [-top, -5, 3, 0], [top, 10, -20, 0], [-20, top, 10, 0], [top, top, -top, 0],
            [low, -1, 0, 0], [7, -3, 2, 1]]
    return np.array(rows, dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axes,keepdims", [([1], 0), ([1], 1), (None, 0), ([0], 0)])
def test_integer_reduce_sum_saturates_like_ort(dtype, axes, keepdims):
    """ORT 1.31 sums integers in float64 and saturates. For int64 that is exact only below 2^53; every case here
    is one where float64 rounding and ORT's order cannot disagree (saturating or small), and the CPU EP decides."""
    x = _sum_cases(dtype)
    if axes is None or axes == [0]:
        x = x[[0, 1, 5, 6]] if axes is None else x  # reduce all: one saturating row dominates the total
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs, inits = ["x"], []
    if axes is not None:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    model = _model([helper.make_node("ReduceSum", inputs, ["y"], name="reduce", keepdims=keepdims)],
                   [helper.make_tensor_value_info("x", elem, list(x.shape))],
                   [helper.make_tensor_value_info("y", elem, None)], inits, opset=18)
    got, want = _run_both(model, {"x": x}, ["reduce"])
    if axes == [1]:
        top = np.iinfo(dtype).max
        assert want[0].reshape(-1)[0] == top  # ORT saturates ([max, 1, 5] would wrap to a negative number)
    _assert_same(got, want)
