"""Differential sweep of Pad (issue 40): ``pad`` (kernels/native/pad.cc) against the reference model
(kernels/ops/pad.py: crop, then np.pad-equivalent copies), byte for byte (elements are moved, never computed: NaN
payloads, -0.0, denormals and float16 kept), for every element size (bool, int8, float16, float32, int64), every
mode (constant, reflect, edge, wrap), ranks 1..4 with positive, zero and negative (crop) pads on each axis, opset-18
``axes`` (negative too) and the constant value as a constant or a runtime input.

pad.cc's structure: unpadded leading axes become one axis split over threads; each axis writes its centre slabs,
then each pad slab as one memcpy of the centre slab it mirrors or a value fill (doubling memcpys); the innermost
axis' pads are element copies. So the cases pad the innermost axis alone, an outer axis alone and every axis, wrap
pads longer than the axis (periodic), reflect pads of one less than the axis, and a large case splits over threads
with the same bytes. The bound step is checked against the kernel by ``_sweep``; sessions show NpuEP ran the node as
its bound native step with the CPU EP's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import bit_values, kernel_and_bound_step, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4043)
DTYPES = [np.bool_, np.int8, np.float16, np.float32, np.int64]
MODES = ["constant", "reflect", "edge", "wrap"]


def _values(shape, dt) -> np.ndarray:
    return bit_values(shape, dt, RNG)


def _allowed(mode: str, shape, pads) -> bool:
    """Pads the reference takes: reflect shorter than the cropped axis, no growth of an empty axis but constant."""
    rank = len(shape)
    for i, d in enumerate(shape):
        b, e = pads[i], pads[i + rank]
        kept = d + min(b, 0) + min(e, 0)
        grow = max(b, 0) or max(e, 0)
        if kept < 0 or (grow and mode != "constant" and kept == 0) or (mode == "reflect" and grow
                                                                        and max(b, e) >= kept):
            return False
    return True


def _same_bytes(x: np.ndarray, pads, mode: str, value=None, axes=None, threads: int = 1, const_pads: bool = True):
    inputs = [("x", x, False), ("pads", np.array(pads, np.int64), const_pads)]
    if value is not None or axes is not None:
        inputs.append(("v", value[0], value[1]) if value is not None else ("v", None, False))
    if axes is not None:
        inputs.append(("axes", np.array(axes, np.int64), True))
    got, want, calls = native_vs_reference("Pad", inputs, threads=threads, mode=mode)
    what = f"Pad {mode} {x.dtype}{x.shape} pads={pads} axes={axes} value={value} threads={threads}"
    assert "pad" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert g.tobytes() == np.ascontiguousarray(w).tobytes(), f"{what}: bytes differ"
    return g


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_and_pad_pattern_of_ranks_1_to_4(dt, mode):
    """Each axis: no pad, grown at one or both ends, cropped, or cropped at one end and grown at the other."""
    patterns = [(0, 0), (1, 0), (0, 2), (2, 3), (-1, 0), (-1, 2), (3, -2)]
    for shape in [(7,), (4, 6), (3, 4, 5), (2, 3, 4, 5)]:
        rank = len(shape)
        for _ in range(12):
            chosen = [patterns[int(i)] for i in RNG.integers(0, len(patterns), rank)]
            pads = [b for b, _ in chosen] + [e for _, e in chosen]
            if _allowed(mode, shape, pads):
                _same_bytes(_values(shape, dt), pads, mode)


@pytest.mark.parametrize("mode", MODES)
def test_long_pads_axes_and_runtime_pads(mode):
    x = _values((2, 5, 6), np.float32)
    long = 4 if mode == "reflect" else 13  # reflect: one less than the axis; the others: longer than it (periodic)
    _same_bytes(x, [0, 0, long, 0, long, 1], mode)
    _same_bytes(x, [long - 3, 1, 2, 3], mode, axes=[-1, 1])  # opset-18 axes, negative first
    _same_bytes(x, [1, 2, 0, 0, 2, 1], mode, const_pads=False)  # runtime pads: the step holds their values
    _same_bytes(_values((3, 1, 4), np.int8), [0, 0, 0, 0, 0, 0], mode)  # no pad: a copy


@pytest.mark.parametrize("dt", [np.float16, np.float32, np.int64, np.bool_])
def test_constant_values_as_constants_and_runtime_inputs(dt):
    x = _values((3, 4), dt)
    v = _values((), dt).reshape(())
    _same_bytes(x, [1, 2, 1, 0], "constant", value=(v, True))
    _same_bytes(x, [0, 1, 2, 0], "constant", value=(v, False))
    if np.dtype(dt).kind == "f":
        _same_bytes(x, [1, 1, 1, 1], "constant", value=(np.array(np.nan, dt), False))


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_run_copies_across_the_vector_path_bounds(dt, isa):
    """Rows and pad slabs of 256 B to 8 KB are copied in 32-byte vectors (row_copy.h) with an overlapping last
    vector; runs just below, at and above those bounds and off the vector width, on every ISA path."""
    item = np.dtype(dt).itemsize
    for nbytes in sorted({224, 255, 256, 257, 288, 300, 1544, 8191, 8192, 8193, 8224}):
        n = max(1, nbytes // item)
        _same_bytes(_values((3, n), dt), [0, 1, 0, 2], "constant")  # the centre rows
        _same_bytes(_values((3, n), dt), [2, 0, 1, 0], "edge")  # the pad slabs: copies of whole padded rows
        _same_bytes(_values((3, n), dt), [1, 0, 1, 0], "reflect")


def test_threads_split_the_leading_axes_with_the_same_bytes():
    x = _values((2, 700, 760), np.float32)  # over the one-thread floor, leading axes unpadded
    for mode in MODES:
        one = _same_bytes(x, [0, 0, 1, 0, 0, 2], mode, threads=1)
        assert one.tobytes() == _same_bytes(x, [0, 0, 1, 0, 0, 2], mode, threads=2).tobytes()


def test_runtime_value_binds_a_step_taking_each_calls_value():
    x = _values((3, 4), np.float32)
    got, bound = kernel_and_bound_step("Pad", [("x", x, False), ("pads", np.array([1, 0, 0, 1], np.int64), True),
                                                ("v", np.array(2.5, np.float32), False)], mode="constant")
    assert bound and bound[0].tobytes() == got[0].tobytes()
    np.testing.assert_array_equal(got[0][0], np.full(5, 2.5, np.float32))


def test_errors_name_the_axis_and_the_pads():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"reflect pads \(3, 0\) need axis 0 longer than them"):
        nat.pad(_values((3, 2), np.float32), [3, 0], [0, 0], "reflect")
    with pytest.raises(ValueError, match=r"mode edge cannot pad empty axis 1 of shape \[3, 0\]"):
        nat.pad(_values((3, 0), np.float32), [0, 1], [0, 0], "edge")
    with pytest.raises(ValueError, match=r"the crop of axis 0 of shape \[3, 2\] .* is more than the axis"):
        nat.pad(_values((3, 2), np.float32), [-2, 0], [-2, 0], "constant")
    with pytest.raises(ValueError, match="mode 'mirror' unknown"):
        nat.pad(_values((3, 2), np.float32), [0, 0], [0, 0], "mirror")


@pytest.mark.parametrize("case", ["speech_reflect_f32", "image_constant_f16", "edge_i64_runtime_pads"])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """A speech front end's 1-D reflect pad, an image's constant pad with a value, edge pads given at run time:
    the CPU EP's bytes, NpuEP ran the node, and ran it as its bound native step (no Python step)."""
    shape, pads, mode, elem, dt, value = {
        "speech_reflect_f32": ((1, 1, 1600), [0, 0, 200, 0, 0, 200], "reflect", TensorProto.FLOAT, np.float32, None),
        "image_constant_f16": ((1, 3, 20, 21), [0, 0, 1, 2, 0, 0, 2, 1], "constant", TensorProto.FLOAT16,
                               np.float16, np.array(-1.5, np.float16)),
        "edge_i64_runtime_pads": ((4, 5), [1, -1, 2, 3], "edge", TensorProto.INT64, np.int64, None)}[case]
    runtime_pads = case == "edge_i64_runtime_pads"
    names = ["x", "pads"] + (["v"] if value is not None else [])
    node = helper.make_node("Pad", names, ["y"], name="the_op", mode=mode)
    out = [d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape)]
    inputs = [helper.make_tensor_value_info("x", elem, list(shape))]
    inits = {"v": value} if value is not None else {}
    if runtime_pads:
        inputs.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [len(pads)]))
    else:
        inits["pads"] = np.array(pads, np.int64)
    model = make_model([node], inputs, [helper.make_tensor_value_info("y", elem, out)], inits, opset=18)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": _values(shape, dt)} | ({"pads": np.array(pads, np.int64)} if runtime_pads else {})
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
