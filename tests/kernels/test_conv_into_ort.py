"""A float conv's bound step writes a partition output straight into ORT's buffer (conv_dense/conv_depthwise out=):
the same bytes as a new array, and a wrong buffer is refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import host_blas
from npu_ep.kernels.runtime import native_module
from npu_ep.tools.bench.ops import python_steps
from npu_testing import cpu_run, make_model, npu_session, session_options

NAT = native_module()
pytestmark = pytest.mark.skipif(NAT is None or host_blas.sgemm_address() is None, reason="no native kernels")


def _dense(x, w, b, tail, out=None):
    geom = [w.shape[2], 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
    return NAT.conv_dense(x, w, b, geom, host_blas.sgemm_address(), 2, *tail, out=out)


def _depthwise(x, w, b, tail, out=None):
    geom = [x.shape[1], x.shape[1], 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
    return NAT.conv_depthwise(x, w, b, geom, 2, *tail, out=out)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("kind", ["dense", "depthwise"])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("hw", [(8, 8), (5, 17), (33, 31)])
def test_out_gets_the_bytes_of_a_new_array(dtype, kind, relu, hw):
    rng = np.random.default_rng(hw[1] + relu)
    c = 16
    x = rng.standard_normal((1, c, *hw)).astype(dtype)
    x.reshape(-1)[:3] = [np.nan, np.inf, -0.0]
    w = (rng.standard_normal((1, c * 9, 24)) if kind == "dense" else rng.standard_normal((c, 9, 1))).astype(np.float32)
    b = rng.standard_normal(w.shape[2] if kind == "dense" else c).astype(np.float32)
    tail = (np.array([0], np.int32), np.array([0.0, np.inf], np.float32), None, -1) if relu else (None,) * 3 + (-1,)
    run = _dense if kind == "dense" else _depthwise
    want = run(x, w, b, tail)
    out = np.full(want.shape, 7, dtype)
    got = run(x, w, b, tail, out)
    assert got.__array_interface__["data"][0] == out.__array_interface__["data"][0]
    assert out.tobytes() == want.tobytes()


def test_a_wrong_buffer_is_refused():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((1, 144, 16)).astype(np.float32)
    tail = (None,) * 3 + (-1,)
    for bad in (np.empty((1, 16, 8, 8), np.float16), np.empty((1, 16, 8, 7), np.float32),
                np.empty((1, 16, 8, 16), np.float32)[..., ::2], "buffer"):
        with pytest.raises((ValueError, TypeError)):
            _dense(x, w, None, tail, bad)
    ro = np.empty((1, 16, 8, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        _dense(x, w, None, tail, ro)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("group", [1, 16])
@pytest.mark.parametrize("act", ["", "Relu", "HardSwish", "PRelu"])
def test_conv_session_output_is_written_in_place(dtype, group, act):
    """The partition's output is the conv's (or its fused tail's): the bound step writes ORT's buffer and the
    values stay the CPU EP's."""
    rng = np.random.default_rng(group + len(act))
    npt = np.float32 if dtype == TensorProto.FLOAT else np.float16
    inits = {"w": rng.standard_normal((16, 16 // group, 3, 3)).astype(npt) * 0.3,
             "b": rng.standard_normal(16).astype(npt)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], "conv", pads=[1, 1, 1, 1],
                              group=group)]
    if act == "PRelu":
        inits["slope"] = rng.uniform(-1, 1, (16, 1, 1)).astype(npt)
        nodes.append(helper.make_node("PRelu", ["c", "slope"], ["y"], "act"))
    elif act:
        nodes.append(helper.make_node(act, ["c"], ["y"], "act"))
    model = make_model(nodes, [helper.make_tensor_value_info("x", dtype, [1, 16, 8, 8])],
                       [helper.make_tensor_value_info("y", dtype, [1, 16, 8, 8])], inits)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    feeds = {"x": rng.standard_normal((1, 16, 8, 8)).astype(npt)}
    first = sess.run(None, feeds)[0]  # the kernel's run (a new array); then the bound step's, into ORT's buffer
    for _ in range(3):
        assert sess.run(None, feeds)[0].tobytes() == first.tobytes()
    assert [s for s in python_steps(sess) if s["op"] == "Conv"] == []
    tol = 1e-4 if npt == np.float32 else 1e-2
    np.testing.assert_allclose(first.astype(np.float32), cpu_run(model, feeds)[0].astype(np.float32), rtol=tol,
                               atol=tol)


def test_arguments_of_other_layouts_are_converted_as_before():
    """C-order float32/int32 weights, bias and tail are read as they are; others (a Fortran-order or strided w, a
    list bias, int64 tail codes where they fit) are converted to the same values; a string is a TypeError."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((1, 144, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    tail = (np.array([0], np.int32), np.array([0.0, 6.0], np.float32), None, -1)
    want = _dense(x, w, b, tail)
    w_strided = np.repeat(w, 2, axis=2)[..., ::2]
    assert _dense(x, np.asfortranarray(w), b.tolist(), tail).tobytes() == want.tobytes()
    assert _dense(x, w_strided, b, (tail[0].tolist(), tail[1][::-1][::-1], None, -1)).tobytes() == want.tobytes()
    dw = rng.standard_normal((16, 9, 1)).astype(np.float32)
    assert (_depthwise(x, dw[::-1][::-1], b.tolist(), tail).tobytes() == _depthwise(x, dw, b, tail).tobytes())
    geom = [16, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
    for bad in (("w", b), (w, "bias")):
        with pytest.raises(TypeError):
            NAT.conv_dense(x, *bad, geom, host_blas.sgemm_address(), 1)
