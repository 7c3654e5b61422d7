"""``npu::QdqLut``: an 8-bit element-wise QDQ unit (or a chain of them) as one table read per element.

Built by ``kernels/fusion/qdq_lut.py``. Inputs: one or two 8-bit tensors, then the constant table (the output's
8-bit type): 256 entries indexed by the byte of the one input, or 65536 indexed by ``256 * byte(a) + byte(b)``
with ONNX broadcasting of a and b. The native kernel (``kernels/native/qdq_lut.cc``) takes one input, two of one
shape, or a per-channel operand (one 256-entry row of the table per run of the other's elements); other
broadcasts, and the reference model, are numpy fancy indexing. ``bind`` makes the native call the step for the
bound input shapes, writing ORT's buffer when the result is a partition output.

Cost: ``_vector.stream_cost`` over the output elements, one gather per element; DMA of the inputs, the table and
the output.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import nbytes
from ._vector import elems, stream_cost


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    table = np.ascontiguousarray(node.inputs[-1].value)
    return Prepared({"binary": len(node.inputs) == 3, "out": table.dtype.name}, {"table": table}, target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    n_src = len(node.inputs) - 1
    t = node.inputs[-1].value if node.inputs else None
    if n_src not in (1, 2) or t is None or t.dtype not in (np.uint8, np.int8) or t.size != 256 ** n_src:
        return f"{op}: needs one or two 8-bit inputs and a constant 8-bit table of 256 ** inputs entries"
    if any(v.dtype not in (np.uint8, np.int8) for v in node.inputs[:-1]):
        return f"{op}: inputs must be uint8 or int8"
    return None


def reference(table: np.ndarray, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """The table read in numpy: ``table[a]`` or ``table[256 * a + b]`` (broadcast)."""
    if b is None:
        return table[a.view(np.uint8)]
    return table[(a.view(np.uint8).astype(np.uint16) << 8) | b.view(np.uint8)]


def _inner(big: tuple[int, ...], small: tuple[int, ...]) -> int | None:
    """Elements of ``big`` per element of ``small`` when ``small`` broadcasts as a run-constant operand (its shape
    is a prefix of big's, then ones: per channel), else None."""
    if len(small) > len(big):
        return None
    s = (1,) * (len(big) - len(small)) + tuple(small)
    k = max((i + 1 for i, d in enumerate(s) if d != 1), default=0)
    if s[:k] != tuple(big[:k]):
        return None
    return int(np.prod(big[k:], dtype=np.int64))


def _rows_by_b(p: Prepared) -> np.ndarray:
    """The 65536-entry table transposed, so a per-channel second operand picks a 256-entry row (made once)."""
    rows = p.kernel_cache.get("rows_by_b")
    if rows is None:
        rows = p.kernel_cache["rows_by_b"] = np.ascontiguousarray(p.consts["table"].reshape(256, 256).T).reshape(-1)
    return rows


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    table = p.consts["table"]
    a = inputs[0]
    b = inputs[1] if p.attrs["binary"] else None
    nat = runtime.native(p)
    if nat is not None and (b is None or a.shape == b.shape):
        y = nat.qdq_lut(np.ascontiguousarray(a), None if b is None else np.ascontiguousarray(b), table,
                        runtime.threads(p))
        return [y.reshape(a.shape)]
    if nat is not None and b is not None:
        small_b = b.size <= a.size
        big, small = (a, b) if small_b else (b, a)
        inner = _inner(big.shape, small.shape)
        if inner:
            rows = _rows_by_b(p) if small_b else table
            return [nat.qdq_lut_rows(np.ascontiguousarray(big), np.ascontiguousarray(small), inner, rows,
                                     runtime.threads(p))]
    return [reference(table, a, b)]


def _bind(p: Prepared, inputs, outs):
    """The table read as one native step for these input shapes (``qdq_lut``, or ``qdq_lut_rows`` for a per-channel
    operand), as ``_run`` calls it, into ORT's buffer when the result is a partition output; None where ``_run``
    falls back to numpy (other broadcasts)."""
    nat = runtime.native(p)
    srcs = [inputs[i] if i < len(inputs) else None for i in range(2 if p.attrs["binary"] else 1)]
    if nat is None or not all(isinstance(v, np.ndarray) and v.flags.c_contiguous for v in srcs):
        return None
    a, b = srcs[0], srcs[1] if len(srcs) == 2 else None
    shape = list(outs[0].shape)
    live = [(i, i, v.dtype, v.shape, None) for i, v in enumerate(srcs)]
    if b is None or a.shape == b.shape:
        fn, args, out_at = nat.qdq_lut, [None, None, p.consts["table"], runtime.threads(p), None], 4
    else:
        small_b = b.size <= a.size
        big, small = (a, b) if small_b else (b, a)
        inner = _inner(big.shape, small.shape)
        if not inner or list(big.shape) != shape:
            return None
        rows = _rows_by_b(p) if small_b else p.consts["table"]
        fn, args, out_at = nat.qdq_lut_rows, [None, None, inner, rows, runtime.threads(p), None], 5
        live = [(0 if v is big else 1, i, v.dtype, v.shape, None) for i, v in enumerate(srcs)]
    where = p.runtime.partition_outputs
    into = [(out_at, where[0], shape)] if where and 0 in where else []
    return runtime.call_step(p, fn, tuple(args), live, [(-1, shape)], None, into)


def _cost(p: Prepared, shapes) -> OpCost:
    srcs = shapes[:2 if p.attrs["binary"] else 1]
    n = max(elems(s) for s in srcs if s is not None)
    b_in = sum(nbytes(s, 1) for s in srcs if s is not None) + p.consts["table"].size
    return stream_cost(p, n, b_in, n, 1.0)


register(KernelDef("npu", "QdqLut", _prepare, _run, _cost, _check, bind=_bind))
