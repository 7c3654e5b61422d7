"""Differential sweep of the data-movement kernels' dims at every rank they hold in place (kernels/native/small_dims.h:
dims, strides, permutations and index lists are inline arrays of numpy's 64 axes, Tile's view of x twice that):
Transpose, Tile, Expand, Pad, Concat, Split, Slice and GatherND at ranks 1..6, 31..33 and 63..64 against the
reference model's numpy calls, byte for byte (values are moved, never computed), with NaN, inf, -0 and denormals in
the float data, empty axes and negative axes; a list longer than numpy's 64 axes is refused with a ValueError."""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(6464)
RANKS = [1, 2, 3, 4, 5, 6, 31, 32, 33, 63, 64]
DTYPES = [np.float32, np.float16, np.int64, np.int8, np.bool_]


def _values(shape, dtype) -> np.ndarray:
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    x = (RNG.standard_normal(shape) * 50).astype(dtype)
    if np.dtype(dtype).kind == "f" and x.size:
        special = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).smallest_subnormal], dtype)
        flat = x.reshape(-1)
        flat[: min(flat.size, special.size)] = special[: flat.size]
    return x


def _shape(rank: int) -> list[int]:
    """A few axes of 2-3 among 1s (a rank-64 array of 2s would not fit in memory), size-1 axes where merging
    happens."""
    shape = [1] * rank
    for a in RNG.choice(rank, min(rank, 4), replace=False):
        shape[int(a)] = int(RNG.integers(2, 4))
    return shape


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = np.ascontiguousarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} vs {want.shape}"
    assert got.flags.c_contiguous and got.tobytes() == want.tobytes(), what


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", RANKS)
def test_every_movement_kernel_at_every_held_rank(rank, dtype):
    nat = runtime.native_module()
    shape = _shape(rank)
    x = _values(shape, dtype)
    perm = [int(a) for a in RNG.permutation(rank)]
    _same(nat.transpose(x, tuple(perm), None, 1), np.transpose(x, perm), f"transpose {shape} {perm}")
    _same(nat.transpose(x, tuple(a - rank for a in perm), None, 1), np.transpose(x, perm), "negative perm")
    _same(nat.transpose(x, None, None, 1), np.transpose(x), "reversed")
    reps = [1] * rank
    reps[int(RNG.integers(rank))] = 3
    _same(nat.tile(x, tuple(reps), None, 1), np.tile(x, reps), f"tile {shape} {reps}")
    target = [1] * rank  # the target's 1s keep x's axes; one of x's 1s broadcast to 2
    ones = [a for a, d in enumerate(shape) if d == 1]
    if ones:
        target[ones[0]] = 2
    want = np.broadcast_to(x, [max(d, t) for d, t in zip(shape, target)])
    _same(nat.expand(x, tuple(target), None, 1), want, f"expand {shape} {target}")
    if rank < 32:  # numpy's broadcast takes 32 axes at most
        _same(nat.expand(x, (2,) + tuple(target), None, 1), np.broadcast_to(x, (2,) + want.shape), "a new axis")
    begins, ends = [0] * rank, [0] * rank
    a, b = int(RNG.integers(rank)), int(RNG.integers(rank))
    begins[a], ends[b] = 2, 1
    pads = list(zip(begins, ends))
    _same(nat.pad(x, tuple(begins), tuple(ends), "constant", None, None, 1), np.pad(x, pads), f"pad {shape} {pads}")
    _same(nat.pad(x, tuple(begins), tuple(ends), "edge", None, None, 1), np.pad(x, pads, mode="edge"), "edge pad")
    for axis in (0, -1, rank // 2):
        _same(nat.concat_into(axis, None, 1, x, x[:0] if axis == 0 else x), np.concatenate(
            [x, x[:0] if axis == 0 else x], axis=axis), f"concat {shape} axis {axis}")
        n = shape[axis]
        sizes = [n - 1, 1, 0] if n > 1 else [n, 0]
        parts = nat.split(x, axis, sizes, 1)
        want = np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)
        for got_part, want_part in zip(parts, want):
            _same(got_part, want_part, f"split {shape} axis {axis} {sizes}")
    starts = [int(RNG.integers(d)) for d in shape]
    dims = [d - s for d, s in zip(shape, starts)]
    index = tuple(slice(s, s + d) for s, d in zip(starts, dims))
    _same(nat.slice_copy(x, starts, [1] * rank, dims, None, 1), x[index], f"slice {shape} from {starts}")
    q = min(rank, 2)
    idx = np.stack([RNG.integers(-d, d, 5) for d in shape[:q]], axis=-1).astype(np.int64)
    want = x[tuple(np.where(idx[:, k] < 0, idx[:, k] + shape[k], idx[:, k]) for k in range(q))]
    _same(nat.gather_nd(x, idx, 0, None, 1), want, f"gather_nd {shape} {q}-tuples")


def test_empty_axes_at_high_rank():
    nat = runtime.native_module()
    shape = [1] * 40
    shape[3], shape[20] = 0, 3
    x = _values(shape, np.float32)
    _same(nat.transpose(x, None, None, 1), np.transpose(x), "empty transpose")
    reps = [1] * 40
    reps[20] = 2
    _same(nat.tile(x, tuple(reps), None, 1), np.tile(x, reps), "empty tile")
    _same(nat.concat_into(3, None, 1, x, x), np.concatenate([x, x], 3), "empty concat")


def test_lists_longer_than_numpys_axes_are_refused():
    nat = runtime.native_module()
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError):
        nat.expand(x, tuple([1] * 65), None, 1)
    with pytest.raises(ValueError):
        nat.tile(x, tuple([1] * 65), None, 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat_and_split_of_more_parts_than_held_in_place(dtype):
    """Concat and Split hold up to 16 parts' runs in place, more on the heap: 1, 16, 17 and 40 parts, rows cut in
    one pass (runs of 32 bytes or more) or part by part (shorter runs), along the last and a middle axis."""
    nat = runtime.native_module()
    for n_parts in (1, 16, 17, 40):
        for width in (1, 40):  # elements per part along the axis: short runs, then runs of 32 bytes or more
            for axis in (-1, 1):
                parts = [_values([width if i == axis % 3 else d for i, d in enumerate((3, 2, 5))], dtype)
                         for _ in range(n_parts)]
                whole = np.concatenate(parts, axis=axis)
                _same(nat.concat_into(axis, None, 1, *parts), whole, f"concat {n_parts} parts axis {axis}")
                sizes = [p.shape[axis] for p in parts]
                for got, want in zip(nat.split(whole, axis % 3, sizes, 1), parts):
                    _same(got, want, f"split {n_parts} parts axis {axis}")
