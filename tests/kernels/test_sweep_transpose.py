"""Differential sweep of Transpose (issue 40): ``transpose`` (kernels/native/transpose.cc) against the reference
model (kernels/ops/movement.py: numpy's transpose), byte for byte (elements are moved, never computed: NaN payloads,
-0.0, denormals and float16 kept), for every element size (bool, int8, float16, float32, int64), every permutation
of ranks 1..4 and the default (axes reversed), on both dispatch paths (scalar and the x86 8 x 8 register tiles, 16 x
16 for bytes and halves).

transpose.cc's structure: the permutation is reduced (size-1 axes dropped, neighbours merged), then either one
memcpy, a memcpy per innermost run, or a 2-D transpose walked in strips of 8 columns (a block of up to 256 KiB) or
8 input rows (larger) in 8 x 8 register tiles with element copies at the tails (bytes and halves: strips of 16 in
16 x 16 tiles, 8 x 8 tiles and element copies at the tails), split over threads by rows. So the shapes cross 8 (16)
on both block axes in both walks, size-1 axes sit between the moved ones, and large cases run on one
thread and two with the same bytes. The bound step
is checked against the kernel by ``_sweep``; a session shows NpuEP ran the node as its bound native step."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, assert_session_runs_natively, bit_values, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4042)
DTYPES = [np.bool_, np.int8, np.float16, np.float32, np.int64]
STRIP = 8  # transpose.cc's kStrip and the register tile's side
BYTE_STRIP = 16  # the same for 1- and 2-byte elements


@pytest.fixture(params=host_isas(top="avx2"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _values(shape, dt) -> np.ndarray:
    return bit_values(shape, dt, RNG)


def _same_bytes(x: np.ndarray, perm, threads: int = 1) -> np.ndarray:
    attrs = {} if perm is None else {"perm": list(perm)}
    got, want, calls = native_vs_reference("Transpose", [("x", x, False)], threads=threads, **attrs)
    what = f"Transpose {x.dtype}{x.shape} perm={perm} threads={threads}"
    assert "transpose" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.array(want[0], order="C")  # ascontiguousarray makes 0-d 1-d
    assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert g.flags.c_contiguous and g.tobytes() == w.tobytes(), f"{what}: bytes differ"
    return g


@pytest.mark.parametrize("dt", DTYPES)
def test_every_permutation_of_ranks_1_to_4(capped_isa, dt):
    for shape in [(5,), (3, 9), (9, 17), (1, 9, 1, 10), (2, 3, 4, 5), (3, 1, 8, 16)]:
        x = _values(shape, dt)
        for perm in itertools.permutations(range(len(shape))):
            _same_bytes(x, perm)
        _same_bytes(x, None)  # the default: the axes reversed
    _same_bytes(_values((2, 3, 4), dt), (-1, 0, -2))  # negative axes count from the end


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_block_tails_of_the_2d_transpose(capped_isa, dt):
    """Both block axes below, at and above multiples of the 8 x 8 tile, alone and under an outer axis."""
    for n in around(STRIP, 2 * STRIP):
        for m in around(STRIP, 3 * STRIP):
            _same_bytes(_values((n, m), dt), (1, 0))
        _same_bytes(_values((2, n, 3, 17), dt), (0, 3, 2, 1))
    _same_bytes(_values((515, 517), dt), (1, 0))  # over 256 KiB for every size here: the walk by rows, both tails


@pytest.mark.parametrize("dt", [np.bool_, np.int8, np.float16])
def test_block_tails_of_the_16_tiles(capped_isa, dt):
    """Bytes and halves go in 16 x 16 register tiles (strips of 16): both block axes below, at and above one and two
    or three tiles, alone and under an outer axis; the 8 x 8 tiles and element copies take the tails."""
    for n in around(BYTE_STRIP, 2 * BYTE_STRIP):
        for m in around(BYTE_STRIP, 3 * BYTE_STRIP) + [STRIP, 2 * BYTE_STRIP + STRIP + 3]:
            _same_bytes(_values((n, m), dt), (1, 0))
        _same_bytes(_values((2, n, 3, 49), dt), (0, 3, 2, 1))
    _same_bytes(_values((7, 40), dt), (1, 0))  # fewer rows than a byte tile
    _same_bytes(_values((600, 521), dt), (1, 0))  # over 256 KiB: the walk by rows of 16, both tails


def test_threads_split_strips_with_the_same_bytes():
    x = _values((1029, 1030), np.int8)  # over the one-thread floor (2^20 elements), a strip tail at the end
    assert _same_bytes(x, (1, 0), threads=1).tobytes() == _same_bytes(x, (1, 0), threads=2).tobytes()
    h = _values((1031, 1027), np.float16)  # 16-row strips of halves split across tasks, tails on both axes
    assert _same_bytes(h, (1, 0), threads=1).tobytes() == _same_bytes(h, (1, 0), threads=2).tobytes()
    y = _values((3, 130, 2700), np.float32)  # an outer axis with strips split across tasks
    assert _same_bytes(y, (0, 2, 1), threads=1).tobytes() == _same_bytes(y, (0, 2, 1), threads=2).tobytes()
    z = _values((600, 3, 700), np.float16)  # the innermost axis stays: a memcpy per run, split over tasks
    assert _same_bytes(z, (1, 0, 2), threads=1).tobytes() == _same_bytes(z, (1, 0, 2), threads=2).tobytes()


def test_empty_and_strided_inputs_and_bad_perms():
    _same_bytes(_values((3, 0, 4), np.float32), (2, 1, 0))
    _same_bytes(_values((), np.int64), None)
    nat = runtime.native_module()
    x = _values((6, 10), np.float32)[:, 1:9:2]  # strided: copied first, as numpy reads it
    assert nat.transpose(x, [1, 0]).tobytes() == np.ascontiguousarray(x.T).tobytes()
    with pytest.raises(ValueError, match=r"perm \[0, 0\] is not a permutation of the axes of shape \[6, 10\]"):
        nat.transpose(_values((6, 10), np.float32), [0, 0])
    with pytest.raises(ValueError, match="out must be a writeable C-order float32 array of 60 elements"):
        nat.transpose(_values((6, 10), np.float32), [1, 0], np.empty(59, np.float32))


def test_native_transpose_writes_into_a_given_buffer():
    x = _values((5, 7, 3), np.float32)
    out = np.empty((3, 5, 7), np.float32)
    got = runtime.native_module().transpose(x, [2, 0, 1], out)
    assert np.shares_memory(got, out) and out.tobytes() == np.ascontiguousarray(x.transpose(2, 0, 1)).tobytes()


@pytest.mark.parametrize("case", ["heads_f32", "nchw_to_nhwc_f16", "matrix_i64"])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """An attention head split, a layout change and a plain matrix transpose: the CPU EP's values exactly (moved
    elements), NpuEP ran the node, and ran it as its bound native step (no Python step) after the first call."""
    shape, perm, elem, dt = {"heads_f32": ((1, 77, 8, 64), (0, 2, 1, 3), TensorProto.FLOAT, np.float32),
                             "nchw_to_nhwc_f16": ((1, 24, 20, 19), (0, 2, 3, 1), TensorProto.FLOAT16, np.float16),
                             "matrix_i64": ((130, 67), (1, 0), TensorProto.INT64, np.int64)}[case]
    node = helper.make_node("Transpose", ["x"], ["y"], name="the_op", perm=list(perm))
    out = [shape[p] for p in perm]
    model = make_model([node], [helper.make_tensor_value_info("x", elem, list(shape))],
                       [helper.make_tensor_value_info("y", elem, out)], opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, {"x": _values(shape, dt)}, bits=True)
