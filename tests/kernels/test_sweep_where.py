"""Differential sweep of Where (issue 40): ``where_select`` (kernels/native/where.cc) against the reference model
(kernels/ops/elementwise.py: numpy's where), byte for byte (the choice copies bits: NaN payloads, -0.0 and float16
kept), for every dtype size (bool, int8, float16, float32, int32, int64, float64), every broadcast of the three
operands (ranks 0..4, size-1 and size-0 axes, a decoder's [1,1,S,S] mask against [B,H,S,S] scores and a constant
-inf), constants in place, sizes around the vector lanes and the 32768-element task split, one thread and two. The
bound step is checked against the kernel by ``_sweep``; sessions show NpuEP ran the node, as its bound native step
(no Python step), with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import around, assert_session_runs_natively, bit_values, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4041)
TASK = 32768  # where.cc's kTaskElems
DTYPES = [np.bool_, np.int8, np.float16, np.float32, np.int32, np.int64, np.float64]
SHAPES = [((2, 3, 4), (2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,), ()), ((), (2, 3, 4), (3, 1)),
          ((1, 1, 5, 5), (1, 3, 5, 5), ()), ((2, 1, 4), (1, 3, 1), (4,)), ((3, 1), (1, 5), (3, 5)),
          ((2, 0, 3), (1, 3), ()), ((), (), ()), ((5, 1, 1, 2), (3, 1, 2), (1, 1, 2)), ((1, 7), (6, 1), (1,))]


def _values(shape, dt) -> np.ndarray:
    return bit_values(shape, dt, RNG)


def _condition(shape) -> np.ndarray:
    return np.asarray(RNG.random(shape) > 0.4)


def _bytes_equal(c, x, y, consts=(), threads: int = 1) -> np.ndarray:
    inputs = [("c", c, 0 in consts), ("x", x, 1 in consts), ("y", y, 2 in consts)]
    got, want, calls = native_vs_reference("Where", inputs, threads=threads)
    what = f"Where {c.shape} {x.dtype}{x.shape} {y.shape} consts={consts} threads={threads}"
    assert "where_select" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == x.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert g.tobytes() == w.tobytes(), f"{what}: bytes differ"
    return g


@pytest.mark.parametrize("dt", DTYPES)
def test_broadcasts_and_constants_byte_for_byte(dt):
    for sc, sx, sy in SHAPES:
        for consts in ((), (0,), (1,), (2,), (0, 2)):
            _bytes_equal(_condition(sc), _values(sx, dt), _values(sy, dt), consts)


@pytest.mark.parametrize("dt", [np.int8, np.float16, np.float32, np.int64])
def test_lane_tails_and_task_split_byte_for_byte(dt):
    for n in around(16, 32, 64, TASK):
        _bytes_equal(_condition((n,)), _values((n,), dt), _values((n,), dt))
        _bytes_equal(_condition((2, n)), _values((1, n), dt), _values((2, 1), dt))
    c, x, y = _condition((3, TASK + 9)), _values((3, TASK + 9), dt), _values((1,), dt)
    assert _bytes_equal(c, x, y, threads=1).tobytes() == _bytes_equal(c, x, y, threads=2).tobytes()


def test_strided_inputs_stay_on_the_reference():
    from _sweep import node_model, run_kernel
    c, x, y = _condition((6, 10)).T, _values((10, 6), np.float32), _values((6,), np.float32)
    m = node_model("Where", [("c", c, False), ("x", x, False), ("y", y, False)])
    got = run_kernel(m, {"c": c, "x": x, "y": y}, "native")[0]
    assert got.tobytes() == np.where(c, x, y).tobytes()


def test_shapes_that_do_not_broadcast_name_them():
    nat = runtime.native_module()
    with pytest.raises(ValueError, match=r"\[2,3\] and \[4\] and \[1\] do not broadcast"):
        nat.where_select(np.zeros((2, 3), bool), np.zeros(4, np.float32), np.zeros(1, np.float32), None, 1)
    with pytest.raises(ValueError, match="condition must be a C-order bool array"):
        nat.where_select(np.zeros(3, np.int8), np.zeros(3, np.float32), np.zeros(3, np.float32), None, 1)


def _session(elem, shapes, y_const: np.ndarray | None):
    sc, sx, sy = shapes
    node = helper.make_node("Where", ["c", "x", "y"], ["out"], name="the_op")
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, list(sc)),
              helper.make_tensor_value_info("x", elem, list(sx))]
    if y_const is None:
        inputs.append(helper.make_tensor_value_info("y", elem, list(sy)))
    out = list(np.broadcast_shapes(sc, sx, sy))
    model = make_model([node], inputs, [helper.make_tensor_value_info("out", elem, out)],
                       {} if y_const is None else {"y": y_const}, opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    return model, npu_session(model, so=so)


@pytest.mark.parametrize("case", ["decoder_mask_f32", "shape_math_i64"])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(case):
    """A decoder's causal mask (scores where allowed, a constant -inf elsewhere) and int64 shape math, equal values
    (NaN where the CPU EP has NaN; the CPU EP's Where gives +0.0 where it chooses a -0.0, numpy's keeps the sign)."""
    if case == "decoder_mask_f32":
        shapes, elem, dt = ((1, 1, 64, 64), (1, 4, 64, 64), ()), TensorProto.FLOAT, np.float32
        y = np.array(-np.inf, np.float32)
        c = np.tril(np.ones((64, 64), bool)).reshape(1, 1, 64, 64)
    else:
        shapes, elem, dt, y = ((4,), (4,), (4,)), TensorProto.INT64, np.int64, None
        c = np.array([True, False, True, False])
    model, sess = _session(elem, shapes, y)
    feeds = {"c": c, "x": _values(shapes[1], dt)} | ({} if y is not None else {"y": _values(shapes[2], dt)})
    assert assignment(sess) == {"the_op": "NpuEP"}
    assert_session_runs_natively(sess, model, feeds)
