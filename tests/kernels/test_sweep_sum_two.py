"""Sum of two float32 inputs binds Add's ``binary_num`` from ``_SUM_MIN_ELEMS`` output elements (kernels/ops/
elementwise.py), below ``NATIVE_MIN_ELEMS`` too, with the reference's bits (NaN/+-Inf/-0/denormals/overflow), same
shapes and broadcast; below the threshold it stays on ``variadic_float``."""

from __future__ import annotations

import numpy as np
import pytest

from _sweep import REF, around, bound_step_outputs, native_calls, node_model, with_specials
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.ops import elementwise as ew
from npu_ep.kernels.registry import kernel_for

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(2929)


def _values(shape) -> np.ndarray:
    x = (RNG.standard_normal(shape) * 1e3).astype(np.float32)
    return with_specials(x, RNG, values=(np.nan, np.inf, -np.inf, -0.0, 0.0, 3.0e38, -3.0e38, 1.0e-45, -1.0e-40))


@pytest.mark.parametrize("n", around(ew._SUM_MIN_ELEMS, 3 * ew._SUM_MIN_ELEMS))
@pytest.mark.parametrize("broadcast", [False, True])
def test_sum_of_two_binds_binary_num_from_the_threshold(n, broadcast):
    a = _values((1, n))
    b = _values((1, 1) if broadcast else (1, n))
    m = node_model("Sum", [("a", a, False), ("b", b, False)])
    (node,) = nodes_from_model(m)
    k = kernel_for("", "Sum")
    p = k.prepare(node, REF)
    runtime.configure([p], "native", 2)
    with np.errstate(all="ignore"):
        outs = list(k.run(p, [a, b]))
        want = np.add(a, b)
    with native_calls() as calls:
        got = bound_step_outputs(k, p, [a, b], outs)
    if n < ew._SUM_MIN_ELEMS:
        assert "binary_num" not in calls, calls
        return
    assert "binary_num" in calls, calls
    assert got[0].dtype == np.float32 and got[0].tobytes() == want.tobytes(), f"Sum n={n} broadcast={broadcast}"
