"""Resize inside the layout pass's NHWC regions (kernels/layout.py ``_resize``), and Resize of NHWC models.

A nearest or linear Resize of an NHWC tensor of a region stays in it as the same Resize with ``axes`` naming the NHWC
place of each scale or size (constant or computed at run time, static or symbolic image sizes), run by the native
kernel of axes 1 and 2 of [N, H, W, C] (resize.cc): no Transpose on either side; a Shape of a region's map (run-time
sizes, as an FPN's ``interpolate(size=...)``) reads the NHWC map and gathers NCHW order. Sessions with
``conv_layout`` nhwc and auto match the CPU EP with no step on its Python kernel; cubic and tf_crop_and_resize stay
NCHW outside the region. A model that is NHWC itself (a TF export's Resize with [1, sh, sw, 1] scales) runs the
same kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, shape_inference

from _sweep import native_calls
from npu_ep.ep.sessions import tag_session_options
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import layout, runtime
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.ops import python_steps
from _layout_sessions import layout_nodes, layout_session
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")
F32 = TensorProto.FLOAT
RNG = np.random.default_rng(40)


def _w(*shape, scale=0.25):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(resize_inputs, extra_nodes=(), extra_inits=None, c=16, hw=(56, 56), out_hw=(56, 56), stride=2,
           deep=False, opset=17, **attrs):
    """dw 3x3 (``stride``) -> Resize (``resize_inputs`` after the map ``a0``) -> pw c->c -> y; ``deep``: a dw 3x3 s2
    and a pw after it (the region's saving then exceeds its boundary, so auto takes it)."""
    inits = {"w0": _w(c, 1, 3, 3, scale=1.0), "b0": _w(c), "w1": _w(c, c, 1, 1), "w2": _w(c, 1, 3, 3, scale=1.0),
             "w3": _w(c, c, 1, 1), **(extra_inits or {})}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a0"], name="dw", group=c, kernel_shape=[3, 3],
                              strides=[stride, stride], pads=[1, 1, 1, 1]),
             *extra_nodes,
             helper.make_node("Resize", ["a0", *resize_inputs], ["up"], name="resize", **attrs),
             helper.make_node("Conv", ["up", "w1"], ["p" if deep else "y"], name="pw")]
    if deep:
        out_hw = tuple((d + 1) // 2 for d in out_hw)
        nodes += [helper.make_node("Conv", ["p", "w2"], ["d"], group=c, kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Conv", ["d", "w3"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, *hw])],
                      [helper.make_tensor_value_info("y", F32, [1, c, *out_hw])], inits, opset=opset)


def _ops(model, how):
    return [n.op_type for n in layout_nodes(model, how)]


def _runs_in_the_region(model, how, xs, kernel, axes=(0, 3, 1, 2)):
    """The session matches the CPU EP for each input of ``xs`` on bound native steps; the Resize step reads the
    depthwise conv's NHWC output and feeds the pointwise conv (no Transpose between), and its kernel was ``kernel``
    (the native function the observing call ran)."""
    sess, steps = layout_session(model, how)
    ops = [s.op for s in steps]
    assert ops.count("Transpose") == 1 and ops[-1] == "Transpose", ops
    resize = next(s for s in steps if s.op == "Resize")
    producer = next(s for s in steps if resize.in_slots[0] in s.out_slots)
    reader = next(s for s in steps if resize.out_slots[0] in s.in_slots)
    assert producer.op == reader.op == "npu::ConvNhwc"
    assert resize.prepared.attrs["axes"] == list(axes)
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for x in xs:
        want = cpu.run(None, {"x": x})[0]
        with native_calls() as calls:
            for _ in range(3):  # observed, then on the bound native steps
                got = sess.run(None, {"x": x})[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert kernel in calls, calls
    assert python_steps(sess) == []
    return steps


def _image(shape, specials=True):
    """With ``specials`` NaN and infinities (for nearest: a linear blend of an infinity differs from ORT's, which
    weighs both neighbours, where the reference adds the weighted difference), always a -0.0."""
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 6, 1, 1] = -0.0
    if specials:
        x[0, 1, 2, 3], x[0, 4, 0, 0], x[0, 5, -1, -1] = np.nan, np.inf, -np.inf
    return x


SCALES2 = {"scales": np.array([1, 1, 2, 2], np.float32)}


@pytest.mark.parametrize("how", ["nhwc", "auto"])
def test_a_linear_upsample_runs_in_the_region(how):
    model = _model(["", "scales"], extra_inits=SCALES2, mode="linear", coordinate_transformation_mode="half_pixel",
                   deep=how == "auto")
    assert _ops(model, how) == ["ConvNhwc", "Resize", "ConvNhwc", *(["ConvNhwc"] * 2 * (how == "auto")), "Transpose"]
    _runs_in_the_region(model, how, [_image((1, 16, 56, 56), specials=False)], "resize_linear_nhwc")


@pytest.mark.parametrize("coord,mode", [("align_corners", "linear"), ("pytorch_half_pixel", "linear"),
                                        ("half_pixel", "nearest"), ("asymmetric", "nearest")])
def test_other_modes_and_a_downsample_run_in_the_region(coord, mode):
    model = _model(["", "scales"], extra_inits={"scales": np.array([1, 1, 0.75, 1.5], np.float32)},
                   out_hw=(21, 42), mode=mode, coordinate_transformation_mode=coord)
    _runs_in_the_region(model, "nhwc", [_image((1, 16, 56, 56), mode == "nearest")], f"resize_{mode}_nhwc")


@pytest.mark.parametrize("axes", [[2, 3], [-1, -2]])
def test_the_axes_attribute_moves_to_the_nhwc_axes(axes):
    """Opset 18's ``axes``: scales for the named NCHW axes only, read for their NHWC places."""
    scales = np.array([2.0, 1.5] if axes == [2, 3] else [1.5, 2.0], np.float32)
    model = _model(["", "scales"], extra_inits={"scales": scales}, out_hw=(56, 42), opset=18, axes=axes,
                   mode="linear", coordinate_transformation_mode="pytorch_half_pixel")
    steps = _runs_in_the_region(model, "nhwc", [_image((1, 16, 56, 56), specials=False)], "resize_linear_nhwc",
                                axes=[1, 2] if axes == [2, 3] else [2, 1])
    assert any(s.op == "Resize" for s in steps)


def test_a_yolo_upsample_of_symbolic_size():
    """Constant scales, the image size symbolic: one compiled program serves every size."""
    c = 16
    inits = {"w0": _w(c, 1, 3, 3, scale=1.0), "b0": _w(c), "w1": _w(c, c, 1, 1), **SCALES2}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a0"], group=c, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["a0", "", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["up", "w1"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, "h", "w"])],
                       [helper.make_tensor_value_info("y", F32, [1, c, "H", "W"])], inits)
    assert _ops(model, "nhwc") == ["ConvNhwc", "Resize", "ConvNhwc", "Transpose"]
    _runs_in_the_region(model, "nhwc", [_image((1, c, 20, 20)), _image((1, c, 13, 30))], "resize_nearest_nhwc")


def test_sizes_computed_at_run_time():
    """sizes = Concat(the input's N and C, its H and W doubled), from a Shape of the graph's input at run time."""
    inits = {"starts": np.array([2], np.int64), "ends": np.array([4], np.int64),
             "n_c": np.array([1, 16], np.int64), "two": np.array(2, np.int64)}
    extra = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "starts", "ends"], ["hw"]),
             helper.make_node("Mul", ["hw", "two"], ["hw2"]),
             helper.make_node("Concat", ["n_c", "hw2"], ["sizes"], axis=0)]
    model = _model(["", "", "sizes"], extra, inits, stride=2, mode="linear",
                   coordinate_transformation_mode="half_pixel", out_hw=(112, 112))
    assert _ops(model, "nhwc").count("Transpose") == 1
    _runs_in_the_region(model, "nhwc", [_image((1, 16, 56, 56), specials=False)], "resize_linear_nhwc")


def _fpn_model(start=2):
    """An FPN's top-down step as torch exports ``interpolate(a, size=b.shape[2:])``: the sizes are Concat(Shape(a)'s
    N and C, Shape(b)'s H and W) at run time, both maps of the region; the upsampled map is added to b."""
    c = 16
    inits = {"w0": _w(c, 1, 3, 3, scale=1.0), "w1": _w(c, 1, 3, 3, scale=1.0), "w2": _w(c, c, 1, 1),
             "w3": _w(c, c, 1, 1), "zero": np.array([0], np.int64), "two": np.array([2], np.int64),
             "four": np.array([4], np.int64)}
    b_hw = [helper.make_node("Shape", ["b"], ["b_shape"], start=start),
            helper.make_node("Slice", ["b_shape", "zero", "two"], ["b_hw"])] if start == 2 else \
        [helper.make_node("Shape", ["b"], ["b_shape"]), helper.make_node("Slice", ["b_shape", "two", "four"], ["b_hw"])]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["b"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w1"], ["a0"], group=c, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a0", "w2"], ["a"]),
             helper.make_node("Shape", ["a"], ["a_shape"], end=2),
             *b_hw,
             helper.make_node("Concat", ["a_shape", "b_hw"], ["sizes"], axis=0),
             helper.make_node("Resize", ["a", "", "", "sizes"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Add", ["up", "b"], ["s"]),
             helper.make_node("Conv", ["s", "w3"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, "h", "w"])],
                      [helper.make_tensor_value_info("y", F32, [1, c, "h", "w"])], inits)


@pytest.mark.parametrize("start", [2, 0])
def test_sizes_from_the_shapes_of_region_maps(start):
    """A Shape of an NHWC map of the region is its Shape gathered back to NCHW order (``start`` / ``end`` kept): no
    Transpose for it; the whole net is one region ending in one Transpose."""
    model = _fpn_model(start)
    ops = _ops(model, "nhwc")
    assert ops.count("Transpose") == 1 and ops.count("Gather") == 2 and ops.count("ConvNhwc") == 4, ops
    sess, _ = layout_session(model, "nhwc")
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((1, 16, 20, 20), (1, 16, 14, 22)):
        x = _image(shape)
        want = cpu.run(None, {"x": x})[0]
        with native_calls() as calls:
            for _ in range(3):
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
        assert "resize_nearest_nhwc" in calls
    assert python_steps(sess) == []


@pytest.mark.parametrize("attrs", [dict(mode="cubic"), dict(mode="linear",
                                                          coordinate_transformation_mode="tf_crop_and_resize")])
def test_cubic_and_crop_and_resize_stay_outside(attrs):
    """The Resize reads the first conv's NCHW output (that conv alone is no region) and the pointwise conv after it
    starts one."""
    model = _model(["", "scales"], extra_inits=SCALES2, deep=True, **attrs)
    assert _ops(model, "nhwc") == ["Conv", "Resize", "Transpose", "ConvNhwc", "ConvNhwc", "ConvNhwc", "Transpose"]
    sess, steps = layout_session(model, "nhwc")
    resize = next(s for s in steps if s.op == "Resize")
    assert resize.prepared.attrs["axes"] is None
    x = _image((1, 16, 56, 56), specials=False)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_an_nhwc_model_resizes_natively(mode):
    """A TF export's Resize of [N, H, W, C] with scales [1, 2, 2, 1]: one native step matching the CPU EP."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="the_op", mode=mode,
                            coordinate_transformation_mode="half_pixel")
    model = make_model([node], [helper.make_tensor_value_info("x", F32, [1, 20, 24, 32])],
                       [helper.make_tensor_value_info("y", F32, [1, 40, 48, 32])],
                       {"scales": np.array([1, 2, 2, 1], np.float32)}, opset=19)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    x = _image((1, 20, 24, 32), mode == "nearest")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with native_calls() as calls:
        for _ in range(3):
            got = sess.run(None, {"x": x})[0]
            if mode == "nearest":
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert f"resize_{mode}_nhwc" in calls
    assert python_steps(sess) == []


def _resize_node(c, hw, **attrs):
    """The fused Resize node of ``_model`` (a 2x Resize by scales of a c-channel hw x hw map)."""
    model = _model(["", "scales"], extra_inits={"scales": np.array([1, 1, 2, 2], np.float32)}, c=c, hw=(hw, hw),
                   out_hw=(hw, hw), **attrs)
    nodes = fuse_partition(nodes_from_model(shape_inference.infer_shapes(model)), REF)
    return next(n for n in nodes if n.op_type == "Resize")


@pytest.mark.parametrize("c,hw,mode,cheaper", [(64, 40, "nearest", "NHWC"), (64, 40, "linear", "NHWC"),
                                               (3, 224, "nearest", "NCHW")])
def test_the_cost_model_credits_a_resize_where_nhwc_fills_more_lanes(c, hw, mode, cheaper):
    """A 2x Resize of many channels copies or blends whole pixels in NHWC (no gather per tap): a saving the region
    counts, a linear one more than a nearest one; one of three channels on wide rows fills its lanes in NCHW."""
    saving = layout.resize_saving(_resize_node(c, hw, mode=mode), REF)
    assert (saving > 0) == (cheaper == "NHWC")
    if mode == "linear":
        assert saving > layout.resize_saving(_resize_node(c, hw, mode="nearest"), REF)
