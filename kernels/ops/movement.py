"""Layout ops: Reshape, Squeeze, Unsqueeze, Flatten, Identity, Shape, Size (free: views or metadata), Transpose,
Expand and Tile (a DMA pass).

Shape-like operands (shape, axes) may be attributes (old opsets), constant inputs (resolved at compile time into
``attrs``) or runtime inputs (read at run time). Views returned by these kernels alias their (read-only) inputs.

Native (kernels/native/movement.cc, transpose.cc): Transpose (``kernels.transpose``: a blocked copy), Expand
(``kernels.expand``: a broadcast copy) and Tile (``kernels.tile``: the same copy of x viewed with a 1 before each
axis) move the elements of any dtype of 1, 2, 4 or 8 bytes, bits unchanged (over the threads from 1 MB); each
binds as the step for the input shape and (shape-derived) target shape or repeats it was bound for, into ORT's buffer
when its output is a partition output (``ep/step_binding.py``).

Cost: a view costs nothing; Transpose/Expand/Tile stream ``bytes_in + bytes_out`` through DMA
(``dma_cycles = 2 * latency + bytes / bytes_per_cycle``, no compute).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..cost import dma_cycles, movement_cost
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of


def static_ints(node: NodeInfo, index: int, attr: str | None = None) -> list[int] | None:
    """Integer list from constant input ``index`` or, failing that, attribute ``attr``; None if neither is static."""
    v = node.input(index)
    if v is not None and v.value is not None:
        return [int(a) for a in np.asarray(v.value).reshape(-1)]
    if attr is not None and node.attr(attr) is not None:
        return [int(a) for a in node.attr(attr)]
    return None


def runtime_ints(p: Prepared, inputs: Sequence[np.ndarray | None], key: str, index: int) -> list[int] | None:
    """``attrs[key]`` if it was static at compile time, else runtime input ``index`` (None if omitted)."""
    static = p.attrs.get(key)
    if static is not None:
        return static
    v = arg(p, inputs, index)
    return None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]


def copy_cost(p: Prepared, bytes_in: int, bytes_out: int) -> OpCost:
    """A pure DMA pass: read ``bytes_in``, write ``bytes_out`` (one transfer each way)."""
    moved = bytes_in + bytes_out
    if moved == 0:
        return OpCost(unit="dma")
    dma = dma_cycles(p.target, moved, transfers=2)
    return OpCost(dma_cycles=dma, cycles=dma, dma_bytes=moved, unit="dma")


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"op": node.op_type, "itemsize": itemsize_of(node.inputs[0]),
             "ints": static_ints(node, 1, "axes" if node.op_type in ("Squeeze", "Unsqueeze") else None)}
    if node.op_type == "Reshape":
        attrs["allowzero"] = int(node.attr("allowzero", 0))
    if node.op_type == "Flatten":
        attrs["axis"] = int(node.attr("axis", 1))
    if node.op_type == "Transpose":
        perm = node.attr("perm")
        attrs["perm"] = [int(a) for a in perm] if perm is not None else None
    return Prepared(attrs, stash_constants(node), target)


def _static_shape(p: Prepared) -> tuple[int, ...] | None:
    """The Reshape target when it is static and holds no 0 to copy from the input (built once, ``p.kernel_cache``)."""
    if "shape" not in p.kernel_cache:
        ints = p.attrs["ints"]
        p.kernel_cache["shape"] = None if ints is None or (0 in ints and not p.attrs["allowzero"]) else tuple(ints)
    return p.kernel_cache["shape"]


def _reshape_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    shape = _static_shape(p)
    if shape is None:
        shape = runtime_ints(p, inputs, "ints", 1)
        if not p.attrs["allowzero"]:
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _axes(p: Prepared, inputs, rank: int, unsqueeze: bool) -> tuple[int, ...] | None:
    """Squeeze/Unsqueeze axes normalized against ``rank`` (Unsqueeze: sorted output positions); static axes are
    normalized once per rank (``p.kernel_cache``). None: no axes (Squeeze drops every 1)."""
    key = ("axes", rank)
    if key in p.kernel_cache:
        return p.kernel_cache[key]
    axes = runtime_ints(p, inputs, "ints", 1)
    if axes is not None:
        rank = rank + len(axes) if unsqueeze else rank
        axes = tuple(sorted(a % rank for a in axes)) if unsqueeze else tuple(a % rank for a in axes)
        if unsqueeze and len(set(axes)) != len(axes):
            raise ValueError("repeated axis")  # np.expand_dims' error
    if p.attrs["ints"] is not None:
        p.kernel_cache[key] = axes
    return axes


def _squeeze_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    axes = _axes(p, inputs, x.ndim, False)
    if axes is None:
        return [x.squeeze()]
    shape = x.shape
    for a in axes:
        if shape[a] != 1:
            bad = [a for a in axes if shape[a] != 1]
            raise ValueError(f"Squeeze: dimension(s) {bad} of shape {x.shape} are not 1")
    return [x.squeeze(axes)]


def _unsqueeze_run(p: Prepared, inputs) -> list[np.ndarray]:
    """A reshape with 1s inserted at the (sorted, normalized) output axes; np.expand_dims is a Python wrapper."""
    x = arg(p, inputs, 0)
    axes = _axes(p, inputs, x.ndim, True)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [x.reshape(shape)]


def movable(x) -> bool:
    """Whether the native movement kernels take ``x``: an array of a plain dtype of 1, 2, 4 or 8 bytes (they move
    bits; the reference's numpy calls serve the rest)."""
    return isinstance(x, np.ndarray) and x.dtype.kind in "biuf" and x.itemsize in (1, 2, 4, 8)


def ort_buffer(p: Prepared, outs, arg_index: int) -> list:
    """A bound step's ``ort_outputs`` entry putting ORT's buffer for output 0 at argument ``arg_index`` when that
    output is a partition output (the kernel writes it in place), else []."""
    where = p.runtime.partition_outputs
    return [(arg_index, where[0], list(outs[0].shape))] if where and 0 in where else []


def _transpose_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    nat = runtime.native(p)
    if nat is not None and movable(x):
        return [nat.transpose(x, p.attrs["perm"], None, runtime.threads(p))]
    return [np.transpose(x, p.attrs["perm"])]


def _expand_run(p: Prepared, inputs) -> list[np.ndarray]:
    """Bidirectional broadcast of x against ``shape``, materialized in C order like ORT's output buffer (and the
    native copy's: a consumer sees one layout whichever ran)."""
    x = arg(p, inputs, 0)
    shape = runtime_ints(p, inputs, "ints", 1)
    return [np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape))), order="C")]


def _expand_bind(p: Prepared, inputs, outs):
    """Expand as one native broadcast copy for this input shape and target shape (a runtime target must hold its
    bound value), into ORT's buffer when the result is a partition output."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 1)
    if nat is None or fixed is None or not isinstance(x, np.ndarray) or x.dtype.hasobject:
        return None
    shape = tuple(runtime_ints(p, inputs, "ints", 1))
    return runtime.call_step(p, nat.expand, (None, shape, None, runtime.threads(p)),
                             [(0, 0, x.dtype, x.shape, None, True)], [(-1, None)], None, ort_buffer(p, outs, 2), fixed)


def _transpose_bind(p: Prepared, inputs, outs):
    """Transpose as one native blocked copy for this input shape (any layout: a strided input is copied first),
    into ORT's buffer when the result is a partition output."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    if nat is None or not movable(x):
        return None
    perm = p.attrs["perm"]
    return runtime.call_step(p, nat.transpose, (None, None if perm is None else tuple(perm), None, runtime.threads(p)),
                             [(0, 0, x.dtype, x.shape, None, True)], [(-1, None)], None, ort_buffer(p, outs, 2))


def _identity_run(p: Prepared, inputs) -> list[np.ndarray]:
    return [arg(p, inputs, 0)]


def _flatten_run(p: Prepared, inputs) -> list[np.ndarray]:
    """[d0..d(axis-1), d(axis)..] -> 2-D (a view); axis may be negative, axis 0 gives [1, N]."""
    x = arg(p, inputs, 0)
    axis = p.attrs["axis"] + x.ndim if p.attrs["axis"] < 0 else p.attrs["axis"]
    return [x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)]


def _tile_run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    repeats = runtime_ints(p, inputs, "ints", 1)
    if len(repeats) != x.ndim or min(repeats, default=0) < 0:
        raise ValueError(f"Tile: repeats {repeats} do not match input rank {x.ndim} (or are negative)")
    nat = runtime.native(p)
    if nat is not None and movable(x):
        return [nat.tile(x, repeats, None, runtime.threads(p))]
    return [np.tile(x, repeats)]


def _tile_bind(p: Prepared, inputs, outs):
    """Tile as one native broadcast copy for this input shape and these repeats (runtime repeats must hold their
    bound value), into ORT's buffer when the result is a partition output."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    fixed = runtime.fixed_inputs(inputs, 1)
    if nat is None or fixed is None or not movable(x):
        return None
    repeats = tuple(runtime_ints(p, inputs, "ints", 1))
    return runtime.call_step(p, nat.tile, (None, repeats, None, runtime.threads(p)),
                             [(0, 0, x.dtype, x.shape, None, True)], [(-1, None)], None, ort_buffer(p, outs, 2), fixed)


def _view_cost(p: Prepared, shapes) -> OpCost:
    return movement_cost(p.target, 0)


def _transpose_cost(p: Prepared, shapes) -> OpCost:
    return movement_cost(p.target, nbytes(shapes[0], p.attrs["itemsize"]))


def _expand_cost(p: Prepared, shapes) -> OpCost:
    size = p.attrs["itemsize"]
    shape = p.attrs["ints"]
    out = np.broadcast_shapes(shapes[0], tuple(shape)) if shape is not None else shapes[0]
    return copy_cost(p, nbytes(shapes[0], size), elems(out) * size)


def _tile_cost(p: Prepared, shapes) -> OpCost:
    size, reps = p.attrs["itemsize"], p.attrs["ints"]
    n_in = nbytes(shapes[0], size)
    return copy_cost(p, n_in, n_in * (int(np.prod(reps, dtype=np.int64)) if reps is not None else 1))


def _shape_prepare(node: NodeInfo, target: Target) -> Prepared:
    return Prepared({"start": int(node.attr("start", 0)), "end": node.attr("end")}, stash_constants(node), target)


def _shape_run(p: Prepared, inputs) -> list[np.ndarray]:
    """Shape (opset 15 start/end, negative and out-of-range values clamped as ONNX says): tensor metadata, which
    the NPU runtime answers on its control processor without touching the data."""
    dims = arg(p, inputs, 0).shape
    end = p.attrs["end"]
    return [np.array(dims[slice(p.attrs["start"], None if end is None else int(end))], dtype=np.int64)]


def _size_run(p: Prepared, inputs) -> list[np.ndarray]:
    """Size: the element count as a 0-d int64 (tensor metadata, like Shape)."""
    return [np.array(arg(p, inputs, 0).size, dtype=np.int64)]


register(KernelDef("", "Shape", _shape_prepare, _shape_run, _view_cost, rank_free=True))
register(KernelDef("", "Size", _shape_prepare, _size_run, _view_cost, rank_free=True))
register(KernelDef("", "Reshape", _prepare, _reshape_run, _view_cost, rank_free=True))
register(KernelDef("", "Squeeze", _prepare, _squeeze_run, _view_cost, rank_free=True))
register(KernelDef("", "Unsqueeze", _prepare, _unsqueeze_run, _view_cost, rank_free=True))
register(KernelDef("", "Transpose", _prepare, _transpose_run, _transpose_cost, rank_free=True, bind=_transpose_bind))
register(KernelDef("", "Expand", _prepare, _expand_run, _expand_cost, rank_free=True, bind=_expand_bind))
register(KernelDef("", "Identity", _prepare, _identity_run, _view_cost, rank_free=True))
register(KernelDef("", "Flatten", _prepare, _flatten_run, _view_cost, rank_free=True))
register(KernelDef("", "Tile", _prepare, _tile_run, _tile_cost, rank_free=True, bind=_tile_bind))
