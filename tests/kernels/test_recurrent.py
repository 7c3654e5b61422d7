"""LSTM, GRU and RNN on NpuEP against ORT's CPU EP: directions, optional bias/initial states/peepholes/
sequence_lens, clip, layout 0/1, linear_before_reset, opset 7 and 14 schemas; ORT's graph assignment proves NpuEP
ran them.
Non-default activations, input_forget and npu-edge (no float matrix mode) are declined with a reason."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session

from _sweep import native_calls
from npu_ep.kernels.support import why_not
from npu_ep.kernels.target import Target
from npu_ep.ep.onnx_graph import nodes_from_model

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def recurrent_model(op: str, *, direction="forward", bias=True, initial=False, peephole=False, lens=False,
                    layout=0, opset=14, outputs=("Y", "Y_h", "Y_c"), **attrs):
    rng = np.random.default_rng(zlib.crc32(repr((op, direction, bias, initial, peephole, lens)).encode()))
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs = 2 if direction == "bidirectional" else 1
    w = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)
    inits = {"W": w(dirs, gates * HIDDEN, INPUT), "R": w(dirs, gates * HIDDEN, HIDDEN)}
    names = ["X", "W", "R"]
    inputs = [helper.make_tensor_value_info("X", F32, [SEQ, BATCH, INPUT] if layout == 0 else [BATCH, SEQ, INPUT])]
    state = [dirs, BATCH, HIDDEN] if layout == 0 else [BATCH, dirs, HIDDEN]

    def optional(name, present, make):
        names.append(name if present else "")
        if present:
            make(name)
    optional("B", bias, lambda n: inits.__setitem__(n, w(dirs, 2 * gates * HIDDEN)))
    optional("sequence_lens", lens, lambda n: inputs.append(helper.make_tensor_value_info(n, TensorProto.INT32,
                                                                                          [BATCH])))
    optional("initial_h", initial, lambda n: inputs.append(helper.make_tensor_value_info(n, F32, state)))
    if op == "LSTM":
        optional("initial_c", initial, lambda n: inputs.append(helper.make_tensor_value_info(n, F32, state)))
        optional("P", peephole, lambda n: inits.__setitem__(n, w(dirs, 3 * HIDDEN)))
    while names[-1] == "":
        names.pop()
    outs = [o for o in outputs if op == "LSTM" or o != "Y_c"]
    if layout:
        attrs["layout"] = layout
    node = helper.make_node(op, names, outs, name="rnn", hidden_size=HIDDEN, direction=direction, **attrs)
    relu = helper.make_node("Relu", [outs[0]], ["relu_out"], name="relu")
    y_outs = [helper.make_tensor_value_info(o, F32, ["a", "b", "c"]) for o in outs[1:]]
    relu_out = helper.make_tensor_value_info("relu_out", F32, ["s", "d", "b", "h"])
    return make_model([node, relu], inputs, [relu_out] + y_outs, inits, opset=opset)


def feeds_for(model, rng, lens=None):
    feeds = {}
    for v in model.graph.input:
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.elem_type == TensorProto.INT32:
            feeds[v.name] = np.array(lens if isinstance(lens, list) else [SEQ, 2, 4][:dims[0]], np.int32)
        else:
            feeds[v.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


LSTM_CASES = {
    "forward": {},
    "reverse": {"direction": "reverse"},
    "bidirectional": {"direction": "bidirectional"},
    "no_bias": {"bias": False},
    "initial_states": {"initial": True},
    "peepholes": {"peephole": True, "initial": True},
    "sequence_lens": {"lens": True},
    "sequence_lens_reverse": {"lens": True, "direction": "reverse", "initial": True},
    "sequence_lens_bidirectional": {"lens": True, "direction": "bidirectional", "peephole": True},
    "empty_sequence": {"lens": [5, 0, 2], "direction": "bidirectional", "initial": True},
    "clip": {"clip": 0.7},
    "layout1": {"layout": 1, "initial": True},
    "layout1_bidirectional_lens": {"layout": 1, "direction": "bidirectional", "lens": True, "initial": True},
    "opset7": {"opset": 13, "direction": "bidirectional", "initial": True},
    "only_y": {"outputs": ("Y",)},
}
GRU_CASES = {
    "forward": {},
    "reverse": {"direction": "reverse"},
    "bidirectional": {"direction": "bidirectional", "initial": True},
    "no_bias": {"bias": False},
    "linear_before_reset": {"linear_before_reset": 1, "initial": True},
    "linear_before_reset_bidirectional_lens": {"linear_before_reset": 1, "direction": "bidirectional", "lens": True},
    "sequence_lens_reverse": {"lens": True, "direction": "reverse", "initial": True},
    "empty_sequence": {"lens": [0, 3, 5], "direction": "bidirectional", "initial": True},
    "clip": {"clip": 0.5, "direction": "bidirectional"},
    "layout1": {"layout": 1, "initial": True, "lens": True},
    "opset7": {"opset": 13, "linear_before_reset": 1},
}

RNN_CASES = {
    "forward": {},
    "reverse": {"direction": "reverse", "initial": True},
    "bidirectional": {"direction": "bidirectional", "initial": True},
    "no_bias": {"bias": False},
    "sequence_lens_bidirectional": {"lens": True, "direction": "bidirectional", "initial": True},
    "empty_sequence": {"lens": [0, 3, 5], "direction": "bidirectional", "initial": True},
    "clip": {"clip": 0.5, "direction": "bidirectional"},
    "layout1": {"layout": 1, "initial": True, "lens": True, "direction": "bidirectional"},
    "opset7": {"opset": 13, "direction": "reverse"},
}


def _layout0_reference(op, case, feeds):
    """ORT's CPU EP refuses layout=1 ("Batchwise recurrent operations are not supported"): the reference is the same
    weights with layout 0 on the CPU EP, batch-major inputs and outputs transposed as the ONNX spec defines."""
    twin = recurrent_model(op, **{k: v for k, v in case.items() if k != "layout"})
    to_seq = {k: (v.transpose(1, 0, 2) if v.ndim == 3 else v) for k, v in feeds.items()}
    out = cpu_run(twin, to_seq)
    return [out[0].transpose(2, 0, 1, 3)] + [s.transpose(1, 0, 2) for s in out[1:]]


def _check_against_cpu(op, case):
    model = recurrent_model(op, **case)
    sess = npu_session(model)
    where = assignment(sess)
    assert where["rnn"] == "NpuEP" and where["relu"] == "NpuEP"
    feeds = feeds_for(model, np.random.default_rng(7), case.get("lens"))
    with native_calls() as calls:
        got = sess.run(None, feeds)
    assert op.lower() in calls, f"NpuEP did not run the native {op}"
    want = _layout0_reference(op, case, feeds) if case.get("layout") else cpu_run(model, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", LSTM_CASES, ids=list(LSTM_CASES))
def test_lstm_matches_cpu(case):
    _check_against_cpu("LSTM", LSTM_CASES[case])


@pytest.mark.parametrize("case", GRU_CASES, ids=list(GRU_CASES))
def test_gru_matches_cpu(case):
    _check_against_cpu("GRU", GRU_CASES[case])


@pytest.mark.parametrize("case", RNN_CASES, ids=list(RNN_CASES))
def test_rnn_matches_cpu(case):
    """ORT writes RNN's schema-default activations (Tanh, Tanh) into the node; the graph view reads them (a STRINGS
    attribute: it was unreadable, and every RNN stayed on the CPU)."""
    _check_against_cpu("RNN", RNN_CASES[case])


@pytest.mark.parametrize("op,attrs,reason", [
    ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]},
     "activations ['Sigmoid', 'Relu', 'Tanh'] (only the defaults"),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"]}, "activations ['HardSigmoid', 'Tanh'] (only the defaults"),
    ("RNN", {"activations": ["Relu"]}, "activations ['Relu'] (only the defaults"),
    ("RNN", {"activations": ["Relu", "Tanh"]}, "activations ['Relu'] (only the defaults"),
    ("LSTM", {"input_forget": 1}, "input_forget=1 (coupled input/forget gates) not supported"),
])
def test_unsupported_attributes_are_declined_with_a_reason_and_match_cpu(op, attrs, reason, caplog):
    """The reason is the same from an ONNX file and through ORT's graph view (which reads STRINGS attributes)."""
    model = recurrent_model(op, **attrs)
    node = next(n for n in nodes_from_model(model) if n.name == "rnn")
    assert reason in why_not(node, Target.load("npu-ref"))
    with caplog.at_level("DEBUG", logger="npu_ep"):
        sess = npu_session(model)
    assert reason in caplog.text
    assert assignment(sess)["rnn"] == "CPUExecutionProvider"
    feeds = feeds_for(model, np.random.default_rng(1))
    for g, w in zip(sess.run(None, feeds), cpu_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_npu_edge_declines_recurrent_ops_for_lack_of_a_float_matrix_mode(op):
    node = next(n for n in nodes_from_model(recurrent_model(op)) if n.name == "rnn")
    assert why_not(node, Target.load("npu-edge")) == (
        f"node 'rnn' ({op}): {op}'s gate matmuls are float32 and target npu-edge has no float matrix mode "
        "(float_compute)")


@pytest.mark.parametrize("op,acts", [("LSTM", ["Sigmoid", "Tanh", "Tanh", "sigmoid", "tanh", "tanh"]),
                                     ("GRU", ["Sigmoid", "Tanh", "Sigmoid", "Tanh"]), ("RNN", ["Tanh", "Tanh"])])
def test_explicit_default_activations_are_accepted(op, acts):
    """Spelled-out defaults are taken, from an ONNX file (``npu-report``'s path) and in a session (the graph view
    reads STRINGS attributes; before, any activations attribute was declined as unreadable)."""
    model = recurrent_model(op, direction="bidirectional", activations=acts)
    node = next(n for n in nodes_from_model(model) if n.name == "rnn")
    assert why_not(node, Target.load("npu-ref")) is None
    sess = npu_session(model)
    assert assignment(sess)["rnn"] == "NpuEP"
    feeds = feeds_for(model, np.random.default_rng(2))
    for g, w in zip(sess.run(None, feeds), cpu_run(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_lstm_takes_an_input_of_unknown_rank():
    """Silero VAD's LSTM reads an Unsqueeze of a runtime-shaped tensor, whose rank ORT's inference loses: the
    schema fixes X's rank, so the kernel takes it (here X = Reshape(x, runtime shape))."""
    model = recurrent_model("LSTM", direction="bidirectional", initial=True)
    g = model.graph
    g.node[0].input[0] = "X_r"
    g.node.insert(0, helper.make_node("Reshape", ["X", "x_shape"], ["X_r"], name="reshape"))
    g.input.append(helper.make_tensor_value_info("x_shape", TensorProto.INT64, ["L"]))
    g.input[0].type.tensor_type.shape.Clear()
    g.input[0].type.tensor_type.shape.dim.add().dim_value = SEQ * BATCH * INPUT
    sess = npu_session(model)
    assert assignment(sess)["rnn"] == "NpuEP"
    rng = np.random.default_rng(3)
    feeds = {"X": rng.standard_normal(SEQ * BATCH * INPUT).astype(np.float32),
             "x_shape": np.array([SEQ, BATCH, INPUT], np.int64),
             "initial_h": rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32),
             "initial_c": rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32)}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
