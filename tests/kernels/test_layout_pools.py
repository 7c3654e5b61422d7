"""The layout pass's pools (kernels/layout.py ``_window``): a float 2-D MaxPool / AveragePool of an NHWC tensor with
any attributes (strides, pads, dilations, ceil_mode, auto_pad, count_include_pad) stays in the region as an
npu::PoolNhwc step (kernels/ops/pool_nhwc.py), no Transpose around it; a pool the role refuses (a 3-D pool, an
Indices output, integer data) stays an NCHW pool behind a Transpose back. Sessions with the pass on give the CPU EP's
results, every node on NpuEP and no step on its Python kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, shape_inference

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import layout, runtime
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.target import Target
from _layout_sessions import layout_nodes, matches_cpu
from npu_testing import make_model

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")
F32 = TensorProto.FLOAT


def _ops(model, how="nhwc"):
    return [n.op_type for n in layout_nodes(model, how)]


def _dw_pool_pw(op="MaxPool", c=24, batch=1, **pool):
    """depthwise 3x3 -> pool -> pointwise, on a symbolic image size."""
    rng = np.random.default_rng(60)
    inits = {"w0": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "w1": (rng.standard_normal((16, c, 1, 1)) / 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["a"], ["p"], **pool),
             helper.make_node("Conv", ["p", "w1"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [batch, c, "h", "w"])],
                      [helper.make_tensor_value_info("y", F32, [batch, 16, None, None])], inits)


def _image(shape, seed, nan=True):
    """Specials included; a NaN only where the CPU EP's pool keeps it (its MaxPool may drop one by position, where
    ours, as the reference, lets it win: kernels/ops/pool.py)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x[0, 1, 2, 3], x[0, 4, 5, 6], x[-1, 7, 0, 0], x[0, 2, 1, 1] = np.nan if nan else 0.0, np.inf, -np.inf, 1e-40
    return x


POOLS = [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[3, 2], strides=[1, 3], dilations=[2, 1], pads=[2, 0, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("MaxPool", dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])),  # SPPF's
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 1], auto_pad="SAME_LOWER")),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="VALID")),
    ("AveragePool", dict(kernel_shape=[5, 2], strides=[1, 1], pads=[0, 1, 4, 0], count_include_pad=1)),
]


@pytest.mark.parametrize("op,attrs", POOLS)
def test_a_pool_stays_in_the_region_as_a_native_nhwc_step(op, attrs):
    model = _dw_pool_pw(op, **attrs)
    assert _ops(model) == ["ConvNhwc", "PoolNhwc", "ConvNhwc", "Transpose"]  # one Transpose: the output's
    for shape, seed in (((1, 24, 20, 18), 61), ((1, 24, 9, 13), 62)):
        steps = matches_cpu(model, "nhwc", _image(shape, seed, nan=op == "AveragePool"))
        assert [s.op for s in steps].count("npu::PoolNhwc") == 1
        assert "MaxPool" not in [s.op for s in steps] and "AveragePool" not in [s.op for s in steps]


@pytest.mark.parametrize("op,attrs", [POOLS[0], POOLS[6]])
def test_auto_matches_the_cpu_ep(op, attrs):
    """``auto`` takes the region where the cost model says it pays (and below AVX-512 none): the CPU EP's results
    either way."""
    model = _dw_pool_pw(op, c=32, batch=2, **attrs)
    matches_cpu(model, "auto", _image((2, 32, 28, 28), 63, nan=op == "AveragePool"))


def _sppf_model(op, k, pads, **attrs):
    """YOLO's SPPF: pw -> pool -> pool -> Concat of the three -> pw, on a symbolic batch and image size."""
    rng = np.random.default_rng(14)
    c = 24
    inits = {"w0": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "w1": (rng.standard_normal((c, c, 1, 1)) / 4).astype(np.float32),
             "w2": (rng.standard_normal((8, 3 * c, 1, 1)) / 6).astype(np.float32)}
    pool = {"kernel_shape": list(k), "pads": list(pads), **attrs}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a0"], group=c, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a0", "w1"], ["a1"]),
             helper.make_node(op, ["a1"], ["p1"], **pool),
             helper.make_node(op, ["p1"], ["p2"], **pool),
             helper.make_node("Concat", ["a1", "p1", "p2"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, ["N", c, "h", "w"])],
                      [helper.make_tensor_value_info("y", F32, ["N", 8, None, None])], inits)


@pytest.mark.parametrize("op,k,pads,attrs", [
    ("MaxPool", (5, 5), (2, 2, 2, 2), {}),
    ("MaxPool", (3, 4), (1, 1, 1, 2), {}),
    ("AveragePool", (3, 3), (1, 1, 1, 1), {"count_include_pad": 0}),
    ("AveragePool", (5, 2), (0, 1, 4, 0), {"count_include_pad": 1}),
])
def test_sppf_pools_run_as_nhwc_steps(op, k, pads, attrs):
    """SPPF's same-size pools (formerly the NCHW pool over a dilated view) are PoolNhwc steps too."""
    model = _sppf_model(op, k, pads, **attrs)
    ops = _ops(model)
    assert ops.count("Transpose") == 1 and ops.count("PoolNhwc") == 2 and op not in ops
    rng = np.random.default_rng(15)
    for shape in ((1, 24, 20, 18), (2, 24, 9, 13)):
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, 1, 2, 3], x[0, 4, 5, 6], x[-1, 7, 0, 0], x[0, 2, 1, 1] = np.nan, np.inf, -np.inf, 1e-40
        steps = matches_cpu(model, "nhwc", x)
        assert sum(s.op == "npu::ConvNhwc" for s in steps) == 3
        assert sum(s.op == "npu::PoolNhwc" for s in steps) == 2


def test_an_indices_output_keeps_the_pool_nchw():
    rng = np.random.default_rng(64)
    inits = {"w0": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
             "w1": rng.standard_normal((16, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a0"], group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a0", "w1"], ["a1"]),
             helper.make_node("MaxPool", ["a1"], ["p", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w1"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 16, 8, 8])],
                       [helper.make_tensor_value_info("y", F32, [1, 16, 4, 4]),
                        helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 16, 4, 4])], inits)
    assert _ops(model) == ["ConvNhwc", "ConvNhwc", "Transpose", "MaxPool", "Conv"]


def _pool_node(op, x_type, shape, n_out=1, **attrs):
    outs = ["y", "idx"][:n_out]
    node = helper.make_node(op, ["x"], outs, **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", x_type, shape)],
                       [helper.make_tensor_value_info(o, x_type if o == "y" else TensorProto.INT64,
                                                      [None] * len(shape)) for o in outs], {})
    (n,) = nodes_from_model(model)
    return n


def test_the_role_refuses_what_pool_nhwc_does_not_compute():
    assert layout._window(_pool_node("MaxPool", F32, [1, 8, 6, 6], kernel_shape=[3, 3], strides=[2, 2]))
    assert layout._window(_pool_node("AveragePool", TensorProto.FLOAT16, [1, 8, 6, 6], kernel_shape=[2, 2]))
    refused = [
        _pool_node("MaxPool", F32, [1, 8, 4, 6, 6], kernel_shape=[2, 2, 2]),  # 3-D
        _pool_node("MaxPool", F32, [1, 8, 6], kernel_shape=[2]),  # 1-D
        _pool_node("MaxPool", F32, [1, 8, 6, 6], n_out=2, kernel_shape=[2, 2]),  # Indices
        _pool_node("MaxPool", TensorProto.UINT8, [1, 8, 6, 6], kernel_shape=[2, 2]),  # integer data
        _pool_node("MaxPool", TensorProto.INT8, [1, 8, 6, 6], kernel_shape=[2, 2]),
        _pool_node("MaxPool", F32, [1, "c", 6, 6], kernel_shape=[2, 2]),  # symbolic channels
        _pool_node("LpPool", F32, [1, 8, 6, 6], kernel_shape=[2, 2]),
    ]
    for n in refused:
        assert not layout._window(n), n.describe()


@pytest.mark.parametrize("c,hw,strides,cheaper", [(64, 56, 2, "NHWC"), (256, 14, 2, "NHWC"), (3, 224, 1, "NCHW")])
def test_the_cost_model_credits_a_pool_where_nhwc_fills_more_lanes(c, hw, strides, cheaper):
    """A strided pool of many channels fills its lanes in NHWC (and needs no permute per tap): a saving the region
    counts; a pool of three channels on wide rows fills them in NCHW: a negative one."""
    model = _dw_pool_pw(c=c, kernel_shape=[3, 3], strides=[strides, strides], pads=[1, 1, 1, 1])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = hw
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = hw
    nodes = fuse_partition(nodes_from_model(shape_inference.infer_shapes(model)), REF)
    pool = next(n for n in nodes if n.op_type == "MaxPool")
    assert (layout.pool_saving(pool, REF) > 0) == (cheaper == "NHWC")
