"""npu::NormMatMul over float32 weights as one native call (``norm_matmul_float``, AVX-512 hosts): the RMS-norm
prologue, the product on the packed GEMM (gamma folded into B, B packed once) with its bias, then a group's SwiGLU.

Against the reference model (the same compiled node with ``kernels=reference``: numpy's prologue, numpy's matmul):
the prologue has the reference's bits (the Skip* sum output is compared exactly), the product sums in the packed
GEMM's order, not numpy's BLAS's, so the outputs are compared within the float32 dot-product error bound. The
bound call step gives the kernel's bits; a session at a decoder's width runs it on NpuEP against the CPU EP
(``test_bound_native_calls.py``, ``level=None``).
"""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.ep import _native as extension
from npu_ep.kernels import runtime
from npu_ep.kernels.ops.matmul import PACKED_B, PACKED_ISAS
from npu_ep.kernels.registry import kernel_for
from tests.kernels.test_bound_native_calls import assert_same, one_step_loop
from tests.kernels.test_native_norm_matmul import _feeds, _model, _prepared

_NAT = runtime.native_module()
pytestmark = pytest.mark.skipif(_NAT is None or _NAT.isa() not in PACKED_ISAS,
                                reason="the float NormMatMul's native call runs on AVX-512 hosts")

def _within_dot_bound(got, want):
    """|got - want| within 1e-5 of the output's scale: two summation orders of K products differ by a few ulps of
    the largest partial sums (the worst case, K * 2^-24 of the sum of |a||b|, is 1e-4 relative at K = 2048)."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("d,rows", [(2048, 1), (2048, 5), (96, 3), (256, 32)])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp", ["swiglu", "pair", "single"])
def test_one_call_matches_the_reference_model(d, rows, skip, mlp):
    model = _model(d, rows, skip=skip, mlp=mlp, level=None)
    p = _prepared(model)
    inputs = _feeds(model, rows, d)
    kernel = kernel_for("npu", "NormMatMul")
    native = kernel.run(p, inputs)
    assert PACKED_B in p.kernel_cache["inner"].kernel_cache  # the packed GEMM made the product
    runtime.configure([p], "reference", 2)
    want = kernel.run(p, inputs)
    assert len(native) == len(want)
    if skip:  # the sum output: the prologue's adds, bit for bit
        np.testing.assert_array_equal(native[-1], want[-1])
    for got, ref in zip(native[:-1] if skip else native, want[:-1] if skip else want):
        _within_dot_bound(got, ref)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mlp", ["swiglu", "pair"])
def test_call_step_equals_the_kernel(rows, skip, mlp):
    """The bound step (what the program's C++ loop runs) gives the kernel's bits; a group's outputs are column views
    of one product; another shape is declined (the kernel runs)."""
    d = 96
    model = _model(d, rows, skip=skip, mlp=mlp, level=None)
    p = _prepared(model)
    kernel = kernel_for("npu", "NormMatMul")
    inputs = _feeds(model, rows, d)
    outs, step, loop = one_step_loop(kernel, p, inputs)
    assert isinstance(step, extension.CallStep)
    got = loop(tuple(inputs))
    assert_same(got, outs)
    assert loop.native_counts == (1, 0)
    if mlp == "pair":
        assert got[0].base is not None and got[0].base is got[1].base
    other = tuple(np.zeros((1, rows + 1, d), np.float32) for _ in inputs)
    loop(other)
    assert loop.native_counts == (1, 1)
