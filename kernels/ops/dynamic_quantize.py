"""ONNX DynamicQuantizeLinear (float32 -> uint8 with a computed scale and zero point) on the vector unit.

As ORT 1.31's CPU kernel (bit-exact): min/max over the tensor, widened to include 0; scale = (max - min) / 255 in
float32 (1 when max == min); zero point = round-half-even(clamp(0 - min / scale, 0, 255)); y = ONNX QuantizeLinear
(``_mm.quantize_float``; natively ``quantize_tensor``, the same float32 steps). Outputs y (uint8, x's shape), y_scale
(float32 scalar), y_zero_point (uint8 scalar).

Cost: two passes of the vector unit: the min/max reduction (2 ops per element) and the quantization (3 ops per
element, see ``_mm.epilogue_ops``); DMA reads x twice and writes y.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from . import _native
from ._mm import quantize_float
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


def dynamic_params(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """The uint8 scale and zero point ORT computes for ``x`` (the range widened to include 0)."""
    lo = min(_F32(x.min()), _F32(0.0)) if x.size else _F32(0.0)
    hi = max(_F32(x.max()), _F32(0.0)) if x.size else _F32(0.0)
    scale = _F32(1.0) if hi == lo else _F32(_F32(hi - lo) / _F32(255.0))
    return scale, _F32(np.rint(np.clip(_F32(_F32(0.0) - _F32(lo / scale)), _F32(0.0), _F32(255.0))))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    scale, zp = dynamic_params(x)
    nat = _native.native(p)
    if nat is not None and x.dtype == np.float32:  # ep/native/kernels/quantize.cc: the same float32 steps
        y = nat.quantize_tensor(np.ascontiguousarray(x), float(scale), int(zp), False, _native.threads(p))
        return [y.reshape(x.shape), np.array(scale, _F32), np.array(zp, np.uint8)]
    return [quantize_float(x, scale, zp, "uint8"), np.array(scale, _F32), np.array(zp, np.uint8)]


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    return stream_cost(p, n, 8 * n, n + 5, 5.0)


register(KernelDef("", "DynamicQuantizeLinear", _prepare, _run, _cost, _check, rank_free=True))
