"""Differential sweep of the native LSTM, GRU, RNN and DynamicQuantizeLSTM (kernels/native/recurrent.cc), issues
38 and 40, against the numpy reference model (kernels/ops/recurrent.py, recurrent_quant.py with
``kernels=reference``), both directions, sequence_lens (0, partial, full), on every instruction-set level the kernel
has; GRU and RNN also layout 1, both linear_before_reset values and the same bits on one thread and two.

recurrent.cc's blocks: the gates 16 lanes at a time on AVX-512 (the last ones masked), scalar elsewhere; the
products on the packed GEMM (4H columns in panels of 32, batch rows in tiles of 8) or, quantized, on the int8 GEMM
(K padded to 64, 16-column blocks, 8/4/2/1-row tiles). Hidden sizes cross 16 and 32 lanes (and 4H the 32-column
panels), batches cross 8, inputs cross 64. Values: large inputs saturating the gates (sigmoid 0 / 1, tanh +-1),
clip, NaN and +-Inf in a float LSTM's X (they propagate as in the reference). Tolerance: atol = rtol = 1e-5, the
existing native LSTM tests' (the gate math is the same operations; the GEMM's sums and the lane exp round
differently, a few ulp per step, bounded over a few steps by the gates' derivatives <= 1)."""

from __future__ import annotations

import numpy as np
import pytest

from _isa import cap_isa, host_isas
from _sweep import native_calls
from npu_ep.kernels import runtime
from tests.kernels.test_recurrent_native import lstm_case, run_kernel as run_lstm
from tests.kernels.test_recurrent_quant import dq_lstm_model, run_kernel as run_qlstm
from _sweep import REF, run_kernel as run_node
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.registry import kernel_for
from onnx import TensorProto, helper
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = [1, 7, 8, 9, 15, 16, 17, 33]  # 16-lane gate blocks; 4H = 28..36: one panel of 32 and its tail


@pytest.fixture(params=host_isas(top="avx512"))
def rnn_isa(request):
    yield from cap_isa(request.param)


def _compare(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, what
        np.testing.assert_allclose(g, w, equal_nan=True, err_msg=f"{what} output {i}", **TOL)


def _assert_bound_step_is_the_kernel(model, feeds, got, what):
    """The kernel binds its native call as the step (what a session's loop runs), and the step's outputs are the
    kernel's bytes."""
    bound: list = []
    run_node(model, feeds, "native", bound=bound)
    assert len(bound) == len(got), f"{what}: the kernel bound no native step"
    for b, g in zip(bound, got, strict=True):
        assert b.shape == g.shape and b.tobytes() == g.tobytes(), f"{what}: the bound step differs from the kernel"


def _lstm(seed, **case):
    model, runtime, feeds = lstm_case(np.random.default_rng(seed), **case)
    with native_calls() as calls:
        got = run_lstm(model, runtime, "native")
    assert "lstm" in calls, case
    _compare(got, run_lstm(model, runtime, "reference"), str(case))
    _assert_bound_step_is_the_kernel(model, feeds, got, f"LSTM {case}")
    return model, runtime


def test_lstm_hidden_sizes_and_directions(rnn_isa):
    for hid in HIDDEN:
        for direction in ("forward", "reverse", "bidirectional"):
            _lstm(hid, seq=3, batch=2, inp=5, hid=hid, direction=direction, initial=True, peep=hid % 2 == 1)


def test_lstm_batches_and_sequence_lengths(rnn_isa):
    for batch in (1, 7, 8, 9):
        lens = [(b * 3) % 5 for b in range(batch)]  # 0, partial and full (seq 4 .. lens up to 4)
        lens = [min(v, 4) for v in lens]
        _lstm(batch, seq=4, batch=batch, inp=65, hid=17, direction="bidirectional", lens=lens, initial=True)


def test_lstm_saturated_gates_clip_and_special_values(rnn_isa):
    model, runtime, _ = lstm_case(np.random.default_rng(5), seq=3, batch=3, inp=4, hid=17, direction="bidirectional",
                                  initial=True, peep=True)
    x = runtime[0] * 100  # pre-activations far past the sigmoid's and tanh's saturation
    x[0, 1, 0], x[1, 2, 1], x[2, 0, 2] = np.nan, np.inf, -np.inf
    runtime = [x] + runtime[1:]
    with native_calls() as calls:
        got = run_lstm(model, runtime, "native")
    assert "lstm" in calls
    _compare(got, run_lstm(model, runtime, "reference"), "saturated")
    for clip in (0.0, 0.5, 3.0):
        _lstm(int(clip * 10), seq=3, batch=2, inp=6, hid=16, direction="bidirectional", clip=clip, initial=True)


def _qlstm(seed, **case):
    model, feeds = dq_lstm_model(np.random.default_rng(seed), **case)
    with native_calls() as calls:
        got = run_qlstm(model, feeds, "native")
    assert "qlstm" in calls, case
    _compare(got, run_qlstm(model, feeds, "reference"), str(case))
    if not case.get("runtime_weights"):
        _assert_bound_step_is_the_kernel(model, feeds, got, f"DynamicQuantizeLSTM {case}")


def test_quantized_lstm_sizes(rnn_isa):
    for hid in (1, 8, 15, 16, 17):
        for inp, batch in ((63, 1), (64, 2), (65, 9)):
            _qlstm(hid + inp, seq=3, batch=batch, inp=inp, hid=hid, direction="bidirectional", initial=True)


def test_quantized_lstm_lens_and_types(rnn_isa):
    _qlstm(1, seq=5, batch=9, inp=20, hid=16, lens=[5, 0, 1, 2, 3, 4, 5, 1, 2], direction="bidirectional",
           initial=True)
    _qlstm(2, seq=5, batch=3, inp=20, hid=17, lens=[2, 1, 2], wtype=np.uint8, per_column=True, peep=True)
    _qlstm(3, seq=4, batch=3, inp=9, hid=9, lens=[4, 0, 3], outputs=("Y_h", "Y_c"), clip=0.5, direction="reverse")


@pytest.mark.slow
def test_lstm_wide_grid(rnn_isa):
    for hid in HIDDEN + [31, 32, 64, 65]:
        for batch in (1, 2, 8, 9, 17):
            for inp in (1, 8, 9, 256, 257):
                _lstm(hid * batch + inp, seq=3, batch=batch, inp=inp, hid=hid, direction="bidirectional",
                      lens=[3 - b % 4 if b % 4 < 4 else 3 for b in range(batch)], initial=True, peep=True)


# NaN and infinities in a DynamicQuantizeLSTM's X: the dynamic range leaves NaN out and a -Inf minimum gives the zero
# point 255 (ORT's GetQuantizationParameter). Before: the reference's range was NaN (every output NaN, where ORT's
# CPU EP gives numbers), and the native zero point for -Inf was the int32 cast of a NaN (not the reference's).
@pytest.mark.parametrize("value", [np.nan, -np.inf, np.inf])
def test_quantized_lstm_with_nan_or_infinite_x_native_equals_reference(rnn_isa, value):
    model, feeds = dq_lstm_model(np.random.default_rng(3), seq=3, batch=1, inp=6, hid=4, initial=True)
    feeds["X"][1, 0, 2] = value
    with native_calls() as calls, np.errstate(all="ignore"):
        got = run_qlstm(model, feeds, "native")
    assert "qlstm" in calls
    with np.errstate(all="ignore"):
        _compare(got, run_qlstm(model, feeds, "reference"), f"X holding {value}")


def test_quantized_lstm_with_a_nan_in_x_matches_the_cpu_ep():
    """One batch entry (ORT quantizes the whole X at once there): the NaN is left out of the range, its code is 0."""
    model, feeds = dq_lstm_model(np.random.default_rng(3), seq=3, batch=1, inp=6, hid=4, initial=True)
    feeds["X"][1, 0, 2] = np.nan
    want = cpu_run(model, feeds)
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        got = sess.run(None, feeds)
        assert not np.isnan(got[0]).any()
        _compare(got, want, f"{kernels} vs the CPU EP")


# seq_length 0: Y is empty and the final states are 0, as for a sequence_lens entry of 0 (ORT's CPU EP leaves Y_h and
# Y_c unwritten there, uninitialized values, so zeros are the specification). The reference model raised (reshaping
# the empty X with -1); the native kernel was right, so the sweep's comparison failed on the reference.
def _empty_sequence_outputs(dirs: int) -> list[np.ndarray]:
    return [np.zeros((0, dirs, 2, 4), np.float32), np.zeros((dirs, 2, 4), np.float32),
            np.zeros((dirs, 2, 4), np.float32)]


@pytest.mark.parametrize("case", [dict(direction="forward"), dict(direction="bidirectional", peep=True)])
def test_an_empty_sequence_gives_zero_states(rnn_isa, case):
    model, runtime, _ = lstm_case(np.random.default_rng(0), seq=0, batch=2, inp=3, hid=4, initial=True, **case)
    want = _empty_sequence_outputs(2 if case["direction"] == "bidirectional" else 1)
    for kernels in ("native", "reference"):
        for g, w in zip(run_lstm(model, runtime, kernels), want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, kernels
            np.testing.assert_array_equal(g, w, err_msg=kernels)


def test_an_empty_sequence_in_a_session_runs_on_npu():
    model, _, feeds = lstm_case(np.random.default_rng(0), seq=0, batch=2, inp=3, hid=4, initial=True)
    for kernels in ("native", "reference"):
        sess = npu_session(model, {"kernels": kernels}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        for g, w in zip(sess.run(None, feeds), _empty_sequence_outputs(1), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=kernels)


# GRU and RNN (issue 40 item 3): the native cells against the reference. The GRU's products: h @ R_zr^T (2H columns)
# and h @ R_h^T or (r * h) @ R_h^T (H columns), so hidden sizes cross 16 lanes and 32-column panels in both.
def gate_case(rng, op: str, seq: int, batch: int, inp: int, hid: int, *, direction="forward", bias=True, lens=None,
              initial=False, clip=None, layout=0, linear_before_reset=0, runtime_weights=False):
    """(model, feeds) for one GRU or RNN node, W, R and B initializers (W and R graph inputs with
    ``runtime_weights``)."""
    gates, dirs = {"GRU": 3, "RNN": 1}[op], 2 if direction == "bidirectional" else 1
    w = lambda *sh: (rng.standard_normal(sh) * 0.4).astype(np.float32)
    inits = {"W": w(dirs, gates * hid, inp), "R": w(dirs, gates * hid, hid)}
    if bias:
        inits["B"] = w(dirs, 2 * gates * hid)
    feeds = {"X": rng.standard_normal([seq, batch, inp] if layout == 0 else [batch, seq, inp]).astype(np.float32)}
    if runtime_weights:
        feeds["W"], feeds["R"] = inits.pop("W"), inits.pop("R")
    if lens is not None:
        feeds["L"] = np.array(lens, np.int32)
    if initial:
        feeds["H0"] = w(*([dirs, batch, hid] if layout == 0 else [batch, dirs, hid]))
    names = ["X", "W", "R", "B" if bias else "", "L" if lens is not None else "", "H0" if initial else ""]
    while names[-1] == "":
        names.pop()
    attrs = {"hidden_size": hid, "direction": direction}
    if clip is not None:
        attrs["clip"] = clip
    if layout:
        attrs["layout"] = layout
    if op == "GRU" and linear_before_reset:
        attrs["linear_before_reset"] = 1
    node = helper.make_node(op, names, ["Y", "Y_h"], name="rnn", **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "L" else F32, list(feeds[n].shape))
              for n in names if n in feeds]
    outputs = [helper.make_tensor_value_info(n, F32, [None] * r) for n, r in (("Y", 4), ("Y_h", 3))]
    return make_model([node], inputs, outputs, inits, opset=14), feeds


def _gates(op, seed, x_values=None, **case):
    """One GRU or RNN case: the native kernel ran, matches the reference, and has the same bits on two threads."""
    model, feeds = gate_case(np.random.default_rng(seed), op, **case)
    if x_values is not None:
        feeds["X"] = x_values(feeds["X"])
    with native_calls() as calls:
        got = run_node(model, feeds, "native")
    assert op.lower() in calls, (op, case)
    _compare(got, run_node(model, feeds, "reference"), f"{op} {case}")
    if not case.get("runtime_weights"):
        _assert_bound_step_is_the_kernel(model, feeds, got, f"{op} {case}")
    for g, two in zip(got, run_node(model, feeds, "native", threads=2), strict=True):
        assert g.tobytes() == two.tobytes(), f"{op} {case}: two threads differ"


GATE_OPS = [("GRU", 0), ("GRU", 1), ("RNN", 0)]  # (op, linear_before_reset)


@pytest.mark.parametrize("op,lbr", GATE_OPS)
def test_gru_rnn_hidden_sizes_and_directions(rnn_isa, op, lbr):
    for hid in HIDDEN:
        for direction in ("forward", "reverse", "bidirectional"):
            _gates(op, hid, seq=3, batch=2, inp=5, hid=hid, direction=direction, initial=hid % 2 == 1,
                   linear_before_reset=lbr)


@pytest.mark.parametrize("op,lbr", GATE_OPS)
def test_gru_rnn_batches_layouts_and_sequence_lengths(rnn_isa, op, lbr):
    for batch in (1, 7, 8, 9):
        lens = [min((b * 3) % 5, 4) for b in range(batch)]  # 0, partial and full (seq 4)
        for layout in (0, 1):
            _gates(op, batch + layout, seq=4, batch=batch, inp=65, hid=17, direction="bidirectional", lens=lens,
                   initial=True, layout=layout, linear_before_reset=lbr)
    _gates(op, 3, seq=3, batch=2, inp=4, hid=9, bias=False, direction="reverse", linear_before_reset=lbr)
    _gates(op, 4, seq=0, batch=2, inp=3, hid=4, direction="bidirectional", initial=True, linear_before_reset=lbr)


def _saturated_with_specials(x):
    x = x * 100  # pre-activations far past the sigmoid's and tanh's saturation
    x[0, 1, 0], x[1, 2, 1], x[2, 0, 2] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.parametrize("op,lbr", GATE_OPS)
def test_gru_rnn_saturated_gates_clip_and_special_values(rnn_isa, op, lbr):
    _gates(op, 5, _saturated_with_specials, seq=3, batch=3, inp=4, hid=17, direction="bidirectional", initial=True,
           linear_before_reset=lbr)
    for clip in (0.0, 0.5, 3.0):
        _gates(op, int(clip * 10), seq=3, batch=2, inp=6, hid=16, direction="bidirectional", clip=clip, initial=True,
               linear_before_reset=lbr)


@pytest.mark.slow
@pytest.mark.parametrize("op,lbr", GATE_OPS)
def test_gru_rnn_wide_grid(rnn_isa, op, lbr):
    for hid in HIDDEN + [31, 32, 64, 65]:
        for batch in (1, 2, 8, 9, 17):
            for inp in (1, 8, 9, 256, 257):
                _gates(op, hid * batch + inp, seq=3, batch=batch, inp=inp, hid=hid, direction="bidirectional",
                       lens=[3 - b % 4 for b in range(batch)], initial=True, linear_before_reset=lbr)


# (hidden, batch) around recurrent.cc's kStepSplitWork (2^17 multiply-adds a step's product: LSTM 4H^2 from H 182,
# GRU's R_zr 2H^2 from 256 and R_h H^2 from 363, RNN H^2 from 363; batch 9 from H 61 for LSTM), 4H and 2H ending
# inside a panel of 32
SPLIT_CASES = {"LSTM": [(181, 1), (182, 1), (190, 1), (60, 9), (61, 9)],
               "GRU": [(255, 1), (256, 1), (362, 1), (363, 1), (121, 9)],
               "RNN": [(362, 1), (363, 1), (370, 1), (120, 9), (121, 9)]}


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), *GATE_OPS])
def test_step_products_split_among_threads(rnn_isa, op, lbr):
    """A step's product from 2^17 multiply-adds on has its panels split among the threads (one direction: two
    directions take a thread each): the same bits on 1, 2 and 3 threads, within tolerance of the reference."""
    for hid, batch in SPLIT_CASES[op]:
        lens = [3 - b % 3 for b in range(batch)]
        direction = "reverse" if hid % 2 else "forward"
        rng = np.random.default_rng(hid * batch)
        if op == "LSTM":
            model, _, feeds = lstm_case(rng, seq=3, batch=batch, inp=17, hid=hid, direction=direction, lens=lens,
                                        initial=True, peep=True)
        else:
            model, feeds = gate_case(rng, op, seq=3, batch=batch, inp=17, hid=hid, direction=direction, lens=lens,
                                     initial=True, linear_before_reset=lbr)
        what = f"{op} lbr={lbr} hidden {hid} batch {batch}"
        with native_calls() as calls:
            got = run_node(model, feeds, "native", threads=2)
        assert op.lower() in calls, what
        for g, w in zip(got, run_node(model, feeds, "reference"), strict=True):  # sums of hundreds of products
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, equal_nan=True, err_msg=what)
        for threads in (1, 3):
            for g, other in zip(got, run_node(model, feeds, "native", threads=threads), strict=True):
                assert g.tobytes() == other.tobytes(), f"{what}: {threads} threads differ from two"


@pytest.mark.parametrize("op,lbr", GATE_OPS)
def test_gru_rnn_runtime_weights_are_read_per_call(op, lbr):
    """W and R as graph inputs: each call packs that call's weights (the packed weights are kept only for
    constants)."""
    model, feeds = gate_case(np.random.default_rng(4), op, 3, 2, 4, 5, initial=True, runtime_weights=True,
                             direction="bidirectional", linear_before_reset=lbr)
    (node,) = nodes_from_model(model)
    kernel = kernel_for("", op)
    native_p, ref_p = (kernel.prepare(node, REF) for _ in range(2))
    runtime.configure([native_p], "native", 1)
    runtime.configure([ref_p], "reference", 1)
    for scale in (1.0, 0.5, -2.0):
        call = [feeds[v.name] * np.float32(scale if v.name in ("W", "R") else 1) if v.name in feeds else None
                for v in node.inputs]
        _compare(kernel.run(native_p, call), kernel.run(ref_p, call), f"{op} weights x {scale}")


@pytest.mark.parametrize("case", [dict(direction="bidirectional", lens=[4, 0, 2], initial=True),
                                  dict(direction="reverse", clip=0.5, linear_before_reset=1, initial=True),
                                  dict(direction="bidirectional", layout=1, lens=[3, 4, 1], linear_before_reset=1)])
def test_native_gru_session_matches_cpu_ep(case):
    """NpuEP runs the GRU (graph assignment) on the native kernel; ORT's CPU EP refuses layout 1, so that case's
    reference is the layout-0 twin with the inputs and outputs transposed."""
    layout = case.get("layout", 0)
    model, feeds = gate_case(np.random.default_rng(9), "GRU", seq=4, batch=3, inp=20, hid=24, **case)
    with native_calls() as calls:
        sess = npu_session(model, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}
        got = sess.run(None, feeds)
    assert "gru" in calls, "NpuEP did not run the native GRU"
    if layout:
        twin, _ = gate_case(np.random.default_rng(9), "GRU", seq=4, batch=3, inp=20, hid=24,
                            **{k: v for k, v in case.items() if k != "layout"})
        to_seq = {k: (v.transpose(1, 0, 2) if v.ndim == 3 else v) for k, v in feeds.items()}
        out = cpu_run(twin, to_seq)
        want = [out[0].transpose(2, 0, 1, 3), out[1].transpose(1, 0, 2)]
    else:
        want = cpu_run(model, feeds)
    _compare(got, want, f"GRU session {case}")


def test_lstm_layouts_and_sequence_lengths(rnn_isa):
    """Layout 1 (batch first: X, the initial states and every output), sequence_lens, peepholes, both directions."""
    for layout in (0, 1):
        for direction in ("forward", "reverse", "bidirectional"):
            _lstm(7 + layout, seq=5, batch=3, inp=4, hid=17, direction=direction, layout=layout, lens=[5, 1, 3],
                  initial=layout == 1, peep=True)


def _session_case(op: str, case: dict):
    """(model, feeds, the CPU EP's outputs) of one recurrent node; ORT's CPU EP refuses layout 1, so that case's
    outputs are its layout-0 twin's with the inputs and outputs transposed."""
    layout = case.get("layout", 0)
    make = (lambda **c: lstm_case(np.random.default_rng(9), **c)[::2]) if op == "LSTM" else \
        (lambda **c: gate_case(np.random.default_rng(9), op, **c))
    shape = dict(seq=4, batch=3, inp=20, hid=24)
    model, feeds = make(**shape, **case)
    if not layout:
        return model, feeds, cpu_run(model, feeds)
    twin, _ = make(**shape, **{k: v for k, v in case.items() if k != "layout"})
    out = cpu_run(twin, {k: (v.transpose(1, 0, 2) if v.ndim == 3 else v) for k, v in feeds.items()})
    return model, feeds, [out[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in out[1:]]


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("case", [dict(direction="bidirectional", lens=[4, 0, 2], initial=True),
                                  dict(direction="reverse", clip=0.5, initial=True),
                                  dict(direction="bidirectional", layout=1, lens=[3, 4, 1], initial=True),
                                  dict(direction="forward")])
def test_session_runs_the_whole_op_as_one_bound_native_step(op, case):
    """NpuEP runs the node (graph assignment) and, from the second call on, as its bound native step: no Python
    kernel, no Python loop over time; the CPU EP's values within the sweep's tolerance (the packed GEMM's sums)."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.bench.ops import python_steps
    from npu_testing import session_options
    model, feeds, want = _session_case(op, case)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for _ in range(3):
        _compare(sess.run(None, feeds), want, f"{op} session {case}")
    assert python_steps(sess) == [], f"{op} ran its Python kernel instead of the bound native step"


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_session_results_follow_new_inputs_in_ort_buffers(op):
    """Layout 0 writes Y, Y_h (and Y_c) into ORT's output buffers: each call's values are that call's (a buffer ORT
    reuses never shows an earlier call's results), as the CPU EP's."""
    from npu_ep.ep.sessions import tag_session_options
    from npu_testing import session_options
    model, feeds, _ = _session_case(op, dict(direction="bidirectional", lens=[4, 1, 3], initial=True))
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so, cpu=False)
    rng = np.random.default_rng(3)
    for i in range(4):
        feeds = dict(feeds, X=rng.standard_normal(feeds["X"].shape).astype(np.float32) * (i + 1))
        _compare(sess.run(None, feeds), cpu_run(model, feeds), f"{op} call {i}")


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_out_buffers_are_written_and_returned(op):
    """The kernels' out_y/out_h/out_c: a writeable C-order float32 array of the result's size is written and returned
    as it is (ORT's buffer), with the bits of a new array's; any other (read-only, float64, another size) is left
    alone and a new array returned."""
    from npu_ep.kernels.ops import recurrent
    model, feeds, _ = _session_case(op, dict(direction="bidirectional", lens=[4, 0, 2], initial=True))
    (node,) = nodes_from_model(model)
    k = kernel_for(node.domain, node.op_type)
    p = k.prepare(node, REF)
    runtime.configure([p], "native", 1)
    inputs = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    fn, args = recurrent._native_args(runtime.native_module(), p, inputs)
    want = fn(*args)
    outs = [np.full(w.shape, np.nan, np.float32) for w in want]
    got = fn(*args, *outs)
    for g, o, w in zip(got, outs, want, strict=True):
        assert g is o and g.tobytes() == w.tobytes()
    readonly = np.zeros(want[0].shape, np.float32)
    readonly.flags.writeable = False
    for bad in (readonly, np.zeros(want[0].shape, np.float64), np.zeros(want[0].size + 1, np.float32)):
        got = fn(*args, bad)
        assert got[0] is not bad and got[0].tobytes() == want[0].tobytes()
