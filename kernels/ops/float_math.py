"""The float32 math the native element-wise instructions compute (``kernels/native/conv_tail.cc``), written as the
reference: the same plain float32 operations in the same order, so reference and native give the same bits.

Erf is Eigen's rational approximation ``erf_f32`` (within 7 ulp, 4.1e-7 absolute, of the exact erf), never float64;
tanh-GELU's tanh is MLAS's (Eigen's) rational ``tanh_f32`` (within 6 ulp, 3.3e-7 absolute). Other dtypes compute
in their own precision.
"""

from __future__ import annotations

import numpy as np

from ..tail_program import SQRT1_2, SQRT_2_OVER_PI
from ._vector import erf

_F32 = np.dtype(np.float32)


# Sigmoid's constants per compute dtype as 0-d arrays (numpy applies those faster than Python or numpy scalars):
# exp's argument is clamped below overflow (exp(88) < float32 max, exp(709) < float64 max), and 1.
_SIGMOID_CONSTS = {np.dtype(t): (np.array(lim, t), np.array(1.0, t))
                   for t, lim in ((np.float32, 88.0), (np.float64, 709.0))}


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) on one temporary (new arrays for a one-element x: numpy's out= calls cost ~1 us more on
    those, measured 6.5 vs 2.7 us; from two elements on both ways cost the same). Clamping -x below exp's overflow
    costs one call, an errstate context would cost more; x < -88 (fp32) then gives ~6e-39 instead of a smaller
    denormal or 0."""
    t = np.asarray(np.negative(x))
    limit, one = _SIGMOID_CONSTS[t.dtype]
    if t.size == 1:
        return np.asarray(np.reciprocal(np.add(np.exp(np.minimum(t, limit)), one)))
    np.minimum(t, limit, out=t)
    np.exp(t, out=t)
    t += one
    return np.reciprocal(t, out=t)


# erf_f32: Eigen's generic_fast_erf_float, x * P(x^2) / Q(x^2) on x clamped to [-4, 4] (|erf| rounds to 1 beyond)
_ERF_P = [np.float32(c) for c in (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                  -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                  -1.60960333262415e-02)]
_ERF_Q = [np.float32(c) for c in (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                  -7.37332916720468e-03, -1.42647390514189e-02)]
_FOUR = np.float32(4.0)


def erf_f32(x: np.ndarray) -> np.ndarray:
    """erf of float32 x in float32 as the native ``erf`` instruction computes it (conv_tail.cc's ``Erf``): the same
    plain multiplies, adds and one divide in the same order, so the same bits; x * (P / Q) rather than (x * P) / Q
    keeps a denormal x's precision. NaN stays NaN, +-inf give +-1, -0 gives -0."""
    return _rational(x, _FOUR, _ERF_P, _ERF_Q)


# tanh_f32: MLAS's MlasTanhKernel (Eigen's float tanh), x * P(x^2) / Q(x^2) on x clamped to [-9, 9]
_TANH_P = [np.float32(c) for c in (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                                   5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                                   4.89352455891786e-03)]
_TANH_Q = [np.float32(c) for c in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                                   4.89352518554385e-03)]
_NINE = np.float32(9.0)


def _rational(x: np.ndarray, bound: np.float32, p_coef: list, q_coef: list) -> np.ndarray:
    """c * (P(c^2) / Q(c^2)) with c = x clamped to [-bound, bound] (NaN kept), Horner in plain float32 operations."""
    c = np.where(x < -bound, -bound, np.where(x > bound, bound, x))
    x2 = c * c
    p = np.full_like(x2, p_coef[0])
    for k in p_coef[1:]:
        p *= x2
        p += k
    q = np.full_like(x2, q_coef[0])
    for k in q_coef[1:]:
        q *= x2
        q += k
    p /= q
    return np.asarray(c * p)


def tanh_f32(x: np.ndarray) -> np.ndarray:
    """tanh of float32 x as the native ``tanh`` instruction computes it (conv_tail.cc's ``Tanh``): the same bits."""
    return _rational(x, _NINE, _TANH_P, _TANH_Q)


def erf_in_dtype(x: np.ndarray) -> np.ndarray:
    """Erf on the compute dtype: float32 as ``erf_f32``, float64 in float64."""
    return erf_f32(x) if x.dtype == _F32 else erf(x).astype(x.dtype, copy=False)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)); float32 as the engine's instructions (``GELU_ERF``) in their order."""
    if x.dtype != _F32:
        return (0.5 * x * (1.0 + erf(x * np.float32(1.0 / np.sqrt(2.0))))).astype(x.dtype, copy=False)
    y = erf_in_dtype(x * SQRT1_2)
    y += np.float32(1.0)
    y *= np.float32(0.5)
    return x * y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); float32 as the engine's instructions (``GELU_TANH``) in
    their order, with ``tanh_f32``."""
    if x.dtype != _F32:
        inner = np.float32(SQRT_2_OVER_PI) * (x + np.float32(0.044715) * x * x * x)
        return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))
    t = x * x
    t = x * t
    t *= np.float32(0.044715)
    t = x + t
    t *= np.float32(SQRT_2_OVER_PI)
    t = tanh_f32(t)
    t += np.float32(1.0)
    t *= np.float32(0.5)
    return x * t


def pow_half(x: np.ndarray) -> np.ndarray:
    """pow(x, 0.5) of float32 x as the engine's ``pow_half`` computes it: the correctly rounded sqrt (powf is within
    1 ulp of it), with pow's special cases: pow(-0, 0.5) = +0 (sqrt keeps -0) and pow(-inf, 0.5) = +inf."""
    with np.errstate(invalid="ignore"):
        y = np.sqrt(x)
    y += np.float32(0.0)
    return np.where(x == -np.inf, np.float32(np.inf), y)
