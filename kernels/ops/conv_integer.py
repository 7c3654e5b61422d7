"""ONNX ConvInteger: the int32 sums of ``(x - x_zero_point) * (w - w_zero_point)``, exact.

What ORT's dynamic quantizer writes for a Conv (``DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul`` by the
two scales): ddddocr's older recognizer has 21 of them. The accumulation is QLinearConv's (``kernels/ops/conv.py``)
without its requantization: the native int8 GEMM (``conv_integer``, ``kernels/native/qlinear_conv.cc``), and
for the reference model exact integer products of the same patches (``_matrix.exact_int_matmul``). Integer sums are
exact, so both give ORT's bits. ``x_zero_point`` may be a runtime scalar (DynamicQuantizeLinear computes it per
call); ``w_zero_point`` is a constant scalar or one per output channel. ``bind`` makes the native call the step
(the runtime x_zero_point passed as its one-byte array). Cost: as QLinearConv's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, Prepared, register
from ..shape_memo import memo_per_shape
from ..target import Target
from .. import runtime
from ._matrix import check_fits, exact_int_matmul, int_bound
from ._util import arg, stash_constants
from .conv import _cost, _geometry, _geometry_list, _native_weights, _reference_weights, check_channels, im2col


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    w = node.input(1)
    if w is None or not w.is_constant or w.shape is None or len(w.shape) not in (3, 4):
        return f"{op}: only 1-D and 2-D convolutions with constant weights [M, C/g, (kh,) kw] are supported"
    m, cg, kh, kw = w.shape if len(w.shape) == 4 else (w.shape[0], w.shape[1], 1, w.shape[2])
    xz, wz = node.input(2), node.input(3)
    if xz is not None and not xz.missing and xz.shape is not None and int(np.prod(xz.shape)) != 1:
        return f"{op}: x_zero_point {xz.describe()} must be a scalar"
    if wz is not None and not wz.missing:
        if not wz.is_constant:
            return f"{op}: w_zero_point {wz.describe()} must be a constant"
        if np.asarray(wz.value).size not in (1, m):
            return f"{op}: w_zero_point {wz.describe()} must hold 1 or {m} values"
    grp = int(node.attr("group", 1))
    return check_fits(1, m // grp, cg * kh * kw, node.input(0).dtype.name, w.dtype.name, target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    w = np.asarray(node.input(1).value)
    geom = _geometry(node, w.shape)
    if w.ndim == 3:
        w = w[:, :, None, :]
    m = w.shape[0]
    wz = node.input(3)
    wzp = np.zeros(m, np.int32) if wz is None or wz.missing else np.asarray(wz.value).astype(np.int32).reshape(-1)
    dt = node.input(0).dtype.name
    consts: dict[str, np.ndarray] = {"qw": _native_weights(w),
                                     "wzp": np.ascontiguousarray(np.broadcast_to(wzp, (m,)))}
    xz = node.input(2)
    if xz is not None and not xz.missing and xz.is_constant:
        consts["xzp"] = np.asarray(xz.value).reshape(())
    wf = w.astype(np.float32) - consts["wzp"].astype(np.float32).reshape(-1, 1, 1, 1)
    attrs: dict[str, Any] = {"op": "ConvInteger", "geom": geom, "dtype": dt, "epilogue": {},
                             "wdims": tuple(w.shape), "plan_a": dt, "plan_b": node.input(1).dtype.name,
                             "plan_out": "int32", "bound_b": int(np.abs(wf).max()) if wf.size else 1}
    return Prepared(attrs, stash_constants(node, consts, only=(0,)), target)  # a constant X is read at run time


def _x_zero_point(p: Prepared, inputs) -> int:
    z = p.consts.get("xzp")
    if z is None:
        z = arg(p, inputs, 2)
    if z is None:
        return 0
    z = np.asarray(z)
    if z.size != 1:
        raise ValueError(f"ConvInteger: x_zero_point has shape {list(z.shape)}; it must be a scalar")
    return int(z.reshape(()))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    check_channels(p, x)
    xzp = _x_zero_point(p, inputs)
    one_d = x.ndim == 3
    x4 = x[:, :, None, :] if one_d else x
    nat = runtime.native(p)
    if nat is not None:
        geom = memo_per_shape(p, "geometry", x4.shape, _geometry_list, p, x4)
        y = nat.conv_integer(np.ascontiguousarray(x4), xzp, p.consts["qw"], p.consts["wzp"], geom,
                             p.attrs["wdims"][1] == 1, runtime.threads(p))
    else:
        y = _reference(p, x4, xzp)
    return [np.ascontiguousarray(y[:, :, 0, :]) if one_d else y]


def _bind(p: Prepared, inputs, outs):
    """``conv_integer`` as the step for this input shape, as ``_run`` calls it: x (viewed 4-D for a 1-D conv), the
    constant x_zero_point as an int or the runtime one (DynamicQuantizeLinear's) as its one-byte array, into ORT's
    buffer when the result is a partition output. None for a constant X."""
    nat = runtime.native(p)
    x = inputs[0] if inputs else None
    if nat is None or not isinstance(x, np.ndarray) or x.ndim not in (3, 4) or x.dtype not in (np.uint8, np.int8):
        return None
    check_channels(p, x)
    x4 = x.shape[:2] + (1,) + x.shape[2:] if x.ndim == 3 else x.shape
    geom = memo_per_shape(p, "geometry", x4, _geometry_list, p, x.reshape(x4))
    live = [(0, 0, x.dtype, x.shape, x4 if x.ndim == 3 else None)]
    z = inputs[2] if len(inputs) > 2 else None
    if "xzp" in p.consts or z is None:
        xzp: Any = _x_zero_point(p, inputs)
    elif isinstance(z, np.ndarray) and z.size == 1 and z.dtype == x.dtype:
        xzp = None
        live.append((1, 2, z.dtype, z.shape, None))
    else:
        return None
    shape = list(outs[0].shape)
    where = p.runtime.partition_outputs
    into = [(7, where[0], shape)] if where and 0 in where else []
    args = (None, xzp, p.consts["qw"], p.consts["wzp"], geom, p.attrs["wdims"][1] == 1, runtime.threads(p), None)
    return runtime.call_step(p, nat.conv_integer, args, live, [(-1, shape)], None, into)


def _reference(p: Prepared, x: np.ndarray, xzp: int) -> np.ndarray:
    """The exact sums from integer-valued float32 patches and weights (zero points removed)."""
    at = p.attrs
    wf = _reference_weights(p)  # QLinearConv's w - w_zp from the same qw and wzp, made once
    xf = x.astype(np.float32) - np.float32(xzp)
    cols, oh, ow = im2col(xf, at["geom"])
    n = x.shape[0]
    grp, kdim, mg = wf.shape
    cols = cols.reshape(n * oh * ow, grp, kdim).transpose(1, 0, 2)
    acc = exact_int_matmul(cols, wf, int_bound(at["dtype"], np.asarray(xzp)), at["bound_b"], p.target.tile[2])
    y = np.asarray(acc).astype(np.int32, copy=False).transpose(1, 0, 2).reshape(n, oh, ow, grp * mg)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


register(KernelDef("", "ConvInteger", _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
