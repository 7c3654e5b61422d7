"""Reductions on the vector unit: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare, ReduceL1,
ReduceL2.

Axes come from the ``axes`` attribute (ReduceSum < opset 13, ReduceMean/Max < opset 18) or from input 1 (later
opsets); a constant axes input is resolved at compile time. Empty/absent axes reduce everything unless
``noop_with_empty_axes=1``, which makes the op an identity. Float16 accumulates in float32 (the vector unit's
accumulator) and rounds once. Integer sums accumulate in float64 and saturate at the type's limits, as ORT's CPU
kernel does (exact for int32; int64 sums beyond 2^53 round as ORT's do, possibly in another order). An empty
reduced axis gives the reduction's identity, as in ORT: 0 for Sum, Mean, SumSquare, L1 and L2, 1 for Prod, the type's
lowest value (-inf) for Max, its highest (+inf) for Min. SumSquare and L2 square each element in the accumulator's
dtype (float16: float32), L1 takes magnitudes there; L2 is the square root of the sum of squares.

Native: every float32/float16 reduction here and int32/int64 ReduceMax/ReduceMin over any one run of axes
(axes of one element merge with either side) run and bind ``reduce_axis`` on x viewed as [outer, n, inner]: the inner
axis is the vector lane, so a non-trailing reduction streams down the rows (numpy's order there, its bits); a
trailing one sums in 32 running lanes (another order than numpy's pairwise sums: within float tolerance, stated in
tests/kernels/test_sweep_reduce_axis.py). Maxima and minima are exact (NaN wins, as numpy's maximum). A float32
ReduceMax over trailing axes keeps ``reduce_max_rows`` (shared with GlobalMaxPool); an int32/int64 ReduceSum over
trailing axes binds ``reduce_sum_int``; a float64 ReduceMean ``reduce_mean_float`` (numpy's own sums scaled in
place). Axes with a kept axis of more than one element between reduced ones run in numpy.

Cost: every input element passes the vector unit once (1 op, +1 per output element for Mean's scaling);
DMA reads the input and writes the output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._util import arg, nbytes, stash_constants
from ._vector import elems, itemsize_of, stream_cost

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    axes = node.attr("axes")
    axes_in = node.input(1)
    if axes_in is not None and axes_in.value is not None:
        axes = axes_in.value.reshape(-1).tolist()
    attrs = {"op": node.op_type, "keepdims": int(node.attr("keepdims", 1)),
             "noop_with_empty_axes": int(node.attr("noop_with_empty_axes", 0)),
             "axes": None if axes is None else [int(a) for a in axes],
             "itemsize": itemsize_of(node.inputs[0])}
    return Prepared(attrs, stash_constants(node), target)  # a constant data input is read at run time


def _normalized(axes: list[int], noop: int, rank: int) -> tuple[int, ...] | None:
    """Normalized axes, () for "reduce nothing" (noop), None for "reduce all"."""
    if not axes:
        return () if noop else None
    return tuple(sorted({int(a) % rank if rank else 0 for a in axes}))


def _axes(p: Prepared, inputs, rank: int) -> tuple[int, ...] | None:
    """The axes of this call; static axes are normalized once per rank (``p.kernel_cache``)."""
    axes = p.attrs["axes"]
    if axes is None:
        given = arg(p, inputs, 1)
        return _normalized(None if given is None else given.reshape(-1).tolist(), p.attrs["noop_with_empty_axes"],
                           rank)
    key = ("axes", rank)
    if key not in p.kernel_cache:
        p.kernel_cache[key] = _normalized(axes, p.attrs["noop_with_empty_axes"], rank)
    return p.kernel_cache[key]


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    axes = _axes(p, inputs, x.ndim)
    if axes == ():
        return [x]
    keep = p.attrs["keepdims"] != 0
    op = p.attrs["op"]
    view = _native_view(p, x, axes)
    if view is not None:
        y = runtime.native(p).reduce_axis(x, _NATIVE_OPS[op], *view, runtime.threads(p))
        return [y.reshape(_reduced_shape(x.shape, axes, keep))]
    if op == "ReduceMax":
        split = _native_max_rows(p, x, axes)
        if split is not None:
            y = runtime.native(p).reduce_max_rows(x.reshape(split), runtime.threads(p))
            return [y.reshape(_reduced_shape(x.shape, axes, keep))]
    return [_reference(op, x, axes, keep)]


def _reference(op: str, x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    """The reduction in numpy (ufunc reductions, not np.sum & co.: Python wrappers); float16 computed in float32."""
    if op in ("ReduceMax", "ReduceMin"):
        ufunc = np.maximum if op == "ReduceMax" else np.minimum
        if x.size == 0:  # an empty reduced axis: the identity (numpy's maximum has none and raises)
            initial = _lowest(x.dtype) if op == "ReduceMax" else _highest(x.dtype)
            return np.asarray(ufunc.reduce(x, axis=axes, keepdims=keep, initial=initial))
        return np.asarray(ufunc.reduce(x, axis=axes, keepdims=keep))
    if op == "ReduceSum" and x.dtype.kind in "iu":
        return _saturating_sum(x, axes, keep)
    acc = _F32 if x.dtype == _F16 else x.dtype
    if op == "ReduceProd":
        y = np.multiply.reduce(x, axis=axes, dtype=acc, keepdims=keep)
    else:
        terms = x
        if op in ("ReduceSumSquare", "ReduceL2"):
            terms = np.multiply(x, x, dtype=acc)
        elif op == "ReduceL1":
            terms = np.abs(x.astype(acc, copy=False))
        y = np.add.reduce(terms, axis=axes, dtype=acc, keepdims=keep)
    if op == "ReduceMean":
        count = x.size // max(y.size, 1) if x.size else 1  # y: an array, or a numpy scalar (size 1)
        y = y / acc.type(count) if acc.kind == "f" else y // count
    elif op == "ReduceL2":
        y = np.sqrt(y)
    return y if type(y) is np.ndarray and y.dtype == x.dtype else np.asarray(y).astype(x.dtype, copy=False)


_EXACT_INTS = (np.dtype(np.int32), np.dtype(np.int64))


_MEAN_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _bind_mean(p: Prepared, nat, x: np.ndarray, outs) -> Any:
    """A float ReduceMean over constant axes as ``reduce_mean_float``, for this input shape."""
    if x.dtype not in _MEAN_DTYPES or p.attrs["axes"] is None or not x.size or outs[0].ndim == 0:
        return None
    axes = _axes(p, (x,), x.ndim)
    if axes == ():
        return None
    count = x.size // max(outs[0].size, 1)
    return runtime.call_step(p, nat.reduce_mean_float, (np.add.reduce, None, axes, p.attrs["keepdims"] != 0, count),
                             [(1, 0, x.dtype, x.shape, None, True)], [(-1, None)])


def _trailing_split(shape: tuple[int, ...], axes: tuple[int, ...] | None) -> tuple[int, int] | None:
    """(rows, cols) of ``shape`` when ``axes`` (None: all) are its trailing axes, else None."""
    reduced = tuple(range(len(shape))) if axes is None else axes
    if not reduced or reduced != tuple(range(len(shape) - len(reduced), len(shape))):
        return None
    rows = int(np.prod(shape[: len(shape) - len(reduced)], dtype=np.int64))
    return rows, int(np.prod(shape[len(shape) - len(reduced):], dtype=np.int64))


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...] | None, keep: bool) -> tuple[int, ...]:
    reduced = set(range(len(shape))) if axes is None else set(axes)
    return tuple(1 if i in reduced else d for i, d in enumerate(shape) if keep or i not in reduced)


def _native_max_rows(p: Prepared, x: np.ndarray, axes: tuple[int, ...] | None) -> tuple[int, int] | None:
    """[rows, cols] of a float32 ReduceMax over trailing axes that ``reduce_max_rows`` computes (native kernels,
    C-contiguous, non-empty), else None."""
    if (p.attrs["op"] != "ReduceMax" or x.dtype != _F32 or not x.size or not x.flags.c_contiguous
            or runtime.native(p) is None):
        return None
    return _trailing_split(x.shape, axes)


_NATIVE_OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4,  # reduce_axis's
               "ReduceSumSquare": 5, "ReduceL1": 6, "ReduceL2": 7}                         # op codes
_FLOATS = (_F32, _F16)
_INTS = (np.dtype(np.int32), np.dtype(np.int64))


def reduction_view(shape: tuple[int, ...], axes: tuple[int, ...] | None) -> tuple[int, int, int] | None:
    """[outer, n, inner] of ``shape`` reduced over ``axes`` (None: all) when the reduced axes of more than one
    element are one run (axes of one element merge with either side), else None."""
    reduced = set(range(len(shape))) if axes is None else set(axes)
    wide = [i for i in reduced if shape[i] != 1]
    if not wide:
        return int(np.prod(shape, dtype=np.int64)), 1, 1
    first, last = min(wide), max(wide)
    if any(shape[i] != 1 and i not in reduced for i in range(first, last + 1)):
        return None  # a kept axis sits between reduced ones: no single [outer, n, inner] walk
    outer = int(np.prod(shape[:first], dtype=np.int64))
    return outer, int(np.prod(shape[first:last + 1], dtype=np.int64)), int(np.prod(shape[last + 1:], dtype=np.int64))


def _native_view(p: Prepared, x: np.ndarray, axes: tuple[int, ...] | None) -> tuple[int, int, int] | None:
    """[outer, n, inner] for ``reduce_axis`` (native kernels, a non-empty C-contiguous float32/float16 x or an
    int32/int64 Max, Min over one run of axes), else None. A float32 ReduceMax over trailing axes
    keeps ``reduce_max_rows`` (AVX-512 rows, shared with GlobalMaxPool)."""
    op = p.attrs["op"]
    native_dtype = x.dtype in _FLOATS or (x.dtype in _INTS and op in ("ReduceMax", "ReduceMin"))
    if (not native_dtype or op not in _NATIVE_OPS or not x.size or not x.flags.c_contiguous or axes == ()
            or runtime.native(p) is None):
        return None
    if op == "ReduceMax" and x.dtype == _F32 and _trailing_split(x.shape, axes) is not None:
        return None
    return reduction_view(x.shape, axes)


def _bind_axis(p: Prepared, nat, inputs, x: np.ndarray, outs) -> Any:
    """A reduction ``reduce_axis`` computes (``_native_view``) as one call for this input shape; runtime axes are
    held to their bound value (``runtime.fixed_inputs``)."""
    fixed = None
    if p.attrs["axes"] is None:
        fixed = runtime.fixed_inputs(inputs, 1)  # [] without an axes input: reduce all (or nothing)
        if fixed is None:
            return None
    axes = _axes(p, inputs, x.ndim)
    view = _native_view(p, x, axes)
    if view is None or outs[0].ndim == 0:
        return None  # a 0-d result: a call step reshapes only to a shape of rank >= 1
    return runtime.call_step(p, nat.reduce_axis, (None, _NATIVE_OPS[p.attrs["op"]], *view, runtime.threads(p)),
                             [(0, 0, x.dtype, x.shape, None)], [(-1, outs[0].shape)], None, None, fixed)


def _bind_max(p: Prepared, nat, x: np.ndarray, outs) -> Any:
    """A float32 ReduceMax over constant trailing axes as one ``reduce_max_rows`` call, for this input shape."""
    if p.attrs["axes"] is None or outs[0].ndim == 0:
        return None
    split = _native_max_rows(p, x, _axes(p, (x,), x.ndim))
    if split is None:
        return None
    return runtime.call_step(p, nat.reduce_max_rows, (None, runtime.threads(p)), [(0, 0, x.dtype, x.shape, split)],
                             [(-1, outs[0].shape)])


def _bind(p: Prepared, inputs, outs) -> Any:
    """An int32/int64 ReduceSum over trailing constant axes as one native call (``reduce_sum_int``: exact where
    the float64 accumulation is, declining the values where it could round), bound for the kept dims and any
    extent of the reduced ones (an attention mask one longer every token); a float ReduceMean (``_bind_mean``)."""
    x = inputs[0] if inputs else None
    nat = runtime.native(p)
    if nat is not None and isinstance(x, np.ndarray) and _native_view(p, x, _axes(p, inputs, x.ndim)) is not None:
        return _bind_axis(p, nat, inputs, x, outs)
    if nat is not None and p.attrs["op"] == "ReduceMean" and isinstance(x, np.ndarray):
        return _bind_mean(p, nat, x, outs)
    if nat is not None and p.attrs["op"] == "ReduceMax" and isinstance(x, np.ndarray):
        return _bind_max(p, nat, x, outs)
    if (nat is None or p.attrs["op"] != "ReduceSum" or p.attrs["axes"] is None or not isinstance(x, np.ndarray)
            or x.dtype not in _EXACT_INTS or not x.flags.c_contiguous or x.ndim == 0):
        return None
    split = _trailing_split(x.shape, _axes(p, inputs, x.ndim))
    if split is None:
        return None  # nothing reduced, or not a suffix of the axes
    rows, cols = split
    if rows == 0 or cols == 0 or outs[0].ndim == 0:
        return None  # empty, or a 0-d result (a call step reshapes only to a shape of rank >= 1)
    kept = x.ndim - len(_axes(p, inputs, x.ndim))
    any_length = (*x.shape[:kept], *[-1] * (x.ndim - kept))  # the reduced axes take any extent (a growing mask)
    return runtime.call_step(p, nat.reduce_sum_int, (None, runtime.threads(p)),
                             [(0, 0, x.dtype, any_length, (rows, -1))],
                             [(-1, outs[0].shape)])


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype: np.dtype):
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


_SATURATION: dict[np.dtype, tuple[float, float, float | None, Any]] = {}


def _saturation(dtype: np.dtype) -> tuple[float, float, float | None, Any]:
    """(lowest, highest float64 the type holds, the type's max as float64 when the type cannot hold it else None,
    the type's max) per integer dtype, computed once (np.iinfo per call costs more than a small sum)."""
    lim = _SATURATION.get(dtype)
    if lim is None:
        info = np.iinfo(dtype)
        top = float(info.max)  # 2^63 for int64, which int64 cannot hold: clip below it, then saturate sums >= it
        below_top = top if int(top) == info.max else float(np.nextafter(top, 0.0))
        lim = _SATURATION[dtype] = (float(info.min), below_top, None if below_top == top else top,
                                    dtype.type(info.max))
    return lim


def _saturating_sum(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    """Integer ReduceSum as ORT: accumulate in float64, then saturate at the type's limits."""
    s = np.asarray(np.add.reduce(x, axis=axes, dtype=np.float64, keepdims=keep))
    lowest, below_top, top, highest = _saturation(x.dtype)
    y = np.asarray(np.minimum(np.maximum(s, lowest), below_top)).astype(x.dtype)  # np.clip, without its wrapper
    if top is not None:
        np.copyto(y, highest, where=s >= top)
    return y


def _cost(p: Prepared, shapes) -> OpCost:
    n = elems(shapes[0])
    size = p.attrs["itemsize"]
    axes = p.attrs["axes"]
    rank = len(shapes[0]) if shapes[0] is not None else 0
    if axes:
        keep = {a % rank for a in axes} if rank else set()
        n_out = int(np.prod([d for i, d in enumerate(shapes[0]) if i not in keep], dtype=np.int64))
    else:
        n_out = 1
    extra = n_out / max(n, 1) if p.attrs["op"] == "ReduceMean" else 0.0
    return stream_cost(p, n, nbytes(shapes[0], size), n_out * size, 1.0 + extra)


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if (x is not None and x.dtype is not None and node.op_type == "ReduceMean"
            and not np.issubdtype(x.dtype, np.floating)):
        return f"{node.describe()}: integer ReduceMean not supported on the vector unit"
    return None


for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
            "ReduceL2"):
    register(KernelDef("", _op, _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
