"""The rotary embedding as exporters write it out (``q * cos + rotate_half(q) * sin``) becomes one npu::RotateHalf.
Its reference is the unfused ops' numpy calls (bit for bit), its native kernel the same float32 operations (bit for
bit); sessions run it on NpuEP (graph assignment and the compiled step checked) and match the CPU EP's unfused ops.
Near misses stay as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels.fusion import fuse_partition
from npu_ep.kernels import runtime
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

REF = Target.load("npu-ref")
B, HEADS, S, H = 2, 3, 5, 16
INT64_MAX = 2**63 - 1


def rotary_model(swap_concat: bool = False, split: int = H // 2, cos_first: bool = False, extra_reader: bool = False,
                 cos_last: int | str = H, q_shape: tuple = (B, HEADS, S, H), runtime_half: bool = False
                 ) -> onnx.ModelProto:
    """q [B, HEADS, S, H], cos/sin [B, 1, S, cos_last] -> q * cos + concat(-q2, q1) * sin -> y. ``runtime_half``:
    the halves split at Shape(q)[3] / 2, computed at run time, as torch's TorchScript exporter writes it."""
    inits = {"zero": np.array([0], np.int64), "mid": np.array([split], np.int64),
             "end": np.array([INT64_MAX], np.int64), "axis": np.array([3], np.int64)}
    nodes = []
    if runtime_half:
        inits.update({"three": np.array(3, np.int64), "two": np.array(2, np.int64)})
        nodes += [helper.make_node("Shape", ["q"], ["q_shape"], "shape"),
                  helper.make_node("Gather", ["q_shape", "three"], ["h"], "gather", axis=0),
                  helper.make_node("Div", ["h", "two"], ["h2"], "div"),
                  helper.make_node("Unsqueeze", ["h2", "zero"], ["mid_rt"], "unsqueeze")]
    mid = "mid_rt" if runtime_half else "mid"
    nodes += [helper.make_node("Mul", ["cos", "q"] if cos_first else ["q", "cos"], ["qc"], "mul_cos"),
             helper.make_node("Slice", ["q", "zero", mid, "axis"], ["q1"], "slice_1"),
             helper.make_node("Slice", ["q", mid, "end", "axis"], ["q2"], "slice_2"),
             helper.make_node("Neg", ["q2"], ["nq2"], "neg"),
             helper.make_node("Concat", ["q1", "nq2"] if swap_concat else ["nq2", "q1"], ["rot"], "concat", axis=-1),
             helper.make_node("Mul", ["rot", "sin"], ["rs"], "mul_sin"),
             helper.make_node("Add", ["qc", "rs"], ["y"], "add")]
    outs = [helper.make_tensor_value_info("y", F32, q_shape)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("rot", F32, [B, HEADS, S, H]))
    ins = [helper.make_tensor_value_info("q", F32, q_shape),
           helper.make_tensor_value_info("cos", F32, [B, 1, S, cos_last]),
           helper.make_tensor_value_info("sin", F32, [B, 1, S, cos_last])]
    return make_model(nodes, ins, outs, inits, opset=18)


def feeds(cos_last: int = H) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    f = {"q": rng.standard_normal((B, HEADS, S, H)).astype(np.float32)}
    angle = rng.uniform(0, 6, (B, 1, S, cos_last)).astype(np.float32)
    f["cos"], f["sin"] = np.cos(angle), np.sin(angle)
    return f


def compiled_ops(model) -> list[str]:
    return [nd.op_type for nd in fuse_partition(nodes_from_model(model), REF)]


@pytest.mark.parametrize("cos_first", [False, True])
def test_the_rotation_is_one_step_on_npu_with_the_unfused_ops_bits(cos_first):
    model = rotary_model(cos_first=cos_first)
    assert compiled_ops(model) == ["RotateHalf"]
    LIVE_SESSIONS.clear()
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (got,) = sess.run(None, feeds())
    (want,) = cpu_run(model, feeds())  # the CPU EP runs the ops as written: two products, then their sum
    np.testing.assert_array_equal(got, want)
    (program,) = [prog for ep in LIVE_SESSIONS for prog in ep.programs.values()]
    assert [s.op for s in program.steps] == ["npu::RotateHalf"]
    assert all(b is not None for b in program._bindings[next(iter(program._bindings))])  # a native step


@pytest.mark.parametrize("split", [H // 2, 4])
def test_where_x_has_no_shape_the_step_checks_at_run_time(split):
    """ORT often knows no dim of x (it comes out of the Reshape that splits heads): the rotation still fuses,
    the native kernel runs where x's last dim is 2 * half, and the ops run as written where it is not (halves split
    at 4 of 16: a rotation of another kind, the same results as the CPU EP's)."""
    model = rotary_model(split=split, q_shape=("b", "n", "s", "h"), cos_last="h")
    assert compiled_ops(model) == ["RotateHalf"]
    LIVE_SESSIONS.clear()
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    (got,) = sess.run(None, feeds())
    np.testing.assert_array_equal(got, cpu_run(model, feeds())[0])
    (program,) = [prog for ep in LIVE_SESSIONS for prog in ep.programs.values()]
    bound = [b for b in program._bindings.values() if b is not None]  # no binding: every step is Python
    assert (bool(bound) and bound[0][0] is not None) == (split == H // 2)


def test_halves_split_at_run_time_fuse_and_bind_for_the_values_they_have():
    """TorchScript's rotate_half: the split point is Shape(q)[3] / 2, a run-time value. The fused step takes it as an
    input, runs natively for the value it was bound for, and gives the CPU EP's bits."""
    model = rotary_model(q_shape=("b", "n", "s", "h"), cos_last="h", runtime_half=True)
    assert compiled_ops(model)[-1] == "RotateHalf" and "Neg" not in compiled_ops(model)
    LIVE_SESSIONS.clear()
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for _ in range(2):
        (got,) = sess.run(None, feeds())
        np.testing.assert_array_equal(got, cpu_run(model, feeds())[0])
    (program,) = [prog for ep in LIVE_SESSIONS for prog in ep.programs.values()]
    (bound,) = [b for b in program._bindings.values() if b is not None]
    assert [type(b).__name__ for s, b in zip(program.steps, bound) if s.op == "npu::RotateHalf"] == ["CallStep"]


def test_the_native_kernel_gives_the_references_bits_with_broadcast_and_edge_values():
    """cos/sin broadcast over heads, over batch too, of rank 2, or not at all; NaN and infinities go through as the
    ops make them."""
    (node,) = fuse_partition(nodes_from_model(rotary_model()), REF)
    kernel = kernel_for(node.domain, node.op_type)
    p = kernel.prepare(node, REF)
    rng = np.random.default_rng(9)
    q = feeds()["q"]
    q[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    for shape in ((B, 1, S, H), (1, 1, S, H), (B, HEADS, S, H), (S, H)):
        angle = rng.uniform(0, 6, shape).astype(np.float32)
        cos, sin = np.cos(angle), np.sin(angle)
        (ref,) = kernel.run(p, [q, cos, sin])
        for threads in (1, 2):
            got = runtime.native_module().rotate_half(q, cos, sin, H // 2, threads)
            assert got.tobytes() == ref.tobytes(), (shape, threads)


def test_the_native_kernel_names_operands_that_do_not_fit():
    nat = runtime.native_module()
    q = np.zeros((1, 2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="cos's last dim 4 is not x's 8"):
        nat.rotate_half(q, np.zeros((1, 1, 3, 4), np.float32), np.zeros((1, 1, 3, 8), np.float32), 4)
    with pytest.raises(ValueError, match="sin does not broadcast to x's shape"):
        nat.rotate_half(q, np.zeros((1, 1, 3, 8), np.float32), np.zeros((1, 1, 2, 8), np.float32), 4)


@pytest.mark.parametrize("kwargs", [dict(swap_concat=True), dict(split=4), dict(extra_reader=True),
                                    dict(cos_last=1)])
def test_near_misses_run_as_written(kwargs):
    """concat(q1, -q2) (the other rotation), halves split elsewhere, the rotated tensor read elsewhere, cos and sin
    that broadcast along the last axis: no fused step, the same results as the CPU EP."""
    model = rotary_model(**kwargs)
    assert "RotateHalf" not in compiled_ops(model)
    f = feeds(kwargs.get("cos_last", H))
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want in zip(sess.run(None, f), cpu_run(model, f)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(swap_concat=True), "the chain differs from the pattern after 4 of its 7 nodes: OpType mismatch: expected "
                             "Neg, got Slice"),
    (dict(split=4), "the halves split 8 channels, x's last dim is 16"),
    (dict(extra_reader=True), "an intermediate value has other readers or is read outside the partition"),
    (dict(cos_last=1), "do not have last dim 16"),
])
def test_each_near_miss_says_why(kwargs, reason):
    """The rule's candidate (the Add) that does not fuse leaves a FusionMiss with the reason (npu-report
    --explain-fusions and the debug log show it)."""
    misses = []
    ops = [nd.op_type for nd in fuse_partition(nodes_from_model(rotary_model(**kwargs)), REF, misses)]
    assert "RotateHalf" not in ops
    assert [(m.fusion, m.node) for m in misses] == [("rotary", "add")]
    assert reason in misses[0].reason


def test_a_fused_rotation_leaves_no_miss():
    misses = []
    assert [nd.op_type for nd in fuse_partition(nodes_from_model(rotary_model()), REF, misses)] == ["RotateHalf"]
    assert misses == []


def test_a_miss_is_in_the_debug_log(caplog):
    """The compiler's debug log names each declined candidate, its fusion and the reason."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="npu_ep"):
        fuse_partition(nodes_from_model(rotary_model(split=4)), REF)
    assert "fusion rotary: node 'add' (Add) not fused: the halves split 8 channels, x's last dim is 16" in caplog.text
