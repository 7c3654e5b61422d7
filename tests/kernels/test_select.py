"""ArgMax/ArgMin, TopK and CumSum vs ORT CPU through the kernel and NpuEP sessions on both targets: keepdims,
select_last_index with ties, negative axes, TopK largest/smallest with ties, sorted=0 (order left open by ONNX:
compared as sets), runtime K, CumSum exclusive/reverse. Indices exact; CumSum float32 1e-5."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import feeds_of, make_model, rand, run_npu, run_ort
from npu_testing import assignment, npu_session

I64 = np.int64
BOTH = ("npu-ref", "npu-edge")


def _ties(shape, dtype, seed=0):
    """Values from a small set, so every row has ties."""
    return rand(shape, dtype, seed=seed, lo=-2, hi=2).round().astype(dtype)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_arg_reductions_with_ties(op, axis, keepdims, last, dtype):
    x = _ties((4, 5, 6), dtype, seed=1) if dtype != np.uint8 else rand((4, 5, 6), dtype, seed=1, lo=0, hi=0.3)
    check_on_ep(op, [("x", x, False)], [("y", I64)], {"axis": axis, "keepdims": keepdims, "select_last_index": last},
                targets=BOTH)


def _with_nan(shape, seed):
    """Small integers with NaN (and some +-inf) at random positions: first, last and middle of rows, whole rows."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 3, size=shape).astype(np.float32)
    x[rng.random(shape) < rng.uniform(0.1, 0.5)] = np.nan
    x[rng.random(shape) < 0.1] = -np.inf
    x[rng.random(shape) < 0.1] = np.inf
    return x


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("shape, axis", [((2, 5), 1), ((5, 4), 0), ((3, 4, 6), 1), ((3, 4, 6), -1), ((37,), 0),
                                         ((1, 9), -1), ((9, 1), 0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arg_reductions_over_nan_match_ort(op, last, keepdims, shape, axis, seed):
    """NaN in the reduced rows: the index ORT's CPU kernel gives (a first-element NaN wins its row, a later NaN is
    passed over; a rank-1 input without select_last_index returns its first NaN), where numpy's argmax returns
    the first NaN everywhere (issue 38 item 5); float16 gives the same indices."""
    x = _with_nan(shape, seed)
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
    want = check_on_ep(op, [("x", x, False)], [("y", I64)], attrs, targets=BOTH)
    want16 = check_on_ep(op, [("x", x.astype(np.float16), False)], [("y", I64)], attrs)
    np.testing.assert_array_equal(want16[0], want[0])


def test_argmax_over_nan_issue_example():
    x = np.array([[1, np.nan, 3, 7, 2], [np.nan, 2, 9, 1, 0]], np.float32)
    (want,) = check_on_ep("ArgMax", [("x", x, False)], [("y", I64)], {"axis": 1, "keepdims": 0})
    assert want.tolist() == [3, 0] and np.argmax(x, axis=1).tolist() == [1, 0]


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8])
def test_topk_sorted_with_ties(largest, axis, k, dtype):
    x = _ties((6, 7, 8), dtype, seed=2) if dtype != np.uint8 else rand((6, 7, 8), dtype, seed=2, lo=0, hi=0.5)
    check_on_ep("TopK", [("x", x, False), ("k", np.array([k], I64), True)], [("v", dtype), ("i", I64)],
                {"largest": largest, "axis": axis, "sorted": 1}, targets=BOTH)


def test_topk_runtime_k_and_k_equal_to_axis_length():
    x = rand((3, 9), np.float32, seed=3)
    for k in (0, 9):
        check_on_ep("TopK", [("x", x, False), ("k", np.array([k], I64), False)], [("v", np.float32), ("i", I64)])


def test_topk_writes_into_the_buffers_it_is_given():
    """A bound TopK step hands the kernel ORT's buffers for the partition's outputs: it writes both there and returns
    them as they are (no arrays made, nothing for the bridge to copy); a buffer of another size or dtype raises."""
    from npu_ep.kernels.runtime import native_module

    nat = native_module()
    x = rand((3, 9), np.float32, seed=5)
    v, i = np.empty((3, 4), np.float32), np.empty((3, 4), I64)
    got = nat.topk(x, 3, 9, 1, 4, True, 1, v, i)
    assert got[0] is v and got[1] is i
    want = nat.topk(x, 3, 9, 1, 4, True, 1)
    np.testing.assert_array_equal(v, want[0].reshape(3, 4))
    np.testing.assert_array_equal(i, want[1].reshape(3, 4))
    with pytest.raises(ValueError, match="indices_out must be a writeable C-order int64 array of 12 elements"):
        nat.topk(x, 3, 9, 1, 4, True, 1, v, np.empty((3, 4), np.int32))
    with pytest.raises(ValueError, match="values_out must be"):
        nat.topk(x, 3, 9, 1, 4, True, 1, np.empty((3, 5), np.float32), i)


def test_a_one_node_topk_session_computes_both_outputs_in_place_with_the_cpu_eps_results():
    inputs = [("x", rand((2, 16), np.float32, seed=6), False), ("k", np.array([5], I64), True)]
    model = make_model("TopK", inputs, [("v", np.float32), ("i", I64)], {"largest": 1, "sorted": 1})
    want = run_ort(model, feeds_of(inputs))
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for _ in range(3):  # the first run binds, the others write into ORT's buffers
        got = sess.run(None, feeds_of(inputs))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_unsorted_returns_the_same_set(largest):
    """sorted=0: ONNX leaves the order open (ORT returns heap order); the selected (value, index) pairs match."""
    x = rand((5, 40), np.float32, seed=4)
    inputs = [("x", x, False), ("k", np.array([7], I64), True)]
    model = make_model("TopK", inputs, [("v", np.float32), ("i", I64)], {"largest": largest, "sorted": 0})
    want = run_ort(model, feeds_of(inputs))
    sess = npu_session(model, {"target": "npu-ref"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got in (sess.run(None, feeds_of(inputs)), run_npu(model, feeds_of(inputs))[0]):
        for row in range(x.shape[0]):
            assert sorted(zip(got[1][row], got[0][row])) == sorted(zip(want[1][row], want[0][row]))


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_cumsum_exclusive_reverse(exclusive, reverse, axis, dtype):
    x = rand((3, 4, 9), dtype, seed=5)
    check_on_ep("CumSum", [("x", x, False), ("a", np.array(axis, I64), True)], [("y", dtype)],
                {"exclusive": exclusive, "reverse": reverse}, targets=BOTH)


def test_cumsum_runtime_axis_int32_and_float16():
    x = rand((6, 5), np.float16, seed=6, lo=0, hi=1)
    check_on_ep("CumSum", [("x", x, False), ("a", np.array(0, np.int32), False)], [("y", np.float16)])
