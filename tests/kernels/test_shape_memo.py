"""Run-time values kernels keep per input shape (kernels/shape_memo.py) are bounded: a session over many distinct
shapes (a decoder's past grows by one every token) keeps each kernel's shape-keyed memo at ``SHAPES_KEPT`` entries
instead of one per shape seen, outputs stay the CPU EP's, and a shape evicted and seen again is derived anew."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_ep.ep.program import SIGNATURES_KEPT
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.kernels import planner
from npu_ep.kernels.registry import Prepared
from npu_ep.kernels.shape_memo import SHAPES_KEPT, ShapeMemo, memo_per_shape
from npu_ep.kernels.target import Target
from npu_testing import assignment, make_model, npu_session, session_options

F32, U8, I32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT32
MEMO_KEYS_PER_STEP = 16  # a step's own memo keys (weights, dtypes, per-rank constants, runtime keys) never grow


# --- the mechanism ---------------------------------------------------------------------------------------------


def test_the_kernels_keep_as_many_shapes_as_the_program_keeps_signatures():
    assert SHAPES_KEPT == SIGNATURES_KEPT


def test_shape_memo_keeps_the_most_recently_used_keys():
    memo = ShapeMemo(3)
    for k in range(3):
        memo.keep(k, str(k))
    assert memo.recall(0) == "0"  # 0 is now the most recent: 1 goes first
    memo.keep(3, "3")
    assert list(memo) == [2, 0, 3]
    assert memo.recall(1) is None and memo.recall(1, "gone") == "gone"
    assert memo.keep(1, "kept again") == "kept again" and list(memo) == [0, 3, 1]


def test_memo_per_shape_makes_once_per_kept_shape_and_keeps_nothing_when_make_fails():
    p, made = Prepared({}), []

    def make(shape):
        made.append(shape)
        return shape[0] * 2

    for _ in range(2):
        for n in range(SHAPES_KEPT):
            assert memo_per_shape(p, "double", (n,), lambda: make((n,))) == 2 * n  # noqa: B023 - called at once
    assert len(made) == SHAPES_KEPT and len(p.kernel_cache["double"]) == SHAPES_KEPT
    memo_per_shape(p, "double", (-1,), lambda: make((-1,)))  # a new shape evicts the least recently used, (0,)
    assert (0,) not in p.kernel_cache["double"] and len(p.kernel_cache["double"]) == SHAPES_KEPT
    with pytest.raises(ZeroDivisionError):
        memo_per_shape(p, "double", (-2,), lambda: 1 // 0)
    assert (-2,) not in p.kernel_cache["double"] and (1,) in p.kernel_cache["double"]


def test_the_planners_process_wide_cache_is_bounded_and_replans_an_evicted_shape(monkeypatch):
    monkeypatch.setattr(planner, "_CACHE", ShapeMemo(4))
    target = Target.load("npu-ref")
    first = planner.plan_matmul(1, 64, 32, "float32", "float32", target)
    for m in range(2, 12):
        planner.plan_matmul(m, 64, 32, "float32", "float32", target)
    assert len(planner._CACHE) == 4
    again = planner.plan_matmul(1, 64, 32, "float32", "float32", target)
    assert again is not first and again == first


# --- sessions over many shapes ---------------------------------------------------------------------------------


def _prepared_in(p: Prepared) -> Iterator[Prepared]:
    """``p`` and the Prepared of the kernels a fused kernel runs inside (kept in its memo)."""
    yield p
    for value in p.kernel_cache.values():
        for inner in value if isinstance(value, list) else [value]:
            if isinstance(inner, Prepared):
                yield from _prepared_in(inner)


def _memos_by_op(sess: ort.InferenceSession) -> dict[str, list[dict]]:
    memos: dict[str, list[dict]] = {}
    for program in session_of(sess).programs.values():
        for step in program.steps:
            memos.setdefault(step.op.split("::")[-1], []).extend(q.kernel_cache for q in _prepared_in(step.prepared))
    return memos


def _assert_bounded(memos: Mapping[str, list[dict]]) -> None:
    """No step's memo grows with the shapes seen: few keys of its own, each mapping at most SHAPES_KEPT long."""
    for op, found in memos.items():
        for memo in found:
            assert len(memo) <= MEMO_KEYS_PER_STEP, (op, len(memo), list(memo)[:5])
            for key, value in memo.items():
                if isinstance(value, Mapping):
                    assert len(value) <= SHAPES_KEPT, (op, key, len(value))


def _kept(memos: Mapping[str, list[dict]], op: str, kind: str) -> ShapeMemo:
    (table,) = [m[kind] for m in memos[op] if kind in m]
    assert isinstance(table, ShapeMemo), (op, kind, type(table))
    return table


def _run_shapes(model, feeds_of: Callable[[int], dict[str, np.ndarray]], sizes: list[int],
                close: Callable[[np.ndarray, np.ndarray], None]) -> ort.InferenceSession:
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}, assignment(sess)
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in sizes:
        feeds = feeds_of(size)
        for got, want in zip(sess.run(None, feeds), cpu.run(None, feeds)):
            close(got, want)
    return sess


def decoder_model():
    """A decoder-like float path over x [1, S, 8] (Pad, Slice, LayerNormalization, MatMul with S rows growing like a
    decoder's past) beside a ConvInteger and a float Conv over images [1, 2, 3, W]: every one keeps values per
    input shape."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad"),
             helper.make_node("Slice", ["padded", "starts", "ends", "axes"], ["sliced"], name="slice"),
             helper.make_node("LayerNormalization", ["sliced", "gamma", "beta"], ["normed"], name="norm", axis=-1),
             helper.make_node("MatMul", ["normed", "w"], ["y"], name="matmul"),
             helper.make_node("ConvInteger", ["u", "wq", "uz"], ["yq"], name="conv_integer", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["v", "wc", "bc"], ["yc"], name="conv", pads=[0, 1, 0, 1])]
    inits = {"pads": np.array([0, 2, 0, 0, 1, 0], np.int64), "starts": np.array([1], np.int64),
             "ends": np.array([-1], np.int64), "axes": np.array([1], np.int64),
             "gamma": rng.uniform(0.5, 1.5, 8).astype(np.float32), "beta": rng.uniform(-1, 1, 8).astype(np.float32),
             "w": rng.standard_normal((8, 16)).astype(np.float32),
             "wq": rng.integers(0, 256, (4, 2, 3, 3)).astype(np.uint8), "uz": np.array(121, np.uint8),
             "wc": rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
             "bc": rng.standard_normal(4).astype(np.float32)}
    ins = [helper.make_tensor_value_info("x", F32, [1, "S", 8]), helper.make_tensor_value_info("u", U8, [1, 2, 3, "W"]),
           helper.make_tensor_value_info("v", F32, [1, 2, 3, "W"])]
    outs = [helper.make_tensor_value_info("y", F32, [1, None, 16]),
            helper.make_tensor_value_info("yq", I32, [None] * 4), helper.make_tensor_value_info("yc", F32, [None] * 4)]
    return make_model(nodes, ins, outs, inits, opset=18)


def _decoder_feeds(size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(size)
    return {"x": rng.standard_normal((1, size, 8)).astype(np.float32),
            "u": rng.integers(0, 256, (1, 2, 3, size)).astype(np.uint8),
            "v": rng.standard_normal((1, 2, 3, size)).astype(np.float32)}


def _equal_or_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)  # ConvInteger's sums are exact


DECODER_KINDS = [("Pad", "pad_geometry"), ("Slice", "slice_index"), ("MatMul", "plans"),
                 ("ConvInteger", "geometry"), ("Conv", "float_call")]


def test_a_session_over_many_shapes_keeps_each_kernels_shape_memo_bounded():
    """200 shapes: every kernel kept one entry per shape for the session's life (Pad's geometry, Slice's index,
    MatMul's tile plans, ConvInteger's geometry, Conv's native call); now SHAPES_KEPT of the latest each. The
    first shape, evicted long ago, is seen again and made anew, with the CPU EP's outputs."""
    sizes = list(range(1, 201))
    sess = _run_shapes(decoder_model(), _decoder_feeds, sizes + [1], _equal_or_close)
    for program in session_of(sess).programs.values():
        program.emulated_seconds()  # prices every shape seen (deferred until asked, ep/program.py), as a report does
    memos = _memos_by_op(sess)
    _assert_bounded(memos)
    for op, kind in DECODER_KINDS:
        table = _kept(memos, op, kind)
        assert len(table) == SHAPES_KEPT, (op, kind, len(table))
    # S = 1, evicted, is seen again with the CPU EP's outputs (_run_shapes); Pad's native step (pad.cc) and
    # ConvInteger's (conv_integer, its geometry bound in) take it without the kernels' geometry, so only the
    # eviction is visible here
    assert (1, 4, 8) not in _kept(memos, "Pad", "pad_geometry")  # S = 4: evicted, not seen since
    assert (1, 2, 3, 4) not in _kept(memos, "ConvInteger", "geometry")


def qlinear_conv_model():
    rng = np.random.default_rng(1)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], name="qconv",
                            pads=[1, 1, 1, 1])
    inits = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
             "w": rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8), "ws": np.array(0.01, np.float32),
             "wz": np.array(0, np.int8), "ys": np.array(0.05, np.float32), "yz": np.array(120, np.uint8),
             "b": rng.integers(-500, 500, 4).astype(np.int32)}
    return make_model([node], [helper.make_tensor_value_info("x", U8, [1, 3, 5, "W"])],
                      [helper.make_tensor_value_info("y", U8, [None] * 4)], inits, opset=10)


def lstm_model():
    rng = np.random.default_rng(2)
    hidden = 4
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "yh"], name="lstm", hidden_size=hidden)
    inits = {"w": rng.uniform(-0.5, 0.5, (1, 4 * hidden, 3)).astype(np.float32),
             "r": rng.uniform(-0.5, 0.5, (1, 4 * hidden, hidden)).astype(np.float32),
             "b": rng.uniform(-0.5, 0.5, (1, 8 * hidden)).astype(np.float32)}
    return make_model([node], [helper.make_tensor_value_info("x", F32, ["T", 1, 3])],
                      [helper.make_tensor_value_info("y", F32, [None] * 4),
                       helper.make_tensor_value_info("yh", F32, [None] * 3)],
                      inits, opset=14)


def _qconv_feeds(size: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(size).integers(0, 256, (1, 3, 5, size)).astype(np.uint8)}


def _lstm_feeds(size: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(size).uniform(-1, 1, (size, 1, 3)).astype(np.float32)}


def _qconv_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # as test_conv's QLinearConv against the CPU EP: the same codes


@pytest.mark.parametrize("model,feeds_of,op,kind,close", [
    (qlinear_conv_model, _qconv_feeds, "QLinearConv", "qlinear_call", _qconv_close),
    (lstm_model, _lstm_feeds, "LSTM", "full_lens", lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5,
                                                                                            atol=1e-6)),
], ids=["QLinearConv", "LSTM"])
def test_other_kernels_keep_their_per_shape_values_bounded(model, feeds_of, op, kind, close):
    """QLinearConv's native call per image width and LSTM's full sequence lengths per (batch, length)."""
    sizes = list(range(1, SHAPES_KEPT + 21)) + [1]
    memos = _memos_by_op(_run_shapes(model(), feeds_of, sizes, close))
    _assert_bounded(memos)
    assert len(_kept(memos, op, kind)) == SHAPES_KEPT
