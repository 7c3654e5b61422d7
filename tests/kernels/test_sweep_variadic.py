"""Differential sweep of the native variadic Sum/Mean/Max/Min (``variadic_float``, kernels/native/binary.cc; issue
40): same-shape float32/float16 inputs folded left to right in float32 and rounded once, as the reference model
(kernels/ops/elementwise.py) folds them: Sum and Mean bit for bit, Max/Min equal values (NaN propagated; the sign of
a zero that ties may differ, as between numpy's own loops), around the 1024-float chunk and the 16384-element task
split, 1 to 5 inputs, with NaN/+-Inf/-0/denormal/huge values, with threads, and bound as the session's step.
Broadcast inputs stay on the reference; a session runs the node on NpuEP with the CPU EP's results."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import around, kernel_and_bound_step, native_vs_reference, with_specials
from npu_ep.kernels import runtime
from npu_testing import assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4041)
CHUNK, TASK = 1024, 16384
OPS = ("Sum", "Mean", "Max", "Min")


def _inputs(shape, dtype, count: int):
    values = (np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0e-8, 60000.0, -60000.0) if dtype == np.float16 else None
    kw = {} if values is None else {"values": values}
    return [(f"x{i}", with_specials((RNG.standard_normal(shape) * 4).astype(dtype), RNG, **kw), False)
            for i in range(count)]


def _same(op: str, got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if op in ("Sum", "Mean"):
        assert got.tobytes() == want.tobytes(), f"{what}: bits differ"
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", OPS)
def test_sizes_counts_and_specials(op, dtype):
    for n in around(16, CHUNK) + [TASK + 3]:
        for count in (1, 2, 3, 5):
            inputs = _inputs((n,), dtype, count)
            got, want, calls = native_vs_reference(op, inputs, threads=2)
            assert "variadic_float" in calls, f"{op} {n} x{count}: the native fold did not run ({calls})"
            _same(op, got[0], want[0], f"{op} {np.dtype(dtype).name} n={n} x{count}")


@pytest.mark.parametrize("op,dtype,count", [("Sum", np.float32, 3), ("Mean", np.float16, 2), ("Max", np.float16, 2),
                                            ("Min", np.float32, 4), ("Max", np.float32, 2)])
def test_binds_one_native_step(op, dtype, count):
    """Every same-shape float case binds one native step (float32 Max/Min of two: numpy's ufunc, as before)."""
    inputs = _inputs((2, 3, 50), dtype, count)
    inputs[-1] = (inputs[-1][0], inputs[-1][1], True)  # a constant input is held in the step
    outs, bound = kernel_and_bound_step(op, inputs)
    assert len(bound) == 1, f"{op} {np.dtype(dtype).name} x{count}: no native step"
    _same(op, bound[0], outs[0], f"{op} bound step")


def test_broadcast_inputs_stay_on_the_reference():
    inputs = [("a", RNG.standard_normal((4, 5)).astype(np.float32), False),
              ("b", RNG.standard_normal((5,)).astype(np.float32), False)]
    got, want, calls = native_vs_reference("Sum", inputs)
    assert "variadic_float" not in calls
    _same("Sum", got[0], want[0], "broadcast Sum")


def test_variadic_float_rejects_mixed_shapes_and_dtypes():
    kernels = runtime.native_module()
    kernels = getattr(kernels, "kernels", kernels)
    a = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="one dtype and shape"):
        kernels.variadic_float(0, 1, None, a, np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="one dtype and shape"):
        kernels.variadic_float(0, 1, None, a, a.astype(np.float16))
    out = np.empty_like(a)
    kernels.variadic_float(1, 1, out, a, a * 3)
    np.testing.assert_array_equal(out, np.full_like(a, 2.0))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_session_matches_cpu_ep_and_runs_on_npu_ep(op, dtype):
    """Three inputs in a session: NpuEP runs the node and equals ORT's CPU EP (float32 Sum/Mean within 1e-6
    relative: ORT may sum in another order; float16 within one float16 ulp: ORT's float16 Sum/Mean round each
    partial sum)."""
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    shape = [1, 64, 56, 56]
    names = ["a", "b", "c"]
    node = helper.make_node(op, names, ["y"], name="the_op")
    model = make_model([node], [helper.make_tensor_value_info(n, elem, shape) for n in names],
                       [helper.make_tensor_value_info("y", elem, shape)], opset=13)
    feeds = {n: (RNG.standard_normal(shape) * 3).astype(dtype) for n in names}
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    got, want = sess.run(None, feeds)[0], cpu_run(model, feeds)[0]
    if op in ("Max", "Min"):
        np.testing.assert_array_equal(got, want)
    elif dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2.0**-10, atol=6e-8)
