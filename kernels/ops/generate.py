"""Ops that make tensors rather than read them: Range, ConstantOfShape, and Trilu (a generated triangle mask).

Range: ``n = max(ceil((limit - start) / delta), 0)`` as ORT computes it (the difference in the input dtype, the
division in double); float outputs accumulate ``value += delta`` in the input dtype like ORT's loop (not
``start + i * delta``, which rounds differently), integers are exact; on the native kernels ``range_fill``
(kernels/native/range.cc) computes the same and is bound as the step, into ORT's buffer when the result is a
partition output (asked for once the length is known). ConstantOfShape: the ``value`` attribute
(one element, default float32 0) broadcast to the runtime shape; on the native kernels ``fill_value``
(kernels/native/constant_of_shape.cc: its bits repeated), bound as the step for the shape's value, into ORT's buffer
when the result is a partition output. Trilu: keep ``j - i >= k`` (upper, default) or
``j - i <= k`` (lower) over the last two axes, zeros elsewhere; ``k`` is an optional scalar input. On the native
kernels ``trilu`` (kernels/native/trilu.cc: per row one memcpy of the kept columns and one memset, any dtype of 1, 2,
4 or 8 bytes) computes the same bytes and is bound as the step, into ORT's buffer when the result is a partition
output.

Cost: Range/ConstantOfShape write their output from the vector unit (one op per element, no input DMA);
Trilu streams input and output with one select per element.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost
from .movement import movable, ort_buffer, runtime_ints, static_ints


def _static_out_elems(node: NodeInfo) -> int | None:
    out = node.outputs[0]
    return elems(out.shape) if out.static else None


def _range_count(start, limit, delta) -> int:
    if delta == 0:
        raise ValueError("Range: delta is 0")
    diff = np.subtract(limit, start, dtype=np.asarray(start).dtype)
    return max(math.ceil(float(diff) / float(delta)), 0)


def _range_prepare(node: NodeInfo, target: Target) -> Prepared:
    consts = stash_constants(node)
    out_elems = _static_out_elems(node)
    if out_elems is None and all(f"in{i}" in consts for i in range(3)):
        out_elems = _range_count(*(consts[f"in{i}"].reshape(-1)[0] for i in range(3)))
    return Prepared({"itemsize": itemsize_of(node.inputs[0]), "out_elems": out_elems}, consts, target)


_RANGE_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int16, np.int32, np.int64))


def _native_range(values: list) -> bool:
    """Whether ``range_fill`` takes these inputs: one-element arrays of one Range dtype."""
    return (all(isinstance(v, np.ndarray) and v.size == 1 for v in values)
            and values[0].dtype in _RANGE_DTYPES and values[1].dtype == values[0].dtype == values[2].dtype)


def _range_lend(p: Prepared) -> Any:
    """``range_fill``'s lend: ORT's buffer for the output when it is a partition output (its length is known only
    once the values are read), else None."""
    where = p.runtime.partition_outputs
    ext = runtime.extension()
    if not where or 0 not in where or ext is None:
        return None
    return functools.partial(ext.partition_output, where[0])


def _range_run(p: Prepared, inputs) -> list[np.ndarray]:
    values = [arg(p, inputs, i) for i in range(3)]
    nat = runtime.native(p)
    if nat is not None and _native_range(values):
        y = nat.range_fill(*values, _range_lend(p), runtime.threads(p))
        if y is not None:
            return [y]
    start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in values)
    n = _range_count(start, limit, delta)
    if np.issubdtype(start.dtype, np.integer):
        return [np.arange(n, dtype=start.dtype) * delta + start]
    steps = np.full(n, delta, start.dtype)
    if n:
        steps[0] = start
    return [np.add.accumulate(steps, dtype=start.dtype)]  # sequential, as ORT's value += delta


def _range_bind(p: Prepared, inputs, outs):
    """Range as one ``range_fill`` call per step (its output's length follows the values), constants held in place;
    the kernel's None (delta 0, a count beyond reach) runs the Python kernel, which raises or answers."""
    values = [arg(p, inputs, i) for i in range(3)]
    nat = runtime.native(p)
    if nat is None or not _native_range(values):
        return None
    given = [i < len(inputs) and inputs[i] is not None for i in range(3)]
    live = [(i, i, v.dtype, v.shape, None) for i, v in enumerate(values) if given[i]]
    if not live:
        return None
    held = tuple(None if given[i] else np.array(v, order="C") for i, v in enumerate(values))
    return runtime.call_step(p, nat.range_fill, (*held, _range_lend(p), runtime.threads(p)), live, [(-1, None)])


def _cos_prepare(node: NodeInfo, target: Target) -> Prepared:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)[:1]
    shape = static_ints(node, 0)
    out_elems = _static_out_elems(node) if shape is None else int(np.prod(shape, dtype=np.int64))
    return Prepared({"shape": shape, "itemsize": value.dtype.itemsize, "out_elems": out_elems},
                    {"value": np.ascontiguousarray(value)}, target)


def _cos_check(node: NodeInfo, target: Target) -> str | None:
    value = node.attr("value")
    if value is not None and (np.asarray(value).size != 1 or np.asarray(value).dtype.kind not in "biuf"):
        return f"{node.describe()}: ConstantOfShape value must be one numeric element"
    return None


def _cos_run(p: Prepared, inputs) -> list[np.ndarray]:
    shape = runtime_ints(p, inputs, "shape", 0)
    if min(shape, default=0) < 0:
        raise ValueError(f"ConstantOfShape: negative dimension in {shape}")
    nat = runtime.native(p)
    if nat is not None and movable(p.consts["value"]):
        return [nat.fill_value(shape, p.consts["value"], None, runtime.threads(p))]
    return [np.full(shape, p.consts["value"][0], p.consts["value"].dtype)]


def _cos_bind(p: Prepared, inputs, outs):
    """ConstantOfShape as one ``fill_value`` call for this shape (a runtime shape must hold its bound value), into
    ORT's buffer when the result is a partition output."""
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 0) if p.attrs["shape"] is None else []
    shape = runtime_ints(p, inputs, "shape", 0)
    if nat is None or fixed is None or shape is None or min(shape, default=0) < 0 or not movable(p.consts["value"]):
        return None
    args = (shape, p.consts["value"], None, runtime.threads(p))
    return runtime.call_step(p, nat.fill_value, args, [], [(-1, None)], None, ort_buffer(p, outs, 2), fixed)


def _generated_cost(p: Prepared, shapes) -> OpCost:
    """Unknown output size (runtime bounds and no static output shape) counts as one element."""
    n = p.attrs["out_elems"] or 1
    return stream_cost(p, n, 0, n * p.attrs["itemsize"], 1.0)


def _trilu_prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs: dict[str, Any] = {"upper": int(node.attr("upper", 1)), "k": static_ints(node, 1),
                             "itemsize": itemsize_of(node.inputs[0])}
    return Prepared(attrs, stash_constants(node), target)


def _trilu_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    if x.ndim < 2:
        raise ValueError(f"Trilu: input of rank {x.ndim} (needs >= 2)")
    k = runtime_ints(p, inputs, "k", 1)
    k = 0 if k is None else k[0]
    nat = runtime.native(p)
    if nat is not None and movable(x):
        return [nat.trilu(x, k, bool(p.attrs["upper"]), None, runtime.threads(p))]
    return [np.triu(x, k) if p.attrs["upper"] else np.tril(x, k)]


def _trilu_bind(p: Prepared, inputs, outs):
    """Trilu as one ``trilu`` call for this input shape and k (a runtime k must hold its bound value), into ORT's
    buffer when the result is a partition output."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 1)
    if nat is None or fixed is None or not movable(x) or x.ndim < 2:
        return None
    k = runtime_ints(p, inputs, "k", 1)
    args = (None, 0 if k is None else k[0], bool(p.attrs["upper"]), None, runtime.threads(p))
    return runtime.call_step(p, nat.trilu, args, [(0, 0, x.dtype, x.shape, None, True)], [(-1, None)], None,
                             ort_buffer(p, outs, 3), fixed)


def _trilu_cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    moved = nbytes(shapes[0], p.attrs["itemsize"])
    return stream_cost(p, n, moved, moved, 1.0)


register(KernelDef("", "Range", _range_prepare, _range_run, _generated_cost, rank_free=True, bind=_range_bind))
register(KernelDef("", "ConstantOfShape", _cos_prepare, _cos_run, _generated_cost, _cos_check, rank_free=True,
                   bind=_cos_bind))
register(KernelDef("", "Trilu", _trilu_prepare, _trilu_run, _trilu_cost, rank_free=True, bind=_trilu_bind))
