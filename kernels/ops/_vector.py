"""Vector-unit numerics and cost helpers shared by the element-wise, reduction, normalization and LLM kernels.

NPU numerics: the vector unit computes in float32 (``[vector] lanes`` are fp32 lanes); float16 tensors are
widened on load and rounded (to nearest even) on store, so fp16 results are one rounding away from the fp32 result.

Cost: an element costs ``ops`` vector cycles per ``lanes`` elements; a transcendental (exp, erf, tanh, sqrt,
reciprocal) costs ``[vector] transcendental_cycles`` instead of 1 (see ``cost.vector_cost`` for DMA and overlap).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..registry import OpCost, Prepared
from ..cost import vector_cost
from ..target import Target

Shape = tuple[int, ...]


_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` in its compute dtype (a copy only for fp16). Called on every kernel call: compares against a
    prebuilt dtype (``== np.float16`` would convert the type each time)."""
    return x.astype(_F32) if x.dtype == _F16 else x


def transcendental(target: Target | None) -> float:
    """Vector cycles per lane-group for one exp/erf/tanh/sqrt/reciprocal."""
    if target is None:
        return 4.0
    return float(target.vector.get("transcendental_cycles", 4))


def elems(shape: Sequence[int] | None) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else 0


def stream_cost(p: Prepared, n_elements: int, bytes_in: int, bytes_out: int, ops: float, trans: float = 0.0) -> OpCost:
    """``n_elements`` streamed through the vector unit with ``ops`` plain and ``trans`` transcendental ops each.

    compute_cycles = ceil(n / lanes) * (ops + trans * transcendental_cycles); DMA as in ``cost.vector_cost``.
    """
    per = ops + trans * transcendental(p.target)
    return vector_cost(p.target, n_elements, bytes_in, bytes_out, per)


def itemsize_of(node_value, default: int = 4) -> int:
    """Item size of a ``ValueInfo`` (``default`` when its dtype is unknown)."""
    return node_value.dtype.itemsize if node_value is not None and node_value.dtype is not None else default


# --- erf without scipy: float64 evaluation, |error| < 2e-7 absolute, good relative accuracy near 0 -------------
_ERFC_COEF = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
              0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)
_TAYLOR = (1.0, -1.0 / 3, 1.0 / 10, -1.0 / 42, 1.0 / 216, -1.0 / 1320, 1.0 / 9360)


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized erf in float64 (returned as float64).

    |x| < 0.5: Maclaurin series to x^13 (relative error < 1e-9); else Numerical Recipes' Chebyshev erfc fit
    (fractional error < 1.2e-7), which is below one fp32 ulp of 1 - erfc.
    """
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.full_like(t, _ERFC_COEF[-1])
    for c in _ERFC_COEF[-2::-1]:
        poly = poly * t + c
    erfc = t * np.exp(-z * z + poly)
    big = 1.0 - erfc
    z2 = z * z
    series = np.full_like(z, _TAYLOR[-1])
    for c in _TAYLOR[-2::-1]:
        series = series * z2 + c
    small = (2.0 / np.sqrt(np.pi)) * z * series
    return np.copysign(np.where(z < 0.5, small, big), x)
