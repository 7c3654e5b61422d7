"""Element-wise ops on the vector unit: arithmetic, comparisons, logic, variadic Min/Max/Sum/Mean,
math and activations (activations with attributes and Clip/PRelu: ``activation.py``).

Broadcasting is ONNX multidirectional broadcasting (== numpy's). Float16 is computed in float32 and rounded once on
store (``_vector.widen``); integer Div truncates toward zero like ORT (C++ integer division), not numpy's floor,
and fails the run on a zero divisor, as ORT's CPU Div does. On the native kernels, with the reference's bits, and
bound as the step: float16 Add/Sub/Mul/Div (``binary_f16``: the same float32 operation rounded once) and comparisons
(``compare_f16``), int32/int64 Div (``div_int``), all in kernels/native/binary.cc; float16 Relu/Abs/Neg/Sqrt
(unary_f16.cc). Large tensors (``NATIVE_MIN_ELEMS`` output elements) of float32/float64/integers/bool run the
plain-dtype kernels, split over the threads where numpy's ufunc runs on one: Add/Sub/Mul/Div, Max/Min, Sum and Mean of
two, comparisons and And/Or/Xor (``binary_num``), Relu/Abs/Neg/Sqrt/Not (``unary_num``, kernels/native/unary.cc).

Each op is one row of a table ``op -> (function, plain ops/element, transcendental ops/element)``; the cost is
``ceil(out_elements / lanes) * (ops + trans * transcendental_cycles)`` on the vector unit plus DMA of every input
and the output (``_vector.stream_cost``).

The element-wise engine: a float32 or float16 op that is a short list of conv-tail instructions
(``tail_program.CODES``: Erf, exact and tanh Gelu, FastGelu, Pow by a constant 3 or 0.5, Exp, Reciprocal, in float16
also Log, Tanh, Sigmoid, Floor, Ceil, Round and Sign (``tail_program.unary_program``), activation.py's LeakyRelu,
HardSigmoid, HardSwish, PRelu of one slope, Elu, Selu, Softplus, Softsign, and gelu.py's QuickGelu) runs natively as
``tail_of`` (``kernels/native/conv_tail.cc``: one pass over the data in L1-sized chunks, vectorized, threaded over
large tensors, into ORT's buffer when the result is a partition output; ``tail_of_bias`` adds a bias along the last
axis first: BiasGelu, FastGelu with a bias), and the same instructions fold into a Conv before it. Its reference
computes the same float32 operations (``float_math``), so both give the same bits; but exp, log, expm1 and sigmoid's
exp, Cephes' float32 algorithms (within 1-3 ulp of the exact functions), where the reference calls numpy's. Where
and Cast are in ``where.py`` and ``cast.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..tail_program import CODES, CUBE, GELU_ERF, GELU_TANH, POW_HALF, unary_program
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import itemsize_of, stream_cost, widen
from .float_math import erf_in_dtype, gelu_erf, gelu_tanh, pow_half, sigmoid

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C++ integer division (truncate toward zero), as ORT's CPU Div; a zero divisor fails the run as ORT's does
    (numpy would give 0 with a warning)."""
    if not np.all(b):
        raise ZeroDivisionError(f"Integer division by zero: the divisor {b.dtype}{list(b.shape)} holds "
                                f"{b.size - np.count_nonzero(b)} zero(s)")
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _int_div(a, b) if np.issubdtype(a.dtype, np.integer) else np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Output has the base's dtype (ONNX Pow); float bases computed in fp32 (fp64 for fp64)."""
    if np.issubdtype(a.dtype, np.floating):
        base = widen(a)
        return np.power(base, b.astype(base.dtype, copy=False)).astype(a.dtype, copy=False)
    return np.power(a, b.astype(a.dtype, copy=False))


# op -> (fn, ops/element, transcendental ops/element)
_BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], float, float]] = {
    "Add": (np.add, 1.0, 0.0),
    "Sub": (np.subtract, 1.0, 0.0),
    "Mul": (np.multiply, 1.0, 0.0),
    "Div": (_div, 1.0, 1.0),
    "Pow": (_pow, 2.0, 2.0),  # exp(b * log(a))
    "Equal": (np.equal, 1.0, 0.0),
    "Less": (np.less, 1.0, 0.0),
    "Greater": (np.greater, 1.0, 0.0),
    "LessOrEqual": (np.less_equal, 1.0, 0.0),
    "GreaterOrEqual": (np.greater_equal, 1.0, 0.0),
    "And": (np.logical_and, 1.0, 0.0),
    "Or": (np.logical_or, 1.0, 0.0),
    "Xor": (np.logical_xor, 1.0, 0.0),
}

# Variadic ops (1..N inputs broadcast together): op -> (pairwise fn, ops per extra input, transcendental ops).
# Min/Max propagate NaN like ORT; Sum/Mean accumulate in the compute dtype and round once on store.
_VARIADIC: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], float, float]] = {
    "Min": (np.minimum, 1.0, 0.0),
    "Max": (np.maximum, 1.0, 0.0),
    "Sum": (np.add, 1.0, 0.0),
    "Mean": (np.add, 1.0, 0.0),  # then one multiply by 1/N
}


def _reciprocal(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.reciprocal(x)


def _log(x: np.ndarray) -> np.ndarray:
    """log(0) = -inf and log(x < 0) = nan, as ORT, without numpy's warnings."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


_ZEROS = {np.dtype(t): np.array(0, t) for t in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64)}

# numpy's clip ufunc: one vectorized pass, where np.maximum/np.minimum on float32 take ~3x longer per element and
# np.clip adds several microseconds of Python checks per call (a small model's activations are dominated by them)
try:
    from numpy._core.umath import clip as CLIP_UFUNC
except ImportError:  # pragma: no cover - every numpy >= 2.0 (required) has it
    CLIP_UFUNC = np.clip
# Clip's open bounds as ORT's defaults (numeric_limits lowest/max: Clip(inf) without a max is FLT_MAX there)
# (0-d arrays: a ufunc converts a numpy scalar operand to an array on every call, ~0.4 us on a small tensor)
FLOAT_RANGES = {np.dtype(t): (np.array(np.finfo(t).min, t), np.array(np.finfo(t).max, t))
                for t in (np.float32, np.float64)}
_RELU_BOUNDS = {t: (np.array(0.0, t), np.array(np.inf, t)) for t in FLOAT_RANGES}  # Relu keeps inf


def clip_float(x: np.ndarray, lo, hi) -> np.ndarray:
    """``min(max(x, lo), hi)`` for float32/float64 x (bounds of x's dtype; None = ORT's default, the dtype's
    lowest/max), NaN propagated and -0.0 kept where it is in range, as ORT's Clip gives it (np.maximum would turn
    max(-0.0, +0.0) into +0.0)."""
    lo_open, hi_open = FLOAT_RANGES[x.dtype]
    return CLIP_UFUNC(x, lo_open if lo is None else lo, hi_open if hi is None else hi)


def _relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0): floats through ``clip_float``; other dtypes against a prebuilt zero of x's dtype (building the
    scalar per call costs more than the max)."""
    bounds = _RELU_BOUNDS.get(x.dtype)
    if bounds is not None:
        return CLIP_UFUNC(x, *bounds)
    zero = _ZEROS.get(x.dtype)
    return np.maximum(x, x.dtype.type(0) if zero is None else zero)


# op -> (fn on the compute dtype, ops/element, transcendental ops/element)
_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float, float]] = {
    "Relu": (_relu, 1.0, 0.0),
    "Neg": (np.negative, 1.0, 0.0),
    "Abs": (np.abs, 1.0, 0.0),  # integers wrap as ORT's: Abs(INT_MIN) == INT_MIN, as Neg(INT_MIN)
    "Sign": (np.sign, 1.0, 0.0),  # float16: _sign_run
    "Sqrt": (np.sqrt, 0.0, 1.0),
    "Reciprocal": (_reciprocal, 0.0, 1.0),
    "Exp": (np.exp, 0.0, 1.0),
    "Erf": (erf_in_dtype, 0.0, 1.0),
    "Sigmoid": (sigmoid, 2.0, 1.0),
    "Tanh": (np.tanh, 0.0, 1.0),
    "Gelu": (gelu_erf, 3.0, 1.0),  # opset 20; approximate="tanh" switches to gelu_tanh
    "FastGelu": (gelu_tanh, 5.0, 1.0),  # com.microsoft
    "Sin": (np.sin, 0.0, 1.0),
    "Cos": (np.cos, 0.0, 1.0),
    "Log": (_log, 0.0, 1.0),
    "Floor": (np.floor, 1.0, 0.0),
    "Ceil": (np.ceil, 1.0, 0.0),
    "Round": (np.rint, 1.0, 0.0),  # ONNX Round: half to even, as rint
    "Not": (np.logical_not, 1.0, 0.0),
    "IsNaN": (np.isnan, 1.0, 0.0),
}
_MS_UNARY = ("Gelu", "FastGelu")
# Unary ops with an engine form for some float dtypes (``tail_program.unary_program``): the engine runs and binds
# them there, their ``_UNARY`` function elsewhere
_ENGINE_UNARY = ("Exp", "Reciprocal", "Log", "Tanh", "Sigmoid", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos")


def prepare(node: NodeInfo, target: Target) -> Prepared:
    out = node.outputs[0]
    attrs = {"op": node.op_type, "in_itemsizes": [itemsize_of(v) for v in node.inputs],
             "out_itemsize": itemsize_of(out), "out_dtype": out.dtype.name if out.dtype is not None else None}
    if node.op_type == "Gelu":
        attrs["approximate"] = str(node.attr("approximate", "none"))
    if node.op_type == "Mod":
        attrs["fmod"] = bool(node.attr("fmod", 0))
    exponent = node.input(1) if node.op_type == "Pow" else None
    if exponent is not None and exponent.value is not None:
        e = np.asarray(exponent.value)
        attrs["square"] = bool(e.size == 1 and float(e.reshape(-1)[0]) == 2.0)
        attrs["cube"] = bool(e.size == 1 and float(e.reshape(-1)[0]) == 3.0)
        attrs["half"] = bool(e.size == 1 and float(e.reshape(-1)[0]) == 0.5)
    engine = {"Erf": [("erf", 0.0, 0.0)],
              "Gelu": GELU_ERF if attrs.get("approximate", "none") == "none" else GELU_TANH,
              "FastGelu": GELU_TANH if node.input(1) is None else None,  # a bias: the reference's add first
              "Pow": CUBE if attrs.get("cube") else POW_HALF if attrs.get("half") else None}.get(node.op_type)
    x = node.input(0)
    if engine is None and node.op_type in _ENGINE_UNARY and x is not None and x.dtype in (_F32, _F16):
        engine = unary_program(node.op_type, x.dtype)
    if engine:
        attrs[ENGINE_KEY] = [list(t) for t in engine]
    return Prepared(attrs, stash_constants(node), target)


def check(node: NodeInfo, target: Target) -> str | None:
    for v in (*node.inputs, *node.outputs):
        if not v.missing and v.dtype is None:
            return f"{node.describe()}: {v.name} has a dtype the NPU cannot carry"
    if node.op_type == "Gelu" and str(node.attr("approximate", "none")) not in ("none", "tanh"):
        return f"{node.describe()}: Gelu approximate={node.attr('approximate')!r} unknown"
    return None


def cost(p: Prepared, shapes) -> OpCost:
    op = p.attrs["op"]
    present = [s for s in shapes if s is not None]
    out = np.broadcast_shapes(*present) if present else ()
    n = int(np.prod(out, dtype=np.int64))
    row = _BINARY.get(op) or _UNARY.get(op) or (None, 1.0, 0.0)
    if op in _VARIADIC:
        row = (None, _VARIADIC[op][1] * max(len(present) - 1, 1), _VARIADIC[op][2])
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in, n * p.attrs["out_itemsize"], row[1], row[2])


def out_dtype(p: Prepared, x: np.ndarray) -> np.dtype:
    """The output dtype as an ``np.dtype``, parsed from ``attrs`` once (kept in ``p.kernel_cache``), ``x``'s dtype
    if unknown."""
    dt = p.kernel_cache.get("out_dtype")
    if dt is None:
        dt = p.kernel_cache["out_dtype"] = np.dtype(p.attrs["out_dtype"] or x.dtype)
    return dt


def _binary_runner(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], op: str = ""):
    """The run function of one binary op (no per-call table lookup); an (op, dtype) of ``_NATIVE_BINARY`` on C-order
    arrays runs its native kernel (the reference's bits; it returns None for values it leaves to the reference)."""
    natives = {dt: call for (o, dt), call in _NATIVE_BINARY.items() if o == op}

    def run(p: Prepared, inputs) -> list[np.ndarray]:
        a, b = arg(p, inputs, 0), arg(p, inputs, 1)
        call = natives.get(a.dtype) if natives else None
        if (call is not None and type(a) is np.ndarray and type(b) is np.ndarray and b.dtype == a.dtype
                and a.flags.c_contiguous and b.flags.c_contiguous and max(a.size, b.size) >= call[2]):
            nat = runtime.native(p)
            y = None if nat is None else getattr(nat, call[0])(*call[1], a, b, None, runtime.threads(p))
            if y is not None:
                return [y]
        return [np.asarray(fn(a, b))]
    return run


# Output elements from which the plain dtypes' native kernels (binary_num, unary_num, clip_num) run: they split over
# the threads there, where numpy's ufunc runs on one; below it the ufunc's call costs less
NATIVE_MIN_ELEMS = 1 << 16
_NUM_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64))
_FLOATS = (_F32, np.dtype(np.float64))
_BOOL = np.dtype(np.bool_)
# binary_num's op codes and the dtypes each takes (kernels/native/binary.cc)
_NUM_BINARY: dict[str, tuple[int, tuple[np.dtype, ...]]] = {
    "Add": (0, _NUM_DTYPES), "Sub": (1, _NUM_DTYPES), "Mul": (2, _NUM_DTYPES), "Div": (3, _FLOATS),
    "Max": (4, _NUM_DTYPES), "Min": (5, _NUM_DTYPES), "Equal": (6, (*_NUM_DTYPES, _BOOL)), "Less": (7, _NUM_DTYPES),
    "LessOrEqual": (8, _NUM_DTYPES), "Greater": (9, _NUM_DTYPES), "GreaterOrEqual": (10, _NUM_DTYPES),
    "And": (11, (_BOOL,)), "Or": (12, (_BOOL,)), "Xor": (13, (_BOOL,)),
    "Mean": (14, _FLOATS),  # of two: (a + b) / 2, the reference's fold
}
# (op, dtype) -> (native kernel, its leading arguments, the least elements it runs for), each with the reference's
# bits (kernels/native/binary.cc): float16 computed in float32 and rounded once, float16 compared exactly; integer
# Div truncating toward zero; the plain dtypes' IEEE operations and wrapping integers
_NATIVE_BINARY: dict[tuple[str, np.dtype], tuple[str, tuple, int]] = {
    **{(op, dt): ("binary_num", (code,), NATIVE_MIN_ELEMS) for op, (code, dts) in _NUM_BINARY.items() for dt in dts},
    **{(op, _F16): ("binary_f16", (code,), 0) for code, op in enumerate(("Add", "Sub", "Mul", "Div"))},
    **{(op, _F16): ("compare_f16", (code,), 0)
       for code, op in enumerate(("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"))},
    ("Div", np.dtype(np.int32)): ("div_int", (), 0), ("Div", np.dtype(np.int64)): ("div_int", (), 0),
}
_NATIVE_BINARY_OPS = {op for op, _ in _NATIVE_BINARY}


def _num_out(op: str, dtype: np.dtype) -> np.dtype:
    """binary_num's result dtype: bool for comparisons and logic, else the operands'."""
    return _BOOL if 6 <= _NUM_BINARY[op][0] <= 13 else dtype


def _native_binder(op: str, other: Callable | None, least: int | None = None) -> Callable:
    """The ``bind`` of an op with native kernels (``_NATIVE_BINARY``): one call of the dtype's kernel for these input
    shapes, a constant operand held in place, into ORT's buffer when the result is a partition output; ``other``
    binds the other dtypes. ``least``: the output elements from which ``binary_num`` binds, for ``NATIVE_MIN_ELEMS``."""
    natives = {dt: call if least is None or call[0] != "binary_num" else (*call[:2], least)
               for (o, dt), call in _NATIVE_BINARY.items() if o == op}

    def bind(p: Prepared, inputs, outs):
        values = [arg(p, inputs, 0), arg(p, inputs, 1)]
        call = natives.get(values[0].dtype) if isinstance(values[0], np.ndarray) and len(inputs) == 2 else None
        if (call is None or not isinstance(values[1], np.ndarray) or values[1].dtype != values[0].dtype
                or (call[2] and (outs[0].size < call[2] or outs[0].dtype != _num_out(op, values[0].dtype)))):
            return other(p, inputs, outs) if other is not None else None
        nat = runtime.native(p)
        if nat is None:
            return None
        name, lead, _ = call
        given = [i < len(inputs) and inputs[i] is not None for i in range(2)]
        live = [(len(lead) + i, i, v.dtype, v.shape, None) for i, v in enumerate(values) if given[i]]
        if not live:
            return None
        held = [None if given[i] else np.array(v, order="C") for i, v in enumerate(values)]  # 0-d stays 0-d
        where = p.runtime.partition_outputs  # into ORT's buffer when the result is a partition output
        into = [(len(lead) + 2, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, getattr(nat, name), (*lead, *held, None, runtime.threads(p)), live, [(-1, None)],
                                 None, into)
    return bind


def _ufunc_binder(fn, arity: int, kinds: str = "", exact_f16: bool = False) -> Callable | None:
    """The ``bind`` of an op whose function is a numpy ufunc: the ufunc itself as the step's native call, constants
    in place, for these input shapes and dtypes, in any layout (ep/step_binding.py), a 0-d result as a 0-d array
    (``ufunc_into``: a ufunc on 0-d arrays returns a numpy scalar; shape arithmetic on scalars, such as a mask's
    length minus one, has them); not float16 (computed in float32) or a result of another dtype than the kernel's.
    ``kinds``: the dtype kinds every input must have (Div: "f", whose integer form is not a ufunc). ``exact_f16``:
    float16 too, where the ufunc on float16 is the float32 result rounded (Min, Max)."""
    if not isinstance(fn, np.ufunc):
        return None

    def bind(p: Prepared, inputs, outs):
        values = [arg(p, inputs, i) for i in range(arity)]
        if not all(isinstance(v, np.ndarray) and (exact_f16 or v.dtype != _F16)
                   and (not kinds or v.dtype.kind in kinds) for v in values):
            return None
        if fn(*[np.empty(0, v.dtype) for v in values]).dtype != outs[0].dtype:
            return None
        live = [(i, i, v.dtype, v.shape, None, True) for i, v in enumerate(values)
                   if i < len(inputs) and inputs[i] is not None]
        if not live:
            return None
        args = tuple(None if i < len(inputs) and inputs[i] is not None else v for i, v in enumerate(values))
        where = p.runtime.partition_outputs  # into ORT's buffer when the result is a partition output
        into = [(arity, where[0], list(outs[0].shape))] if where and 0 in where else []
        if outs[0].ndim == 0:
            return runtime.call_step(p, ufunc_into(fn, zero_d=True), (*args, None), live, [(-1, None)], None, into)
        return runtime.call_step(p, fn, (*args, None), live, [(-1, None)], None, into, keywords=("out",))
    return bind


ufunc_binder = _ufunc_binder  # for activation.py's IsInf

_UFUNC_INTO: dict[object, Callable] = {}  # fn, or (fn, True) for its 0-d form


def ufunc_into(fn: np.ufunc, *, zero_d: bool = False) -> Callable:
    """``fn(*operands, out)`` with ``out`` as the keyword (a bound step's last argument: ORT's output buffer, or None
    for a new array); np.maximum/np.minimum deprecate a positional out. ``zero_d``: the result of 0-d operands as a
    0-d array (the ufunc returns a numpy scalar without ``out``)."""
    key = (fn, True) if zero_d else fn
    call = _UFUNC_INTO.get(key)
    if call is None:
        if zero_d:
            def call(*args):
                return np.asarray(fn(*args[:-1], out=args[-1]))
        else:
            def call(*args):
                return fn(*args[:-1], out=args[-1])
        call = _UFUNC_INTO[key] = call
    return call


_POW_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # float16 is computed in float32


def _pow_bind(p: Prepared, inputs, outs):
    """Pow on float32/float64 as its kernel's ufunc call: a constant exponent of 2 as ``np.multiply(x, x)``, else
    ``np.power`` with an exponent of the base's dtype (``_pow`` casts nothing then)."""
    a, b = arg(p, inputs, 0), arg(p, inputs, 1)
    if p.attrs.get("cube") or (p.attrs.get("half") and isinstance(a, np.ndarray) and a.dtype in (_F32, _F16)):
        return engine_bind(p, inputs, outs)  # the engine's for float32/float16; float64 by 3 stays unbound
    if (not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.dtype not in _POW_DTYPES
            or outs[0].ndim == 0 or outs[0].dtype != a.dtype or inputs[0] is None):
        return None
    x = (0, 0, a.dtype, a.shape, None, True)
    if p.attrs.get("square") and b.ndim <= a.ndim:
        return runtime.call_step(p, np.multiply, (None, None), [x, (1, *x[1:])], [(-1, None)])
    if b.dtype != a.dtype:
        return None
    ins = [x] if len(inputs) < 2 or inputs[1] is None else [x, (1, 1, b.dtype, b.shape, None, True)]
    return runtime.call_step(p, np.power, (None, None if len(ins) == 2 else b), ins, [(-1, None)])


def _relu_bind(p: Prepared, inputs, outs):
    """Relu on float32/float64 as its kernel's own clip ufunc call (``_relu``), for this input shape."""
    x = inputs[0] if inputs else None
    if (not isinstance(x, np.ndarray) or x.dtype not in _RELU_BOUNDS or not x.flags.c_contiguous
            or outs[0].ndim == 0 or outs[0].dtype != x.dtype):
        return None
    where = p.runtime.partition_outputs  # into ORT's buffer when the result is a partition output
    into = [(3, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, CLIP_UFUNC, (None, *_RELU_BOUNDS[x.dtype], None), [(0, 0, x.dtype, x.shape, None)],
                             [(-1, None)], None, into, keywords=("out",))


# --- the element-wise engine: float32 ops as conv-tail instructions run by the native ``tail_of`` ---------------

ENGINE_KEY = "engine_program"  # Prepared.attrs: the op's instructions, when it has a float32 engine form


def engine_program(p: Prepared) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes int32[n], consts float32[n, 2]) of the op's engine instructions (``attrs[ENGINE_KEY]``), made once."""
    prog = p.kernel_cache.get(ENGINE_KEY)
    if prog is None:
        ins = p.attrs.get(ENGINE_KEY)
        if not ins:
            return None
        prog = p.kernel_cache[ENGINE_KEY] = (np.asarray([CODES[t[0]] for t in ins], np.int32),
                                     np.asarray([t[1:] for t in ins], np.float32).reshape(-1, 2))
    return prog


def _engine_call(p: Prepared, x: np.ndarray) -> np.ndarray | None:
    """The op on the native engine for float32 ``x`` of rank >= 1 with a float32 output, else None. Float16 (in and
    out: ``tail_of_f16``) widens each chunk to float32 and rounds once on store as the reference does: the same
    bits."""
    nat = runtime.native(p)
    if nat is None or x.dtype not in (_F32, _F16) or not x.ndim or out_dtype(p, x) != x.dtype:
        return None
    prog = engine_program(p)
    if prog is None:
        return None
    out = runtime.ort_output(p, 0, x.shape, x.dtype)  # ORT's buffer when the result is a partition output
    fn = nat.tail_of if x.dtype == _F32 else nat.tail_of_f16
    return fn(np.ascontiguousarray(x), *prog, runtime.threads(p), out)


def engine_runner(reference: Callable):
    """The run function of an op with an engine form: the native engine where it applies, else ``reference``."""
    def run(p: Prepared, inputs) -> list[np.ndarray]:
        y = _engine_call(p, arg(p, inputs, 0))
        return reference(p, inputs) if y is None else [y]
    return run


def engine_bind(p: Prepared, inputs, outs):
    """A float32 (float16) engine op of a runtime input (and constants only otherwise) as one native ``tail_of``
    (``tail_of_f16``) call for its shape."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    prog = engine_program(p)
    if (nat is None or prog is None or not isinstance(x, np.ndarray) or x.dtype not in (_F32, _F16)
            or not x.flags.c_contiguous or outs[0].ndim == 0 or outs[0].dtype != x.dtype or outs[0].shape != x.shape
            or any(v is not None for v in inputs[1:])):
        return None
    where = p.runtime.partition_outputs  # written into ORT's buffer when y is an output of the partition
    into = [(4, where[0], list(x.shape))] if where and 0 in where else []
    fn = nat.tail_of if x.dtype == _F32 else nat.tail_of_f16
    return runtime.call_step(p, fn, (None, *prog, runtime.threads(p), None),
                             [(0, 0, x.dtype, x.shape, None)], [(-1, None)],
                             None, into)


def _bias_ok(x, bias) -> bool:
    """Whether ``tail_of_bias`` takes these: C-order float32 or float16 x of rank >= 1 and a bias of its dtype and
    its last axis's length."""
    return (type(x) is np.ndarray and type(bias) is np.ndarray and x.dtype in (_F32, _F16) and bias.dtype == x.dtype
            and x.ndim >= 1 and x.size > 0 and bias.size == x.shape[-1] and x.flags.c_contiguous
            and bias.flags.c_contiguous)


def bias_engine_call(p: Prepared, x, bias, prog: tuple[np.ndarray, np.ndarray]) -> np.ndarray | None:
    """x + bias (along x's last axis) then the engine program ``prog`` in one native pass (``tail_of_bias``), into
    ORT's buffer when the result is a partition output; None where it does not apply."""
    nat = runtime.native(p)
    if nat is None or not _bias_ok(x, bias):
        return None
    out = runtime.ort_output(p, 0, x.shape, x.dtype)
    return nat.tail_of_bias(x, bias, *prog, runtime.threads(p), out)


def bias_engine_bind(p: Prepared, inputs, outs, prog: tuple[np.ndarray, np.ndarray]):
    """``bias_engine_call`` as one bound step for this input shape (a constant bias held)."""
    x, bias = arg(p, inputs, 0), arg(p, inputs, 1)
    nat = runtime.native(p)
    if nat is None or not inputs or inputs[0] is None or not _bias_ok(x, bias) or outs[0].dtype != x.dtype:
        return None
    live = [(0, 0, x.dtype, x.shape, None)]
    if len(inputs) > 1 and inputs[1] is not None:
        live.append((1, 1, bias.dtype, bias.shape, None))
    held = None if len(live) == 2 else np.array(bias, order="C")
    where = p.runtime.partition_outputs  # written into ORT's buffer when y is an output of the partition
    into = [(5, where[0], list(x.shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.tail_of_bias, (None, held, *prog, runtime.threads(p), None), live, [(-1, None)],
                             None, into)


def _sigmoid_run(p: Prepared, inputs) -> list[np.ndarray]:
    """Sigmoid; float32 on the native kernel (the conv tail's sigmoid: exp in lanes, within 2 ulp of numpy's),
    numpy's ``sigmoid`` for the reference model and other dtypes."""
    x = arg(p, inputs, 0)
    nat = runtime.native(p)
    if nat is not None and x.dtype == _F32 and x.ndim and p.kernel_cache.get("out_dtype", _F32) == _F32:
        out = runtime.ort_output(p, 0, x.shape, _F32)  # ORT's buffer when the result is a partition output
        return [nat.sigmoid(np.ascontiguousarray(x), runtime.threads(p), out)]
    return _SIGMOID_REFERENCE(p, inputs)


def _sigmoid_bind(p: Prepared, inputs, outs):
    """A float32 Sigmoid of a runtime input as one native call for its shape."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    if (nat is None or not isinstance(x, np.ndarray) or x.dtype != _F32 or not x.flags.c_contiguous
            or outs[0].ndim == 0 or outs[0].dtype != _F32):
        return None
    where = p.runtime.partition_outputs  # written into ORT's buffer when y is an output of the partition
    into = [(2, where[0], list(x.shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.sigmoid, (None, runtime.threads(p), None), [(0, 0, x.dtype, x.shape, None)],
                             [(-1, None)], None, into)


def _mod_native(a, b) -> bool:
    """Whether ``mod_into`` (kernels/native/mod.cc) takes these operands: arrays of one integer or float dtype."""
    return (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype and a.dtype.kind in "iuf"
            and a.dtype.itemsize in (1, 2, 4, 8))


def _mod_run(p: Prepared, inputs) -> list[np.ndarray]:
    """ONNX Mod as ORT's CPU kernel: fmod=1 is C's fmod (the dividend's sign), fmod=0 (integers) the divisor's
    sign, numpy's remainder; an integer zero divisor fails the run as ORT's does. On the native kernels
    ``mod_into`` for C-order operands (the same bits; None on a zero divisor, which the reference then reports)."""
    a, b = arg(p, inputs, 0), arg(p, inputs, 1)
    nat = runtime.native(p)
    if nat is not None and _mod_native(a, b) and a.flags.c_contiguous and b.flags.c_contiguous:
        y = nat.mod_into(a, b, p.attrs["fmod"], None, runtime.threads(p))
        if y is not None:
            return [y]
    if np.issubdtype(a.dtype, np.integer) and not np.all(b):
        raise ZeroDivisionError(f"Integer modulo by zero: the divisor {b.dtype}{list(b.shape)} holds "
                                f"{b.size - np.count_nonzero(b)} zero(s)")
    with np.errstate(divide="ignore", invalid="ignore"):
        return [np.asarray((np.fmod if p.attrs["fmod"] else np.remainder)(a, b))]


def _mod_bind(p: Prepared, inputs, outs):
    """Mod as one ``mod_into`` call for these input shapes, a constant operand held in place, into ORT's buffer
    when the result is a partition output; a zero integer divisor declines the call (the kernel raises then)."""
    values = [arg(p, inputs, 0), arg(p, inputs, 1)]
    nat = runtime.native(p)
    if nat is None or not _mod_native(*values) or outs[0].dtype != values[0].dtype:
        return None
    given = [i < len(inputs) and inputs[i] is not None for i in range(2)]
    live = [(i, i, v.dtype, v.shape, None) for i, v in enumerate(values) if given[i]]
    if not live:
        return None
    held = [None if given[i] else np.array(v, order="C") for i, v in enumerate(values)]  # 0-d stays 0-d
    where = p.runtime.partition_outputs  # into ORT's buffer when the result is a partition output
    into = [(3, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.mod_into, (*held, p.attrs["fmod"], None, runtime.threads(p)), live,
                             [(-1, None)], None, into)


def _mod_check(node: NodeInfo, target: Target) -> str | None:
    t = node.inputs[0].dtype
    if not node.attr("fmod", 0) and t is not None and np.issubdtype(t, np.floating):
        return f"{node.describe()}: Mod of floats needs fmod=1 (the ONNX spec)"
    return check(node, target)


def _sign_run(p: Prepared, inputs) -> list[np.ndarray]:
    """Sign; ORT's float16 kernel compares with 0, so NaN gives 0 there (float32 keeps NaN, as numpy's sign)."""
    x = arg(p, inputs, 0)
    if x.dtype == _F16:
        return [np.asarray(np.sign(np.where(np.isnan(x), x.dtype.type(0), x)))]  # an array also for a 0-d x
    return _SIGN_REFERENCE(p, inputs)


def _pow_run(p: Prepared, inputs) -> list[np.ndarray]:
    """Pow; a constant exponent of 2 is ``x * x`` and of 3 ``x * x * x`` as ORT's CPU kernel computes them
    (correctly rounded products, no powf), with the base's broadcast against the exponent's shape; float32 and
    float16 by 3 run on the element-wise engine, as by 0.5 (``pow_half``)."""
    a, b = arg(p, inputs, 0), arg(p, inputs, 1)
    if p.attrs.get("half") and a.dtype in (_F32, _F16) and b.ndim <= a.ndim:
        native = _engine_call(p, a)
        if native is not None:
            return [native]
        y = pow_half(widen(a))
        return [y if a.dtype == _F32 else y.astype(_F16)]
    if (p.attrs.get("square") or p.attrs.get("cube")) and a.dtype.kind == "f" and b.ndim <= a.ndim:
        if p.attrs.get("cube") and (native := _engine_call(p, a)) is not None:
            return [native]
        base = a if a.dtype != _F16 else a.astype(_F32)
        y = np.multiply(base, base)
        if p.attrs.get("cube"):
            y *= base
        return [y if a.dtype != _F16 else y.astype(_F16)]
    return [np.asarray(_pow(a, b))]


def _store(p: Prepared, y, x: np.ndarray) -> np.ndarray:
    """``y`` (an array, or a numpy scalar from a 0-d input) rounded on store to the output dtype."""
    dt = out_dtype(p, x)
    if type(y) is np.ndarray and y.dtype == dt:
        return y
    return np.asarray(y).astype(dt, copy=False)


# Float32 elements from which Sin/Cos/Tanh run natively in chunks over the threads (``ufunc_split``: numpy's own
# float32 loop, numpy's bits; Tanh ``exp_tanh``); below it the one ufunc step costs less (numpy's float32 tanh costs
# what exp_tanh's does per element, and a bound ufunc step ~0.15 us less per call). Float32 Exp runs ``exp_tanh``
# from ``_F32_SPLIT_FROM`` (numpy's exp loop is 3x slower per element: sessions at [1,4096] 5.4 -> 4.6 us, [1,16384]
# 9.3 -> 5.8; at [1,64] the ufunc step is 0.1 us faster), all over the threads from ``_EXP_TANH_THREADS_FROM``.
# Float32 Log runs on the engine.
SPLIT_MIN_ELEMS = 1 << 15
_SPLIT_UFUNCS = {"Exp": np.exp, "Tanh": np.tanh, "Sin": np.sin, "Cos": np.cos}
# Float16 ops run natively at any size (threaded as their float32 form), before the engine: each block widened, the
# float32 op (Log: numpy's loop, ``ufunc_split``, so the reference itself: the engine's Cephes log is one float16 ulp
# off it for one pattern; Exp, Tanh: ``exp_tanh``), rounded once; the engine costs more per call and per element.
_SPLIT_F16 = {"Exp": np.exp, "Log": np.log, "Tanh": np.tanh}
# Ops of the two dicts above on ``exp_tanh`` (kernels/native/exp_tanh.cc, by op code) instead of numpy's loop: a
# range reduction and polynomial of its own (as ORT's MLAS computes them), the same bits on every ISA and thread count.
# np.exp / np.tanh in float32 stay the specification, with this tolerance: over all 2^32 float32 patterns float32
# Exp and Tanh within EXP_TANH_ULP ulp of numpy's (numpy's own exp is up to 2.4 ulp off the correctly rounded result,
# this one 0.9; its tanh 1.4, this one 2.5), NaN, inf and 0 where numpy gives them, tanh(-0) = -0, and tanh +-1
# from |x| = 8.49 (numpy's from 10); float16 Exp and Tanh (widened, that exp or tanh, rounded once) within one
# float16 ulp of the reference (measured over every float16 pattern: Exp equal, Tanh one off at +-1.691 only).
_EXP_TANH = {"Exp": 0, "Tanh": 1}
EXP_TANH_ULP = {"Exp": 3, "Tanh": 3}
_F32_SPLIT_FROM = {"Exp": 1 << 10}  # else SPLIT_MIN_ELEMS


def _split_native(p: Prepared, x, op: str = ""):
    """The native module where ``ufunc_split`` / ``exp_tanh`` take x: a C-order float32 array of the op's
    ``_F32_SPLIT_FROM`` elements or more."""
    if (type(x) is not np.ndarray or x.dtype != _F32 or not x.flags.c_contiguous
            or x.size < _F32_SPLIT_FROM.get(op, SPLIT_MIN_ELEMS)):
        return None
    return runtime.native(p)


def _split_kernel(nat, op: str) -> tuple[Callable, object]:
    """(native kernel, its first argument) of a split op: ``exp_tanh`` and its code, else ``ufunc_split`` and the
    op's ufunc."""
    if op in _EXP_TANH:
        return nat.exp_tanh, _EXP_TANH[op]
    return nat.ufunc_split, _SPLIT_UFUNCS.get(op) or _SPLIT_F16[op]


# Elements from which ``exp_tanh`` splits over the threads: about 11 us of one thread's work (exp 0.1 ns, tanh 0.17 ns
# per element); below, waking a second thread cost more than it saved (sessions, [1,128,384]: one thread 0.6-0.9 us
# faster for both, median and fastest call).
_EXP_TANH_THREADS_FROM = {"Exp": 1 << 17, "Tanh": 1 << 16}


def _split_threads(p: Prepared, x: np.ndarray, op: str) -> int:
    return runtime.threads(p) if x.size >= _EXP_TANH_THREADS_FROM.get(op, SPLIT_MIN_ELEMS) else 1


def _split_binder(op: str, other: Callable | None) -> Callable:
    """The ``bind`` of float32 Exp/Tanh/Sin/Cos on a C-order array of ``_F32_SPLIT_FROM`` elements (float16 of
    ``_SPLIT_F16`` at any size): one ``exp_tanh`` call (Exp, Tanh) or ``ufunc_split`` call of its ufunc for this
    input shape, into ORT's buffer when the result is a partition output; ``other`` binds the rest."""
    dtypes = (*((_F32,) if op in _SPLIT_UFUNCS else ()), *((_F16,) if op in _SPLIT_F16 else ()))

    def bind(p: Prepared, inputs, outs):
        x = inputs[0] if inputs else None
        nat = runtime.native(p)
        if (nat is None or type(x) is not np.ndarray or x.dtype not in dtypes or not x.flags.c_contiguous
                or (x.dtype == _F32 and x.size < _F32_SPLIT_FROM.get(op, SPLIT_MIN_ELEMS))
                or outs[0].dtype != x.dtype or outs[0].shape != x.shape):
            return other(p, inputs, outs) if other is not None else None
        where = p.runtime.partition_outputs
        into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
        kernel, head = _split_kernel(nat, op)
        return runtime.call_step(p, kernel, (head, None, None, _split_threads(p, x, op)),
                                 [(1, 0, x.dtype, x.shape, None)], [(-1, None)], None, into)
    return bind


def _split_f16_runner(op: str, other: Callable) -> Callable:
    """The run function of a ``_SPLIT_F16`` op: ``exp_tanh`` (Exp, Tanh) or ``ufunc_split`` (Log) for a C-order
    float16 input, else ``other``."""

    def run(p: Prepared, inputs) -> list[np.ndarray]:
        x = arg(p, inputs, 0)
        if (type(x) is np.ndarray and x.dtype == _F16 and x.flags.c_contiguous and out_dtype(p, x) == _F16
                and (nat := runtime.native(p)) is not None):
            kernel, head = _split_kernel(nat, op)
            return [kernel(head, x, runtime.ort_output(p, 0, x.shape, _F16), _split_threads(p, x, op))]
        return other(p, inputs)
    return run


def _unary_runner(fn: Callable[[np.ndarray], np.ndarray], f16_code: int | None = None, op: str = ""):
    """The run function of one unary op: ``fn`` on the compute dtype, rounded once on store. The common case (a
    runtime input, an array result already in the output dtype) makes no further Python call: a unary step is
    often all a small partition does. ``f16_code``: the op's ``unary_f16`` code, run for C-order float16 on the
    native kernels (the reference's bits); ``op`` of ``_NUM_UNARY``: ``unary_num`` for large C-order arrays of its
    dtypes (``_num_unary_min``); of ``_SPLIT_UFUNCS``: ``exp_tanh`` (Exp, Tanh) or ``ufunc_split`` for C-order float32
    arrays of ``_F32_SPLIT_FROM`` elements."""
    num = _NUM_UNARY.get(op)
    split_op = op in _SPLIT_UFUNCS

    def run(p: Prepared, inputs) -> list[np.ndarray]:
        x = inputs[0] if inputs else None
        if x is None:
            x = arg(p, inputs, 0)
        if f16_code is not None and x.dtype == _F16 and type(x) is np.ndarray and x.flags.c_contiguous:
            nat = runtime.native(p)
            if nat is not None:
                return [nat.unary_f16(f16_code, x, None, runtime.threads(p))]
        if (num is not None and x.dtype in num[1] and type(x) is np.ndarray and x.size >= _num_unary_min(x, op)
                and x.flags.c_contiguous and (nat := runtime.native(p)) is not None):
            return [nat.unary_num(num[0], x, None, runtime.threads(p))]
        if split_op and (nat := _split_native(p, x, op)) is not None:
            kernel, head = _split_kernel(nat, op)
            return [kernel(head, x, runtime.ort_output(p, 0, x.shape, _F32), _split_threads(p, x, op))]
        y = fn(x if x.dtype != _F16 else x.astype(_F32))  # widen(x), inline
        dt = p.kernel_cache.get("out_dtype")
        if dt is not None and type(y) is np.ndarray and y.dtype == dt:
            return [y]
        return [_store(p, y, x)]
    return run


def _gelu_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    fn = gelu_tanh if p.attrs.get("approximate") == "tanh" else gelu_erf
    return [_store(p, fn(widen(x)), x)]


_GELU_TANH_PROGRAM: list = []


def _gelu_tanh_program() -> tuple[np.ndarray, np.ndarray]:
    """(codes, consts) of the engine's tanh GELU (``GELU_TANH``), made once."""
    if not _GELU_TANH_PROGRAM:
        _GELU_TANH_PROGRAM.append((np.asarray([CODES[t[0]] for t in GELU_TANH], np.int32),
                                   np.asarray([t[1:] for t in GELU_TANH], np.float32).reshape(-1, 2)))
    return _GELU_TANH_PROGRAM[0]


def _fast_gelu_run(p: Prepared, inputs) -> list[np.ndarray]:
    """FastGelu; with a bias, x + bias in float32 and the engine's tanh GELU in one native pass (``tail_of_bias``:
    the same instructions and bits as ``gelu_tanh``; without a bias the engine runs through ``engine_runner``)."""
    x, bias = arg(p, inputs, 0), arg(p, inputs, 1)
    if bias is not None and (y := bias_engine_call(p, x, bias, _gelu_tanh_program())) is not None:
        return [y]
    xc = widen(x) if bias is None else widen(x) + widen(bias)
    return [_store(p, gelu_tanh(xc), x)]


def _fast_gelu_bind(p: Prepared, inputs, outs):
    """FastGelu as one engine step: ``tail_of_bias`` with a bias, ``tail_of`` without."""
    if len(inputs) > 1 and arg(p, inputs, 1) is not None:
        return bias_engine_bind(p, inputs, outs, _gelu_tanh_program())
    return engine_bind(p, inputs, outs)


_VARIADIC_CODES = {"Sum": 0, "Mean": 1, "Max": 2, "Min": 3}  # kernels/native/binary.cc's variadic_float ops


def _variadic_native(xs: list) -> bool:
    """Whether ``variadic_float`` takes these inputs: C-order float32 or float16 arrays of one dtype and shape."""
    x0 = xs[0]
    return all(type(x) is np.ndarray and x.dtype == x0.dtype and x.shape == x0.shape and x.flags.c_contiguous
               for x in xs) and x0.dtype in (_F32, _F16)


# The binary_num op a Sum (Mean) of two runs and binds from ``_SUM_MIN_ELEMS`` output elements
_TWO_AS = {"Sum": "Add", "Mean": "Mean"}


def _two_as_binary(xs: list, name: str | None) -> bool:
    """Whether a Sum (Mean) of these two inputs runs ``binary_num``'s ``name``, as its bind does (``_sum_two``)."""
    if name is None or len(xs) != 2:
        return False
    a, b = xs
    return (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype and a.dtype != _F16
            and a.dtype in _NUM_BINARY[name][1] and a.flags.c_contiguous and b.flags.c_contiguous
            and int(np.prod(np.broadcast_shapes(a.shape, b.shape))) >= _SUM_MIN_ELEMS)


def _variadic_runner(op: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    """The run function of one variadic op: ``fn`` folded over every input in the compute dtype; same-shape float32
    or float16 inputs fold natively (``variadic_float``: the same float32 operations in the same order), other large
    Sums or Means of two (broadcast, float64, integers) as their bound step (``binary_num``: the same operations)."""
    two = _TWO_AS.get(op)

    def run(p: Prepared, inputs) -> list[np.ndarray]:
        xs = [arg(p, inputs, i) for i in range(len(inputs))]
        nat = runtime.native(p)
        if nat is not None and _variadic_native(xs) and out_dtype(p, xs[0]) == xs[0].dtype:
            out = runtime.ort_output(p, 0, xs[0].shape, xs[0].dtype)
            return [nat.variadic_float(_VARIADIC_CODES[op], runtime.threads(p), out, *xs)]
        if nat is not None and _two_as_binary(xs, two) and out_dtype(p, xs[0]) == xs[0].dtype:
            return [nat.binary_num(_NUM_BINARY[two][0], xs[0], xs[1], None, runtime.threads(p))]
        acc = widen(xs[0])
        for x in xs[1:]:
            acc = fn(acc, widen(x))
        if op == "Mean":
            acc = acc / acc.dtype.type(len(xs))
        return [_store(p, acc, xs[0])]
    return run


def _variadic_binder(op: str, other: Callable | None = None) -> Callable:
    """The ``bind`` of a variadic op: one ``variadic_float`` call for same-shape float32/float16 inputs (constants
    held), into ORT's buffer when the result is a partition output; ``other`` binds the rest (and, where it binds,
    comes first: numpy's float32 Max/Min of two inputs)."""
    def bind(p: Prepared, inputs, outs):
        if other is not None and (step := other(p, inputs, outs)) is not None:
            return step
        xs = [arg(p, inputs, i) for i in range(len(inputs))]
        nat = runtime.native(p)
        if nat is None or not xs or not _variadic_native(xs) or outs[0].dtype != xs[0].dtype:
            return None
        given = [inputs[i] is not None for i in range(len(inputs))]
        live = [(3 + i, i, x.dtype, x.shape, None) for i, x in enumerate(xs) if given[i]]
        if not live:
            return None
        held = [None if given[i] else np.array(x, order="C") for i, x in enumerate(xs)]
        where = p.runtime.partition_outputs
        into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.variadic_float, (_VARIADIC_CODES[op], runtime.threads(p), None, *held),
                                 live, [(-1, None)], None, into)
    return bind


for _op, (_fn, _, _) in _BINARY.items():
    _bind = {"Pow": _pow_bind, "Div": _ufunc_binder(np.divide, 2, "f")}.get(_op) or _ufunc_binder(_fn, 2)
    if _op in _NATIVE_BINARY_OPS:
        _bind = _native_binder(_op, _bind)
    register(KernelDef("", _op, prepare, _pow_run if _op == "Pow" else _binary_runner(_fn, _op), cost, check,
                       rank_free=True, bind=_bind))
register(KernelDef("", "Mod", prepare, _mod_run, cost, _mod_check, rank_free=True, bind=_mod_bind))
# unary_f16's op codes (kernels/native/unary_f16.cc): float16 ops exact in float32, computed there, rounded once
_F16_UNARY = {"Relu": 0, "Abs": 1, "Neg": 2, "Sqrt": 3}
_F16_SIGN = 4  # unary_f16's Sign: on the bits, NaN gives 0 as ORT's float16 kernel (_sign_run)


def _f16_unary_binder(code: int, other: Callable | None) -> Callable:
    """The ``bind`` of a float16 Relu/Abs/Neg/Sqrt/Sign: one ``unary_f16`` call for this input shape, into ORT's buffer
    when the result is a partition output; ``other`` binds the other dtypes."""
    def bind(p: Prepared, inputs, outs):
        x = inputs[0] if inputs else None
        if not isinstance(x, np.ndarray) or x.dtype != _F16:
            return other(p, inputs, outs) if other is not None else None
        nat = runtime.native(p)
        if nat is None or outs[0].dtype != _F16:
            return None
        where = p.runtime.partition_outputs
        into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.unary_f16, (code, None, None, runtime.threads(p)),
                                 [(1, 0, _F16, x.shape, None)], [(-1, None)], None, into)
    return bind


_INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
# unary_num's op codes and the dtypes each takes (kernels/native/unary.cc)
_NUM_UNARY: dict[str, tuple[int, tuple[np.dtype, ...]]] = {
    "Relu": (0, (*_FLOATS, *_INTS)), "Abs": (1, (*_FLOATS, *_INTS)), "Neg": (2, (*_FLOATS, *_INTS)),
    "Sqrt": (3, _FLOATS), "Not": (4, (_BOOL,)),
}


# float32/float64 elements from which ``unary_num`` runs an op (below, a bound ufunc step costs ~0.15 us less per call
# than the kernel's; from here its loop saves more: float32 [1,128,384] sessions Relu 8.0 -> 7.3 us, Sqrt 17.6 ->
# 7.9; [1,4096] Relu/Abs even, Sqrt's ufunc 2x slower per element); integers from NATIVE_MIN_ELEMS (int64 Abs ran
# slower at 49152)
_NUM_FLOAT_FROM = {"Sqrt": 1 << 10}  # else 1 << 13


def _num_unary_min(x: np.ndarray, op: str) -> int:
    """The least elements from which ``unary_num`` takes x (``_NUM_FLOAT_FROM``, integers ``NATIVE_MIN_ELEMS``)."""
    return _NUM_FLOAT_FROM.get(op, 1 << 13) if x.dtype in _FLOATS else NATIVE_MIN_ELEMS


def _num_unary_binder(op: str, other: Callable | None) -> Callable:
    """The ``bind`` of Relu/Abs/Neg/Sqrt/Not on a C-order array of ``_NUM_UNARY``'s dtypes (``_num_unary_min``):
    one ``unary_num`` call for this input shape (threaded when large), into ORT's buffer when the result is a
    partition output; ``other`` binds the rest."""
    code, dtypes = _NUM_UNARY[op]

    def bind(p: Prepared, inputs, outs):
        x = inputs[0] if inputs else None
        if (not isinstance(x, np.ndarray) or x.dtype not in dtypes or x.size < _num_unary_min(x, op)
                or not x.flags.c_contiguous or outs[0].dtype != x.dtype):
            return other(p, inputs, outs) if other is not None else None
        nat = runtime.native(p)
        if nat is None:
            return None
        where = p.runtime.partition_outputs
        into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.unary_num, (code, None, None, runtime.threads(p)),
                                 [(1, 0, x.dtype, x.shape, None)], [(-1, None)], None, into)
    return bind


def class_f16_binder(test_of: Callable, other: Callable | None) -> Callable:
    """The ``bind`` of IsNaN / IsInf: on float16 one native bit test (``class_f16``, exact; numpy's float16 loops
    widen every element) for this input shape, ``test_of(p)`` its test code, into ORT's buffer when the result is a
    partition output; ``other`` binds the other dtypes."""
    def bind(p: Prepared, inputs, outs):
        x = inputs[0] if inputs else None
        if not isinstance(x, np.ndarray) or x.dtype != _F16:
            return other(p, inputs, outs) if other is not None else None
        nat = runtime.native(p)
        if nat is None or outs[0].dtype != np.bool_ or outs[0].shape != x.shape:
            return None
        where = p.runtime.partition_outputs
        into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.class_f16, (test_of(p), None, None, runtime.threads(p)),
                                 [(1, 0, _F16, x.shape, None)], [(-1, None)], None, into)
    return bind


def engine_or(other: Callable | None) -> Callable:
    """The ``bind`` of an op with an engine form for some dtypes: the engine's step where its program applies
    (``engine_bind``), else ``other``'s."""
    def bind(p: Prepared, inputs, outs):
        step = engine_bind(p, inputs, outs) if ENGINE_KEY in p.attrs else None
        if step is None and other is not None:
            step = other(p, inputs, outs)
        return step
    return bind


_SIGMOID_REFERENCE = _unary_runner(sigmoid)
_SIGN_REFERENCE = _unary_runner(np.sign)
for _op, (_fn, _, _) in _UNARY.items():
    if _op == "Sigmoid":
        register(KernelDef("", _op, prepare, engine_runner(_sigmoid_run), cost, check, rank_free=True,
                           bind=engine_or(_sigmoid_bind)))
    elif _op == "Erf":
        register(KernelDef("", _op, prepare, engine_runner(_unary_runner(_fn)), cost, check, rank_free=True,
                           bind=engine_bind))
    elif _op == "Sign":  # float16 binds unary_f16's bit test (the engine's widen-and-round costs 2x the CPU EP)
        register(KernelDef("", _op, prepare, engine_runner(_sign_run), cost, check, rank_free=True,
                           bind=_f16_unary_binder(_F16_SIGN, engine_or(_ufunc_binder(_fn, 1)))))
    elif _op == "IsNaN":  # float16: a native bit test; exact on other dtypes as the ufunc
        register(KernelDef("", _op, prepare, _unary_runner(_fn), cost, check, rank_free=True,
                           bind=class_f16_binder(lambda p: 0, ufunc_binder(_fn, 1))))
    elif _op in _SPLIT_F16:
        register(KernelDef("", _op, prepare, _split_f16_runner(_op, engine_runner(_unary_runner(_fn, None, _op))),
                           cost, check, rank_free=True,
                           bind=_split_binder(_op, engine_or(_ufunc_binder(_fn, 1)))))
    elif _op in _ENGINE_UNARY:
        _bind = _ufunc_binder(_fn, 1)
        _bind = _split_binder(_op, _bind) if _op in _SPLIT_UFUNCS else _bind
        register(KernelDef("", _op, prepare, engine_runner(_unary_runner(_fn, None, _op)), cost, check,
                           rank_free=True, bind=engine_or(_bind)))
    elif _op in _F16_UNARY:
        register(KernelDef("", _op, prepare, _unary_runner(_fn, _F16_UNARY[_op], _op), cost, check, rank_free=True,
                           bind=_f16_unary_binder(_F16_UNARY[_op], _num_unary_binder(
                               _op, _relu_bind if _op == "Relu" else _ufunc_binder(_fn, 1)))))
    elif _op in _NUM_UNARY:
        register(KernelDef("", _op, prepare, _unary_runner(_fn, None, _op), cost, check, rank_free=True,
                           bind=_num_unary_binder(_op, _ufunc_binder(_fn, 1))))
    elif _op not in _MS_UNARY:
        register(KernelDef("", _op, prepare, _unary_runner(_fn), cost, check, rank_free=True,
                           bind=_relu_bind if _op == "Relu" else _ufunc_binder(_fn, 1)))
# opset 20; approximate="tanh" switches
register(KernelDef("", "Gelu", prepare, engine_runner(_gelu_run), cost, check, rank_free=True, bind=engine_bind))
register(KernelDef("com.microsoft", "Gelu", prepare, engine_runner(_gelu_run), cost, check, rank_free=True,
                   bind=engine_bind))
register(KernelDef("com.microsoft", "FastGelu", prepare, engine_runner(_fast_gelu_run), cost, check,
                   rank_free=True, bind=_fast_gelu_bind))
def _pairwise_binder(fn: np.ufunc):
    """Min/Max of two inputs as its ufunc's native call (the kernel's one fold step), as the binary ops bind, float16
    too (its min/max is exact); same-shape float16 and other counts of inputs bind ``variadic_float`` (numpy's
    float16 loops are slow)."""
    bind = _ufunc_binder(fn, 2, exact_f16=True)

    def bind_two(p: Prepared, inputs, outs):
        if len(inputs) != 2:
            return None
        xs = [arg(p, inputs, 0), arg(p, inputs, 1)]
        return None if xs[0].dtype == _F16 and _variadic_native(xs) else bind(p, inputs, outs)
    return bind_two


# Output elements from which a Sum (Mean) of two binds binary_num's Add (Mean): below NATIVE_MIN_ELEMS it runs on one
# thread, yet costs less there than variadic_float's fold, whose call costs less on smaller tensors
_SUM_MIN_ELEMS = 1 << 14
_ADD_TWO = _native_binder("Add", None, _SUM_MIN_ELEMS)
_MEAN_TWO = _native_binder("Mean", None, _SUM_MIN_ELEMS)


def _sum_two(p: Prepared, inputs, outs):
    """Sum of two inputs of ``_SUM_MIN_ELEMS`` output elements or more as Add's ``binary_num`` (the same float32 add;
    broadcasting too, a constant on either side); float16 and the rest stay on ``variadic_float``."""
    x = arg(p, inputs, 0) if inputs else None
    return None if not isinstance(x, np.ndarray) or x.dtype == _F16 else _ADD_TWO(p, inputs, outs)


def _mean_two(p: Prepared, inputs, outs):
    """Mean of two float32/float64 inputs of ``_SUM_MIN_ELEMS`` output elements or more as ``binary_num``'s Mean
    ((a + b) / 2: the fold's add and divide; broadcasting too, a constant on either side); float16 and the rest stay
    on ``variadic_float``."""
    x = arg(p, inputs, 0) if inputs else None
    return None if not isinstance(x, np.ndarray) or x.dtype == _F16 else _MEAN_TWO(p, inputs, outs)


for _op, (_fn, _, _) in _VARIADIC.items():
    register(KernelDef("", _op, prepare, _variadic_runner(_op, _fn), cost, check, rank_free=True,
                       bind=_variadic_binder(_op, _native_binder(_op, _pairwise_binder(_fn))
                                             if _op in ("Min", "Max") else _sum_two if _op == "Sum"
                                             else _mean_two if _op == "Mean" else None)))
