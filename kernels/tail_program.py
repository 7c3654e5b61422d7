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
         "add_saved": 9, "sigmoid": 10, "erf": 11, "leaky_relu": 12,
         "tanh": 13, "pow_half": 14}

Instruction = tuple[str, float, float]  # (CODES name, a, b)

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
