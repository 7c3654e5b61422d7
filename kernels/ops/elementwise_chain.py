"""``npu::ElementwiseChain``: a chain of float32 element-wise ops (``kernels/fusion/eltwise_chain.py``) as one pass of
the native element-wise engine (``tail_of``, kernels/native/conv_tail.cc) over its input, bound as the step.

The reference runs the same instruction list with numpy (``run_program``, also the conv tail's reference), each
instruction the float32 operation of the node it replaced (exp, log, expm1, softplus, sin and cos numpy's own; the
engine's are within 1-3 ulp of them). Cost: one stream over the data, the instructions as vector ops (transcendental
ones counted as such).
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..tail_program import CODES
from ..target import Target
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost
from .elementwise import ENGINE_KEY, engine_bind, engine_runner
from .float_math import erf_f32, pow_half, sigmoid, tanh_f32

_TRANSCENDENTAL = {"sigmoid", "erf", "tanh", "exp", "log", "elu", "softplus", "sin", "cos", "pow_half"}

_WITH_CONSTANT = {"mul": (np.multiply, False), "add": (np.add, False), "sub": (np.subtract, False),
                  "rsub": (np.subtract, True), "div": (np.divide, False), "rdiv": (np.divide, True)}
_WITH_SAVED = {"mul_saved": np.multiply, "add_saved": np.add, "div_saved": np.divide}  # saved copy first
_UNARY = {"sigmoid": sigmoid, "erf": erf_f32, "tanh": tanh_f32, "pow_half": pow_half, "exp": np.exp, "log": np.log,
          "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.rint,
          "softplus": lambda y: np.logaddexp(np.float32(0.0), y), "sin": np.sin, "cos": np.cos,
          "softsign": lambda y: y / (np.abs(y) + np.float32(1.0))}


_NAMES = {code: name for name, code in CODES.items()}


def program_of(codes: np.ndarray, consts: np.ndarray) -> list[tuple[str, float, float]]:
    """The instruction list of native codes and their [n, 2] constants (a conv tail's arrays)."""
    unknown = [c for c in codes.tolist() if c not in _NAMES]
    if unknown:
        raise ValueError(f"element-wise program: unknown instruction code {unknown[0]}")
    return [(_NAMES[code], a, b) for code, (a, b) in zip(codes.tolist(), consts)]


def run_program(x: np.ndarray, program: list, channel: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """The instruction list over a float32 copy of ``x`` with numpy: the engine's reference, for chains and conv
    tails (``conv.tail_reference``). ``channel``: (instruction index, float32 constants broadcast against ``x``) of a
    per-output-channel operand, which replaces that instruction's first constant."""
    y = np.array(x, dtype=np.float32, copy=True)
    saved = None
    with np.errstate(all="ignore"):
        for k, (name, a, b) in enumerate(program):
            a32 = channel[1] if channel is not None and k == channel[0] else np.float32(a)
            if name in _WITH_CONSTANT:
                fn, constant_first = _WITH_CONSTANT[name]
                y = fn(a32, y) if constant_first else fn(y, a32)
            elif name in _WITH_SAVED:
                y = _WITH_SAVED[name](saved, y)
            elif name == "save":
                saved = y.copy()
            elif name == "clip":
                y = np.clip(y, a32, np.float32(b))
            elif name == "leaky_relu":
                y = np.where(y >= 0, y, y * a32)
            elif name == "elu":
                y = np.where(y >= 0, y, np.expm1(np.minimum(y, np.float32(0.0))) * a32)
            elif name == "sign":
                y = np.where(np.isnan(y), np.float32(0.0) if b else y, np.sign(y) + np.float32(0.0))
            elif name in _UNARY:
                y = _UNARY[name](y)
            else:
                raise ValueError(f"element-wise program: unknown instruction {name!r}")
            y = np.asarray(y, np.float32)
    return y


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    program = [list(t) for t in node.attr("program", [])]
    out = node.outputs[0]
    attrs = {"op": node.op_type, "program": program, ENGINE_KEY: program,
             "in_itemsizes": [itemsize_of(v) for v in node.inputs], "out_itemsize": itemsize_of(out),
             "out_dtype": out.dtype.name if out.dtype is not None else None}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    program = node.attr("program", [])
    if not program or any(t[0] not in CODES for t in program):
        return f"{node.describe()}: no program, or an instruction the engine does not know"
    x = node.input(0)
    if x is None or x.dtype != np.float32 or node.outputs[0].dtype != np.float32:
        return f"{node.describe()}: the chain runs float32 only"
    return None


def _reference(p: Prepared, inputs) -> list[np.ndarray]:
    return [run_program(arg(p, inputs, 0), p.attrs["program"])]


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    names = [t[0] for t in p.attrs["program"]]
    trans = sum(1.0 for t in names if t in _TRANSCENDENTAL)
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in, n * p.attrs["out_itemsize"], len(names) - trans, trans)


register(KernelDef("npu", "ElementwiseChain", _prepare, engine_runner(_reference), _cost, _check, rank_free=True,
                   bind=engine_bind))
