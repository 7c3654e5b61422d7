"""ONNX DynamicQuantizeLinear (float32 -> uint8 with a computed scale and zero point) on the vector unit.

As ORT 1.31's CPU kernel (bit-exact): min/max over the tensor (NaN left out), widened to include 0; scale = (max -
min) / 255 in float32 (1 when max == min); zero point = round-half-even(clamp(0 - min / scale, 0, 255)), 255 when
that is NaN (min = -Inf); y = ONNX QuantizeLinear
(``_matrix.quantize_float``; natively ``quantize_tensor``, the same float32 steps). Outputs y (uint8, x's shape),
y_scale (float32 scalar), y_zero_point (uint8 scalar).

On the native kernels the op is ``dynamic_quantize`` (kernels/native/quantize.cc: the min/max pass, the same
float32 parameter steps, ``quantize_tensor``'s quantization), bound as the step for its input shape (y written into
ORT's buffer when it is a partition output).

Cost: two passes of the vector unit: the min/max reduction (2 ops per element) and the quantization (3 ops per
element, see ``_matrix.epilogue_ops``); DMA reads x twice and writes y.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._matrix import quantize_float
from ._util import arg, stash_constants
from ._vector import elems, stream_cost

_F32 = np.float32


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    return Prepared({}, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x is None or x.dtype != np.float32:
        return f"{node.describe()}: DynamicQuantizeLinear needs float32 input"
    return None


def _range(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """x's minimum and maximum widened to include 0, NaN left out: ORT's MlasFindMinMaxElement folds each value into
    running bounds with std::min / std::max, which keep the bound against a NaN (all NaN: the range [0, 0])."""
    if not x.size:
        return _F32(0.0), _F32(0.0)
    lo, hi = _F32(x.min()), _F32(x.max())
    if np.isnan(lo):  # a NaN somewhere (min and max propagate it): the bounds of the other values
        lo, hi = _F32(np.fmin.reduce(x, axis=None)), _F32(np.fmax.reduce(x, axis=None))
        if np.isnan(lo):
            lo = hi = _F32(0.0)
    return min(lo, _F32(0.0)), max(hi, _F32(0.0))


def dynamic_params(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """The uint8 scale and zero point ORT computes for ``x`` (qmath.h's GetQuantizationParameter): the zero point is
    round-half-even(max(0, min(255, 0 - lo / scale))), whose std::min gives 255 for a NaN (lo = -Inf, scale = Inf)."""
    lo, hi = _range(x)
    scale = _F32(1.0) if hi == lo else _F32(_F32(hi - lo) / _F32(255.0))
    with np.errstate(invalid="ignore"):
        initial = _F32(_F32(0.0) - _F32(lo / scale))
    if np.isnan(initial):
        return scale, _F32(255.0)
    return scale, _F32(np.rint(np.clip(initial, _F32(0.0), _F32(255.0))))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    nat = runtime.native(p)
    if nat is not None and x.dtype == np.float32 and x.flags.c_contiguous:
        return list(nat.dynamic_quantize(x, None, runtime.threads(p)))
    scale, zp = dynamic_params(x)
    return [quantize_float(x, scale, zp, "uint8"), np.array(scale, _F32), np.array(zp, np.uint8)]


def _bind(p: Prepared, inputs, outs):
    """DynamicQuantizeLinear as one ``dynamic_quantize`` call for this input shape, y into ORT's buffer when it is a
    partition output."""
    x = arg(p, inputs, 0)
    nat = runtime.native(p)
    if nat is None or not isinstance(x, np.ndarray) or x.dtype != np.float32 or not inputs or inputs[0] is None:
        return None
    where = p.runtime.partition_outputs
    into = [(1, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.dynamic_quantize, (None, None, runtime.threads(p)),
                             [(0, 0, x.dtype, x.shape, None)], [(0, None), (1, None), (2, None)], None, into)


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    return stream_cost(p, n, 8 * n, n + 5, 5.0)


register(KernelDef("", "DynamicQuantizeLinear", _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
