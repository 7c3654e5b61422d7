"""The native LSTM (``kernels/native/recurrent.cc``) against the numpy reference model (``kernels/ops/recurrent.py``
with ``kernels=reference``) over odd sizes and every attribute the kernel takes: directions, sequence_lens (0 and
partial), initial states, peepholes, clip, layout 1, absent bias, on one thread and two (the same bits). Float
tolerance: rtol=atol=1e-5 (the gate math is the same; the packed GEMM's sums and exp/tanh round differently).
Sessions prove NpuEP ran the native kernel against ORT's CPU EP."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from npu_testing import F32, assignment, cpu_run, make_model, npu_session

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target

TOL = dict(rtol=1e-5, atol=1e-5)


def lstm_case(rng, seq, batch, inp, hid, *, direction="forward", bias=True, lens=None, initial=False, peep=False,
              clip=None, layout=0, runtime_weights=False):
    """(model, runtime inputs in node order, feeds) for one LSTM node; W, R, B, P are initializers unless
    ``runtime_weights`` makes W and R graph inputs."""
    dirs = 2 if direction == "bidirectional" else 1
    w = lambda *s: (rng.standard_normal(s) * 0.4).astype(np.float32)
    inits = {"W": w(dirs, 4 * hid, inp), "R": w(dirs, 4 * hid, hid)}
    if bias:
        inits["B"] = w(dirs, 8 * hid)
    if peep:
        inits["P"] = w(dirs, 3 * hid)
    x_shape = [seq, batch, inp] if layout == 0 else [batch, seq, inp]
    state = [dirs, batch, hid] if layout == 0 else [batch, dirs, hid]
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32)}
    if runtime_weights:
        feeds["W"], feeds["R"] = inits.pop("W"), inits.pop("R")
    if lens is not None:
        feeds["L"] = np.array(lens, np.int32)
    if initial:
        feeds["H0"], feeds["C0"] = w(*state), w(*state)
    names = ["X", "W", "R", "B" if bias else "", "L" if lens is not None else "", "H0" if initial else "",
             "C0" if initial else "", "P" if peep else ""]
    while names[-1] == "":
        names.pop()
    attrs = {"hidden_size": hid, "direction": direction}
    if clip is not None:
        attrs["clip"] = clip
    if layout:
        attrs["layout"] = layout
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], name="rnn", **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "L" else F32, list(feeds[n].shape))
              for n in names if n in feeds]
    outputs = [helper.make_tensor_value_info(n, F32, [None] * r) for n, r in (("Y", 4), ("Y_h", 3), ("Y_c", 3))]
    model = make_model([node], inputs, outputs, inits, opset=14)
    return model, [feeds.get(n) if n in feeds else None for n in names], feeds


def run_kernel(model, given, kernels, threads=1):
    (node,) = nodes_from_model(model)
    kernel = kernel_for("", "LSTM")
    prepared = kernel.prepare(node, Target.load("npu-ref"))
    runtime.configure([prepared], kernels, threads)
    return kernel.run(prepared, given)


CASES = {
    "one_step_silero_like": dict(seq=1, batch=1, inp=128, hid=128, initial=True),
    "odd_forward": dict(seq=5, batch=3, inp=7, hid=9),
    "hidden_1_no_bias": dict(seq=3, batch=2, inp=1, hid=1, bias=False),
    "reverse_lens_initial": dict(seq=6, batch=4, inp=5, hid=11, direction="reverse", lens=[6, 0, 3, 1], initial=True),
    "bidirectional_peep_lens": dict(seq=4, batch=3, inp=3, hid=13, direction="bidirectional", lens=[4, 2, 0],
                                    peep=True, initial=True),
    "clip": dict(seq=4, batch=2, inp=6, hid=17, direction="bidirectional", clip=0.3, initial=True),
    "clip_zero": dict(seq=2, batch=2, inp=3, hid=5, clip=0.0),
    "layout1_bidirectional": dict(seq=5, batch=3, inp=4, hid=7, direction="bidirectional", layout=1, lens=[5, 1, 3],
                                  initial=True, peep=True),
    "wide_batch": dict(seq=3, batch=33, inp=19, hid=40, initial=True),
    "ddddocr_like": dict(seq=6, batch=1, inp=64, hid=48, direction="bidirectional"),  # 4H = 192: six panels
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_native_lstm_equals_reference_with_the_same_bits_on_one_or_two_threads(case, monkeypatch):
    model, given, _ = lstm_case(np.random.default_rng(len(case)), **CASES[case])
    calls = []
    mod = runtime.native_module()
    real = mod.lstm
    monkeypatch.setattr(mod, "lstm", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = run_kernel(model, given, "native")
    want = run_kernel(model, given, "reference")
    assert calls, "the native kernel did not run"
    for g, w, two in zip(got, want, run_kernel(model, given, "native", threads=2), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype == np.float32
        np.testing.assert_allclose(g, w, **TOL)
        assert g.tobytes() == two.tobytes()


def test_native_lstm_runtime_weights_are_read_per_call():
    """W and R as graph inputs: each call uses that call's weights (nothing prepared once is reused)."""
    model, given, feeds = lstm_case(np.random.default_rng(2), 3, 2, 4, 5, initial=True, runtime_weights=True)
    (node,) = nodes_from_model(model)
    kernel = kernel_for("", "LSTM")
    native_p, ref_p = (kernel.prepare(node, Target.load("npu-ref")) for _ in range(2))
    runtime.configure([ref_p], "reference", 1)
    for scale in (1.0, 0.5):
        call = [None if v is None else (v * scale if v is feeds["W"] or v is feeds["R"] else v) for v in given]
        for g, w in zip(kernel.run(native_p, call), kernel.run(ref_p, call), strict=True):
            np.testing.assert_allclose(g, w, **TOL)
    sess = npu_session(model)
    assert assignment(sess)["rnn"] == "NpuEP"
    for g, w in zip(sess.run(None, feeds), cpu_run(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, **TOL)


def test_native_lstm_rejects_bad_sequence_lens_with_a_clear_error():
    model, runtime, _ = lstm_case(np.random.default_rng(0), 3, 2, 4, 5, lens=[3, 4])
    with pytest.raises(ValueError, match="sequence_lens"):
        run_kernel(model, runtime, "native")


@pytest.mark.parametrize("case", ["one_step_silero_like", "bidirectional_peep_lens", "clip"])
def test_native_lstm_session_matches_cpu_ep(case, monkeypatch):
    mod = runtime.native_module()
    real, calls = mod.lstm, []
    monkeypatch.setattr(mod, "lstm", lambda *a, **k: calls.append(1) or real(*a, **k))
    model, _, feeds = lstm_case(np.random.default_rng(5), **CASES[case])
    sess = npu_session(model)
    assert assignment(sess)["rnn"] == "NpuEP"
    got = sess.run(None, feeds)
    assert calls, "NpuEP did not run the native LSTM"
    for g, w in zip(got, cpu_run(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, **TOL)
