"""Differential sweep of the native data movement (kernels/native/movement.cc: Expand's broadcast copy, Tile;
indexing.cc: Concat's concat_into), issues 38 and 40: every broadcast pattern of ranks 1..4 (each axis kept,
broadcast from 1, or given as 1 by the target: numpy's two-way rule), Tile by repeat patterns of ranks 0..4 (0, 1
and the copy counts below), and Concat along every axis of 1..4 parts (empty parts, strided parts), against the
reference model's numpy calls, byte for byte (values are moved, never computed), on both sides of the 64 KiB size
where the copy releases the GIL.

movement.cc's structure: Expand (and Tile, the same copy of x viewed with a 1 before each axis) merges the trailing
axes that match into one memcpy run and replicates a broadcast axis's first block by doubling memcpys (Replicate:
1, 2, 4 ... copies, then the rest), so the copy counts that cross a power of two are the boundaries here (3, 4, 5,
7, 8, 9 copies); a run broadcast along the axis just before it is copied from the input each time instead (a
pattern whose last broadcast axis precedes the merged run; Tile's repeated last axis)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from _sweep import around, kernel_and_bound_step, native_vs_reference
from npu_ep.kernels import runtime

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(3805)
COPIES = [1, 3, 4, 5, 8, 9]  # Replicate's doubling memcpys: just below, at and above powers of two


def _values(shape, dtype) -> np.ndarray:
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    x = (RNG.standard_normal(shape) * 50).astype(dtype)
    if np.dtype(dtype).kind == "f" and x.size:
        x.reshape(-1)[::5] = np.nan  # moved, never compared as values: the bytes must match
        x.reshape(-1)[1::7] = -0.0
    return x


def _same_bytes(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} vs {want.shape}"
    assert got.flags.c_contiguous and got.tobytes() == want.tobytes(), what


def _expand(x: np.ndarray, shape) -> None:
    got = runtime.native_module().expand(x, list(shape))
    want = np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape))), order="C")
    _same_bytes(got, want, f"expand {x.shape} -> {shape}")


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float16, np.int64, np.bool_])
def test_expand_every_broadcast_pattern(dtype):
    """Each axis of a rank-1..4 shape: kept (x and target agree), broadcast from x's 1 (copies from COPIES) or
    kept by the target's 1; the target's rank one more than x's or the same."""
    for rank in range(1, 5):
        for pattern in itertools.product("kbt", repeat=rank):
            dims = RNG.integers(2, 4, rank)
            copies = RNG.choice(COPIES, rank)
            x_shape = [1 if p == "b" else int(d) for p, d in zip(pattern, dims)]
            target = [int(c) if p == "b" else 1 if p == "t" else int(d) for p, d, c in zip(pattern, dims, copies)]
            x = _values(x_shape, dtype)
            _expand(x, target)
            _expand(x, [2] + target)  # a new leading axis


def test_expand_sizes_around_the_gil_release_and_strided_inputs():
    for run in (16383, 16384, 16385):  # float32 runs around 64 KiB
        _expand(_values((1, run), np.float32), (1, 1))
        _expand(_values((1, run), np.float32), (2, run))
    x = _values((4, 6, 10), np.float32)[:, ::2, 1:9]  # a strided view: copied first
    _expand(x, (2, 4, 3, 8))
    _expand(_values((), np.int64), (3, 5))
    _expand(_values((3, 0, 1), np.float32), (3, 0, 4))


def _concat(axis: int, parts) -> None:
    got = runtime.native_module().concat_into(axis, None, 1, *parts)
    _same_bytes(got, np.concatenate(parts, axis=axis), f"concat axis {axis} {[p.shape for p in parts]}")


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.float16, np.int64, np.bool_])
def test_concat_every_axis_and_part_count(dtype):
    for rank in range(1, 5):
        base = [int(d) for d in RNG.integers(1, 4, rank)]
        for axis in range(-rank, rank):
            for n_parts in (1, 2, 3, 4):
                sizes = [int(s) for s in RNG.integers(0, 4, n_parts)]  # empty parts included
                parts = [_values([s if i == axis % rank else d for i, d in enumerate(base)], dtype) for s in sizes]
                _concat(axis, parts)


def test_concat_strided_parts_and_sizes_around_the_gil_release():
    a = _values((3, 10, 8), np.float32)[:, ::2]  # strided: copied first
    _concat(1, [a, _values((3, 2, 8), np.float32), a[:, :0]])
    for n in (8191, 8192, 8193):  # two float32 parts of n: the output around 64 KiB
        _concat(0, [_values((n,), np.float32), _values((n,), np.float32)])
        _concat(-1, [_values((2, n // 2), np.float32), _values((2, n - n // 2), np.float32)])


def test_expand_and_concat_nodes_bind_steps_with_the_kernels_bytes():
    """Through the kernels: the bound native step (a runtime or constant shape, a constant part held in place) gives
    the kernel's bytes (_sweep.kernel_and_bound_step), for broadcasts and concatenations around the copy's runs."""
    for x_shape, shape in (((1, 3, 1, 5), (2, 3, 4, 5)), ((3, 1), (3, 9)), ((4,), (2, 1, 4)), ((2, 1, 3), (2, 0, 3))):
        x = _values(x_shape, np.float32)
        for const_shape in (True, False):
            got, bound = kernel_and_bound_step("Expand", [("x", x, False), ("shape", np.array(shape, np.int64),
                                                                             const_shape)])
            np.testing.assert_array_equal(got[0], np.broadcast_to(x, np.broadcast_shapes(x.shape, shape)))
            assert bound and bound[0].tobytes() == got[0].tobytes()
    for axis in (0, 1, -1):
        a, b = _values((2, 3, 4), np.int8), _values((2, 3, 4), np.int8)
        got, bound = kernel_and_bound_step("Concat", [("a", a, False), ("b", b, True), ("c", a, False)], axis=axis)
        np.testing.assert_array_equal(got[0], np.concatenate([a, b, a], axis=axis))
        assert bound and bound[0].tobytes() == got[0].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float16, np.int64, np.bool_])
def test_tile_every_repeat_pattern_through_the_kernel(dtype):
    """Tile's kernel on the native kernels (``tile`` ran) against the reference's np.tile, byte for byte: each
    axis of a rank-0..4 input repeated 0 times, once or a copy count crossing Replicate's powers of two."""
    for rank in range(0, 5):
        for _ in range(6 if rank else 1):
            x = np.asarray(_values([int(d) for d in RNG.integers(1, 4, rank)], dtype))
            repeats = [int(r) for r in RNG.choice([0, 1] + COPIES, rank)]
            got, want, calls = native_vs_reference("Tile", [("x", x, False), ("r", np.array(repeats, np.int64),
                                                                               True)])
            assert "tile" in calls, f"tile {x.shape} x {repeats}: the native kernel did not run ({calls})"
            _same_bytes(np.asarray(got[0]), np.asarray(want[0]), f"tile {x.shape} x {repeats}")


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int64])
def test_repeated_runs_copied_from_the_input(dtype):
    """A run repeated along the axis before it, under outer axes kept or broadcast: rows of a sequence tiled along
    their last axis (the op table's Tile), runs short and around 64 KiB of output."""
    nat = runtime.native_module()
    for x_shape, repeats in (((1, 128, 384), (1, 1, 2)), ((3, 5, 7), (1, 1, 9)), ((2, 1, 3), (2, 1, 4)),
                             ((1, 4, 8191), (1, 1, 2)), ((1, 4, 8193), (1, 2, 2))):
        x = _values(x_shape, dtype)
        _same_bytes(nat.tile(x, list(repeats)), np.tile(x, repeats), f"tile {x_shape} x {repeats}")
    for x_shape, shape in (((4, 1, 6), (3, 4, 5, 6)), ((2, 1, 1, 3), (2, 4, 3, 3)), ((5, 1), (5, 3))):
        _expand(_values(x_shape, dtype), shape)


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.int64])
def test_runs_across_the_vector_copy_bounds_on_every_isa(isa, dtype):
    """Runs of 256 B to 8 KB are copied in 32-byte vectors with an overlapping last one (row_copy.h): tiled and
    expanded runs just below, at and above those bounds and off the vector width, on every ISA path."""
    nat = runtime.native_module()
    item = np.dtype(dtype).itemsize
    for nbytes in (224, 255, 256, 257, 288, 300, 1536, 8191, 8192, 8193, 8224):
        x = _values((3, max(1, nbytes // item)), dtype)
        _same_bytes(nat.tile(x, [1, 3]), np.tile(x, (1, 3)), f"tile {x.shape} x (1, 3)")
        _expand(x.reshape(3, 1, -1), (3, 2, x.shape[1]))


def test_repeats_and_shape_as_tuple_list_or_array():
    """A bound step passes a tuple of ints, the kernels' Python side a list; numpy integers and arrays go through
    pybind11's caster: the same bytes."""
    nat = runtime.native_module()
    x = _values((2, 1, 3), np.int8)
    for reps in ((2, 3, 1), [2, 3, 1], np.array([2, 3, 1]), [np.int64(2), 3, 1]):
        _same_bytes(nat.tile(x, reps), np.tile(x, (2, 3, 1)), f"tile x {reps!r}")
    for shape in ((4, 2, 5, 3), [4, 2, 5, 3], np.array([4, 2, 5, 3]), [np.int32(4), 2, 5, 3]):
        _same_bytes(nat.expand(x, shape), np.array(np.broadcast_to(x, (4, 2, 5, 3))), f"expand to {shape!r}")


def test_tile_node_binds_a_step_with_the_kernels_bytes_and_sizes_around_the_gil_release():
    for x_shape, repeats in (((2, 3), (3, 1)), ((1, 5, 2), (2, 3, 4)), ((4,), (0,)), ((16383,), (2,))):
        x = _values(x_shape, np.float32)
        for const in (True, False):
            got, bound = kernel_and_bound_step("Tile", [("x", x, False), ("r", np.array(repeats, np.int64), const)])
            _same_bytes(np.asarray(got[0]), np.tile(x, repeats), f"tile {x_shape} x {repeats}")
            assert bound and bound[0].tobytes() == got[0].tobytes()
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"tile: repeats \[2\] do not match input shape \[2, 3\]"):
        nat.tile(_values((2, 3), np.float32), [2])


def test_expand_and_tile_write_into_a_given_buffer():
    """The bound steps pass ORT's output buffer: the kernels fill it in place, and refuse one of another size."""
    nat = runtime.native_module()
    x = _values((3, 1, 4), np.float16)
    out = np.empty((2, 3, 5, 4), np.float16)
    assert np.shares_memory(nat.expand(x, [2, 3, 5, 4], out), out)
    assert out.tobytes() == np.array(np.broadcast_to(x, (2, 3, 5, 4)), order="C").tobytes()
    tiled = np.empty((6, 2, 8), np.float16)
    assert np.shares_memory(nat.tile(x, [2, 2, 2], tiled), tiled) and tiled.tobytes() == np.tile(x, (2, 2, 2)).tobytes()
    with pytest.raises(ValueError, match="expand: out must be a writeable C-order float16 array of 120 elements"):
        nat.expand(x, [2, 3, 5, 4], np.empty(119, np.float16))


@pytest.mark.parametrize("dtype", [np.int8, np.float32, np.int64])
def test_expand_from_16_mb_streams_byte_for_byte(isa, dtype):
    """From 16 MB of output (movement.cc's kStreamBytes) and runs of 256 bytes, Expand writes with non-temporal
    stores from the output's first 32-byte boundary, memcpy before and after: into ORT-like buffers at every offset
    of the 32 bytes, runs off the 128-byte step, one long run in 64 KiB parts, just under 16 MB (memcpy), one and two
    threads, numpy's bytes."""
    nat = runtime.native_module()
    item = np.dtype(dtype).itemsize
    big = (1 << 24) // item
    expands = [((1, big // 2 + 37), (2, big // 2 + 37)), ((3, 1, big // 48 + 5), (3, 16, big // 48 + 5)),
               ((1, big // 2 - 1), (2, big // 2 - 1)), ((4, 1, 255 // item + 1), (4, big // 1000, 255 // item + 1))]
    for x_shape, shape in expands:
        x = _values(x_shape, dtype)
        want = np.array(np.broadcast_to(x, shape), order="C")
        n = want.size
        buf = np.empty(n + 64, dtype)
        lead = (-buf.ctypes.data % 32) // item
        for threads in (1, 2):
            for off in sorted({0, 1, 32 // item - 1}):
                out = buf[lead + off:lead + off + n].reshape(shape)
                out[...] = 0
                what = f"expand {x_shape} -> {shape} threads={threads} offset {off * item} B"
                _same_bytes(nat.expand(x, list(shape), out, threads), want, what)


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.int64])
def test_expand_and_tile_over_threads_from_1_mb_byte_for_byte(dtype):
    """From 1 MB of output and runs of 256 bytes the copy runs on the threads: runs in 64 KiB tasks (runs around
    256 bytes and 64 KiB) or one long run in parts (the op table's Expand [1, 1500, 1536] -> [2, 1500, 1536]), under
    kept and broadcast outer axes; shorter runs stay on one thread. 1, 2 and 3 threads give numpy's bytes, around the
    1 MB threshold too."""
    nat = runtime.native_module()
    item = np.dtype(dtype).itemsize
    mb = (1 << 20) // item
    tiles = [((1, 4, mb // 8), (1, 1, 2)), ((1, 4, mb // 8), (1, 1, 2)), ((3, 5, 7), (2, 1, mb // 105 + 1)),
             ((1, 2, (1 << 16) // item + 1), (1, 1, 5)), ((1, 2, (1 << 16) // item - 1), (1, 3, 2)),
             ((mb // 2 - 1,), (2,)), ((mb // 2 + 1,), (2,)), ((1, 7, 3), (mb // 21 + 1, 1, 1))]
    tiles += [((1, (1 << 20) // 512 + 1, w), (1, 1, 2)) for w in around(256 // item)]
    expands = [((1, 3, mb // 6), (2, 3, mb // 6)), ((4, 1, mb // 64), (4, 17, mb // 64)),
               ((1, mb // 4 + 3), (5, mb // 4 + 3)), ((7, 1), (7, mb // 7 + 1)), ((mb // 2 + 1,), (2, mb // 2 + 1))]
    for threads in (1, 2, 3):
        for x_shape, repeats in tiles:
            x = _values(x_shape, dtype)
            _same_bytes(nat.tile(x, list(repeats), None, threads), np.tile(x, repeats),
                        f"tile {x_shape} x {repeats} threads={threads}")
        for x_shape, shape in expands:
            x = _values(x_shape, dtype)
            want = np.array(np.broadcast_to(x, shape), order="C")
            what = f"expand {x_shape} -> {shape} threads={threads}"
            _same_bytes(nat.expand(x, list(shape), None, threads), want, what)
    x = _values((1, 300, 768), dtype)
    got, want, calls = native_vs_reference("Tile", [("x", x, False), ("r", np.array([1, 1, 3], np.int64), True)],
                                           threads=2)
    assert "tile" in calls
    _same_bytes(np.asarray(got[0]), np.asarray(want[0]), "tile node on 2 threads")
