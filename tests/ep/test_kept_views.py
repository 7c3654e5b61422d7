"""The bridge keeps the numpy views it made of ORT's buffers and hands one to a later call only when ORT passes the
same memory again and nothing else holds the view: results stay the CPU EP's whether the feeds, ORT's buffers and
the callers' results are reused, kept or dropped, and a view a caller kept is never changed under it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.program import Program
from tests.npu_testing import assignment, cpu_run, make_model, npu_session


def _model(op: str):
    """A one-node model on a [n, 64] float32 input: Abs (its output lent to the step), Squeeze (a view step whose
    output the bridge copies) or Add of the input to itself."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    if op == "Squeeze":
        node = helper.make_node("Squeeze", ["x", "axes"], ["y"], name="node")
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])
        return make_model([node], [x], [y], {"axes": np.array([0], np.int64)})
    inputs = ["x", "x"] if op == "Add" else ["x"]
    node = helper.make_node(op, inputs, ["y"], name="node")
    return make_model([node], [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])])


@pytest.mark.parametrize("op", ["Abs", "Squeeze", "Add"])
@pytest.mark.parametrize("keep_results", [False, True])
def test_results_follow_the_feeds(op, keep_results):
    model = _model(op)
    sess = npu_session(model)
    rng = np.random.default_rng(0)
    feed = rng.standard_normal((1, 64)).astype(np.float32)
    kept = []
    for i in range(40):
        if i % 3 == 0:
            feed[...] = rng.standard_normal((1, 64))  # the same buffer, new values
        elif i % 3 == 1:
            feed = rng.standard_normal((1, 64)).astype(np.float32)  # another buffer
        if op != "Squeeze" and i % 10 == 9:
            feed = rng.standard_normal((2, 64)).astype(np.float32)  # another shape, then back
        got = sess.run(None, {"x": feed})[0]
        want = cpu_run(model, {"x": feed})[0]
        np.testing.assert_array_equal(got, want)
        if keep_results:
            kept.append((got, want))
    for got, want in kept:  # no later call wrote into an earlier result
        np.testing.assert_array_equal(got, want)
    assert assignment(sess) == {"node": "NpuEP"}


def test_a_view_held_elsewhere_is_not_handed_out_again(monkeypatch):
    model = _model("Abs")
    sess = npu_session(model)
    held = []
    real_observe = Program._observe

    def spy(self, inputs):
        held.extend(inputs)
        return real_observe(self, inputs)

    monkeypatch.setattr(Program, "_observe", spy)
    feed = np.arange(64, dtype=np.float32).reshape(1, 64) - 32
    first = feed.copy()
    for _ in range(5):
        np.testing.assert_array_equal(sess.run(None, {"x": feed})[0], np.abs(feed))
    assert len(held) == 1
    view = held[0]
    assert view.shape == (1, 64) and not view.flags.writeable
    np.testing.assert_array_equal(view, first)  # the same buffer, unchanged values: the view still reads it


@pytest.mark.parametrize("op", ["Abs", "Squeeze", "Add"])
def test_a_kept_view_moves_only_to_aligned_buffers(op):
    """A kept view takes a new buffer's address only where a new view would be aligned too: feeds that alternate
    between aligned and misaligned buffers (ORT passes a contiguous feed's memory as it is) still give the CPU EP's
    results, and a misaligned view is never marked aligned."""
    model = _model(op)
    sess = npu_session(model)
    rng = np.random.default_rng(1)
    raw = bytearray(64 * 4 + 8)
    for i in range(12):
        offset = (1, 2, 0, 4)[i % 4]
        feed = np.frombuffer(raw, dtype=np.float32, count=64, offset=offset).reshape(1, 64)
        values = rng.standard_normal((1, 64)).astype(np.float32)
        values[0, :4] = [np.nan, -np.inf, -0.0, 1e-40]
        raw[offset:offset + 256] = values.tobytes()
        assert feed.flags.aligned == (offset % 4 == 0)
        got = sess.run(None, {"x": feed})[0]
        want = cpu_run(model, {"x": feed})[0]
        np.testing.assert_array_equal(got, want)
    assert assignment(sess) == {"node": "NpuEP"}
