"""Differential sweep of com.microsoft QLinearConcat on the native kernels (issue 40): ``qlinear_concat``
(kernels/native/qlinear_concat.cc: each part copied or read through its requantization table) against the reference
model (kernels/ops/qlinear_lut.py: numpy indexing of the same tables, then numpy's concatenate), byte for byte: int8
and uint8, every byte value, parts copied and requantized side by side, every axis of ranks 1..4 (negative too),
size-0 parts, one to four parts, scales and zero points constant or fed at run time, outputs around the 64 KB task
split, one thread and two. The bound step is checked against the kernel by ``_sweep``. Sessions show NpuEP ran the
node as its bound native step (no Python step) with the CPU EP's bytes (ORT builds the same tables). Runs around
the vector widths (AVX-512 VBMI table permutes, 32-byte copies) on every ISA path."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import assert_session_runs_natively, check
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4061)
MS = "com.microsoft"
TASK = 1 << 16  # qlinear_concat.cc's kTaskBytes
# (scale, zero point as int8; uint8 adds 128) per part; the output's are Y; a part with Y's own is copied
Y = (0.02, 3)
PARAMS = [Y, (0.05, -7), (0.013, 0), Y]


def _bytes(shape, dt) -> np.ndarray:
    """Every byte value first, then random ones."""
    n = int(np.prod(shape))
    v = np.concatenate([np.arange(256), RNG.integers(0, 256, max(0, n - 256))])[:n]
    return v.astype(np.uint8).view(dt).reshape(shape)


def _zp(z: int, dt) -> np.ndarray:
    return np.array(z + (128 if dt == np.uint8 else 0), dt)


def _inputs(parts: list[np.ndarray], params, const: bool = True) -> list:
    dt = parts[0].dtype
    out = [("y_s", np.array(Y[0], np.float32), const), ("y_z", _zp(Y[1], dt), const)]
    for k, (x, (s, z)) in enumerate(zip(parts, params)):
        out += [(f"x{k}", x, False), (f"s{k}", np.array(s, np.float32), const), (f"z{k}", _zp(z, dt), const)]
    return out


def _shape_with(shape, axis: int, size: int) -> tuple:
    s = list(shape)
    s[axis] = size
    return tuple(s)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("shape", [(300,), (3, 100), (2, 3, 50), (2, 3, 4, 13)])
def test_every_axis_copied_and_requantized_parts(dt, shape):
    rank = len(shape)
    for axis in range(-rank, rank):
        for n_parts in (1, 2, 4):
            sizes = [shape[axis] + k for k in range(n_parts)]
            parts = [_bytes(_shape_with(shape, axis, s), dt) for s in sizes]
            check("QLinearConcat", _inputs(parts, PARAMS[:n_parts]), "qlinear_concat", domain=MS, axis=axis)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_runs_around_the_vector_widths_on_every_isa(isa, dt):
    """Requantized runs through the 64-byte table permutes (AVX-512 VBMI) and copied runs through 32-byte vectors
    (row_copy.h): run lengths around 64 and 256 bytes (masked tails), every byte value, on every ISA path."""
    for n in (1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300):
        parts = [_bytes((3, max(n, 256)), dt)[:, :n], _bytes((3, n + 1), dt), _bytes((3, n), dt)]
        parts = [np.ascontiguousarray(x) for x in parts]
        parts[0].reshape(-1)[: min(256, parts[0].size)] = np.arange(256).astype(np.uint8).view(dt)[: parts[0].size]
        check("QLinearConcat", _inputs(parts, PARAMS[1:4]), "qlinear_concat", domain=MS, axis=-1)


def test_size_zero_parts_and_runtime_parameters():
    parts = [_bytes((2, 0, 5), np.uint8), _bytes((2, 3, 5), np.uint8), _bytes((2, 0, 5), np.uint8)]
    check("QLinearConcat", _inputs(parts, PARAMS[1:4]), "qlinear_concat", domain=MS, axis=1)
    parts = [_bytes((4, 70), np.int8), _bytes((4, 30), np.int8)]
    check("QLinearConcat", _inputs(parts, PARAMS[:2], const=False), "qlinear_concat", domain=MS, axis=-1)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
def test_task_split_one_thread_and_two(dt):
    for rows in (1, 2, 3, 7):  # whole rows per 64 KB task: tasks of one to many rows, a last partial task
        parts = [_bytes((rows * 97, TASK // 97 + 1), dt), _bytes((rows * 97, 13), dt)]
        one = check("QLinearConcat", _inputs(parts, PARAMS[:2]), "qlinear_concat", domain=MS, axis=1, threads=1)
        two = check("QLinearConcat", _inputs(parts, PARAMS[:2]), "qlinear_concat", domain=MS, axis=1, threads=2)
        assert one[0].tobytes() == two[0].tobytes()


def test_bad_parts_name_them():
    nat = runtime.native_module()
    a, b = np.zeros((2, 3), np.uint8), np.zeros((3, 3), np.uint8)
    with pytest.raises(ValueError, match=r"part \[3,3\] \(uint8\) does not match \[2,3\] \(uint8\) off axis 1"):
        nat.qlinear_concat(1, [None, None], None, 1, a, b)
    with pytest.raises(ValueError, match=r"one table \(or None\) per part, got 1 for 2 parts"):
        nat.qlinear_concat(0, [None], None, 1, a, b)
    with pytest.raises(ValueError, match="table 0 must be None or a C-order array of 256 bytes"):
        nat.qlinear_concat(0, [np.zeros(255, np.uint8), None], None, 1, a, b)


def _session(dt, runtime_params: bool):
    elem = TensorProto.INT8 if dt == np.int8 else TensorProto.UINT8
    names = ["y_s", "y_z", "a", "a_s", "a_z", "b", "b_s", "b_z", "c", "c_s", "c_z"]
    node = helper.make_node("QLinearConcat", names, ["y"], name="the_op", domain=MS, axis=-1)
    params = {"y_s": np.array(Y[0], np.float32), "y_z": _zp(Y[1], dt),
              "a_s": np.array(PARAMS[1][0], np.float32), "a_z": _zp(PARAMS[1][1], dt),
              "b_s": np.array(Y[0], np.float32), "b_z": _zp(Y[1], dt),
              "c_s": np.array(PARAMS[2][0], np.float32), "c_z": _zp(PARAMS[2][1], dt)}
    inputs = [helper.make_tensor_value_info(n, elem, [2, 48, w]) for n, w in (("a", 40), ("b", 7), ("c", 300))]
    if runtime_params:
        inputs += [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), [])
                   for n, v in params.items()]
    model = make_model([node], inputs, [helper.make_tensor_value_info("y", elem, [2, 48, 347])],
                       {} if runtime_params else params, opset=17, extra_opsets=[(MS, 1)])
    so = session_options()
    tag_session_options(so)  # so python_steps finds the session's programs
    feeds = {"a": _bytes((2, 48, 40), dt), "b": _bytes((2, 48, 7), dt), "c": _bytes((2, 48, 300), dt)}
    return model, npu_session(model, so=so), feeds | (params if runtime_params else {})


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("runtime_params", [False, True])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(dt, runtime_params):
    """Two requantized parts around a copied one: the CPU EP's bytes, as the bound step."""
    model, sess, feeds = _session(dt, runtime_params)
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, feeds, bits=True)
