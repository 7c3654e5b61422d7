"""Differential sweep of the indexing kernels (issue 40, kernels/native/indexing.cc) against the reference model
(kernels/ops/indexing.py: numpy's take, slicing, split, concatenate, fancy indexing and ufunc.at), byte for byte:
these kernels move bytes (NaN payloads, -0.0 and float16 kept). ScatterND's reductions compute in the data's dtype
as numpy does (integers wrap, float16 rounds each step): integers bit-exact, floats the same values with NaN where
the reference has NaN (which NaN's payload a sum of two keeps is the compiler's choice, in numpy as here).
Shapes cross the row sizes the copies specialize (1, 2, 4, 8 bytes and longer rows), the 64 KB task split and the
1 MB parallel threshold; indices are negative, repeated and out of range (an IndexError naming the index, as ORT's
error does). The copies dispatch to no instruction set
of their own; ScatterND's float16 reductions go through the shared conversion rows (half.cc), swept at every ISA
they dispatch to. Sessions show NpuEP ran the node as its bound native step (no Python step) with the CPU EP's
values, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, assert_matches, bit_values, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4040)
TASK = 1 << 16  # indexing.cc's kTaskBytes
DTYPES = [np.bool_, np.int8, np.float16, np.float32, np.int32, np.int64]
ELEM = {np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.int8): TensorProto.INT8,
        np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.float16): TensorProto.FLOAT16,
        np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
        np.dtype(np.int64): TensorProto.INT64}


def _values(shape, dt) -> np.ndarray:
    return bit_values(shape, dt, RNG)


def _same_bytes(op: str, inputs, native_fn: str, threads: int = 1, n_out: int = 1, computed: bool = False,
                **attrs) -> list[np.ndarray]:
    """The native kernel ran and its outputs are the reference's bytes; ``computed`` (ScatterND's float
    reductions): the same values, NaN where the reference has NaN, as C leaves which NaN operand's payload a sum of
    two NaNs keeps, and numpy which of -0.0 and +0.0 its maximum returns, to the compiler."""
    got, want, calls = native_vs_reference(op, inputs, threads=threads, n_out=n_out, **attrs)
    what = f"{op} {attrs} {[(s[0], np.shape(s[1]), s[2]) for s in inputs]} threads={threads}"
    assert native_fn in calls, f"{what}: the native {native_fn} did not run ({calls})"
    assert len(got) == len(want) == n_out
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if computed and w.dtype.kind == "f":
            assert_matches(g, w, what=what)
        else:
            assert g.tobytes() == w.tobytes(), f"{what}: bytes differ"
    return got


def _session(nodes, inputs, outputs, consts=None, opset: int = 18):
    model = make_model(nodes, inputs, outputs, consts or {}, opset=opset)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    return model, npu_session(model, so=so)


def _runs_native_like_cpu_ep(model, sess, feeds, names) -> None:
    """Every node on NpuEP, the CPU EP's outputs bit for bit over three runs (the kernel's, then the bound step's),
    and no Python step."""
    assert assignment(sess) == {n: "NpuEP" for n in names}
    want = cpu_run(model, feeds)
    for _ in range(3):
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert g.tobytes() == w.tobytes()
    assert python_steps(sess) == [], "a node ran its Python kernel instead of the bound native step"


# ---- Gather ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_gather_axes_row_sizes_and_index_shapes_byte_for_byte(dt):
    """Rows of 1, 2, 4 and 8 bytes and longer (every dtype on every axis), scalar, empty and 2-D indices, int32 and
    int64, negative and repeated, the table constant or not."""
    x = _values((3, 5, 4), dt)
    for axis in (0, 1, 2, -1):
        dim = x.shape[axis]
        for idx in (np.array(-1), np.array([0, -dim, dim - 1, 0]), np.array([[1, -1], [0, 0]]), np.zeros((0, 2))):
            for idt in (np.int64, np.int32):
                for const in (False, True):
                    _same_bytes("Gather", [("x", x, const), ("i", idx.astype(idt), False)], "gather", axis=axis)


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_gather_task_split_and_threads_byte_for_byte(dt):
    """Rows per task around the 64 KB task and the 1 MB parallel threshold; two threads give one thread's bytes."""
    for rows in around(TASK // 4, (1 << 20) // 4):
        x = _values((2, rows), dt)
        idx = RNG.integers(-rows, rows, size=rows)
        one = _same_bytes("Gather", [("x", x, False), ("i", idx, False)], "gather", axis=1)
        two = _same_bytes("Gather", [("x", x, False), ("i", idx, False)], "gather", threads=2, axis=1)
        assert one[0].tobytes() == two[0].tobytes()
    table = _values((300, 1030), np.float32)  # an embedding table: 4120-byte rows
    _same_bytes("Gather", [("t", table, True), ("i", RNG.integers(-300, 300, size=(4, 70)), False)], "gather",
                threads=2)


@pytest.mark.parametrize("bad", [[4], [-5], [[0, 4]], [1, -5, 0]])
def test_gather_out_of_range_names_the_index_like_ort(bad):
    nat = runtime.native_module()
    idx = np.array(bad, np.int64)
    value = next(v for v in idx.reshape(-1) if not -4 <= v < 4)
    with pytest.raises(IndexError, match=rf"Gather: indices outside \[-4, 4\) on axis 0, idx={value}$"):
        nat.gather(np.zeros((4, 3), np.float32), idx, 0)
    with pytest.raises(IndexError, match=rf"idx={value}$"):
        nat.gather(np.zeros((4, 3), np.float32), idx.astype(np.int32), 0)


@pytest.mark.parametrize("case", ["embedding_f16", "every_other_last_i8"])
def test_gather_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """A decoder's embedding lookup (constant float16 table, int64 ids with a negative one) and a strided pick on the
    last axis, bit for bit with the CPU EP."""
    if case == "embedding_f16":
        table = _values((1000, 64), np.float16)
        node = helper.make_node("Gather", ["table", "ids"], ["y"], name="the_op", axis=0)
        ids = np.array([[3, 999, -1, 0]], np.int64)
        model, sess = _session([node], [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 64])], {"table": table})
        feeds = {"ids": ids}
    else:
        x = _values((2, 16, 64), np.int8)
        node = helper.make_node("Gather", ["x", "i"], ["y"], name="the_op", axis=-1)
        model, sess = _session([node], [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 16, 64])],
                               [helper.make_tensor_value_info("y", TensorProto.INT8, [2, 16, 32])],
                               {"i": np.arange(0, 64, 2, dtype=np.int64)})
        feeds = {"x": x}
    _runs_native_like_cpu_ep(model, sess, feeds, ["the_op"])


# ---- Slice -----------------------------------------------------------------------------------------------------

BIG = np.iinfo(np.int64).max
SLICES = [([1], [-1], [-1], [1]), ([0, 1], [BIG, -1], [1, 2], [2, 3]), ([-1], [-BIG], [2], [-1]),
          ([5], [0], [0], [-2]), ([2, -1, 1], [BIG, -BIG, -1], [0, 1, 2], [1, -2, 1]), ([1], [2], [1], [1]),
          ([100], [-100], [0], [-1]), ([3], [1], [2], [1])]


@pytest.mark.parametrize("dt", DTYPES)
def test_slice_bounds_steps_and_clamping_byte_for_byte(dt):
    """ONNX clamping, negative and long steps, empty results; the native copy runs wherever numpy's view is not C
    order (a C-order view is kept as it is: free)."""
    x = _values((6, 5, 7), dt)
    for starts, ends, axes, steps in SLICES:
        inputs = [("x", x, False), ("st", np.array(starts), True), ("en", np.array(ends), True),
                  ("ax", np.array(axes), True), ("sp", np.array(steps), True)]
        got, want, calls = native_vs_reference("Slice", inputs)
        assert got[0].tobytes() == want[0].tobytes() and got[0].shape == want[0].shape
        assert ("slice_copy" in calls) == (not want[0].flags.c_contiguous), (starts, ends, axes, steps, calls)


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_slice_long_lines_task_split_and_threads_byte_for_byte(dt):
    """Lines around the 64 KB task (split in parts when longer), many short lines past the 1 MB parallel threshold,
    one thread and two."""
    for n in around(TASK // np.dtype(dt).itemsize, 2 * TASK // np.dtype(dt).itemsize):
        x = _values((3, n + 2), dt)
        inputs = [("x", x, False), ("st", np.array([1]), True), ("en", np.array([-1]), True),
                  ("ax", np.array([-1]), True)]
        one = _same_bytes("Slice", inputs, "slice_copy")
        assert one[0].tobytes() == _same_bytes("Slice", inputs, "slice_copy", threads=2)[0].tobytes()
    x = _values((700, 3, 130), dt)
    inputs = [("x", x, False), ("st", np.array([2, 0]), True), ("en", np.array([-1, 3]), True),
              ("ax", np.array([2, 1]), True), ("sp", np.array([3, 2]), True)]
    assert _same_bytes("Slice", inputs, "slice_copy")[0].tobytes() == \
        _same_bytes("Slice", inputs, "slice_copy", threads=2)[0].tobytes()


def test_slice_copy_reads_any_layout_and_checks_its_bounds():
    nat = runtime.native_module()
    x = _values((9, 8, 5), np.float32).transpose(2, 0, 1)[:, ::2]  # strided, negative-free
    got = nat.slice_copy(x, [4, 1, 7], [-1, 2, -3], [5, 2, 3])
    assert got.tobytes() == np.ascontiguousarray(x[4::-1, 1:5:2, 7::-3]).tobytes()
    one = np.array(5.0, np.float32)  # every axis of size 1, or none at all: one element
    assert nat.slice_copy(one, [], [], []).tobytes() == one.tobytes()
    assert nat.slice_copy(x, [2, 1, 3], [1, 1, 1], [1, 1, 1]).tobytes() == x[2:3, 1:2, 3:4].tobytes()
    with pytest.raises(ValueError, match=r"slice_copy: axis 1: 3 elements from 1 by 2 leave data \[5, 5, 8\]"):
        nat.slice_copy(x, [0, 1, 0], [1, 2, 1], [5, 3, 8])


@pytest.mark.parametrize("case", ["last_axis_f32", "reverse_i64"])
def test_slice_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """A rotary half (the last axis cut) and a reversed, stepped slice: into ORT's buffer, bit for bit."""
    dt, elem = (np.float32, TensorProto.FLOAT) if case == "last_axis_f32" else (np.int64, TensorProto.INT64)
    x = _values((2, 24, 64), dt)
    if case == "last_axis_f32":
        consts, out = {"st": np.array([32]), "en": np.array([BIG]), "ax": np.array([-1])}, [2, 24, 32]
    else:
        consts, out = {"st": np.array([-1, 60]), "en": np.array([-BIG, 0]), "ax": np.array([1, 2])}, [2, 24, 20]
        consts["sp"] = np.array([-1, -3])
    node = helper.make_node("Slice", ["x", *consts], ["y"], name="the_op")
    model, sess = _session([node], [helper.make_tensor_value_info("x", elem, list(x.shape))],
                           [helper.make_tensor_value_info("y", elem, out)], consts)
    _runs_native_like_cpu_ep(model, sess, {"x": x}, ["the_op"])


# ---- Concat ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_concat_axes_parts_and_constants_byte_for_byte(dt):
    """Every axis, parts of different lengths (one empty), a constant part held in place, rank 1 to 4."""
    for shapes, axis in [(((2, 3, 4), (2, 1, 4), (2, 0, 4)), 1), (((5,), (3,)), 0), (((2, 3), (2, 5)), -1),
                         (((1, 2, 3, 4), (2, 2, 3, 4)), 0), (((2, 3, 1, 4), (2, 3, 2, 4), (2, 3, 3, 4)), 2)]:
        for const in (None, 0, len(shapes) - 1):
            inputs = [(f"p{k}", _values(s, dt), k == const) for k, s in enumerate(shapes)]
            _same_bytes("Concat", inputs, "concat_into", axis=axis)


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_concat_runs_around_the_task_split_and_threads_byte_for_byte(dt):
    """Runs just under, at and over the 64 KB task (long ones split in parts), the 1 MB threshold, two threads."""
    for n in around(TASK // np.dtype(dt).itemsize, (1 << 20) // np.dtype(dt).itemsize):
        inputs = [("a", _values((2, n), dt), False), ("b", _values((2, 3), dt), False)]
        one = _same_bytes("Concat", inputs, "concat_into", axis=-1)
        assert one[0].tobytes() == _same_bytes("Concat", inputs, "concat_into", threads=2, axis=-1)[0].tobytes()
    inputs = [("a", _values((3000, 70), dt), False), ("b", _values((3000, 1), dt), False)]  # many short runs
    assert _same_bytes("Concat", inputs, "concat_into", axis=1)[0].tobytes() == \
        _same_bytes("Concat", inputs, "concat_into", threads=2, axis=1)[0].tobytes()


@pytest.mark.parametrize("dt", [np.bool_, np.float16, np.float32, np.int64])
def test_concat_rows_in_one_pass_around_its_run_and_row_limits_byte_for_byte(dt):
    """indexing.cc assembles y's rows in one pass when every non-empty part's run has 32 bytes and a row is at most
    one task: runs around 32 bytes, rows around the task split, an empty part, three parts, a constant part, over
    1 MB on 2 threads (the same bytes as on one)."""
    item = np.dtype(dt).itemsize
    run = 32 // item
    for first in around(run):
        for rows in (1, 3):
            inputs = [("a", _values((rows, 2, first), dt), False), ("e", _values((rows, 2, 0), dt), False),
                      ("b", _values((rows, 2, run + 5), dt), True)]
            _same_bytes("Concat", inputs, "concat_into", axis=-1)
    for width in around(TASK // item):
        inputs = [("a", _values((3, width - 40 // item), dt), False), ("b", _values((3, 40 // item), dt), False)]
        _same_bytes("Concat", inputs, "concat_into", axis=1)
    rows = (1 << 20) // (768 * item) + 7
    for parts in (2, 3):
        inputs = [(f"p{k}", _values((1, rows, 768 // parts), dt), False) for k in range(parts)]
        one = _same_bytes("Concat", inputs, "concat_into", axis=-1)
        assert one[0].tobytes() == _same_bytes("Concat", inputs, "concat_into", threads=2, axis=-1)[0].tobytes()


@pytest.mark.parametrize("isa", host_isas())
@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_row_runs_across_the_vector_copy_bounds_byte_for_byte(isa, dt):
    """Runs of 256 B to 8 KB are copied in 32-byte vectors with an overlapping last one (row_copy.h): concat,
    split and slice runs just below, at and above those bounds and off the vector width, on every ISA path."""
    item = np.dtype(dt).itemsize
    gen = cap_isa(isa)
    next(gen)
    try:
        for nbytes in (224, 255, 256, 257, 288, 300, 1536, 8191, 8192, 8193, 8224):
            n = max(1, nbytes // item)
            a, b = _values((3, n), dt), _values((3, n + 1), dt)
            _same_bytes("Concat", [("a", a, False), ("b", b, False)], "concat_into", axis=-1)
            x = np.concatenate([a, b], axis=-1)
            _same_bytes("Split", [("x", x, False), ("s", np.array([n, n + 1]), True)], "split", n_out=2, axis=-1)
            _same_bytes("Slice", [("x", b, False), ("st", np.array([1]), True), ("en", np.array([n + 1]), True),
                                  ("ax", np.array([-1]), True)], "slice_copy")
    finally:
        next(gen, None)


def test_concat_into_names_mismatched_parts():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"input \[2, 4\] \(float32\) does not match \[2, 3\] \(float32\) off axis 0"):
        nat.concat_into(0, None, 1, np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"\(int32\) does not match"):
        nat.concat_into(1, None, 1, np.zeros((2, 3), np.float32), np.zeros((2, 4), np.int32))


def test_concat_session_matches_cpu_ep_and_runs_on_npu_ep():
    """A decoder's past + new key along the sequence axis (float16), into ORT's buffer, bit for bit."""
    past, new = _values((1, 4, 30, 16), np.float16), _values((1, 4, 1, 16), np.float16)
    node = helper.make_node("Concat", ["past", "new"], ["present"], name="the_op", axis=2)
    model, sess = _session([node], [helper.make_tensor_value_info("past", TensorProto.FLOAT16, [1, 4, 30, 16]),
                                    helper.make_tensor_value_info("new", TensorProto.FLOAT16, [1, 4, 1, 16])],
                           [helper.make_tensor_value_info("present", TensorProto.FLOAT16, [1, 4, 31, 16])])
    _runs_native_like_cpu_ep(model, sess, {"past": past, "new": new}, ["the_op"])


# ---- Split -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_split_sizes_num_outputs_and_axes_byte_for_byte(dt):
    """A split input (with a zero-sized part), opset 18's num_outputs with a short last part, every axis."""
    x = _values((4, 7, 6), dt)
    for axis in (0, 1, 2, -1):
        dim = x.shape[axis]
        _same_bytes("Split", [("x", x, False), ("s", np.array([1, 0, dim - 1]), True)], "split", n_out=3, axis=axis)
        _same_bytes("Split", [("x", x, False)], "split", n_out=3, axis=axis, num_outputs=3)


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_split_runs_around_the_task_split_and_threads_byte_for_byte(dt):
    for n in around(TASK // np.dtype(dt).itemsize, (1 << 20) // np.dtype(dt).itemsize):
        inputs = [("x", _values((2, n + 3), dt), False), ("s", np.array([n, 3]), True)]
        one = _same_bytes("Split", inputs, "split", n_out=2, axis=-1)
        two = _same_bytes("Split", inputs, "split", threads=2, n_out=2, axis=-1)
        assert [a.tobytes() for a in one] == [b.tobytes() for b in two]


@pytest.mark.parametrize("dt", [np.bool_, np.float16, np.float32, np.int64])
def test_split_rows_in_one_pass_around_its_run_and_row_limits_byte_for_byte(dt):
    """indexing.cc cuts x's rows in one pass when every non-empty part's run has 32 bytes and a row is at most one
    task: runs around 32 bytes, rows around the task split, a zero-sized part, three parts, over 1 MB on 2 threads."""
    item = np.dtype(dt).itemsize
    run = 32 // item
    for first in around(run):
        for rows in (1, 3):
            inputs = [("x", _values((rows, 2, first + run + 5), dt), False), ("s", np.array([first, 0, run + 5]), True)]
            _same_bytes("Split", inputs, "split", n_out=3, axis=-1)
    for width in around(TASK // item):
        inputs = [("x", _values((3, width), dt), False), ("s", np.array([width - 40 // item, 40 // item]), True)]
        _same_bytes("Split", inputs, "split", n_out=2, axis=1)
    rows = (1 << 20) // (768 * item) + 7
    for parts in (2, 3):
        x = _values((1, rows, 768), dt)
        one = _same_bytes("Split", [("x", x, False)], "split", n_out=parts, axis=-1, num_outputs=parts)
        two = _same_bytes("Split", [("x", x, False)], "split", threads=2, n_out=parts, axis=-1, num_outputs=parts)
        assert [a.tobytes() for a in one] == [b.tobytes() for b in two]
        _same_bytes("Split", [("x", x, False)], "split", threads=2, n_out=parts, axis=1, num_outputs=parts)


def test_split_names_sizes_that_do_not_add_up():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"split: sizes \[2, 2\] do not split axis 1 of \[3, 5\]"):
        nat.split(np.zeros((3, 5), np.float32), 1, [2, 2], 1)


def test_split_session_matches_cpu_ep_and_runs_on_npu_ep():
    """A fused QKV projection split three ways on the last axis (float32), every part into ORT's buffer."""
    x = _values((1, 24, 3 * 64), np.float32)
    node = helper.make_node("Split", ["x", "s"], ["q", "k", "v"], name="the_op", axis=-1)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 24, 64]) for n in "qkv"]
    model, sess = _session([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 192])], outs,
                           {"s": np.array([64, 64, 64])})
    _runs_native_like_cpu_ep(model, sess, {"x": x}, ["the_op"])


# ---- GatherND --------------------------------------------------------------------------------------------------

ND_CASES = [((4, 5), [[0, 0], [3, -1], [-4, 2]], 0), ((4, 5, 3), [[1], [-1], [1]], 0),
            ((2, 4, 5), [[[1, 2]], [[3, -5]]], 1), ((2, 3, 4, 5), [[[1], [2], [-1]], [[0], [3], [2]]], 2),
            ((3, 4, 2), [[[[2, 1, 0]], [[-3, -4, -2]]]], 0), ((6, 7), np.zeros((0, 1), np.int64), 0)]


@pytest.mark.parametrize("dt", DTYPES)
def test_gather_nd_batch_dims_and_tuple_lengths_byte_for_byte(dt):
    """Whole rows, single elements (every dtype's element size), batch_dims 0..2, negative and repeated tuples,
    no tuples; the data constant or not."""
    for xs, idx, b in ND_CASES:
        for const in (False, True):
            _same_bytes("GatherND", [("x", _values(xs, dt), const), ("i", np.array(idx, np.int64), False)],
                        "gather_nd", batch_dims=b)


@pytest.mark.parametrize("dt", [np.int8, np.float32, np.int64])
def test_gather_nd_task_split_and_threads_byte_for_byte(dt):
    for rows in around(TASK // np.dtype(dt).itemsize, (1 << 20) // np.dtype(dt).itemsize):
        x = _values((3, rows), dt)
        idx = np.stack([RNG.integers(-3, 3, size=rows), RNG.integers(-rows, rows, size=rows)], axis=-1)
        one = _same_bytes("GatherND", [("x", x, False), ("i", idx, False)], "gather_nd")
        assert one[0].tobytes() == _same_bytes("GatherND", [("x", x, False), ("i", idx, False)], "gather_nd",
                                               threads=2)[0].tobytes()


@pytest.mark.parametrize("bad", [[[4, 0]], [[0, -6]], [[1, 1], [0, 5]]])
def test_gather_nd_out_of_range_names_the_index_like_ort(bad):
    """ORT: 'invalid index found, index = 4'; kernel and reference name the same index."""
    x = np.zeros((4, 5), np.float32)
    idx = np.array(bad, np.int64)
    value = next(v for row in idx for v, d in zip(row, x.shape) if not -d <= v < d)
    with pytest.raises(IndexError, match=rf"GatherND: indices outside the data dims \[4, 5\], index = {value}$"):
        runtime.native_module().gather_nd(x, idx, 0)
    with pytest.raises(IndexError, match=rf"index = {value}$"):
        native_vs_reference("GatherND", [("x", x, False), ("i", idx, False)])


def test_gather_nd_session_matches_cpu_ep_and_runs_on_npu_ep():
    """Batched row picks (batch_dims 1, int64 data), into ORT's buffer, bit for bit."""
    x, idx = _values((2, 6, 8), np.int64), np.array([[[5], [0], [-1]], [[2], [2], [-6]]], np.int64)
    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="the_op", batch_dims=1)
    model, sess = _session([node], [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 6, 8]),
                                    helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3, 1])],
                           [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 3, 8])])
    _runs_native_like_cpu_ep(model, sess, {"x": x, "i": idx}, ["the_op"])


# ---- ScatterND -------------------------------------------------------------------------------------------------

REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _scatter_cases(dt):
    """(data shape, indices, updates) with whole rows, single elements, repeats (in order: the last wins for none,
    every one counts for the reductions) and no updates."""
    yield (4, 5, 3), np.array([[2], [0]]), _values((2, 5, 3), dt)
    yield (4, 5, 3), np.array([[1, 2, 0], [3, -1, 2], [1, 2, 0]]), _values((3,), dt)
    yield (4, 5), np.array([[1, 2], [1, 2], [0, -5], [1, 2]]), _values((4,), dt)
    yield (6, 7), np.array([[[-1], [5]], [[5], [0]]]), _values((2, 2, 7), dt)
    yield (3, 4), np.zeros((0, 2), np.int64), _values((0,), dt)


@pytest.fixture(params=host_isas(top="avx2"))
def capped_isa(request):
    """float16 reductions convert through half.cc's rows, which dispatch up to AVX2 (F16C)."""
    yield from cap_isa(request.param)


@pytest.mark.parametrize("dt", DTYPES + [np.uint8, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd_reductions_in_the_data_dtype(dt, reduction):
    """none/add/mul/max/min as numpy's ufunc.at in the data's dtype: integers wrap, bool add/mul are or/and,
    max/min keep a NaN, float16 rounds each step; the indices constant or not."""
    for shape, idx, upd in _scatter_cases(dt):
        for const in (False, True):
            _same_bytes("ScatterND", [("x", _values(shape, dt), False), ("i", idx.astype(np.int64), const),
                                      ("u", upd, False)], "scatter_nd", computed=reduction != "none",
                        reduction=reduction)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd_float16_at_every_isa(capped_isa, reduction):
    for n in around(8, 256):  # conversion lanes and scatter_nd's 256-element float blocks
        idx = np.array([[1], [0], [1], [-1]])
        _same_bytes("ScatterND", [("x", _values((3, n), np.float16), False), ("i", idx, False),
                                  ("u", _values((4, n), np.float16), False)], "scatter_nd",
                    computed=reduction != "none", reduction=reduction)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_column_tasks_and_threads_byte_for_byte(reduction):
    """Data past the 1 MB threshold: the copy in 64 KB tasks, the updates in column tasks that keep each element's
    updates in index order (repeated rows), one thread and two."""
    x = _values((40, 9000), np.float32)
    idx = np.array([[3], [-1], [3], [0], [3]])
    inputs = [("x", x, False), ("i", idx, False), ("u", _values((5, 9000), np.float32), False)]
    computed = reduction != "none"
    one = _same_bytes("ScatterND", inputs, "scatter_nd", computed=computed, reduction=reduction)
    assert one[0].tobytes() == _same_bytes("ScatterND", inputs, "scatter_nd", threads=2, computed=computed,
                                           reduction=reduction)[0].tobytes()


PICK_ROW_BYTES = 64  # indexing.cc: from this row size ScatterND without reduction writes each row once


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_scatter_nd_rows_picked_from_x_or_their_last_update(dt, threads):
    """Reduction none with rows of 64 bytes or more: each result row is x's or its last update's. Rows around the
    64-byte switch, repeated and negative indices (the last wins), untouched runs at the start, middle and end,
    every row updated, no update, index tuples addressing sub-blocks (q = 2), and data past the 1 MB split with
    rows across its 64 KB tasks, one thread and two."""
    item = np.dtype(dt).itemsize
    for row in sorted({max(1, (PICK_ROW_BYTES + d) // item) for d in (-item, 0, item)}):
        for idx in ([[2], [0], [2], [-1]], [[1]], [[0], [1], [2], [3], [4], [5]], [[-6], [5], [-6]]):
            idx = np.array(idx)
            _same_bytes("ScatterND", [("x", _values((6, row), dt), False), ("i", idx, False),
                                      ("u", _values((len(idx), row), dt), False)], "scatter_nd", threads=threads)
        _same_bytes("ScatterND", [("x", _values((6, row), dt), False), ("i", np.zeros((0, 1), np.int64), False),
                                  ("u", _values((0, row), dt), False)], "scatter_nd", threads=threads)
    idx = np.array([[1, 2], [0, 0], [1, 2], [2, -1]])
    _same_bytes("ScatterND", [("x", _values((3, 4, 5, 16), dt), False), ("i", idx, False),
                              ("u", _values((4, 5, 16), dt), False)], "scatter_nd", threads=threads)
    row = 1000 * 8 // item  # 8000 bytes: 8 rows per 64 KB task
    rows = (1 << 21) // (row * item) + 9
    idx = np.array([[7], [8], [9], [rows - 1], [16], [8], [-rows], [23], [24]])
    _same_bytes("ScatterND", [("x", _values((rows, row), dt), False), ("i", idx, False),
                              ("u", _values((len(idx), row), dt), False)], "scatter_nd", threads=threads)


def test_scatter_nd_names_bad_indices_and_updates():
    nat = runtime.native_module()
    x = np.zeros((4, 5), np.float32)
    with pytest.raises(IndexError, match=r"ScatterND: indices outside the data dims \[4, 5\], index = 5$"):
        nat.scatter_nd(x, np.array([[1, 5]]), np.zeros(1, np.float32), "none")
    with pytest.raises(ValueError, match=r"updates \[2\] do not fit indices \[1, 2\] into data \[4, 5\]"):
        nat.scatter_nd(x, np.array([[1, 1]]), np.zeros(2, np.float32), "none")
    with pytest.raises(ValueError, match="reduction 'sum' unknown"):
        nat.scatter_nd(x, np.array([[1, 1]]), np.zeros(1, np.float32), "sum")


@pytest.mark.parametrize("reduction,dt,elem,width", [("none", np.float32, TensorProto.FLOAT, 8),
                                                     ("none", np.float32, TensorProto.FLOAT, 32),
                                                     ("add", np.int32, TensorProto.INT32, 8)])
def test_scatter_nd_session_matches_cpu_ep_and_runs_on_npu_ep(reduction, dt, elem, width):
    """A KV-cache style row write (float32, none: rows of 32 bytes, and of 128 picked from x or their update) and
    repeated integer accumulation (int32 add, exact), into ORT's buffer, bit for bit."""
    x = _values((4, 6, width), dt)
    idx = np.array([[1, 2], [3, -1]] if reduction == "none" else [[1, 2], [1, 2], [0, 0]], np.int64)
    upd = _values((len(idx), width), dt)
    if dt == np.int32:
        x, upd = x // 4, upd // 4
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="the_op", reduction=reduction)
    model, sess = _session([node], [helper.make_tensor_value_info("x", elem, [4, 6, width]),
                                    helper.make_tensor_value_info("u", elem, [len(idx), width])],
                           [helper.make_tensor_value_info("y", elem, [4, 6, width])], {"i": idx})
    _runs_native_like_cpu_ep(model, sess, {"x": x, "u": upd}, ["the_op"])


# ---- errors through a session ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Gather", "GatherND", "ScatterND"])
def test_out_of_range_index_fails_the_run_naming_node_and_index_then_the_session_goes_on(op):
    """As ORT's CPU EP fails the run (INVALID_ARGUMENT naming the index), the bound step fails it naming the node,
    the op and the index; the next good run is right."""
    table = _values((10, 4), np.float32)
    ins = ["table", "ids"] + (["u"] if op == "ScatterND" else [])
    node = helper.make_node(op, ins, ["y"], name="the_op")
    shape, out = ([2], [2, 4]) if op == "Gather" else ([2, 1], [2, 4] if op == "GatherND" else [10, 4])
    consts = {"table": table} | ({"u": _values((2, 4), np.float32)} if op == "ScatterND" else {})
    model, sess = _session([node], [helper.make_tensor_value_info("ids", TensorProto.INT64, shape)],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], consts)
    good, bad = np.array([1, -2]).reshape(shape), np.array([1, 10]).reshape(shape)
    want = cpu_run(model, {"ids": good})[0]
    for _ in range(2):  # the kernel's run, then the bound step
        assert sess.run(None, {"ids": good})[0].tobytes() == want.tobytes()
    with pytest.raises(Exception, match=rf"node 'the_op' \({op}\) failed.*IndexError: {op}: indices outside.*10$"):
        sess.run(None, {"ids": bad})
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*(out of data bounds|invalid index|invalid indice)"):
        cpu_run(model, {"ids": bad})
    assert sess.run(None, {"ids": good})[0].tobytes() == want.tobytes()
    assert python_steps(sess) == []
