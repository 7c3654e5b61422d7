"""com.microsoft QLinearSigmoid and QLinearConcat: 8-bit in, 8-bit out, through 256-entry lookup tables.

As ORT 1.31's CPU kernels (qlinear_lookup_table.cc, qlinear_concat.cc), every 8-bit input value v (indexed by its
byte) maps through ``table[v] = quantize(f(float32(x_scale * (v - x_zp))), y_scale, y_zp)`` with the ONNX
QuantizeLinear rounding (``_matrix.quantize_float``: divide, round half to even, add zp, saturate):
  QLinearSigmoid: f = sigmoid, evaluated here as 1 / (1 + exp(-x)) in float64 rounded to float32. ORT's MLAS
    logistic is a rational approximation a few float32 ulps off, so an entry that sits on a rounding boundary can
    differ by one quantum (the tests allow exactly that).
  QLinearConcat: f = identity (a requantization), skipped (a plain copy) for an input whose scale and zero point
    equal the output's, as ORT does. Inputs: y_scale, y_zp, then (x, x_scale, x_zp) per tensor.
Tables are built once per node when the quantization parameters are constant, else per call (256 entries).
On the native kernels QLinearSigmoid's table read is ``qdq_lut`` (kernels/native/qdq_lut.cc), bound as the step for
its input shape; its quantization parameters, when fed at run time, are held to the bound values. QLinearConcat's
copies and table reads are ``qlinear_concat`` (kernels/native/qlinear_concat.cc), bound the same way.

Cost: ``_vector.stream_cost`` over the output elements, one gather per element; DMA of inputs and the output.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._matrix import quantize_float
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost
from .qlinear_binary import check_quant_params, scalar

_ALL_BYTES = np.arange(256, dtype=np.uint8)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def build_table(qtype: str, x_scale, x_zp, y_scale, y_zp, fn=None) -> np.ndarray:
    """The 256-entry table indexed by an input's byte (module docstring)."""
    values = _ALL_BYTES.view(qtype).astype(np.int32) - np.int32(x_zp)
    x = np.float32(x_scale) * values.astype(np.float32)
    return quantize_float(x if fn is None else fn(x), np.float32(y_scale), np.float32(y_zp), qtype)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    data = 0 if node.op_type == "QLinearSigmoid" else 2
    attrs = {"op": node.op_type, "qtype": node.input(data).dtype.name, "axis": int(node.attr("axis", 0)),
             "in_itemsizes": [itemsize_of(v) for v in node.inputs]}
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    if node.op_type == "QLinearSigmoid":
        x = node.input(0)
        if x is None or x.dtype not in (np.int8, np.uint8):
            return f"{op}: QLinearSigmoid needs int8 or uint8 data"
        return check_quant_params(node, ((1, 2), (3, 4)))
    n_in = len(node.inputs)
    if n_in < 5 or (n_in - 2) % 3:
        return f"{op}: QLinearConcat needs y_scale, y_zero_point and (x, x_scale, x_zero_point) triples"
    dt = node.input(2).dtype if node.input(2) is not None else None
    for i in range(2, n_in, 3):
        x = node.input(i)
        if x is None or x.dtype not in (np.int8, np.uint8) or x.dtype != dt:
            return f"{op}: QLinearConcat needs int8 or uint8 data of one dtype"
    y_zp = node.input(1)
    if y_zp is None or y_zp.dtype != dt:
        return f"{op}: QLinearConcat needs y_zero_point of the data dtype {dt}"
    return check_quant_params(node, ((0, 1),) + tuple((i + 1, i + 2) for i in range(2, n_in, 3)), data_index=2)


def _table(p: Prepared, inputs, key, idx: tuple[int, int, int, int], fn=None) -> np.ndarray | None:
    """The lookup table of one input (memoized when its parameters are constants); None when it is a copy."""
    t = p.kernel_cache.get(key)
    if t is not None:
        return t
    sx, zx, sy, zy = (scalar(p, inputs, i) for i in idx)
    t = None if fn is None and sx == sy and zx == zy else build_table(p.attrs["qtype"], sx, zx, sy, zy, fn)
    if all(i >= len(inputs) or inputs[i] is None for i in idx):
        p.kernel_cache[key] = t if t is not None else False
    return t


def _sigmoid_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    table = _table(p, inputs, "table", (1, 2, 3, 4), _sigmoid)
    nat = runtime.native(p)
    if nat is not None and x.flags.c_contiguous:
        return [nat.qdq_lut(x, None, table, runtime.threads(p))]
    return [table[x.view(np.uint8)]]


def _sigmoid_bind(p: Prepared, inputs, outs):
    """QLinearSigmoid as one ``qdq_lut`` call on its table for this input shape; scales and zero points fed at run
    time are held to these values (the table is theirs)."""
    x = arg(p, inputs, 0)
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 1)
    if nat is None or fixed is None or not isinstance(x, np.ndarray) or x.dtype not in (np.int8, np.uint8):
        return None
    table = _table(p, inputs, "table", (1, 2, 3, 4), _sigmoid)
    live = [(0, 0, x.dtype, x.shape, None)]
    return runtime.call_step(p, nat.qdq_lut, (None, None, table, runtime.threads(p)), live, [(-1, None)],
                             fixed=fixed)


def _concat_tables(p: Prepared, inputs) -> list[np.ndarray | None]:
    """Each part's requantization table, None for a part that is copied (its parameters are the output's)."""
    tables = []
    for i in range(2, len(p.attrs["in_itemsizes"]), 3):
        t = _table(p, inputs, ("table", i), (i + 1, i + 2, 0, 1))
        tables.append(None if t is None or t is False else t)
    return tables


def _concat_native(parts: list) -> bool:
    """Whether ``qlinear_concat`` takes these parts: C-order int8/uint8 arrays of one dtype with a rank."""
    return all(type(x) is np.ndarray and x.dtype == parts[0].dtype and x.dtype in (np.int8, np.uint8) and x.ndim
               and x.flags.c_contiguous for x in parts)


def _concat_run(p: Prepared, inputs) -> list[np.ndarray]:
    """The parts copied or mapped through their tables, joined; on the native kernels ``qlinear_concat``
    (kernels/native/qlinear_concat.cc: the same table reads, one pass into the output)."""
    parts = [arg(p, inputs, i) for i in range(2, len(p.attrs["in_itemsizes"]), 3)]
    tables = _concat_tables(p, inputs)
    nat = runtime.native(p)
    if nat is not None and _concat_native(parts):
        return [nat.qlinear_concat(p.attrs["axis"], tables, None, runtime.threads(p), *parts)]
    return [np.concatenate([x if t is None else t[x.view(np.uint8)] for x, t in zip(parts, tables)],
                           axis=p.attrs["axis"])]


def _concat_bind(p: Prepared, inputs, outs):
    """QLinearConcat as one ``qlinear_concat`` call for these part shapes with their tables, into ORT's buffer when
    the result is a partition output; scales and zero points fed at run time are held to these values (the tables
    are theirs)."""
    data = range(2, len(p.attrs["in_itemsizes"]), 3)
    parts = [arg(p, inputs, i) for i in data]
    nat = runtime.native(p)
    if nat is None or not _concat_native(parts):
        return None
    fixed = []
    for i in range(len(p.attrs["in_itemsizes"])):
        if i not in data and i < len(inputs) and inputs[i] is not None:
            held = runtime.fixed_inputs([inputs[i]], 0)
            if held is None:
                return None
            fixed.append((i, held[0][1]))
    given = [i < len(inputs) and inputs[i] is not None for i in data]
    live = [(4 + k, i, x.dtype, x.shape, None) for k, (i, x) in enumerate(zip(data, parts)) if given[k]]
    if not live:
        return None
    held_parts = [None if given[k] else np.array(x, order="C") for k, x in enumerate(parts)]
    where = p.runtime.partition_outputs
    into = [(2, where[0], list(outs[0].shape))] if where and 0 in where else []
    args = (p.attrs["axis"], _concat_tables(p, inputs), None, runtime.threads(p), *held_parts)
    return runtime.call_step(p, nat.qlinear_concat, args, live, [(-1, None)], None, into, fixed)


def _cost(p: Prepared, shapes) -> OpCost:
    data = [0] if p.attrs["op"] == "QLinearSigmoid" else range(2, len(shapes), 3)
    n = sum(elems(shapes[i]) for i in data if shapes[i] is not None)
    b_in = sum(nbytes(s, sz) for s, sz in zip(shapes, p.attrs["in_itemsizes"]) if s is not None)
    return stream_cost(p, n, b_in + 256 * len(data), n, 1.0)


register(KernelDef("com.microsoft", "QLinearSigmoid", _prepare, _sigmoid_run, _cost, _check, bind=_sigmoid_bind))
register(KernelDef("com.microsoft", "QLinearConcat", _prepare, _concat_run, _cost, _check, bind=_concat_bind))
