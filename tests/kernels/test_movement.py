"""Data-movement kernels vs ORT CPU (bit-exact: these ops only move bytes).

Reshape (0/-1, allowzero), Transpose, Squeeze/Unsqueeze (axes attribute and input), Expand, Concat,
Split (input sizes, equal parts, opset-18 num_outputs with a short tail), Slice (negative and clamped bounds,
negative steps, axes subsets, runtime bounds), Gather (negative indices, scalar indices, constant table).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npu_ep.kernels.ops.indexing import onnx_slice
from _vector_ortref import check_against_ort, make_model, run_npu, rand
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from npu_ep.ep.onnx_graph import nodes_from_model

I64 = np.int64
DTYPES = [np.float32, np.float16, np.int64, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,new", [((2, 3, 4), (0, -1)), ((6, 4), (3, 2, -1)), ((1, 5), (5,))])
def test_reshape(dtype, shape, new):
    check_against_ort("Reshape", [("x", rand(shape, dtype), False), ("s", np.array(new, I64), True)], [("y", dtype)])


def test_reshape_runtime_shape_and_allowzero():
    x = rand((0, 4), np.float32)
    check_against_ort("Reshape", [("x", x, False), ("s", np.array([4, 0], I64), False)], [("y", np.float32)],
                      {"allowzero": 1})
    x = rand((2, 3, 4), np.float32)
    check_against_ort("Reshape", [("x", x, False), ("s", np.array([0, 12], I64), False)], [("y", np.float32)])


@pytest.mark.parametrize("perm", [None, [0, 2, 1, 3], [3, 1, 0, 2]])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_transpose(perm, dtype):
    attrs = {"perm": perm} if perm else {}
    check_against_ort("Transpose", [("x", rand((2, 3, 5, 7), dtype), False)], [("y", dtype)], attrs)


@pytest.mark.parametrize("axes", [None, [1], [-1, 1]])
def test_squeeze_axes_input(axes):
    x = rand((3, 1, 4, 1), np.float32)
    inputs = [("x", x, False)] + ([("a", np.array(axes, I64), True)] if axes else [])
    check_against_ort("Squeeze", inputs, [("y", np.float32)])


def test_squeeze_and_unsqueeze_axes_attribute_opset11():
    check_against_ort("Squeeze", [("x", rand((1, 4, 1), np.float32), False)], [("y", np.float32)], {"axes": [0]},
                      opset=11)
    check_against_ort("Unsqueeze", [("x", rand((4, 3), np.float32), False)], [("y", np.float32)],
                      {"axes": [0, -1]}, opset=11)


@pytest.mark.parametrize("axes", [[0], [-1], [0, 3], [1, -1]])
def test_unsqueeze_axes_input(axes):
    check_against_ort("Unsqueeze", [("x", rand((4, 3), np.float32), False), ("a", np.array(axes, I64), True)],
                      [("y", np.float32)])


def _second_call(op, inputs, x2, attrs=None, opset=21):
    """Run once (through the ORT comparison), then the same Prepared (its kernel_cache warm) on ``x2``; returns that
    output."""
    model = make_model(op, inputs, [("y", x2.dtype)], attrs, opset=opset)
    feeds = {n: v for n, v, const in inputs if not const}
    _, prepared, _ = run_npu(model, feeds)
    return kernel_for("", op).run(prepared, [x2] + [None] * (len(inputs) - 1))[0]


def test_squeeze_static_axes_reused_across_shapes_and_checked_every_call():
    x = rand((3, 1, 4, 1), np.float32)
    inputs = [("x", x, False), ("a", np.array([-1, 1], I64), True)]
    check_against_ort("Squeeze", inputs, [("y", np.float32)])
    assert _second_call("Squeeze", inputs, np.zeros((2, 1, 5, 1), np.float32)).shape == (2, 5)
    assert _second_call("Squeeze", inputs, np.zeros((5, 1, 1), np.float32)).shape == (5,)
    with pytest.raises(ValueError, match=r"Squeeze: dimension\(s\) \[3\] of shape \(2, 1, 5, 3\) are not 1"):
        _second_call("Squeeze", inputs, np.zeros((2, 1, 5, 3), np.float32))


def test_squeeze_unsqueeze_runtime_axes():
    x = rand((1, 4, 1), np.float32)
    check_against_ort("Squeeze", [("x", x, False), ("a", np.array([0, 2], I64), False)], [("y", np.float32)])
    check_against_ort("Unsqueeze", [("x", x, False), ("a", np.array([-1, 0], I64), False)], [("y", np.float32)])


def test_unsqueeze_static_axes_reused_across_ranks_and_repeated_axis_raises():
    inputs = [("x", rand((4, 3), np.float32), False), ("a", np.array([0, -1], I64), True)]
    check_against_ort("Unsqueeze", inputs, [("y", np.float32)])
    assert _second_call("Unsqueeze", inputs, np.array(5, I64)).shape == (1, 1)
    assert _second_call("Unsqueeze", inputs, np.zeros((2, 3, 4), np.float32)).shape == (1, 2, 3, 4, 1)
    with pytest.raises(ValueError, match="repeated axis"):
        _second_call("Unsqueeze", [inputs[0], ("a", np.array([0, -3], I64), True)], np.zeros(4, np.float32))


def test_reshape_static_shape_with_zero_copies_each_calls_dim():
    inputs = [("x", rand((2, 3, 4), np.float32), False), ("s", np.array([0, -1], I64), True)]
    check_against_ort("Reshape", inputs, [("y", np.float32)])
    assert _second_call("Reshape", inputs, np.zeros((5, 3, 4), np.float32)).shape == (5, 12)


@pytest.mark.parametrize("shape,target", [((3, 1), (2, 1, 6)), ((1, 4), (3, 1)), ((5,), (1,)), ((2, 1, 3), (2, 4, 3))])
def test_expand_bidirectional(shape, target):
    check_against_ort("Expand", [("x", rand(shape, np.float32), False), ("s", np.array(target, I64), True)],
                      [("y", np.float32)])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_concat_with_constant_part(axis, dtype):
    a = rand((2, 3, 4), dtype, seed=1)
    b = rand((2, 3, 4), dtype, seed=2)
    c = rand((2, 3, 4), dtype, seed=3)
    check_against_ort("Concat", [("a", a, False), ("b", b, True), ("c", c, False)], [("y", dtype)], {"axis": axis})


@pytest.mark.parametrize("split,n", [([2, 3, 5], 3), ([10], 1), (None, 2)])
def test_split_sizes_input(split, n):
    x = rand((4, 10), np.float32)
    inputs = [("x", x, False)] + ([("s", np.array(split, I64), True)] if split else [])
    check_against_ort("Split", inputs, [(f"y{i}", np.float32) for i in range(n)], {"axis": 1}, opset=13)


@pytest.mark.parametrize("dim,n", [(10, 3), (7, 4), (8, 4)])
def test_split_num_outputs_opset18(dim, n):
    x = rand((dim, 3), np.float32)
    check_against_ort("Split", [("x", x, False)], [(f"y{i}", np.float32) for i in range(n)],
                      {"axis": 0, "num_outputs": n}, opset=18)


def test_split_attribute_opset11():
    check_against_ort("Split", [("x", rand((3, 9), np.float32), False)], [("a", np.float32), ("b", np.float32)],
                      {"axis": -1, "split": [4, 5]}, opset=11)


BIG = np.iinfo(np.int64).max
SLICES = [
    ([1], [3], [0], [1]),
    ([-3], [BIG], [1], None),
    ([0, 1], [-1, 100], [0, 2], [2, 3]),
    ([-1], [-BIG], [2], [-1]),
    ([5], [0], [0], [-2]),
    ([-100], [-200], [1], [-1]),
    ([100], [-100], [0], [-1]),
    ([2], [1], [2], [1]),
    ([0], [3], None, None),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice_matches_onnx_clamping(starts, ends, axes, steps):
    x = rand((6, 5, 7), np.float32)
    inputs = [("x", x, False), ("st", np.array(starts, I64), True), ("en", np.array(ends, I64), True)]
    inputs.append(("ax", np.array(axes, I64), True) if axes is not None else None)
    if steps is not None:
        inputs.append(("sp", np.array(steps, I64), True))
    if steps is None:
        inputs = [i for i in inputs if i is not None]
    check_against_ort("Slice", inputs, [("y", np.float32)])


def test_slice_runtime_bounds():
    x = rand((6, 5, 7), np.int64)
    check_against_ort("Slice", [("x", x, False), ("st", np.array([-2, 4], I64), False),
                                ("en", np.array([-7, 0], I64), False), ("ax", np.array([2, 1], I64), False),
                                ("sp", np.array([-2, -1], I64), False)], [("y", np.int64)])


def test_slice_with_constant_bounds_recomputes_per_input_shape():
    """The index made once per input shape (constant bounds) is not reused for another shape; runtime bounds are read
    per call."""
    from onnx.reference import ReferenceEvaluator

    consts = [("st", np.array([-3, 1], I64), True), ("en", np.array([100, -1], I64), True)]
    model = make_model("Slice", [("x", rand((6, 5), np.float32), False), *consts], [("y", np.float32)])
    (node,) = nodes_from_model(model)
    kernel = kernel_for("", "Slice")
    prepared = kernel.prepare(node, Target.load("npu-ref"))
    for shape in [(6, 5), (4, 9), (6, 5), (2, 3)]:
        x = rand(shape, np.float32, seed=sum(shape))
        (want,) = ReferenceEvaluator(model).run(None, {"x": x, "st": consts[0][1], "en": consts[1][1]})
        (got,) = kernel.run(prepared, [x, None, None])
        np.testing.assert_array_equal(got, want)
    runtime = make_model("Slice", [("x", rand((6, 5), np.float32), False), ("st", np.array([0], I64), False),
                                   ("en", np.array([2], I64), False)], [("y", np.float32)])
    (node,) = nodes_from_model(runtime)
    prepared = kernel.prepare(node, Target.load("npu-ref"))
    x = rand((6, 5), np.float32)
    for end in (2, 4, 1):
        (got,) = kernel.run(prepared, [x, np.array([0], I64), np.array([end], I64)])
        np.testing.assert_array_equal(got, x[:end])


def test_slice_legacy_attributes_opset9():
    check_against_ort("Slice", [("x", rand((4, 6), np.float32), False)], [("y", np.float32)],
                      {"starts": [1, -4], "ends": [3, 1000], "axes": [0, 1]}, opset=9)


def test_onnx_slice_differs_from_python_on_clamped_negative_step():
    """Python would give [] for x[-10:-20:-1]; ONNX clamps start to 0 and yields [x0]."""
    idx = onnx_slice((5,), [-10], [-20], [0], [-1])
    assert np.arange(5)[idx].tolist() == [0]


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("indices", [np.array([0, -1, 2, -3], I64), np.array([[1, 0], [-2, 2]], I64),
                                     np.array(-1, I64)])
def test_gather_negative_and_scalar_indices(axis, indices):
    x = rand((4, 3, 5), np.float32)
    check_against_ort("Gather", [("x", x, False), ("i", indices, False)], [("y", np.float32)], {"axis": axis})


def test_gather_constant_embedding_table_int32_indices():
    table = rand((50, 16), np.float16)
    ids = np.array([[3, 49, 0], [7, -50, 1]], np.int32)
    check_against_ort("Gather", [("table", table, True), ("ids", ids, False)], [("y", np.float16)])


@pytest.mark.parametrize("ids", [[4], [-5], [[0, 4]], [1, -5, 0], [[[-5]]]])
def test_gather_out_of_range_raises(ids):
    """Both the single-index check (a Python int) and the min/max check of many indices."""
    x = rand((4, 3), np.float32)
    ids = np.array(ids, I64)
    model = make_model("Gather", [("x", x, False), ("i", ids, False)], [("y", np.float32)])
    with pytest.raises(IndexError, match=r"Gather: indices outside \[-4, 4\) on axis 0"):
        run_npu(model, {"x": x, "i": ids})


@pytest.mark.parametrize("token", [0, 7, 999, -1, -1000])
@pytest.mark.parametrize("dtype", [I64, np.int32])
def test_gather_one_token_from_constant_embedding(token, dtype):
    """The decode step's embedding lookup: one id of shape [1, 1] into a constant table."""
    table = rand((1000, 32), np.float32, seed=3)
    ids = np.array([[token]], dtype)
    check_against_ort("Gather", [("table", table, True), ("ids", ids, False)], [("y", np.float32)])


def test_gather_empty_indices():
    x = rand((4, 3), np.float32)
    check_against_ort("Gather", [("x", x, False), ("i", np.zeros((0, 2), I64), False)], [("y", np.float32)])


def test_cost_views_are_free_and_gather_moves_only_selected_rows():
    x = rand((1000, 64), np.float32)
    _, _, reshape = run_npu(make_model("Reshape", [("x", x, False), ("s", np.array([64, 1000], I64), True)],
                                       [("y", np.float32)]), {"x": x})
    assert reshape.cycles == 0 and reshape.dma_bytes == 0
    ids = np.array([1, 5, 7], I64)
    _, _, gather = run_npu(make_model("Gather", [("x", x, True), ("i", ids, False)], [("y", np.float32)]), {"i": ids})
    assert gather.dma_bytes == 2 * 3 * 64 * 4 + ids.nbytes


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 5}])
def test_shape_with_start_and_end(attrs):
    check_against_ort("Shape", [("x", rand((2, 3, 4), np.float32), False)], [("y", I64)], attrs, opset=15)


# --- Identity, Flatten, Tile, GatherND, ScatterND (issue 13), also through NpuEP sessions on both targets -------
from _ep_single import check_on_ep
from npu_testing import assignment, npu_session

BOTH = ("npu-ref", "npu-edge")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_identity(dtype):
    # the kernel against ORT; a session whose only node is an Identity is left to ORT (capability: nothing to gain)
    check_against_ort("Identity", [("x", rand((3, 4), dtype), False)], [("y", dtype)])
    x = rand((3, 4), dtype)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["i"], name="identity"),
         helper.make_node("Reshape", ["i", "shape"], ["y"], name="reshape")], "g",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [3, 4])],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [4, 3])],
        [numpy_helper.from_array(np.array([4, 3], I64), "shape")]), opset_imports=[helper.make_opsetid("", 21)],
        ir_version=10)
    for target in BOTH:
        sess = npu_session(model, {"target": target}, cpu=False)
        assert set(assignment(sess).values()) == {"NpuEP"}, target  # the Identity runs inside a partition
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.reshape(4, 3))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten_axes(axis):
    check_on_ep("Flatten", [("x", rand((2, 3, 4), np.float32), False)], [("y", np.float32)], {"axis": axis},
                targets=BOTH)


@pytest.mark.parametrize("repeats,const", [([2, 1, 3], True), ([1, 1, 1], True), ([3, 2, 1], False),
                                           ([1, 0, 2], True)])
def test_tile(repeats, const):
    check_on_ep("Tile", [("x", rand((2, 3, 4), np.float16), False), ("r", np.array(repeats, I64), const)],
                [("y", np.float16)], targets=BOTH if const else ("npu-ref",))


@pytest.mark.parametrize("xs,idx,b", [((4, 5), [[1, 2], [-1, 0]], 0), ((4, 5, 3), [[1], [3]], 0),
                                      ((2, 4, 5), [[[1, 2]], [[3, -5]]], 1),
                                      ((2, 3, 4, 5), [[[1], [2], [-1]], [[0], [3], [2]]], 2),
                                      ((4, 5), [[[0, 0], [3, 4]], [[1, 1], [2, 2]]], 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_gather_nd_batch_dims_and_negative_indices(xs, idx, b, dtype):
    check_on_ep("GatherND", [("x", rand(xs, dtype), False), ("i", np.array(idx, I64), False)], [("y", dtype)],
                {"batch_dims": b}, targets=BOTH)


def test_gather_nd_out_of_range_raises():
    x, i = rand((4, 5), np.float32), np.array([[4, 0]], I64)
    model = make_model("GatherND", [("x", x, False), ("i", i, False)], [("y", np.float32)])
    with pytest.raises(IndexError, match="GatherND: indices outside"):
        run_npu(model, {"x": x, "i": i})


@pytest.mark.parametrize("reduction,case", [(r, c) for r in ("none", "add", "mul", "max", "min")
                                             for c in ("rows", "elements", "duplicates")
                                             if (r, c) != ("none", "duplicates")])  # ONNX: undefined
def test_scatter_nd_reductions(reduction, case):
    x = rand((4, 5, 3), np.float32, seed=1)
    if case == "rows":
        idx, upd = np.array([[2], [0]], I64), rand((2, 5, 3), np.float32, seed=2)
    elif case == "elements":
        idx, upd = np.array([[1, 2, 0], [3, -1, 2]], I64), rand((2,), np.float32, seed=3)
    else:
        idx, upd = np.array([[1, 2], [1, 2], [0, 4]], I64), rand((3, 3), np.float32, seed=4)
    check_on_ep("ScatterND", [("x", x, False), ("i", idx, True), ("u", upd, False)], [("y", np.float32)],
                {"reduction": reduction}, opset=18, targets=BOTH)


@pytest.mark.parametrize("shape", [(2, 3, 4), (0, 5), ()])
def test_size(shape):
    check_on_ep("Size", [("x", rand(shape, np.float32), False)], [("y", I64)], targets=BOTH)
