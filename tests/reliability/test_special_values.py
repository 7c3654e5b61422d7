"""Special values (NaN, +-Inf, huge, tiny, +-0) through the element-wise, softmax, normalization and reduction
kernels with Python warnings turned into errors: a session must give what the CPU EP gives (inf, nan, ...) and
numpy must not warn ("overflow encountered in exp" used to fail every run under ``python -W error``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from _child import run_child
from npu_testing import assignment, cpu_run, npu_session

F32 = np.float32
VALUES = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e30, -1e30, 1e-45, -1e-45, 1e-38, 0.0, -0.0, 1.0, -1.0,
                   88.8, -88.8, 100.0, -100.0, 1e4, -1e4, 0.5, 2.0, -2.0, 7.0], F32)
N = VALUES.size

UNARY = ["Relu", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Erf", "Sigmoid", "Tanh", "Gelu", "Sin", "Cos", "Log",
         "Floor", "Ceil", "Round", "IsNaN", "Softmax"]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]
VARIADIC = ["Min", "Max", "Sum", "Mean"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax"]
NORMS = ["LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"]
# Left out for the norms: a row of -3e38 everywhere. ORT keeps the row statistics in double (finite), NpuEP's norm
# kernels sum in float32 (overflow: LayerNorm gives nan, RMS gives -0 or nan by gamma); a norm-kernel matter
# (kernels/ops/norm.py), not a warning.
# ReduceMax of a row holding NaN: ORT's result depends on where the NaN sits (Eigen's vectorized max: [0, nan, 2,
# ..., 7] gives 6, [nan, 1, 2] gives nan); NpuEP propagates NaN (IEEE, numpy). Those rows are checked to be NaN.
# Where ORT's own implementation is not IEEE-faithful for such inputs, the test says so and keeps the NaN/Inf
# pattern exact while the finite values use this tolerance.
ATOL = {"Sin": 1e-6, "Cos": 1e-6, "Erf": 1e-6, "Gelu": 1e-5, "Pow": 0.0}


def _model(nodes, inputs, outputs, inits=(), opset=21, extra=()):
    graph = helper.make_graph(nodes, "special", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] +
                              [helper.make_opsetid(d, 1) for d in extra])
    model.ir_version = 10
    return model


def _vi(name, shape, elem=TP.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _case(op: str):
    """(model, feeds) of one op on the special values."""
    bool_out = op in ("IsNaN", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
    out_elem = TP.BOOL if bool_out else TP.FLOAT
    if op in BINARY:  # every pair of special values
        a, b = VALUES.reshape(N, 1), VALUES.reshape(1, N)
        node = helper.make_node(op, ["a", "b"], ["y"], name="k")
        return _model([node], [_vi("a", a.shape), _vi("b", b.shape)], [_vi("y", (N, N), out_elem)]), {"a": a, "b": b}
    if op in VARIADIC:
        a, b = VALUES.reshape(N, 1), VALUES.reshape(1, N)
        node = helper.make_node(op, ["a", "b", "a"], ["y"], name="k")
        return _model([node], [_vi("a", a.shape), _vi("b", b.shape)], [_vi("y", (N, N))]), {"a": a, "b": b}
    uniform = [1e30, 1e-45, 0.0] + ([] if op in NORMS else [-3e38])  # see NORM_ROWS_LEFT_OUT
    rows = np.stack([np.roll(VALUES, i) for i in range(0, N, 3)] + [np.full(N, v, F32) for v in uniform])
    if op in REDUCE:
        node = helper.make_node(op, ["x", "axes"], ["y"], name="k", keepdims=0)
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
        return _model([node], [_vi("x", rows.shape)], [_vi("y", (rows.shape[0],))], inits), {"x": rows}
    if op in NORMS:
        gamma = numpy_helper.from_array(np.linspace(0.5, 1.5, N).astype(F32), "g")
        inputs = ["x", "g"]
        inits = [gamma]
        if op == "LayerNormalization":
            inits.append(numpy_helper.from_array(np.linspace(-1, 1, N).astype(F32), "b"))
            inputs.append("b")
        extra = ("com.microsoft",) if op == "SimplifiedLayerNormalization" else ()
        node = helper.make_node(op, inputs, ["y"], name="k", axis=-1, epsilon=1e-5)
        opset = 23 if op == "RMSNormalization" else 21
        return _model([node], [_vi("x", rows.shape)], [_vi("y", rows.shape)], inits, opset=opset, extra=extra), \
            {"x": rows}
    x = np.concatenate([VALUES.reshape(1, N), rows])
    node = helper.make_node(op, ["x"], ["y"], name="k")
    return _model([node], [_vi("x", x.shape)], [_vi("y", x.shape, out_elem)]), {"x": x}


def _compare(op, got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
        return
    assert (np.isnan(got) == np.isnan(want)).all(), f"{op}: NaN at other places than the CPU EP"
    inf = np.isinf(want)
    assert (np.isinf(got) == inf).all() and (got[inf] == want[inf]).all(), f"{op}: Inf differs from the CPU EP"
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=ATOL.get(op, 1e-6), err_msg=op)


@pytest.mark.parametrize("op", UNARY + BINARY + VARIADIC + REDUCE + NORMS)
def test_special_values_give_the_cpu_ep_result_without_numpy_warnings(op):
    model, feeds = _case(op)
    sess = npu_session(model)
    assert assignment(sess)["k"] == "NpuEP"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning inside a kernel now fails the run
        got = sess.run(None, feeds)[0]
    want = cpu_run(model, feeds)[0]
    if op == "ReduceMax":
        has_nan = np.isnan(feeds["x"]).any(axis=1)
        assert np.isnan(got[has_nan]).all()
        got, want = got[~has_nan], want[~has_nan]
    _compare(op, got, want)


def test_session_under_python_W_error_returns_inf_like_the_cpu_ep():
    """The reported case, in a fresh interpreter started with ``-W error``: Exp of 100 overflows to inf."""
    child = run_child("""
        import sys, warnings
        assert sys.warnoptions == ["error"]
        import numpy as np
        from onnx import helper, TensorProto as TP
        from npu_testing import assignment, cpu_run, npu_session, make_model
        x = np.array([[100.0, -100.0, 1.0]], np.float32)
        model = make_model([helper.make_node("Exp", ["x"], ["e"], name="exp"),
                            helper.make_node("Softmax", ["e"], ["y"], name="soft")],
                           [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3])],
                           [helper.make_tensor_value_info("y", TP.FLOAT, [1, 3])])
        sess = npu_session(model)
        assert set(assignment(sess).values()) == {"NpuEP"}
        got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
        print("OK", got.tolist())
    """, env={"PYTHONWARNINGS": "error"})
    assert child.returncode == 0 and child.last_line().startswith("OK"), child.stderr[-3000:]


def test_split_matmul_with_inf_does_not_warn_on_the_helper_thread(monkeypatch):
    """A product split over the helper thread (kernels/host_blas.py) overflows there too: no warning either."""
    from npu_ep.kernels import host_blas

    monkeypatch.setattr(host_blas, "SPLIT_MACS", 1)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 16)).astype(F32)
    a[0, 0], a[1, 1] = np.inf, np.nan
    w = rng.standard_normal((16, 32)).astype(F32)
    w[0, :] = 0.0  # inf * 0 = nan in BLAS, the case numpy reports as "invalid value encountered in matmul"
    model = _model([helper.make_node("MatMul", ["a", "w"], ["y"], name="k")], [_vi("a", a.shape)],
                   [_vi("y", (8, 32))], [numpy_helper.from_array(w, "w")])
    sess = npu_session(model)
    assert assignment(sess)["k"] == "NpuEP"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sess.run(None, {"a": a})[0]
    _compare("MatMul", got, cpu_run(model, {"a": a})[0])


def test_compile_time_constant_folding_with_huge_weights_does_not_warn():
    """Compile time folds constants (Gemm's alpha into B, beta into C): 2 * 3e38 overflows to inf there too, and
    session creation must not fail under warnings-as-errors."""
    b = np.full((4, 3), 3e38, F32)
    c = np.full((3,), 3e38, F32)
    model = _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="k", alpha=2.0, beta=2.0)],
                   [_vi("a", (2, 4))], [_vi("y", (2, 3))],
                   [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")], opset=17)
    a = np.array([[1.0, 0.0, 0.0, 0.0], [-1e-3, 0.0, 0.0, 0.0]], F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = npu_session(model)
        got = sess.run(None, {"a": a})[0]
    assert assignment(sess)["k"] == "NpuEP"
    _compare("Gemm", got, cpu_run(model, {"a": a})[0])
