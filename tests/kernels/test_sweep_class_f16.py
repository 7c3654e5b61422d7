"""Differential sweep of float16 IsNaN / IsInf as native bit tests (issue 40: numpy's float16 isnan/isinf widen every
element, 6-27x the CPU EP): ``class_f16`` (kernels/native/unary_f16.cc) against the reference model (np.isnan /
np.isinf with the node's detect_negative / detect_positive, kernels/ops/elementwise.py and activation.py), bit for bit
(a bool per element: the tests are exact). Every float16 bit pattern is in the exhaustive case; sizes cross the
vector tails and the 32768-element task split, with two threads; the ISA cap does not apply (one integer loop that
the compiler vectorizes for the baseline)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import around, native_vs_reference, with_specials
from npu_ep.kernels import runtime
from npu_testing import assignment, cpu_run, make_model, npu_session

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(4041)
TASK = 32768
F16_SPECIALS = (np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0e-8, -6.0e-8, 65504.0, -65504.0)
CASES = [("IsNaN", {}), ("IsInf", {}), ("IsInf", {"detect_negative": 0}), ("IsInf", {"detect_positive": 0})]
IDS = ["IsNaN", "IsInf", "IsInf-positive", "IsInf-negative"]


def _every_half() -> np.ndarray:
    """All 65536 float16 bit patterns (NaNs of every payload and sign, both infinities, subnormals, both zeros)."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _native_equals_reference(op: str, x: np.ndarray, attrs: dict, threads: int = 1) -> None:
    got, want, calls = native_vs_reference(op, [("x", x, False)], threads=threads, **attrs)
    assert "class_f16" in calls, f"{op} {attrs}: the native bit test did not run ({calls})"
    assert got[0].dtype == want[0].dtype == np.bool_ and got[0].shape == x.shape
    np.testing.assert_array_equal(got[0], want[0], err_msg=f"{op} {attrs} {x.shape}")


@pytest.mark.parametrize("op,attrs", CASES, ids=IDS)
def test_every_float16_bit_pattern(op, attrs):
    _native_equals_reference(op, _every_half().reshape(256, 256), attrs, threads=2)


@pytest.mark.parametrize("op,attrs", CASES, ids=IDS)
def test_sizes_across_tails_and_the_task_split(op, attrs):
    for n in around(8, 16, 32, 64, TASK, 2 * TASK):
        x = with_specials((RNG.standard_normal(n) * 100).astype(np.float16), RNG, values=F16_SPECIALS, fraction=0.1)
        _native_equals_reference(op, x, attrs, threads=2)


def test_class_f16_rejects_other_dtypes_and_unknown_tests():
    kernels = runtime.native_module()
    with pytest.raises(ValueError, match="float16"):
        kernels.class_f16(0, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="test must be"):
        kernels.class_f16(7, np.zeros(4, np.float16))
    with pytest.raises(ValueError, match="bool array of 4"):
        kernels.class_f16(0, np.zeros(4, np.float16), np.zeros(4, np.uint16))


@pytest.mark.parametrize("op,attrs", CASES, ids=IDS)
def test_session_on_npu_ep_equals_cpu_ep(op, attrs):
    """The node in a session: NpuEP runs it (graph assignment) with the CPU EP's booleans exactly."""
    shape = [2, 3, 1500]
    node = helper.make_node(op, ["x"], ["y"], name="the_op", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape)],
                       [helper.make_tensor_value_info("y", TensorProto.BOOL, shape)], opset=20)
    x = with_specials((RNG.standard_normal(shape) * 4).astype(np.float16), RNG, values=F16_SPECIALS, fraction=0.2)
    sess = npu_session(model)
    assert assignment(sess) == {"the_op": "NpuEP"}
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu_run(model, {"x": x})[0])
