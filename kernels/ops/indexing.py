"""Indexing ops on the DMA engine: Concat, Split, Slice, Gather, GatherND (batch_dims) and ScatterND (reduction
none/add/mul/max/min).

Split sizes come from the ``split`` input/attribute, else ``num_outputs`` (opset 18: ceil-sized chunks, the last
smaller), else equal parts. Slice follows ONNX clamping exactly (not Python's): starts/ends are made non-negative by
adding the dim once, then clamped to [0, dim] (step > 0) or start to [0, dim-1] and end to [-1, dim-1] (step < 0).
Gather accepts negative indices in [-dim, dim) like ORT and raises on anything outside, naming the index as ORT does.

Native (kernels/native/indexing.cc, rows of bytes copied by index or stride, any dtype): Gather runs
``kernels.gather``, GatherND ``kernels.gather_nd``, ScatterND ``kernels.scatter_nd`` (its reductions in the data's
dtype), Concat ``kernels.concat_into`` and Split ``kernels.split`` (one call writing every part), each bound as the
step for its input shapes and writing ORT's buffer where its result is a partition output. Slice stays numpy's view
where that is C order (as a partition output only under 64 KB), else one native strided copy into ORT's buffer or a
C-order array (``kernels.slice_copy``), bound for the input shapes and (shape-derived) bounds it was bound for
(``ep/step_binding.py``).

Cost: a DMA pass over the bytes actually moved (Slice/Gather read only the selected elements).
"""

from __future__ import annotations

import operator

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..shape_memo import memo_per_shape
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of
from .movement import copy_cost, runtime_ints, static_ints


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    op = node.op_type
    attrs = {"op": op, "itemsize": itemsize_of(node.inputs[0]), "axis": int(node.attr("axis", 0)),
             "n_outputs": len(node.outputs)}
    if op == "Split":
        attrs["split"] = static_ints(node, 1, "split")
        attrs["num_outputs"] = node.attr("num_outputs")
    if op in ("GatherND", "ScatterND"):
        attrs["batch_dims"] = int(node.attr("batch_dims", 0))
        attrs["reduction"] = str(node.attr("reduction", "none"))
    if op == "Slice":
        for i, key in enumerate(("starts", "ends", "axes", "steps"), start=1):
            attrs[key] = static_ints(node, i, key if i < 4 else None)
        attrs["legacy"] = node.input(1) is None and node.attr("starts") is not None
    return Prepared(attrs, stash_constants(node), target)


_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _native_step(p: Prepared, fn, values: list, inputs, attrs: tuple, outs):
    """A bound step calling ``fn(*values, *attrs, out, threads)`` (the indexing kernels' signature) for these input
    shapes: constants held in place (C order), ``out`` ORT's buffer when the result is a partition output."""
    given = [i < len(inputs) and inputs[i] is not None for i in range(len(values))]
    live = [(i, i, v.dtype, v.shape, None) for i, v in enumerate(values) if given[i]]
    if not live:
        return None
    held = [None if given[i] else v if v.flags.c_contiguous else np.array(v, order="C") for i, v in enumerate(values)]
    where = p.runtime.partition_outputs
    into = [(len(values) + len(attrs), where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, fn, (*held, *attrs, None, runtime.threads(p)), live, [(-1, None)], None, into)


def _one_plain_dtype(parts: list) -> bool:
    return bool(parts) and all(isinstance(v, np.ndarray) and not v.dtype.hasobject and v.dtype == parts[0].dtype
                               for v in parts)


def _concat_run(p: Prepared, inputs) -> list[np.ndarray]:
    """numpy's concatenate; on the native kernels ``kernels.concat_into`` (kernels/native/indexing.cc)."""
    parts = [arg(p, inputs, i) for i in range(len(inputs))]
    nat = runtime.native(p)
    if nat is not None and _one_plain_dtype(parts):
        return [nat.concat_into(p.attrs["axis"], None, runtime.threads(p), *parts)]
    return [np.concatenate(parts, axis=p.attrs["axis"])]


def _concat_bind(p: Prepared, inputs, outs):
    """Concat as one native copy for these input shapes (``kernels.concat_into``), constants in place, into ORT's
    buffer when the result is a partition output (any layout: a strided part is made C order first)."""
    nat = runtime.native(p)
    parts = [arg(p, inputs, i) for i in range(len(inputs))]
    if nat is None or not _one_plain_dtype(parts):
        return None
    live = [(i + 3, i, v.dtype, v.shape, None, True) for i, v in enumerate(parts) if inputs[i] is not None]
    held = (None if inputs[i] is not None else np.ascontiguousarray(v) for i, v in enumerate(parts))
    where = p.runtime.partition_outputs
    into = [(1, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, nat.concat_into, (p.attrs["axis"], None, runtime.threads(p), *held), live,
                             [(-1, None)], None, into)


def split_sizes(dim: int, n: int, split: list[int] | None, num_outputs: int | None) -> list[int]:
    if split is not None:
        if sum(split) != dim:
            raise ValueError(f"Split: sizes {split} do not sum to dim {dim}")
        return split
    n = int(num_outputs) if num_outputs else n
    chunk = -(-dim // n)
    return [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]


def _split_run(p: Prepared, inputs) -> list[np.ndarray]:
    """numpy's split (views); on the native kernels ``kernels.split`` copies each part (C order)."""
    x = arg(p, inputs, 0)
    axis = p.attrs["axis"] % x.ndim
    sizes = split_sizes(x.shape[axis], p.attrs["n_outputs"], runtime_ints(p, inputs, "split", 1),
                        p.attrs["num_outputs"])
    nat = runtime.native(p)
    if nat is not None and not x.dtype.hasobject:
        return list(nat.split(x, axis, sizes, runtime.threads(p)))
    return np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)


def _split_bind(p: Prepared, inputs, outs):
    """Split as one native call for this input shape and these sizes (a runtime ``split`` must hold its bound
    value), each part written into ORT's buffer when it is a partition output."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 1)
    if nat is None or not isinstance(x, np.ndarray) or x.dtype.hasobject or fixed is None:
        return None
    axis = p.attrs["axis"] % x.ndim
    sizes = [o.shape[axis] for o in outs]
    where = p.runtime.partition_outputs or {}
    into = [(4 + k, where[k], list(o.shape)) for k, o in enumerate(outs) if k in where]
    args = (None, axis, sizes, runtime.threads(p), *(None for _ in outs))
    return runtime.call_step(p, nat.split, args, [(0, 0, x.dtype, x.shape, None)],
                             [(k, None) for k in range(len(outs))], None, into, fixed)


def onnx_slice(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int] | None,
               steps: list[int] | None) -> tuple[slice, ...]:
    """The numpy index for ONNX Slice on ``shape`` (ONNX clamping rules, see module docstring)."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if len(set(axes)) != len(axes):
        raise ValueError(f"Slice: repeated axes {axes}")
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis]
        if step == 0:
            raise ValueError("Slice: step 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


def _slice_run(p: Prepared, inputs) -> list[np.ndarray]:
    """numpy's view of x; on the native kernels a strided one is copied by ``kernels.slice_copy`` instead, so readers
    get C order. With every parameter a compile-time constant (no runtime input past x), the index is made once
    per input shape (``shape_memo``)."""
    x = arg(p, inputs, 0)
    if all(v is None for v in inputs[1:]):
        index = memo_per_shape(p, "slice_index", x.shape, _slice_index, p, inputs, x.shape)
    else:
        index = _slice_index(p, inputs, x.shape)
    view = x[index]
    nat = runtime.native(p)
    if nat is None or view.flags.c_contiguous or x.dtype.hasobject:
        return [view]
    return [nat.slice_copy(x, *_slice_plan(index, x.shape), None, runtime.threads(p))]


def _slice_index(p: Prepared, inputs, shape: tuple[int, ...]) -> tuple[slice, ...]:
    a = p.attrs
    if a["legacy"]:
        return onnx_slice(shape, a["starts"], a["ends"], a["axes"], None)
    return onnx_slice(shape, runtime_ints(p, inputs, "starts", 1), runtime_ints(p, inputs, "ends", 2),
                      runtime_ints(p, inputs, "axes", 3), runtime_ints(p, inputs, "steps", 4))


def _slice_plan(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[list[int], list[int], list[int]]:
    """``kernels.slice_copy``'s (starts, steps, dims): per axis the first element, the step and the count."""
    starts, steps, dims = [], [], []
    for s, dim in zip(index, shape):
        first, stop, step = s.indices(dim)
        count = len(range(first, stop, step))
        starts.append(first if count else 0)
        steps.append(step)
        dims.append(count)
    return starts, steps, dims


_VIEW_OUTPUT_BYTES = 65536


def _slice_bind(p: Prepared, inputs, outs):
    """Slice for this input shape and these bounds (runtime bounds must hold their bound values), x in any layout:
    a C-order view stays numpy's view (free; as a partition output under ``_VIEW_OUTPUT_BYTES`` the bridge's copy of
    it costs less than a native call); anything else is one native copy (``kernels.slice_copy``), into ORT's buffer
    when the result is a partition output."""
    x = inputs[0] if inputs else None
    fixed = runtime.fixed_inputs(inputs, 1)
    if not isinstance(x, np.ndarray) or fixed is None:
        return None
    index = _slice_index(p, inputs, x.shape)
    live = [(0, 0, x.dtype, x.shape, None, True)]
    nat = runtime.native(p)
    where = p.runtime.partition_outputs
    into_ort = bool(where and 0 in where)
    view = x[index]
    if nat is None or x.dtype.hasobject or (view.flags.c_contiguous and
                                            (not into_ort or view.nbytes < _VIEW_OUTPUT_BYTES)):
        return runtime.call_step(p, operator.getitem, (None, index), live, [(-1, None)], fixed=fixed)
    into = [(4, where[0], list(outs[0].shape))] if into_ort else []
    args = (None, *_slice_plan(index, x.shape), None, runtime.threads(p))
    return runtime.call_step(p, nat.slice_copy, args, live, [(-1, None)], None, into, fixed)


def _gather_native(x, idx) -> bool:
    """Whether ``kernels.gather`` takes these operands: plain data, int32/int64 indices."""
    return (isinstance(x, np.ndarray) and isinstance(idx, np.ndarray) and not x.dtype.hasobject
            and idx.dtype in _INDEX_DTYPES)


def _gather_run(p: Prepared, inputs) -> list[np.ndarray]:
    """numpy's ``take`` in raise mode (it wraps [-dim, 0) like ORT; the range check before it gives ORT's error,
    naming the index); on the native kernels ``kernels.gather`` (kernels/native/indexing.cc), which checks alike."""
    x, idx = arg(p, inputs, 0), arg(p, inputs, 1)
    nat = runtime.native(p)
    if nat is not None and _gather_native(x, idx):
        return [nat.gather(x, idx, p.attrs["axis"], None, runtime.threads(p))]
    axis = p.attrs["axis"] % x.ndim
    dim = x.shape[axis]
    bad = np.asarray(idx)[(idx < -dim) | (idx >= dim)] if idx.size else ()
    if len(bad):
        raise IndexError(f"Gather: indices outside [-{dim}, {dim}) on axis {axis}, idx={int(bad.flat[0])}")
    return [np.asarray(x.take(idx, axis=axis))]


def _gather_bind(p: Prepared, inputs, outs):
    x, idx = arg(p, inputs, 0), arg(p, inputs, 1)
    nat = runtime.native(p)
    if nat is None or not _gather_native(x, idx):
        return None
    return _native_step(p, nat.gather, [x, idx], inputs, (p.attrs["axis"],), outs)


def _nd_index(idx: np.ndarray, dims: tuple[int, ...], op: str) -> tuple[np.ndarray, ...]:
    """The last axis of ``idx`` (index tuples into ``dims``) as one int64 array per dim, negatives wrapped once;
    anything outside [-dim, dim) raises."""
    idx = idx.astype(np.int64, copy=False)
    d = np.asarray(dims, np.int64)
    bad = idx[(idx < -d) | (idx >= d)] if idx.size else ()
    if len(bad):
        raise IndexError(f"{op}: indices outside the data dims {list(dims)}, index = {int(bad[0])}")
    idx = np.where(idx < 0, idx + d, idx)
    return tuple(idx[..., t] for t in range(idx.shape[-1]))


def _nd_native(x, idx, b: int) -> bool:
    """Whether ``kernels.gather_nd``/``scatter_nd`` take these operands: plain data, int64 index tuples of length
    1 to rank - b with the data's batch dims (anything else meets the reference's own error)."""
    return (isinstance(x, np.ndarray) and isinstance(idx, np.ndarray) and not x.dtype.hasobject
            and idx.dtype == np.int64 and idx.ndim > b and 1 <= idx.shape[-1] <= x.ndim - b
            and idx.shape[:b] == x.shape[:b])


def _gather_nd_run(p: Prepared, inputs) -> list[np.ndarray]:
    """out[b..., m...] = data[b..., *indices[b..., m..., :]] over ``batch_dims`` leading batch axes; on the native
    kernels ``kernels.gather_nd``."""
    x, idx = arg(p, inputs, 0), arg(p, inputs, 1)
    b = p.attrs["batch_dims"]
    nat = runtime.native(p)
    if nat is not None and _nd_native(x, idx, b):
        return [nat.gather_nd(x, idx, b, None, runtime.threads(p))]
    q = idx.shape[-1]
    if q > x.ndim - b:
        raise ValueError(f"GatherND: index tuples of length {q} for data {x.shape} with batch_dims {b}")
    n_batch = int(np.prod(x.shape[:b], dtype=np.int64))
    xb = x.reshape((n_batch,) + x.shape[b:])
    ib = idx.reshape(n_batch, -1, q)
    parts = _nd_index(ib, x.shape[b:b + q], "GatherND")
    batch = np.arange(n_batch).reshape(n_batch, 1)
    out = xb[(batch,) + parts]
    return [out.reshape(idx.shape[:-1] + x.shape[b + q:])]


def _gather_nd_bind(p: Prepared, inputs, outs):
    x, idx = arg(p, inputs, 0), arg(p, inputs, 1)
    nat = runtime.native(p)
    if nat is None or not _nd_native(x, idx, p.attrs["batch_dims"]):
        return None
    return _native_step(p, nat.gather_nd, [x, idx], inputs, (p.attrs["batch_dims"],), outs)


_SCATTER_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_nd_run(p: Prepared, inputs) -> list[np.ndarray]:
    """A copy of data with ``updates`` written (or reduced, ``reduction``) at the index tuples; with duplicate
    indices and reduction 'none' the last update wins (ONNX leaves the order undefined). On the native kernels
    ``kernels.scatter_nd``, which applies the updates in the same order."""
    x, idx, upd = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    nat = runtime.native(p)
    if nat is not None and _scatter_native(x, idx, upd):
        return [nat.scatter_nd(x, idx, upd, p.attrs["reduction"], None, runtime.threads(p))]
    q = idx.shape[-1]
    if upd.shape != idx.shape[:-1] + x.shape[q:]:
        raise ValueError(f"ScatterND: updates {upd.shape} != indices {idx.shape[:-1]} + data {x.shape[q:]}")
    out = np.array(x, copy=True)
    where = _nd_index(idx.reshape(-1, q), x.shape[:q], "ScatterND")
    rows = upd.reshape((-1,) + x.shape[q:])
    red = p.attrs["reduction"]
    if red == "none":
        out[where] = rows
    else:
        _SCATTER_REDUCE[red].at(out, where, rows)
    return [out]


def _scatter_native(x, idx, upd) -> bool:
    """Whether ``kernels.scatter_nd`` takes these operands: as ``_nd_native`` (no batch axes), updates of the data's
    dtype and the shape the indices call for (else the reference's own error)."""
    return (_nd_native(x, idx, 0) and isinstance(upd, np.ndarray) and upd.dtype == x.dtype
            and upd.shape == idx.shape[:-1] + x.shape[idx.shape[-1]:])


def _scatter_nd_bind(p: Prepared, inputs, outs):
    x, idx, upd = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    nat = runtime.native(p)
    if nat is None or not _scatter_native(x, idx, upd):
        return None
    return _native_step(p, nat.scatter_nd, [x, idx, upd], inputs, (p.attrs["reduction"],), outs)


def _nd_check(node: NodeInfo, target: Target) -> str | None:
    red = str(node.attr("reduction", "none"))
    if node.op_type == "ScatterND" and red not in ("none", *_SCATTER_REDUCE):
        return f"{node.describe()}: ScatterND reduction {red!r} unknown"
    idx = node.input(1)
    if idx is None or idx.dtype is None or idx.dtype != np.int64:
        return f"{node.describe()}: indices must be int64"
    return None


def _concat_cost(p: Prepared, shapes) -> OpCost:
    moved = sum(nbytes(s, p.attrs["itemsize"]) for s in shapes if s is not None)
    return copy_cost(p, moved, moved)


def _split_cost(p: Prepared, shapes) -> OpCost:
    moved = nbytes(shapes[0], p.attrs["itemsize"])
    return copy_cost(p, moved, moved)


def _slice_cost(p: Prepared, shapes) -> OpCost:
    a = p.attrs
    if a["starts"] is None or a["ends"] is None:  # runtime bounds: assume everything moves
        out = elems(shapes[0])
    else:
        idx = onnx_slice(tuple(shapes[0]), a["starts"], a["ends"], a["axes"], a["steps"])
        out = int(np.prod([len(range(*s.indices(d))) for s, d in zip(idx, shapes[0])], dtype=np.int64))
    return copy_cost(p, out * a["itemsize"], out * a["itemsize"])


def _gather_cost(p: Prepared, shapes) -> OpCost:
    data, idx = shapes[0], shapes[1]
    axis = p.attrs["axis"] % len(data)
    out = elems(idx) * int(np.prod(data[:axis] + data[axis + 1:], dtype=np.int64))
    return copy_cost(p, out * p.attrs["itemsize"] + nbytes(idx, 8), out * p.attrs["itemsize"])


def _gather_nd_cost(p: Prepared, shapes) -> OpCost:
    data, idx = shapes[0], shapes[1]
    q, b = idx[-1], p.attrs["batch_dims"]
    out = elems(idx[:-1]) * elems(data[b + q:])
    return copy_cost(p, out * p.attrs["itemsize"] + nbytes(idx, 8), out * p.attrs["itemsize"])


def _scatter_nd_cost(p: Prepared, shapes) -> OpCost:
    moved = nbytes(shapes[0], p.attrs["itemsize"])
    upd = nbytes(shapes[2], p.attrs["itemsize"])
    return copy_cost(p, moved + upd + nbytes(shapes[1], 8), moved)


register(KernelDef("", "Concat", _prepare, _concat_run, _concat_cost, rank_free=True, bind=_concat_bind))
register(KernelDef("", "Split", _prepare, _split_run, _split_cost, rank_free=True, bind=_split_bind))
register(KernelDef("", "Slice", _prepare, _slice_run, _slice_cost, rank_free=True, bind=_slice_bind))
register(KernelDef("", "Gather", _prepare, _gather_run, _gather_cost, rank_free=True, bind=_gather_bind))
register(KernelDef("", "GatherND", _prepare, _gather_nd_run, _gather_nd_cost, _nd_check, rank_free=True,
                   bind=_gather_nd_bind))
register(KernelDef("", "ScatterND", _prepare, _scatter_nd_run, _scatter_nd_cost, _nd_check, rank_free=True,
                   bind=_scatter_nd_bind))
