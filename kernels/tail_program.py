"""The instruction set of the native element-wise engine (``kernels/native/conv_tail.cc``'s ``tail_of``), and the
instruction lists of the ops it computes whole.

One home for both sides that use them: the fusion pass that appends element-wise ops to a conv as its tail
(``fusion.conv_tail``) and the element-wise kernels that run an op alone on the engine (``ops.elementwise``,
``ops.gelu``). It imports only numpy, so neither side imports the other.
"""

from __future__ import annotations

import numpy as np

# Instruction name -> the code conv_tail.cc switches on (the order of its enum)
CODES = {"mul": 0, "add": 1, "sub": 2, "rsub": 3, "div": 4, "rdiv": 5, "clip": 6, "save": 7, "mul_saved": 8,
         "add_saved": 9, "sigmoid": 10, "erf": 11, "leaky_relu": 12, "tanh": 13, "pow_half": 14, "exp": 15, "log": 16,
         "abs": 17, "floor": 18, "ceil": 19, "round": 20, "sign": 21, "div_saved": 22, "elu": 23, "softplus": 24,
         "sin": 25, "cos": 26, "softsign": 27}

Instruction = tuple[str, float, float]  # (CODES name, a, b)

# The transcendental instructions are Cephes' float32 algorithms (kernels/native/engine_math.h) but exp, which is
# exp_tanh.cc's (also inside elu and softplus), measured against the exact function in
# tests/kernels/test_sweep_unary_engine.py: exp within 1 ulp, log within 1 ulp, elu's expm1 within 2 ulp, softplus
# within 3 ulp, sin/cos within 8e-8 absolute for |x| < 8192 (the C library's beyond).
# sign b=1 gives 0 for NaN (ORT's float16 Sign), b=0 keeps NaN; div_saved is v = s / v.

SQRT1_2 = np.float32(1.0 / np.sqrt(2.0))
SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)

# x * ((1 + erf(x / sqrt 2)) * 0.5): halving 1 + erf is exact, and x is multiplied once (x * (1 + erf) would
# overflow for |x| > 1.7e38, where ORT's 0.5 * x * (1 + erf) stays finite)
GELU_ERF: list[Instruction] = [("save", 0.0, 0.0), ("mul", float(SQRT1_2), 0.0), ("erf", 0.0, 0.0),
                               ("add", 1.0, 0.0), ("mul", 0.5, 0.0), ("mul_saved", 0.0, 0.0)]
CUBE: list[Instruction] = [("save", 0.0, 0.0), ("mul_saved", 0.0, 0.0), ("mul_saved", 0.0, 0.0)]
POW_HALF: list[Instruction] = [("pow_half", 0.0, 0.0)]
GELU_TANH: list[Instruction] = [*CUBE, ("mul", float(np.float32(0.044715)), 0.0), ("add_saved", 0.0, 0.0),
                                ("mul", float(np.float32(SQRT_2_OVER_PI)), 0.0), ("tanh", 0.0, 0.0),
                                ("add", 1.0, 0.0), ("mul", 0.5, 0.0), ("mul_saved", 0.0, 0.0)]

# x / (1 + |x|): Softsign as its kernel computes it, in one loop (the bits of save, abs, add 1, div_saved)
SOFTSIGN: list[Instruction] = [("softsign", 0.0, 0.0)]


def unary_program(op: str, dtype, attrs: dict | None = None) -> list[Instruction] | None:
    """The engine instructions of a standalone float unary op of this input dtype (np.float32 or np.float16), or
    None where its kernel keeps another path (float32 Exp, Floor, Ceil, Round, Sign, Sin, Cos: numpy's own
    vectorized float32 loops, Exp's measured faster than the engine's exp alone; float32 Sigmoid: the native
    ``sigmoid``)."""
    attrs = attrs or {}
    half = np.dtype(dtype) == np.float16
    if op == "Reciprocal":
        return [("rdiv", 1.0, 0.0)]
    if op == "Log":  # float32 too: numpy's Log needs an errstate wrapper, no ufunc step, so the engine binds it
        return [("log", 0.0, 0.0)]
    if op == "Softsign":
        return list(SOFTSIGN)
    if op == "Softplus":
        return [("softplus", 0.0, 0.0)]
    if op == "Elu":
        return [("elu", float(np.float32(attrs.get("alpha", 1.0))), 0.0)]
    if op == "Selu":  # gamma * (x > 0 ? x : alpha * expm1(x)); x = -0 gives -0 either way
        return [("elu", float(np.float32(attrs.get("alpha", 1.67326319217681884765625))), 0.0),
                ("mul", float(np.float32(attrs.get("gamma", 1.05070102214813232421875))), 0.0)]
    if not half:
        return None
    simple = {"Exp": "exp", "Tanh": "tanh", "Sigmoid": "sigmoid", "Floor": "floor", "Ceil": "ceil",
              "Round": "round", "Sin": "sin", "Cos": "cos"}
    if op in simple:
        return [(simple[op], 0.0, 0.0)]
    if op == "Sign":
        return [("sign", 0.0, 1.0)]
    return None
