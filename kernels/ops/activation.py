"""Element-wise ops whose behaviour depends on attributes or optional operands: Clip (bounds as opset-11+ inputs
or opset-6 attributes, either may be absent), HardSigmoid, HardSwish, LeakyRelu, Elu, Selu, Softplus, Softsign,
PRelu (slope broadcast to x) and IsInf (detect_negative/detect_positive).

Numerics as the element-wise kernels: float16 widens to float32, one rounding on store; Clip and PRelu compute in
the input dtype (Clip also takes integers; it is exact there). Clip is ``min(max(x, lo), hi)`` like ORT, so
lo > hi gives hi everywhere.

Each op is a row ``op -> (fn(x, attrs), attribute defaults, plain ops/element, transcendental ops/element)``; the
cost is ``_vector.stream_cost`` over the output elements with DMA of every input and the output.

Float32 and float16 LeakyRelu, HardSigmoid, HardSwish and PRelu of one constant slope run on the element-wise
engine (``elementwise.engine_runner``: conv-tail instructions, the same float32 operations as the functions here); a
float32 PRelu whose slope varies along one run of x's axes (per channel) runs natively per row (``prelu_rows``). A
Clip with constant bounds binds one clip ufunc call as the step (float32/float64, integers; ``clip_num``, threaded,
on large tensors) or ``clip_f16`` (float16, also its run), a Clip without bounds a view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost, widen
from ..tail_program import unary_program
from .elementwise import (CLIP_UFUNC, ENGINE_KEY, FLOAT_RANGES, NATIVE_MIN_ELEMS, class_f16_binder, clip_float,
                          engine_bind, engine_runner, ufunc_binder)


def _f(x: np.ndarray, v: float) -> np.generic:
    """An attribute as a scalar of x's compute dtype (so fp32 math stays fp32 as in ORT)."""
    return x.dtype.type(v)


def _hard_sigmoid(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    y = x * a["alpha"]
    y += a["beta"]
    return CLIP_UFUNC(y, a["zero"], a["one"], out=y)


def _hard_swish(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    return x * _hard_sigmoid(x, a)  # alpha 1/6, beta 0.5: fixed defaults (HardSwish has no attributes)


def _leaky_relu(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    return np.where(x >= 0, x, x * _f(x, a["alpha"]))


def _elu(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x >= 0, x, np.expm1(np.minimum(x, _f(x, 0.0))) * _f(x, a["alpha"]))


def _selu(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    neg = np.expm1(np.minimum(x, _f(x, 0.0))) * _f(x, a["alpha"])
    return np.where(x > 0, x, neg) * _f(x, a["gamma"])


def _softplus(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    return np.logaddexp(_f(x, 0.0), x)  # log(1 + exp(x)) without overflow


def _softsign(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    return x / (_f(x, 1.0) + np.abs(x))


def _is_inf(x: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    neg, pos = bool(a["detect_negative"]), bool(a["detect_positive"])
    if neg and pos:
        return np.isinf(x)
    if pos:
        return np.isposinf(x)
    return np.isneginf(x) if neg else np.zeros(x.shape, np.bool_)


# op -> (fn on the compute dtype, attribute defaults, ops/element, transcendental ops/element)
_PARAM_UNARY: dict[str, tuple[Callable[[np.ndarray, dict[str, Any]], np.ndarray], dict[str, Any], float, float]] = {
    "HardSigmoid": (_hard_sigmoid, {"alpha": 0.2, "beta": 0.5}, 3.0, 0.0),
    "HardSwish": (_hard_swish, {"alpha": 1.0 / 6.0, "beta": 0.5}, 4.0, 0.0),
    "LeakyRelu": (_leaky_relu, {"alpha": 0.01}, 2.0, 0.0),
    "Elu": (_elu, {"alpha": 1.0}, 3.0, 1.0),
    "Selu": (_selu, {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, 4.0, 1.0),
    "Softplus": (_softplus, {}, 2.0, 2.0),  # exp + log
    "Softsign": (_softsign, {}, 2.0, 1.0),  # reciprocal
    "IsInf": (_is_inf, {"detect_negative": 1, "detect_positive": 1}, 1.0, 0.0),
}
_FLOAT_ONLY = set(_PARAM_UNARY) - {"IsInf"}


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    op = node.op_type
    out = node.outputs[0]
    attrs: dict[str, Any] = {"op": op, "in_itemsizes": [itemsize_of(v) for v in node.inputs],
                             "out_itemsize": itemsize_of(out),
                             "out_dtype": out.dtype.name if out.dtype is not None else None}
    if op in _PARAM_UNARY:
        attrs["params"] = {k: type(v)(node.attr(k, v)) for k, v in _PARAM_UNARY[op][1].items()}
    if op == "Clip" and (node.attr("min") is not None or node.attr("max") is not None):
        attrs["bounds"] = [node.attr("min"), node.attr("max")]  # opset 6: attributes
    engine = _engine_instructions(node, attrs.get("params", {}))
    if engine:
        attrs[ENGINE_KEY] = engine
    return Prepared(attrs, stash_constants(node), target)


def _engine_instructions(node: NodeInfo, params: dict[str, Any]) -> list[list] | None:
    """The op's float32 form on the element-wise engine (conv-tail instructions, as fusion.conv_tail's), or None."""
    f32 = {k: float(np.float32(v)) for k, v in params.items()}
    op = node.op_type
    if op == "LeakyRelu":
        return [["leaky_relu", f32["alpha"], 0.0]]
    if op == "HardSigmoid":
        return [["mul", f32["alpha"], 0.0], ["add", f32["beta"], 0.0], ["clip", 0.0, 1.0]]
    if op == "HardSwish":
        return [["save", 0.0, 0.0], ["mul", f32["alpha"], 0.0], ["add", f32["beta"], 0.0], ["clip", 0.0, 1.0],
                ["mul_saved", 0.0, 0.0]]
    x = node.input(0)
    if op in ("Elu", "Selu", "Softplus", "Softsign") and x is not None and x.dtype in (np.float32, np.float16):
        return [list(t) for t in unary_program(op, x.dtype, params)]
    slope = node.input(1) if op == "PRelu" else None
    if slope is not None and slope.value is not None and np.asarray(slope.value).size == 1:
        return [["leaky_relu", float(np.asarray(slope.value, np.float32).reshape(-1)[0]), 0.0]]
    return None


def _check(node: NodeInfo, target: Target) -> str | None:
    for v in (*node.inputs, *node.outputs):
        if not v.missing and v.dtype is None:
            return f"{node.describe()}: {v.name} has a dtype the NPU cannot carry"
    x = node.input(0)
    if node.op_type in _FLOAT_ONLY | {"PRelu"} and not np.issubdtype(x.dtype, np.floating):
        return f"{node.describe()}: {node.op_type} of {x.dtype} (only float inputs)"
    return None


def _out_dtype(p: Prepared, x: np.ndarray) -> np.dtype:
    dt = p.kernel_cache.get("out_dtype")
    if dt is None:
        dt = p.kernel_cache["out_dtype"] = np.dtype(p.attrs["out_dtype"] or x.dtype)
    return dt


def _param_runner(fn: Callable[[np.ndarray, dict[str, Any]], np.ndarray]):
    """The run function of one op of ``_PARAM_UNARY``: ``fn`` gets the attributes (and ``zero``, ``one``) as 0-d
    arrays of the compute dtype, made once per dtype (building them per call cost more than a small tensor's math)."""
    def run(p: Prepared, inputs) -> list[np.ndarray]:
        x = arg(p, inputs, 0)
        xc = widen(x)
        typed = p.kernel_cache.get(("typed_params", xc.dtype))
        if typed is None:
            params = {**p.attrs["params"], "zero": 0.0, "one": 1.0}
            # 0-d arrays: a ufunc converts a numpy-scalar operand to an array on every call
            typed = p.kernel_cache[("typed_params", xc.dtype)] = {k: np.array(v, xc.dtype) for k, v in params.items()}
        y = fn(xc, typed)
        dt = _out_dtype(p, x)
        return [y if type(y) is np.ndarray and y.dtype == dt else np.asarray(y).astype(dt, copy=False)]
    return run


def _clip_bounds(p: Prepared, inputs, dtype: np.dtype) -> tuple[Any, Any]:
    """(lo, hi) of this call, None where that side is open."""
    if "bounds" in p.attrs:  # opset-6 attributes: 0-d arrays of x's dtype, made once per dtype
        key = ("bounds", dtype)
        return p.kernel_cache.get(key) or p.kernel_cache.setdefault(key, tuple(
            None if b is None else np.array(b).astype(dtype) for b in p.attrs["bounds"]))
    return arg(p, inputs, 1), arg(p, inputs, 2)


def _half_clip(x, lo, hi) -> bool:
    """Whether ``clip_f16`` takes this float16 Clip: C-order x, one-element float16 bounds, at least one."""
    return (type(x) is np.ndarray and x.dtype == _F16 and x.flags.c_contiguous and (lo is not None or hi is not None)
            and all(b is None or (isinstance(b, np.ndarray) and b.dtype == _F16 and b.size == 1) for b in (lo, hi)))


def _clip_run(p: Prepared, inputs) -> list[np.ndarray]:
    """``min(max(x, lo), hi)`` with each bound optional (an omitted input or attribute leaves that side open)."""
    x = arg(p, inputs, 0)
    lo, hi = _clip_bounds(p, inputs, x.dtype)
    if _half_clip(x, lo, hi):
        nat = runtime.native(p)
        if nat is not None:
            return [nat.clip_f16(x, lo, hi, None, runtime.threads(p))]
    same = x.dtype in FLOAT_RANGES and (lo is None or lo.dtype == x.dtype) and (hi is None or hi.dtype == x.dtype)
    if same and x.ndim and (lo is not None or hi is not None):
        if (bounds := _num_clip_bounds(x, lo, hi)) is not None and (nat := runtime.native(p)) is not None:
            y = nat.clip_num(x, *bounds, None, runtime.threads(p))
            if y is not None:
                return [y]
        return [clip_float(x, lo, hi)]
    y = x
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi)
    return [np.asarray(y)]  # no bounds: a view of x, as the movement kernels return


_INT_RANGES: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {
    np.dtype(t): (np.array(np.iinfo(t).min, t), np.array(np.iinfo(t).max, t))
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)}


def _num_clip_bounds(x, lo, hi) -> tuple[np.ndarray, np.ndarray] | None:
    """(lo, hi) for ``clip_num`` (kernels/native/unary.cc: numpy's clip, threaded) when it takes this Clip, the open
    sides at the reference's defaults: a large C-order float32/float64/integer x, one-element bounds of its dtype,
    neither NaN (numpy fills NaN then); else None."""
    ranges = FLOAT_RANGES.get(x.dtype) or _INT_RANGES.get(x.dtype)
    if ranges is None or type(x) is not np.ndarray or x.size < NATIVE_MIN_ELEMS or not x.flags.c_contiguous:
        return None
    bounds = (ranges[0] if lo is None else lo, ranges[1] if hi is None else hi)
    if any(not isinstance(b, np.ndarray) or b.dtype != x.dtype or b.size != 1
           or (b.dtype.kind == "f" and np.isnan(b)) for b in bounds):
        return None
    return bounds


def _clip_bind(p: Prepared, inputs, outs):
    """A Clip with constant bounds (inputs or attributes) as one clip ufunc call for this input shape, into ORT's
    buffer when the result is a partition output: float32/float64 as ``clip_float`` calls it (the open sides at ORT's
    defaults), integers with the open sides at the type's limits (the kernel's max then min: the same values, exact).
    float16 binds ``clip_f16`` (numpy's float16 maximum then minimum); a Clip without bounds is a view step (the
    kernel returns x); runtime bounds stay on the kernel."""
    x = inputs[0] if inputs else None
    if (not isinstance(x, np.ndarray) or outs[0].dtype != x.dtype
            or any(i < len(inputs) and inputs[i] is not None for i in (1, 2))):
        return None
    lo, hi = _clip_bounds(p, inputs, x.dtype)
    if lo is None and hi is None:
        ext = runtime.extension()
        return None if ext is None else ext.ViewStep(x.shape, x.shape, len(inputs), [])
    if _half_clip(x, lo, hi):  # numpy's float16 maximum then minimum: clip_f16 chooses the same bits
        nat = runtime.native(p)
        return None if nat is None else runtime.call_step(
            p, nat.clip_f16, (None, lo, hi, None, runtime.threads(p)), [(0, 0, x.dtype, x.shape, None)], [(-1, None)])
    ranges = FLOAT_RANGES.get(x.dtype) or _INT_RANGES.get(x.dtype)
    if (ranges is None or not x.flags.c_contiguous or x.ndim == 0
            or any(b is not None and b.dtype != x.dtype for b in (lo, hi))):
        return None  # float16 (computed in float32), 0-d, or bounds of another dtype (numpy's promotion)
    where = p.runtime.partition_outputs
    into = [(3, where[0], list(outs[0].shape))] if where and 0 in where else []
    if (bounds := _num_clip_bounds(x, lo, hi)) is not None and (nat := runtime.native(p)) is not None:
        return runtime.call_step(p, nat.clip_num, (None, *bounds, None, runtime.threads(p)),
                                 [(0, 0, x.dtype, x.shape, None)], [(-1, None)], None, into)
    return runtime.call_step(p, CLIP_UFUNC, (None, ranges[0] if lo is None else lo, ranges[1] if hi is None else hi,
                                             None),
                             [(0, 0, x.dtype, x.shape, None)], [(-1, None)], None, into, keywords=("out",))


def _prelu_reference(p: Prepared, inputs) -> list[np.ndarray]:
    x, slope = arg(p, inputs, 0), arg(p, inputs, 1)
    xc = widen(x)
    return [np.where(xc < 0, xc * widen(slope), xc).astype(x.dtype, copy=False)]


_PRELU_ENGINE = engine_runner(_prelu_reference)
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)


def slope_rows(x_shape: tuple[int, ...], slope_shape: tuple[int, ...]) -> int | None:
    """The row length ``inner`` that views PRelu's x as [rows, inner] with one slope per row (row r's slope
    ``slope.flat[r % slope.size]``): the slope's axes other than 1 (aligned to x's last axes) must be one run of
    x's axes with x's sizes; None otherwise (or when the slope would widen the output)."""
    if len(slope_shape) > len(x_shape):
        return None
    s = (1,) * (len(x_shape) - len(slope_shape)) + tuple(slope_shape)
    axes = [i for i, d in enumerate(s) if d != 1]
    if not axes or axes != list(range(axes[0], axes[-1] + 1)) or any(s[i] != x_shape[i] for i in axes):
        return None
    return int(np.prod(x_shape[axes[-1] + 1:], dtype=np.int64))


def _prelu_rows_ok(p: Prepared, x, slope) -> int | None:
    """``inner`` when float32 x and slope run on the native per-row PRelu, else None."""
    if (runtime.native(p) is None or not isinstance(x, np.ndarray) or not isinstance(slope, np.ndarray)
            or x.dtype != _F32 or slope.dtype != _F32 or not x.ndim or not x.size or _out_dtype(p, x) != _F32):
        return None
    inner = slope_rows(x.shape, slope.shape)
    return inner if inner else None


def _prelu_run(p: Prepared, inputs) -> list[np.ndarray]:
    """PRelu; one constant slope of a rank the output keeps is LeakyRelu on the engine, a per-channel slope the
    native per-row PRelu (both the same float32 operations as the reference)."""
    x, slope = arg(p, inputs, 0), arg(p, inputs, 1)
    if ENGINE_KEY in p.attrs and slope.ndim <= x.ndim:
        return _PRELU_ENGINE(p, inputs)
    inner = _prelu_rows_ok(p, x, slope)
    if inner is not None:
        out = runtime.ort_output(p, 0, x.shape, _F32)
        return [runtime.native(p).prelu_rows(np.ascontiguousarray(x), np.ascontiguousarray(slope), inner,
                                             runtime.threads(p), out)]
    return _prelu_reference(p, inputs)


def _prelu_bind(p: Prepared, inputs, outs):
    """PRelu as one native call for these shapes: the engine's for one constant slope, else ``prelu_rows``."""
    if ENGINE_KEY in p.attrs:
        return engine_bind(p, inputs, outs)
    x, slope = arg(p, inputs, 0), arg(p, inputs, 1)
    inner = _prelu_rows_ok(p, x, slope)
    if (inner is None or inputs[0] is None or not x.flags.c_contiguous or not slope.flags.c_contiguous
            or outs[0].shape != x.shape):
        return None
    ins = [(0, 0, _F32, x.shape, None)] + ([] if len(inputs) < 2 or inputs[1] is None
                                           else [(1, 1, _F32, slope.shape, None)])
    where = p.runtime.partition_outputs  # written into ORT's buffer when y is an output of the partition
    into = [(4, where[0], list(x.shape))] if where and 0 in where else []
    args = (None, None if len(ins) == 2 else slope, inner, runtime.threads(p), None)
    return runtime.call_step(p, runtime.native(p).prelu_rows, args, ins, [(-1, None)],
                             None, into)


def _cost(p: Prepared, shapes) -> OpCost:
    op = p.attrs["op"]
    present = [s for s in shapes if s is not None]
    n = elems(np.broadcast_shapes(*present)) if present else 0
    _, _, ops, trans = _PARAM_UNARY.get(op, (None, None, 2.0, 0.0))  # Clip, PRelu: compare + select
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in, n * p.attrs["out_itemsize"], ops, trans)


_IS_INF_UFUNC = ufunc_binder(np.isinf, 1)


def _is_inf_ufunc_bind(p: Prepared, inputs, outs):
    """IsInf detecting both signs as np.isinf's call; one sign stays on the kernel."""
    params = p.attrs["params"]
    return _IS_INF_UFUNC(p, inputs, outs) if params["detect_negative"] and params["detect_positive"] else None


def _is_inf_test(p: Prepared) -> int:
    """class_f16's test code for this node's signs: 1 both, 2 positive, 3 negative, -1 neither (the kernel's)."""
    neg, pos = p.attrs["params"]["detect_negative"], p.attrs["params"]["detect_positive"]
    if neg and pos:
        return 1
    return 2 if pos else 3 if neg else -1


def _is_inf_bind(p: Prepared, inputs, outs):
    """IsInf: float16 as one native bit test for the signs asked (``class_f16``), other dtypes as np.isinf."""
    if _is_inf_test(p) < 0:
        return None
    return _IS_INF_F16(p, inputs, outs)


_IS_INF_F16 = class_f16_binder(_is_inf_test, _is_inf_ufunc_bind)


_ENGINE_OPS = ("LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus", "Softsign")
for _op, (_fn, _, _, _) in _PARAM_UNARY.items():
    _engine = _op in _ENGINE_OPS
    _bind = engine_bind if _engine else _is_inf_bind if _op == "IsInf" else None
    register(KernelDef("", _op, _prepare, engine_runner(_param_runner(_fn)) if _engine else _param_runner(_fn), _cost,
                       _check, rank_free=True, bind=_bind))
register(KernelDef("", "Clip", _prepare, _clip_run, _cost, _check, rank_free=True, bind=_clip_bind))
register(KernelDef("", "PRelu", _prepare, _prelu_run, _cost, _check, rank_free=True, bind=_prelu_bind))
