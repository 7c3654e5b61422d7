"""Differential sweep of float16 Relu/Abs/Neg/Sqrt/Sign (issue 40): ``unary_f16`` (kernels/native/unary_f16.cc)
against the reference model (kernels/ops/elementwise.py: widened to float32, numpy's op, rounded once; Sign with NaN
giving 0, as ORT's float16 kernel, on the bits natively): every one of the
65536 float16 bit patterns, bit for bit (the sign of zero included; NaN where the reference has NaN), on every ISA
level the host runs (the scalar _Float16 path and F16C's 8 lanes), around the lanes and the 32768-element task split
on one thread and two; the bound step (what a session's loop runs) equals the kernel (``_sweep``). Sessions show
NpuEP ran the node, as its bound native step (no Python step), with the CPU EP's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4044)
OPS = ["Relu", "Abs", "Neg", "Sqrt", "Sign"]
TASK = 32768  # unary_f16.cc's kTaskElems
EVERY = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


@pytest.fixture(params=host_isas(top="avx2"))
def capped_isa(request):
    yield from cap_isa(request.param)


def _bits_equal(op: str, x: np.ndarray, threads: int = 1) -> np.ndarray:
    got, want, calls = native_vs_reference(op, [("x", x, False)], threads=threads)
    what = f"{op} {x.shape} threads={threads}"
    assert "unary_f16" in calls, f"{what}: the native kernel did not run ({calls})"
    g, w = np.asarray(got[0]), np.asarray(want[0])
    assert g.dtype == w.dtype == np.float16 and g.shape == w.shape, what
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ"
    diff = np.flatnonzero(g.view(np.uint16)[~nan] != w.view(np.uint16)[~nan])
    assert diff.size == 0, f"{what}: bits differ for {x[~nan][diff[:5]]}: {g[~nan][diff[:5]]} vs {w[~nan][diff[:5]]}"
    return g


@pytest.mark.parametrize("op", OPS)
def test_every_float16_bit_for_bit(capped_isa, op):
    _bits_equal(op, EVERY)
    _bits_equal(op, EVERY.reshape(256, 256))


@pytest.mark.parametrize("op", OPS)
def test_lanes_and_task_split(op):
    for n in around(8, 16, TASK):
        _bits_equal(op, RNG.choice(EVERY, n))
    x = RNG.choice(EVERY, 2 * TASK + 3)
    assert _bits_equal(op, x, threads=2).tobytes() == _bits_equal(op, x, threads=1).tobytes()


@pytest.mark.parametrize("op", OPS)
def test_session_matches_cpu_ep_and_runs_on_npu_ep(op):
    node = helper.make_node(op, ["x"], ["y"], name="the_op")
    shape = [1, 64, 28, 28]
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)], opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    feeds = {"x": (RNG.standard_normal(shape) * 8).astype(np.float16)}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)  # NaN (Sqrt of negatives) where the CPU EP has NaN
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"
