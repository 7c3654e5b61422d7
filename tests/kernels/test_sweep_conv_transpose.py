"""Differential sweep of the native ConvTranspose (kernels/native/conv_transpose.cc) against the reference model
(kernels/ops/conv_transpose.py), issue 40; and ConvTranspose in a session against the CPU EP, on NpuEP's bound
native step.

The kernel is the reference's GEMM then col2im: the product on the conv kernels' pointwise GEMM (DenseFloat: its
own AVX-512 GEMM, or blocks on the host sgemm below AVX-512: every ISA level is run), then per output plane the taps
added from 0.0 in row-major tap order, cropped by the pads, + bias. The col2im is the reference's float32 additions
in its order; the GEMM sums in another order than the reference's BLAS matmul, so results agree within float32
rounding of the products' sums (rtol/atol 2e-5 on values of magnitude ~1) and float16 within one float16 rounding
(rtol 1e-3). Geometries: strides 1-3, kernels 1-4, dilations, explicit and negative-total pads, output_padding,
output_shape, SAME_UPPER/SAME_LOWER/VALID, groups, the disjoint 2x2/2 upsampling head, 1-D, with and without bias,
sizes around the GEMM's 16-pixel blocks, NaN propagation. A unit-stride ConvTranspose whose pads crop no more than
the taps reach runs as the equivalent Conv (swapped, flipped weights) on the same conv kernels: also within float32
rounding of the reference's products."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _isa import cap_isa, host_isas
from _sweep import around, check, kernel_and_bound_step
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_ep.tools.bench.ops import python_steps
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

RNG = np.random.default_rng(42)


@pytest.fixture(params=host_isas(top="avx512"))
def gemm_isa(request):
    yield from cap_isa(request.param)


def _inputs(x, c, mg, k, group=1, bias=True):
    w = RNG.standard_normal((c, mg, *k)).astype(np.float32) * 0.3
    specs = [("x", x, False), ("w", w.astype(x.dtype), True)]
    if bias:
        specs.append(("b", RNG.standard_normal(mg * group).astype(x.dtype), True))
    return specs


def _check(x, mg, k, group=1, bias=True, **attrs):
    tol = 2e-5 if x.dtype == np.float32 else 1e-3
    return check("ConvTranspose", _inputs(x, x.shape[1], mg, k, group, bias), "conv_transpose", exact=False,
                 rtol=tol, atol=tol, threads=2, group=group, **attrs)


GEOMETRIES = [dict(strides=[1, 1], pads=[1, 1, 1, 1]), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
              dict(strides=[2, 2]), dict(strides=[3, 2], dilations=[2, 1], pads=[0, 2, 1, 0]),
              dict(strides=[2, 2], auto_pad="SAME_UPPER"), dict(strides=[2, 1], auto_pad="SAME_LOWER"),
              dict(strides=[1, 2], auto_pad="VALID"), dict(strides=[2, 2], output_shape=[9, 12])]


@pytest.mark.parametrize("attrs", GEOMETRIES)
def test_geometries(gemm_isa, attrs):
    for w in (3, 5, *around(16)):
        x = RNG.standard_normal((2, 4, 4, w)).astype(np.float32)
        if "output_shape" in attrs:
            attrs = dict(attrs, output_shape=[2 * 4 + 1, 2 * w + 2])
        _check(x, 3, (3, 3), **attrs)


@pytest.mark.parametrize("k", [(2, 2), (4, 4), (1, 1), (3, 2)])
def test_kernel_sizes_groups_and_bias(gemm_isa, k):
    x = RNG.standard_normal((1, 6, 5, 7)).astype(np.float32)
    _check(x, 2, k, strides=list(k))  # stride = kernel: the disjoint upsampling head
    _check(x, 2, k, group=3, strides=[2, 2], pads=[0, 1, 1, 0], bias=False)
    _check(x, 4, k, group=2, strides=[1, 1])


def test_float16_and_1d(gemm_isa):
    x = RNG.standard_normal((1, 8, 6, 9)).astype(np.float16)
    _check(x, 4, (3, 3), strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    _check(x, 4, (2, 2), strides=[2, 2])
    x1 = RNG.standard_normal((2, 4, 17)).astype(np.float32)
    _check(x1, 3, (4,), strides=[2], pads=[1, 1])
    _check(x1.astype(np.float16), 3, (3,), strides=[1], dilations=[2])


def test_unit_stride_as_a_conv_and_its_fallback(gemm_isa):
    """Unit stride runs as the equivalent Conv (weights swapped and flipped, pads (k - 1) d - p); pads cropping past
    the taps' reach (a negative conv pad) and output_padding on either side fall back to the GEMM and col2im."""
    x = RNG.standard_normal((2, 6, 7, 9)).astype(np.float32)
    for attrs in (dict(pads=[0, 2, 1, 0]), dict(dilations=[2, 1], pads=[1, 0, 2, 1]), dict(pads=[3, 1, 0, 3]),
                  dict(pads=[1, 1, 1, 1], output_shape=[9, 11]), dict(auto_pad="SAME_LOWER")):
        _check(x, 4, (3, 3), strides=[1, 1], **attrs)
        _check(x, 2, (3, 2), group=3, strides=[1, 1], **attrs)


def test_output_larger_than_the_taps_reach_and_nan():
    """An output_shape past the taps' reach ends in bias alone (negative total pad); a NaN input pixel spreads to
    the outputs its taps reach, as in the reference."""
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    _check(x, 2, (3, 3), strides=[2, 2], output_shape=[12, 13])
    x[0, 1, 2, 3] = np.nan
    _check(x, 2, (3, 3), strides=[2, 2], pads=[1, 1, 1, 1])


def test_bound_step_equals_the_kernel():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float16)
    got, bound = kernel_and_bound_step("ConvTranspose", _inputs(x, 4, 2, (3, 3)), strides=[2, 2], pads=[1, 1, 1, 1])
    assert bound and bound[0].tobytes() == got[0].tobytes()


# ConvTransposes of real models: a U-Net / segmentation decoder's 2x2/2 upsampling, a detector neck's 4x4/2 pad 1
# (DCGAN-style), float16.
SESSION_CASES = [(np.float32, (2, 2), dict(strides=[2, 2])),
                 (np.float32, (4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
                 (np.float16, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]))]


@pytest.mark.parametrize("dt,k,attrs", SESSION_CASES)
def test_session_matches_cpu_ep_as_a_native_step(dt, k, attrs):
    """Within float32 rounding of the CPU EP's (its GEMM sums in another order: rtol 1e-4 over 16 * 9 products),
    float16 within float16 rounding (2e-2 absolute on outputs of magnitude ~5)."""
    elem = TensorProto.FLOAT if dt == np.float32 else TensorProto.FLOAT16
    w = (RNG.standard_normal((16, 8, *k)) * 0.3).astype(dt)
    b = RNG.standard_normal(8).astype(dt)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="the_op", **attrs)
    model = make_model([node], [helper.make_tensor_value_info("x", elem, [1, 16, 14, 14])],
                       [helper.make_tensor_value_info("y", elem, [None] * 4)], {"w": w, "b": b}, opset=17)
    so = session_options()
    tag_session_options(so)  # so the bench's python_steps finds the session's programs
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    x = RNG.standard_normal((1, 16, 14, 14)).astype(dt)
    want = cpu_run(model, {"x": x})[0]
    tol = (1e-4, 1e-4) if dt == np.float32 else (1e-2, 2e-2)
    for _ in range(3):  # the kernel's run, then the bound step
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol[0], atol=tol[1])
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound step"
