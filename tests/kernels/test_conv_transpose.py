"""ConvTranspose vs ORT CPU (float32 rtol/atol 1e-4, float16 2e-2) through the kernel and an NpuEP session:
strides, dilations, pads, output_padding, output_shape, auto_pad, groups (incl. depthwise), 1-D, bias; npu-edge
(no float matrix mode) leaves it to the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep, declined_by
from _vector_ortref import rand

CASES = [  # x shape, w shape, attrs
    ((1, 3, 5, 4), (3, 2, 3, 3), {}),
    ((2, 4, 5, 6), (4, 3, 3, 2), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 4, 4, 4), (4, 2, 3, 3), {"strides": [2, 3], "output_padding": [1, 2], "group": 2}),
    ((1, 6, 5, 5), (6, 1, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 6}),  # depthwise upsampler
    ((1, 2, 4, 5), (2, 3, 3, 3), {"dilations": [2, 1], "strides": [1, 2]}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 9]}),  # odd totals: which side gets more
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 9], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 12]}),  # larger than the taps reach
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 12], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5), (2, 3, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 4, 5), (2, 3, 2, 2), {"strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 3, 9), (3, 4, 5), {"strides": [3], "pads": [1, 2]}),  # 1-D
    ((1, 4, 7), (4, 2, 4), {"strides": [2], "group": 2, "output_padding": [1]}),
    # stride == kernel, no dilation, one group: the disjoint-taps path (no scatter-add)
    ((2, 5, 3, 4), (5, 3, 2, 2), {"strides": [2, 2]}),
    ((1, 5, 3, 4), (5, 3, 2, 3), {"strides": [2, 3], "pads": [1, 0, 0, 2]}),
    ((1, 5, 3, 4), (5, 3, 2, 2), {"strides": [2, 2], "output_padding": [1, 1]}),
    ((1, 5, 3, 4), (5, 3, 2, 2), {"strides": [2, 2], "output_shape": [5, 7]}),  # cropped by derived pads
    ((1, 5, 3, 4), (5, 1, 2, 2), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 9), (3, 4, 3), {"strides": [3]}),  # 1-D
]


@pytest.mark.parametrize("xs,ws,attrs", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_transpose_matches_cpu(xs, ws, attrs, dtype, with_bias):
    x, w = rand(xs, dtype, seed=1), rand(ws, dtype, seed=2)
    m = ws[1] * attrs.get("group", 1)
    inputs = [("x", x, False), ("w", w, True)] + ([("b", rand((m,), dtype, seed=3), True)] if with_bias else [])
    tol = (1e-4, 1e-4) if dtype == np.float32 else (2e-2, 2e-2)
    check_on_ep("ConvTranspose", inputs, [("y", dtype)], attrs, tol=tol)


def test_npu_edge_has_no_float_matrix_mode():
    inputs = [("x", rand((1, 3, 5, 4), np.float32), False), ("w", rand((3, 2, 3, 3), np.float32), True)]
    reason = declined_by("ConvTranspose", inputs, [("y", np.float32)], target="npu-edge")
    assert reason is not None and "not listed" in reason


def test_runtime_weights_declined():
    inputs = [("x", rand((1, 3, 5, 4), np.float32), False), ("w", rand((3, 2, 3, 3), np.float32), False)]
    reason = declined_by("ConvTranspose", inputs, [("y", np.float32)], target="npu-ref")
    assert reason is not None and "constant weights" in reason


@pytest.mark.parametrize("xs,ws,attrs", [c for c in CASES if c[2].get("group", 1) == 1 and "dilations" not in c[2]
                                         and c[2].get("strides") == list(c[1][2:])])
@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_disjoint_taps_path_equals_the_scatter_add(xs, ws, attrs, kernels, monkeypatch):
    """Same values as the general GEMM + col2im path (float32 sums over C in another BLAS call shape: 1e-6), with
    the product on the native pointwise conv kernel or on numpy."""
    from _vector_ortref import make_model
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.ops import conv_transpose as ct
    from npu_ep.kernels.target import Target

    x, w = rand(xs, np.float32, seed=1), rand(ws, np.float32, seed=2)
    inputs = [("x", x, False), ("w", w, True), ("b", rand((ws[1],), np.float32, seed=3), True)]
    (node,) = nodes_from_model(make_model("ConvTranspose", inputs, [("y", np.float32)], attrs, opset=21))
    p = ct._prepare(node, Target.load("npu-ref"))
    from npu_ep.kernels import runtime
    runtime.configure([p], kernels, 2)
    assert ct._disjoint_taps(p)
    fast = ct._run(p, [x])[0]
    monkeypatch.setattr(ct, "_disjoint_taps", lambda p: False)
    np.testing.assert_allclose(fast, ct._run(p, [x])[0], rtol=1e-6, atol=1e-6)
