"""MaxPool (exact), AveragePool and GlobalAveragePool (fp32 rtol 1e-6, fp16 1e-3) vs ORT CPU: pads, strides,
dilations, ceil_mode, count_include_pad, auto_pad, odd sizes, windows larger than the input, 1-D pools."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from _single_op import both
from npu_testing import F32, assignment, cpu_run, make_model, npu_session

RNG = np.random.default_rng(5)
CASES = [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1),
         dict(kernel_shape=[3, 2], strides=[1, 2], pads=[0, 1, 2, 0], ceil_mode=1),
         dict(kernel_shape=[2, 2])]


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int8, np.uint8])
def test_maxpool_exact(attrs, dt):
    x = (RNG.standard_normal((2, 3, 11, 10)) * 50).astype(dt)
    a = dict(attrs)
    if dt == np.float32:
        a["dilations"] = [1, 2] if "ceil_mode" not in a else [1, 1]
    ours, ref, _, cost = both("MaxPool", [("x", x, False)], **a)
    np.testing.assert_array_equal(ours[0], ref[0])
    assert cost.cycles > 0


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_averagepool_matches_cpu(attrs, include_pad, dt):
    x = RNG.standard_normal((1, 4, 9, 12)).astype(dt)
    ours, ref, _, _ = both("AveragePool", [("x", x, False)], count_include_pad=include_pad, **attrs)
    tol = 1e-6 if dt == np.float32 else 1e-3
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_globalaveragepool_matches_cpu(dt):
    x = RNG.standard_normal((2, 5, 7, 3)).astype(dt)
    ours, ref, _, _ = both("GlobalAveragePool", [("x", x, False)])
    np.testing.assert_allclose(ours[0].astype(np.float32), ref[0].astype(np.float32), rtol=1e-3, atol=1e-3)


# Every padding mode against ORT's CPU EP inside one NpuEP session (one node per combination, one partition).
# The recognizer case of issue 13: a 3x80 map pooled by a kernel as tall as the map (output side 1 < kernel).
GRID_INPUTS = {"tall": (1, 2, 3, 80), "odd": (1, 2, 7, 9), "tiny": (1, 1, 2, 2)}
GRID_GEOMETRIES = [dict(kernel_shape=[3, 2], strides=[3, 2]), dict(kernel_shape=[2, 2], strides=[2, 2]),
                   dict(kernel_shape=[3, 3], strides=[2, 2]), dict(kernel_shape=[4, 3], strides=[1, 2]),
                   dict(kernel_shape=[3, 3], strides=[1, 1], dilations=[2, 1]),
                   dict(kernel_shape=[2, 1], strides=[3, 3]),  # kernel < stride: SAME pads go negative
                   dict(kernel_shape=[1, 2], dilations=[1, 3])]
GRID_PADS = [None, [1, 1, 1, 1], [0, 1, 2, 0], [1, 0, 0, 1]]
AUTO_PADS = ["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]


def _grid_nodes(op: str):
    """(node attrs, input name) for every combination ORT's CPU EP accepts on that input."""
    from _single_op import model, run_ort

    out = []
    for name, shape in GRID_INPUTS.items():
        x = RNG.standard_normal(shape).astype(np.float32)
        for geom, cip, ceil, auto, pads in itertools.product(GRID_GEOMETRIES, [0, 1], [0, 1], AUTO_PADS, GRID_PADS):
            if (auto != "NOTSET" and pads is not None) or (op == "MaxPool" and cip):
                continue
            attrs = dict(geom, ceil_mode=ceil, auto_pad=auto, **({"pads": pads} if pads else {}))
            if op == "AveragePool":
                attrs["count_include_pad"] = cip
            try:  # combinations whose output size is negative are refused by ORT itself: not part of the grid
                run_ort(model(op, [("x", x, False)], **attrs), [("x", x, False)])
            except Exception:  # noqa: BLE001 - ORT refuses it: not part of the grid
                continue
            out.append((attrs, name))
    return out


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_pool_padding_grid_matches_cpu_ep_on_npu(op):
    combos = _grid_nodes(op)
    assert len(combos) > 200
    nodes = [helper.make_node(op, [name], [f"y{i}"], name=f"pool{i}", **attrs)
             for i, (attrs, name) in enumerate(combos)]
    inputs = [helper.make_tensor_value_info(n, F32, s) for n, s in GRID_INPUTS.items()]
    outputs = [helper.make_tensor_value_info(f"y{i}", F32, [None] * 4) for i in range(len(combos))]
    model = make_model(nodes, inputs, outputs, opset=21)
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in GRID_INPUTS.items()}
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for i, (got, ref) in enumerate(zip(sess.run(None, feeds), cpu_run(model, feeds))):
        assert got.shape == ref.shape, combos[i]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=str(combos[i]))


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_1d_pool_matches_cpu_ep_on_npu(op):
    extra = {"count_include_pad": 1} if op == "AveragePool" else {}
    node = helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=[3], strides=[2], pads=[1, 2], ceil_mode=1,
                            **extra)
    model = make_model([node], [helper.make_tensor_value_info("x", F32, ["N", 4, 21])],
                       [helper.make_tensor_value_info("y", F32, [None] * 3)], opset=21)
    x = RNG.standard_normal((2, 4, 21)).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"pool": "NpuEP"}
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 17), (2, 5, 7, 3), (1, 3, 1, 1)])  # rank 5 > the targets' max_rank
def test_globalaveragepool_any_rank_matches_cpu_ep_on_npu(shape):
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")
    model = make_model([node], [helper.make_tensor_value_info("x", F32, shape)],
                       [helper.make_tensor_value_info("y", F32, [None] * len(shape))], opset=21)
    x = RNG.standard_normal(shape).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"gap": "NpuEP"}
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(2, 3, 17), (2, 5, 7, 3), (1, 3, 1, 1)])
def test_globalmaxpool_equals_cpu_ep_on_npu(shape, dt):
    """Magika's classifier head. A max is exact: equal to the CPU EP's. A NaN pixel makes its channel NaN, as
    ONNX Max and numpy's maximum do; the CPU EP's answer there depends on where the NaN lies (Eigen's packet
    reduction: a NaN among 17 pixels is dropped, four pixels of which two are NaN give NaN), so the
    NaN channel is checked on NpuEP alone."""
    node = helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gmp")
    ftype = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    model = make_model([node], [helper.make_tensor_value_info("x", ftype, shape)],
                       [helper.make_tensor_value_info("y", ftype, [None] * len(shape))], opset=21)
    x = np.random.default_rng(17).standard_normal(shape).astype(dt)
    sess = npu_session(model)
    assert assignment(sess) == {"gmp": "NpuEP"}
    got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    x[0, -1].flat[0] = np.nan
    got = sess.run(None, {"x": x})[0]
    assert np.isnan(got[0, -1]).all() and not np.isnan(got[1:]).any() and not np.isnan(got[0, :-1]).any()


@pytest.mark.parametrize("op,attrs,shape", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 8, 112, 112)),  # ResNet stem
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (1, 4, 35, 35)),  # Inception
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), (1, 8, 35, 35)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1),
     (1, 4, 17, 17)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), (1, 8, 56, 56))])
def test_network_pools_match_cpu_ep_on_npu(op, attrs, shape):
    """The pools of real vision models (issue 40), on the native window kernels: the node on NpuEP, MaxPool equal to
    the CPU EP's, AveragePool within float32 rounding of it (its sums in another order)."""
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", F32, shape)],
                       [helper.make_tensor_value_info("y", F32, [None] * 4)], opset=21)
    x = (RNG.standard_normal(shape) * 10).astype(np.float32)
    sess = npu_session(model)
    assert assignment(sess) == {"pool": "NpuEP"}
    got, want = sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0]
    assert got.shape == want.shape
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
