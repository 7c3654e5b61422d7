"""com.microsoft DynamicQuantizeLSTM (kernels/ops/recurrent_quant.py).

- The native kernel against the numpy reference model over odd sizes and every input the op takes: directions,
  sequence_lens (0 and partial), initial states, peepholes, clip, uint8 weights with a zero point, per-column
  scales, Y absent; on one thread and two (the same bits). The integer products are exact in both; the gate math
  rounds differently (the native exp/tanh against numpy's): 2.4e-7 at most here. A last bit of h that differs can
  move the next step's quantization by one level (about 1e-3 in the outputs); none does in these cases.
- Sessions against ORT's CPU EP on LSTMs that ORT's own dynamic quantizer (``quantize_dynamic``) rewrote, proving
  NpuEP ran the node. ORT's gates use MLAS's approximate sigmoid/tanh, so its h differs in the last bits (7.2e-7
  at most here), with the same caveat of a level. ORT quantizes each thread's batch rows on their own, so the CPU
  EP runs on one thread.
- Declines with a reason for what ORT's kernel or ours does not take.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from npu_testing import F32, assignment, make_model, npu_session, save, session_options

from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.support import why_not
from npu_ep.kernels.target import Target
from npu_ep.tools.bench.ops import python_steps

TOL = dict(rtol=0, atol=1e-5)
MS = ("com.microsoft", 1)


def dq_lstm_model(rng, seq, batch, inp, hid, *, direction="forward", bias=True, lens=None, initial=False,
                  peep=False, clip=None, wtype=np.int8, per_column=False, outputs=("Y", "Y_h", "Y_c"),
                  runtime_weights=False):
    """(model, feeds) for one DynamicQuantizeLSTM node built by hand (W [dirs, I, 4H] and R [dirs, H, 4H])."""
    dirs = 2 if direction == "bidirectional" else 1
    cols = (dirs, 4 * hid) if per_column else (dirs,)
    if wtype == np.int8:
        w, r = (rng.integers(-127, 128, s).astype(np.int8) for s in ((dirs, inp, 4 * hid), (dirs, hid, 4 * hid)))
        zw = zr = np.zeros(cols, np.int8)
    else:
        w, r = (rng.integers(0, 256, s).astype(np.uint8) for s in ((dirs, inp, 4 * hid), (dirs, hid, 4 * hid)))
        one_per_direction = (dirs,) + (1,) * (len(cols) - 1)
        zw, zr = (np.broadcast_to(rng.integers(100, 156, one_per_direction), cols).astype(np.uint8) for _ in "wr")
    spread = 0.5 / 127 / np.sqrt(max(inp, hid) / 64)  # gate pre-activations of order 1
    ws, rs = ((rng.uniform(0.5, 1.5, cols) * spread).astype(np.float32) for _ in "wr")
    inits = {"W": w, "R": r, "W_scale": ws, "W_zp": zw, "R_scale": rs, "R_zp": zr}
    f = lambda *s: (rng.standard_normal(s) * 0.4).astype(np.float32)
    if bias:
        inits["B"] = f(dirs, 8 * hid)
    if peep:
        inits["P"] = f(dirs, 3 * hid)
    feeds = {"X": rng.standard_normal((seq, batch, inp)).astype(np.float32)}
    if runtime_weights:
        feeds["W"] = inits.pop("W")
    if lens is not None:
        feeds["L"] = np.array(lens, np.int32)
    if initial:
        feeds["H0"], feeds["C0"] = f(dirs, batch, hid), f(dirs, batch, hid)
    names = ["X", "W", "R", "B" if bias else "", "L" if lens is not None else "", "H0" if initial else "",
             "C0" if initial else "", "P" if peep else "", "W_scale", "W_zp", "R_scale", "R_zp"]
    attrs = {"hidden_size": hid, "direction": direction}
    if clip is not None:
        attrs["clip"] = clip
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")]
    while outs[-1] == "":
        outs.pop()
    node = helper.make_node("DynamicQuantizeLSTM", names, outs, name="qlstm", domain="com.microsoft", **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "L" else
                                            (TensorProto.INT8 if n == "W" else F32), list(feeds[n].shape))
              for n in names if n in feeds]
    ranks = {"Y": 4, "Y_h": 3, "Y_c": 3}
    outputs_vi = [helper.make_tensor_value_info(n, F32, [None] * ranks[n]) for n in outs if n]
    return make_model([node], inputs, outputs_vi, inits, opset=14, extra_opsets=[MS]), feeds


def run_kernel(model, feeds, kernels, threads=1, target="npu-ref"):
    (node,) = nodes_from_model(model)
    kernel = kernel_for("com.microsoft", "DynamicQuantizeLSTM")
    prepared = kernel.prepare(node, Target.load(target))
    runtime.configure([prepared], kernels, threads)
    given = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    return kernel.run(prepared, given)


CASES = {
    "ddddocr_like": dict(seq=7, batch=1, inp=96, hid=64, direction="bidirectional"),
    "odd_forward": dict(seq=5, batch=3, inp=7, hid=9),
    "hidden_1_no_bias": dict(seq=3, batch=2, inp=1, hid=1, bias=False),
    "reverse_lens_initial": dict(seq=6, batch=4, inp=5, hid=11, direction="reverse", lens=[6, 0, 3, 1], initial=True),
    "bidirectional_peep_lens": dict(seq=4, batch=3, inp=3, hid=13, direction="bidirectional", lens=[4, 2, 0],
                                    peep=True, initial=True),
    "lens_short_of_seq": dict(seq=6, batch=2, inp=9, hid=8, lens=[3, 2]),
    "y_absent_lens": dict(seq=5, batch=3, inp=6, hid=10, lens=[5, 2, 4], outputs=("Y_h", "Y_c"), initial=True),
    "clip": dict(seq=4, batch=2, inp=6, hid=17, direction="bidirectional", clip=0.3, initial=True),
    "uint8_per_column": dict(seq=4, batch=2, inp=70, hid=20, wtype=np.uint8, per_column=True, initial=True),
    "uint8_per_direction_bidirectional": dict(seq=3, batch=1, inp=65, hid=33, wtype=np.uint8,
                                              direction="bidirectional"),
}


@pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")
@pytest.mark.parametrize("case", sorted(CASES))
def test_native_matches_the_reference_model_on_any_thread_count(case):
    rng = np.random.default_rng(sum(map(ord, case)))
    model, feeds = dq_lstm_model(rng, **CASES[case])
    ref = run_kernel(model, feeds, "reference")
    one, two = run_kernel(model, feeds, "native", 1), run_kernel(model, feeds, "native", 2)
    for r, a, b in zip(ref, one, two):
        np.testing.assert_array_equal(a, b)  # the same bits at any thread count
        np.testing.assert_allclose(a, r, **TOL)
    assert np.abs(ref[0]).max() > 0.05  # the case exercises the gates


def test_reference_first_step_is_the_exact_integer_product():
    """One step, no bias, zero initial state: the gates see exactly float32(acc) * (a_scale * w_scale) of X's
    uint8 quantization times W, the int32 sums computed here in int64."""
    rng = np.random.default_rng(3)
    model, feeds = dq_lstm_model(rng, 1, 2, 21, 5, bias=False)
    y, _, yc = run_kernel(model, feeds, "reference")
    (node,) = nodes_from_model(model)
    w = np.asarray(node.input(1).value).astype(np.int64)[0]
    ws = np.asarray(node.input(8).value, np.float32)[0]
    x = feeds["X"].reshape(2, 21)
    lo, hi = min(np.float32(x.min()), np.float32(0)), max(np.float32(x.max()), np.float32(0))
    s = np.float32((hi - lo) / np.float32(255))
    z = np.rint(np.clip(np.float32(0) - np.float32(lo / s), 0, 255))
    q = np.clip(np.rint(x / s) + z, 0, 255).astype(np.int64) - int(z)
    g = (q @ w).astype(np.float32) * (s * ws)
    sig = lambda v: 1 / (1 + np.exp(-v))
    hid = 5
    c = sig(g[:, :hid]) * np.tanh(g[:, 3 * hid:])
    np.testing.assert_allclose(yc[0], c, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y[0, 0], sig(g[:, hid:2 * hid]) * np.tanh(c), rtol=1e-6, atol=1e-7)


def _float_lstm(rng, seq, batch, inp, hid, direction="forward", lens=False, initial=False):
    dirs = 2 if direction == "bidirectional" else 1
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
    inits = {"W": f(dirs, 4 * hid, inp), "R": f(dirs, 4 * hid, hid), "B": f(dirs, 8 * hid)}
    names = ["X", "W", "R", "B", "L" if lens else "", "H0" if initial else "", "C0" if initial else ""]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], name="rnn", hidden_size=hid, direction=direction)
    ins = [helper.make_tensor_value_info("X", F32, [seq, batch, inp])]
    if lens:
        ins.append(helper.make_tensor_value_info("L", TensorProto.INT32, [batch]))
    if initial:
        ins += [helper.make_tensor_value_info(n, F32, [dirs, batch, hid]) for n in ("H0", "C0")]
    outs = [helper.make_tensor_value_info(n, F32, [None] * r) for n, r in (("Y", 4), ("Y_h", 3), ("Y_c", 3))]
    return make_model([node], ins, outs, inits, opset=14)


SESSION_CASES = {
    "bidirectional_512_like_ddddocr": dict(seq=12, batch=1, inp=256, hid=128, direction="bidirectional"),
    "forward_batch_lens_initial": dict(seq=6, batch=3, inp=24, hid=16, lens=True, initial=True),
    "reverse_small": dict(seq=5, batch=1, inp=10, hid=7, direction="reverse"),
}


@pytest.mark.parametrize("case", sorted(SESSION_CASES))
def test_ort_quantized_lstm_runs_on_npu_and_matches_the_cpu_ep(tmp_path, case):
    spec = SESSION_CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    src = save(_float_lstm(rng, **spec), tmp_path, "float.onnx")
    dst = str(tmp_path / "dq.onnx")
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM"])
    feeds = {"X": rng.standard_normal((spec["seq"], spec["batch"], spec["inp"])).astype(np.float32)}
    dirs = 2 if spec.get("direction") == "bidirectional" else 1
    if spec.get("lens"):
        feeds["L"] = np.array([spec["seq"], 2, 0][:spec["batch"]], np.int32)
    if spec.get("initial"):
        feeds["H0"], feeds["C0"] = (rng.standard_normal((dirs, spec["batch"], spec["hid"])).astype(np.float32) * 0.3
                                    for _ in range(2))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(dst, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    so = session_options()
    tag_session_options(so)  # so python_steps finds the session's programs
    sess = npu_session(dst, so=so)
    ops = {n.name: n.op_type for n in onnx.load(dst).graph.node}
    assert "DynamicQuantizeLSTM" in ops.values()
    placed = assignment(sess)
    assert all(placed[name] == "NpuEP" for name in ops), placed
    for _ in range(3):  # the kernel, then its bound native step
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, **TOL)
    assert np.abs(want[0]).max() > 0.05
    assert python_steps(sess) == [], "a step ran its Python kernel instead of a bound native step"


def test_npu_edge_takes_it_on_its_int8_unit():
    """npu-edge has no float matrix mode, so it declines LSTM; DynamicQuantizeLSTM's products are int8."""
    model, _ = dq_lstm_model(np.random.default_rng(0), 2, 1, 8, 4)
    (node,) = nodes_from_model(model)
    assert why_not(node, Target.load("npu-edge")) is None


@pytest.mark.parametrize("change, reason", [
    (dict(runtime_weights=True), "must be constant initializers"),
    ("nonzero_int8_zero_point", "zero point must be one value per direction (0 for int8)"),
    ("zero_point_per_column_differs", "zero point must be one value per direction"),
    ("activations", "only the defaults"),
])
def test_declined_with_a_reason(change, reason):
    rng = np.random.default_rng(1)
    model, _ = dq_lstm_model(rng, 2, 1, 8, 4, **(change if isinstance(change, dict) else
                                                    dict(wtype=np.uint8, per_column=True)
                                                    if change == "zero_point_per_column_differs" else {}))
    inits = {t.name: t for t in model.graph.initializer}
    if change == "nonzero_int8_zero_point":
        inits["W_zp"].CopyFrom(numpy_helper.from_array(np.array([3], np.int8), "W_zp"))
    elif change == "zero_point_per_column_differs":
        zp = np.full((1, 16), 128, np.uint8)
        zp[0, 5] = 127
        inits["R_zp"].CopyFrom(numpy_helper.from_array(zp, "R_zp"))
    elif change == "activations":
        model.graph.node[0].attribute.append(helper.make_attribute("activations", ["Sigmoid", "Tanh", "Relu"]))
    (node,) = nodes_from_model(model)
    why = why_not(node, Target.load("npu-ref"))
    assert why is not None and reason in why, why


def test_offline_shape_inference_types_what_follows_it():
    """ONNX's and ORT's symbolic inference have no rule for DynamicQuantizeLSTM; without one, npu-report saw every
    node after it as dtype None and declined them (the session, with ORT's own types, took them all)."""
    model, _ = dq_lstm_model(np.random.default_rng(2), 5, 3, 8, 4, direction="bidirectional")
    y = model.graph.output[0]
    model.graph.node.append(helper.make_node("Transpose", ["Y"], ["T"], name="after", perm=[2, 0, 1, 3]))
    y.name = "T"
    nodes = nodes_from_model(model)
    after = nodes[-1].input(0)
    assert (after.dtype, after.shape) == (np.float32, (5, 2, 3, 4))
    assert why_not(nodes[-1], Target.load("npu-ref")) is None
