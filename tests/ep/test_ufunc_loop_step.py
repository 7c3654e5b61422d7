"""A CallStep calling a numpy ufunc into ORT's buffer runs numpy's own strided loop for the bound dtypes (what the
ufunc's call runs on C-order operands of one shape) without numpy's dispatch: its results keep numpy's bits, and
steps that broadcast, get no buffer or take a non-ufunc keep calling the function."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npu_ep.kernels import runtime
from npu_ep.kernels.ops.elementwise import CLIP_UFUNC
from tests.npu_testing import assignment, make_model, npu_session

ext = runtime.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the extension is not built")


def _step(fn, shapes, dtype=np.float32, into=True):
    n = len(shapes)
    inputs = [(i, i, np.dtype(dtype), shape, None, True) for i, shape in enumerate(shapes)]
    ort = [(n, 0, [abs(d) for d in np.broadcast_shapes(*[tuple(abs(d) for d in s) for s in shapes])])] if into else []
    return ext.CallStep(fn, (None,) * (n + 1), inputs, [(-1, None)], [], ort, [], ("out",))


def test_which_steps_run_the_loop():
    assert _step(np.abs, [(4, 16)]).ufunc_loop
    assert _step(np.add, [(4, 16), (4, 16)], np.int32).ufunc_loop
    assert _step(np.equal, [(3, 5), (3, 5)]).ufunc_loop
    assert not _step(np.add, [(4, 16), (1, 16)]).ufunc_loop  # broadcasting
    assert not _step(np.abs, [(4, 16)], into=False).ufunc_loop  # no ORT buffer
    assert not _step(np.abs, [(1, 1)]).ufunc_loop  # one element: numpy's call runs it with other strides
    assert not _step(np.abs, [(4, -1)]).ufunc_loop  # any extent
    tiny = ext.CallStep(np.negative, (None, None), [(0, 0, np.dtype(np.float32), (4, 16), None, True)], [(-1, None)],
                        [], [(1, 0, [4, 16])], [], ())
    assert not tiny.ufunc_loop  # out by position: not the form taken


def _clip_step(lo, hi, shape=(4, 16), dtype=np.float32):
    return ext.CallStep(CLIP_UFUNC, (None, lo, hi, None), [(0, 0, np.dtype(dtype), shape, None)], [(-1, None)], [],
                        [(3, 0, list(shape))], [], ("out",))


def test_constant_operands_run_the_loop_only_as_0d_arrays_of_the_loops_dtypes():
    f32 = np.float32
    assert _clip_step(np.array(0, f32), np.array(np.inf, f32)).ufunc_loop  # Relu's bounds: numpy's stride 0
    assert _clip_step(np.array(0.0), np.array(1.0), dtype=np.float64).ufunc_loop
    assert _clip_step(np.array(-3, np.int32), np.array(7, np.int32), dtype=np.int32).ufunc_loop
    assert not _clip_step(np.array([0], f32), np.array(np.inf, f32)).ufunc_loop  # broadcast through the iterator
    assert not _clip_step(0.0, np.array(np.inf, f32)).ufunc_loop  # a Python scalar: converted per call
    assert not _clip_step(np.array(0.0), np.array(np.inf)).ufunc_loop  # float64 bounds: x would be cast
    assert not _clip_step(np.array(0, ">f4"), np.array(np.inf, f32)).ufunc_loop  # byte-swapped
    assert not _clip_step(np.array(0, f32), np.array(1, f32), shape=(1, 1)).ufunc_loop  # one element
    only = ext.CallStep(CLIP_UFUNC, (np.array(0, f32), np.array(1, f32), np.array(2, f32), None), [], [(-1, None)],
                        [], [(3, 0, [4, 16])], [], ("out",))
    assert not only.ufunc_loop  # no step input: nothing gives the shape


_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 1.5, -2.5], np.float64)


def _values(shape, dtype, rng):
    n = int(np.prod(shape))
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal(n) * 100
        x[: min(n, _SPECIAL.size)] = _SPECIAL[: min(n, _SPECIAL.size)]
        return x.astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    x[:4] = [info.min, info.max, 0, -1][: min(n, 4)]
    return x.reshape(shape)


def _bits(a):
    return a.view(np.uint8) if a.dtype == np.bool_ else a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("shape", [(1, 64), (3, 5), (2, 3, 700)], ids=str)
@pytest.mark.parametrize("op,fn,arity,dtypes", [
    ("Abs", np.abs, 1, (np.float32, np.int32, np.int64)),
    ("Neg", np.negative, 1, (np.float32, np.int32)),
    ("Sqrt", np.sqrt, 1, (np.float32,)),
    ("Add", np.add, 2, (np.float32, np.int32, np.int64)),
    ("Sub", np.subtract, 2, (np.float32, np.int64)),
    ("Mul", np.multiply, 2, (np.float32, np.int32)),
    ("Div", np.divide, 2, (np.float32,)),
    ("Equal", np.equal, 2, (np.float32, np.int64)),
    ("Less", np.less, 2, (np.float32,)),
])
def test_session_results_keep_numpys_bits(op, fn, arity, dtypes, shape):
    rng = np.random.default_rng(7)
    for dtype in dtypes:
        onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        names = ["a", "b"][:arity]
        out_type = helper.np_dtype_to_tensor_dtype(np.dtype(np.bool_)) if op in ("Equal", "Less") else onnx_type
        model = make_model([helper.make_node(op, names, ["y"], name="node")],
                           [helper.make_tensor_value_info(n, onnx_type, list(shape)) for n in names],
                           [helper.make_tensor_value_info("y", out_type, list(shape))])
        sess = npu_session(model)
        for _ in range(3):  # the first call binds the step, the later ones run it
            feeds = {n: _values(shape, dtype, rng) for n in names}
            if arity == 2:
                feeds["b"].flat[::3] = feeds["a"].flat[::3]  # equal pairs too
            got = sess.run(None, feeds)[0]
            with np.errstate(all="ignore"):
                want = fn(*feeds.values())
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(_bits(got), _bits(want))
        assert assignment(sess) == {"node": "NpuEP"}


@pytest.mark.parametrize("chained", [False, True], ids=["into_ort", "intermediate"])
def test_floating_point_errors_stay_quiet(chained):
    """Division by zero: into ORT's buffer numpy's loop runs without numpy's error check; an intermediate (no buffer
    lent) calls the ufunc, under the program's "ignore all" error state either way, whatever the caller's."""
    f32 = helper.np_dtype_to_tensor_dtype(np.dtype(np.float32))
    nodes = [helper.make_node("Div", ["a", "b"], ["q" if chained else "y"], name="div")]
    if chained:
        nodes.append(helper.make_node("Abs", ["q"], ["y"], name="abs"))
    model = make_model(nodes, [helper.make_tensor_value_info(n, f32, [2, 8]) for n in "ab"],
                       [helper.make_tensor_value_info("y", f32, [2, 8])])
    sess = npu_session(model)
    a = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    b = np.zeros((2, 8), np.float32)
    b[0, ::2] = 2.0
    with np.errstate(all="ignore"):
        want = np.abs(a / b) if chained else a / b
    for _ in range(3):
        with np.errstate(all="raise"):
            got = sess.run(None, {"a": a, "b": b})[0]
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert set(assignment(sess).values()) == {"NpuEP"}


@pytest.mark.parametrize("shape", [(1, 64), (3, 5), (2, 3, 700)], ids=str)
@pytest.mark.parametrize("op", ["Relu", "Clip", "ClipMin"])
def test_constant_bounds_keep_numpys_bits(op, shape):
    """Relu and a Clip of constant bounds on float32 (0-d arrays in the step's call; NpuEP leaves float64 to the CPU
    EP): NaN, -0.0, +-inf and denormals as numpy's clip call gives them."""
    dtype = np.float32
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits, names = {}, ["x"]
    bounds = {"Relu": (0.0, np.inf), "Clip": (-0.0, 1.5), "ClipMin": (-2.5, np.finfo(dtype).max)}[op]
    if op != "Relu":
        inits["lo"] = np.array(bounds[0], dtype)
        names.append("lo")
        if op == "Clip":
            inits["hi"] = np.array(bounds[1], dtype)
            names.append("hi")
    model = make_model([helper.make_node("Relu" if op == "Relu" else "Clip", names, ["y"], name="node")],
                       [helper.make_tensor_value_info("x", onnx_type, list(shape))],
                       [helper.make_tensor_value_info("y", onnx_type, list(shape))], initializers=inits)
    sess = npu_session(model)
    rng = np.random.default_rng(11)
    lo, hi = (np.array(b, dtype) for b in bounds)
    for _ in range(3):  # the first call binds the step, the later ones run it
        x = _values(shape, dtype, rng)
        got = sess.run(None, {"x": x})[0]
        with np.errstate(all="ignore"):
            want = CLIP_UFUNC(x, lo, hi)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert assignment(sess) == {"node": "NpuEP"}


def test_operands_that_only_gain_leading_axes_run_the_loop():
    """numpy pairs a [C] operand with a [1, C] output element by element in C order: one loop call, as same shapes."""
    assert _step(np.add, [(1, 16), (16,)]).ufunc_loop
    assert _step(np.multiply, [(1, 1, 16), (1, 16)]).ufunc_loop
    assert not _step(np.add, [(2, 16), (16,)]).ufunc_loop  # a real broadcast: the iterator repeats b
    rank3 = ext.CallStep(np.add, (None, None, None), [(0, 0, np.dtype(np.float32), (1, 1, 16), None, True),
                                                      (1, 1, np.dtype(np.float32), (16,), None, True)],
                         [(-1, None)], [], [(2, 0, [1, 16])], [], ("out",))
    assert not rank3.ufunc_loop  # an operand of a higher rank than ORT's buffer: numpy's call would refuse `out`
    f32 = np.float32
    assert _clip_step(np.zeros(16, f32), np.array(1, f32), shape=(1, 16)).ufunc_loop  # a full constant bound
    assert not _clip_step(np.zeros(16, f32), np.array(1, f32), shape=(4, 16)).ufunc_loop
    assert not _clip_step(np.zeros(32, f32)[::2], np.array(1, f32), shape=(1, 16)).ufunc_loop  # strided


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("constant", [False, True], ids=["input", "initializer"])
def test_a_bias_of_the_last_axis_keeps_numpys_bits(dtype, constant):
    """x [1, 1, 64] + b [64] (a decoder's bias add at batch 1, one token): b a second input or an initializer."""
    rng = np.random.default_rng(5)
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    b = _values((64,), dtype, rng)
    inputs = [helper.make_tensor_value_info("x", onnx_type, [1, 1, 64])]
    if not constant:
        inputs.append(helper.make_tensor_value_info("b", onnx_type, [64]))
    model = make_model([helper.make_node("Add", ["x", "b"], ["y"], name="node")], inputs,
                       [helper.make_tensor_value_info("y", onnx_type, [1, 1, 64])],
                       initializers={"b": b} if constant else {})
    sess = npu_session(model)
    for _ in range(4):  # the first call binds the step, the later ones run it
        feeds = {"x": _values((1, 1, 64), dtype, rng)}
        if not constant:
            b = feeds["b"] = _values((64,), dtype, rng)
        got = sess.run(None, feeds)[0]
        with np.errstate(all="ignore"):
            want = feeds["x"] + b
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert assignment(sess) == {"node": "NpuEP"}
