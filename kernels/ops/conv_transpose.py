"""ConvTranspose (1-D and 2-D, groups, strides, dilations, pads, output_padding, output_shape, auto_pad) as a GEMM
on the matrix unit followed by a col2im scatter-add on the vector unit.

Layouts: X ``[N, C, H, W]``, W ``[C, M/g, kh, kw]``, Y ``[N, M, OH, OW]`` (1-D: height 1). Per group the GEMM is
``[N*H*W, C/g] x [C/g, M/g*kh*kw]`` (weights re-laid out at compile time to ``[g, C/g, M/g*kh*kw]``); every kernel
tap (i, j) then adds its ``[N, M/g, H, W]`` slice into the output at rows ``i*dh + y*sh`` and columns
``j*dw + x*sw`` (a Python loop over the kh*kw taps, each a strided numpy add). When the stride equals the kernel (no
dilation, one group) the taps never overlap: the GEMM runs in NCHW as ``W^T @ x`` (natively the pointwise conv kernel's
blocked sgemm) and one strided copy per tap places the taps.

Output size (ONNX): ``stride * (in - 1) + output_padding + (k - 1) * dilation + 1 - pad_begin - pad_end``. With
``output_shape`` (or auto_pad SAME_*, whose output is ``in * stride``) the pads are derived from it: the total
splits as ``begin = total // 2`` for SAME_UPPER and ``begin = total - total // 2`` otherwise; an output larger than
the taps reach (negative total) ends in zeros plus bias, as ORT. Float32 accumulation;
float16 widens and rounds once on store. Natively (float32, float16 with the host BLAS) the whole op is one call,
``kernels.conv_transpose``: the GEMM on the conv kernels' pointwise path, the taps added in this order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import host_blas
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._matrix import check_fits, planned_cost
from ._util import arg, stash_constants


def _pairs(node: NodeInfo, name: str, n: int, default: int) -> list[int]:
    v = node.attr(name)
    return [int(a) for a in v] if v is not None else [default] * n


def _check(node: NodeInfo, target: Target) -> str | None:
    wv = node.input(1)
    if wv is None or not wv.is_constant or wv.shape is None or len(wv.shape) not in (3, 4):
        return (f"{node.describe()}: only 1-D and 2-D transposed convolutions with constant weights "
                f"[C, M/g, (kh,) kw] are supported")
    dt = node.input(0).dtype
    if dt is None or target.float_mode(dt.name) is None:
        return f"{node.describe()}: target {target.name} has no float matrix mode (matrix.float_compute)"
    c, mg = wv.shape[0], wv.shape[1]
    taps = int(np.prod(wv.shape[2:]))
    grp = int(node.attr("group", 1))
    if grp <= 0 or c % grp:
        return f"{node.describe()}: {c} input channels not divisible into group={grp}"
    return check_fits(1, mg * taps, c // grp, dt.name, dt.name, target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    w = np.asarray(node.input(1).value)
    one_d = w.ndim == 3
    nd = w.ndim - 2
    grp = int(node.attr("group", 1))
    c, _mg = w.shape[:2]
    lift = (lambda v, fill: [fill] + v) if one_d else (lambda v, fill: v)
    pads = _pairs(node, "pads", 2 * nd, 0)
    pads = [0, pads[0], 0, pads[1]] if one_d else pads
    attrs: dict[str, Any] = {
        "one_d": one_d, "group": grp, "dtype": node.input(0).dtype.name,
        "kernel": lift(list(w.shape[2:]), 1), "strides": lift(_pairs(node, "strides", nd, 1), 1),
        "dilations": lift(_pairs(node, "dilations", nd, 1), 1), "pads": pads,
        "output_padding": lift(_pairs(node, "output_padding", nd, 0), 0),
        "output_shape": (lift([int(a) for a in node.attr("output_shape")][-nd:], 1)
                         if node.attr("output_shape") else None),  # spatial dims (a full [N, M, ...] is cut)
        "auto_pad": str(node.attr("auto_pad", "NOTSET")), "epilogue": {},
        "plan_a": node.input(0).dtype.name, "plan_b": node.input(0).dtype.name, "plan_out": node.input(0).dtype.name,
    }
    w4 = w[:, :, None, :] if one_d else w
    # [g, C/g, M/g*kh*kw], columns ordered (m, kh, kw)
    consts = {"w": np.ascontiguousarray(w4.astype(np.float32).reshape(grp, c // grp, -1))}
    bias = node.input(2)
    if bias is not None:
        consts["bias"] = np.asarray(bias.value, np.float32)
    return Prepared(attrs, stash_constants(node, consts, only=(0,)), target)  # a constant X is read at run time


def _conv_weights(p: Prepared) -> np.ndarray:
    """[g, C/g*kh*kw, M/g] (rows (c, i, j)): each group's weights swapped (c <-> m) and flipped, the Conv a
    unit-stride ConvTranspose equals (the native kernel runs it so); made once, kept in the kernel's cache."""
    w = p.kernel_cache.get("w_conv")
    if w is None:
        grp, cg, cols = p.consts["w"].shape
        kh, kw = p.attrs["kernel"]
        w5 = p.consts["w"].reshape(grp, cg, cols // (kh * kw), kh, kw)[:, :, :, ::-1, ::-1]
        w = p.kernel_cache["w_conv"] = np.ascontiguousarray(w5.transpose(0, 1, 3, 4, 2).reshape(grp, cg * kh * kw, -1))
    return w


def _begin_end(a: dict[str, Any], size: int, axis: int) -> tuple[int, int, int]:
    """(pad_begin, pad_end, full length before cropping) along spatial ``axis`` (0: H, 1: W)."""
    k, s, d, op = a["kernel"][axis], a["strides"][axis], a["dilations"][axis], a["output_padding"][axis]
    full = s * (size - 1) + op + (k - 1) * d + 1
    target = None
    if a["output_shape"] is not None:
        target = a["output_shape"][-2:][axis]
    elif a["auto_pad"] in ("SAME_UPPER", "SAME_LOWER"):
        target = size * s
    if target is None:
        if a["auto_pad"] == "VALID":
            return 0, 0, full
        return a["pads"][axis], a["pads"][axis + 2], full
    total = full - target
    if total < 0:  # the output is larger than the taps reach: ORT pads nothing, the tail is zeros (+ bias)
        return 0, total, full
    small = total // 2
    return (small, total - small, full) if a["auto_pad"] == "SAME_UPPER" else (total - small, small, full)


def _disjoint_taps(p: Prepared) -> bool:
    """Stride equal to the kernel, no dilation, one group: every output pixel takes exactly one tap of one input
    pixel (the usual 2x upsampling head), so there is nothing to scatter-add."""
    a = p.attrs
    return a["group"] == 1 and a["strides"] == a["kernel"] and a["dilations"] == [1, 1]


def _run_disjoint(p: Prepared, xf: np.ndarray) -> np.ndarray:
    """``W^T[M*kh*kw, C] @ x[n][C, H*W]`` per image (NCHW, no patch gather), then one interleaving copy into the
    output rows ``y*kh + i`` and columns ``x*kw + j``; cropped by the pads and padded past the taps as ``_run``."""
    a, w = p.attrs, p.consts["w"]
    n, c, h, wd = xf.shape
    kh, kw = a["kernel"]
    m = w.shape[2] // (kh * kw)
    (t, b, fh), (l, r, fw) = _begin_end(a, h, 0), _begin_end(a, wd, 1)
    full = (np.empty if (fh, fw) == (h * kh, wd * kw) else np.zeros)((n, m, fh, fw), np.float32)
    nat, sgemm = runtime.native(p), host_blas.sgemm_address()
    if nat is not None and sgemm is not None:  # the product as a pointwise conv: pixel blocks on both threads
        prods = nat.conv_dense(xf, w, None, [m * kh * kw, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0], sgemm, runtime.threads(p))
    else:
        wt = p.kernel_cache.get("w_t")
        if wt is None:
            wt = p.kernel_cache["w_t"] = np.ascontiguousarray(w[0].T)  # [M*kh*kw, C]
        prods = [host_blas.matmul(wt, xf[i].reshape(c, h * wd)) for i in range(n)]
    for i in range(n):
        prod = prods[i].reshape(m, kh, kw, h, wd)
        out = full[i, :, :h * kh, :wd * kw].reshape(m, h, kh, wd, kw)
        for ti in range(kh):
            for tj in range(kw):
                out[:, :, ti, :, tj] = prod[:, ti, tj]  # one tap plane at a time: ~3x faster than one 5-D copy
    y = full[:, :, max(t, 0):fh - max(b, 0), max(l, 0):fw - max(r, 0)]
    if min(t, b, l, r) < 0:
        y = np.pad(y, ((0, 0), (0, 0), (max(-t, 0), max(-b, 0)), (max(-l, 0), max(-r, 0))))
    if "bias" in p.consts:
        y = np.ascontiguousarray(y)
        y += p.consts["bias"].reshape(1, -1, 1, 1)
    return y


def _native_call(p: Prepared, x: np.ndarray) -> tuple | None:
    """(kernel, its arguments after x viewed 4-D) of the native ConvTranspose (kernels/native/conv_transpose.cc:
    the product on the conv GEMM, then the taps added in ``_run``'s order, cropped, + bias), or None where the
    reference runs (no extension or host BLAS, a dtype other than float32/float16)."""
    nat, sgemm = runtime.native(p), host_blas.sgemm_address()
    if nat is None or sgemm is None or x.dtype not in (np.float32, np.float16) or x.ndim not in (3, 4):
        return None
    a, w = p.attrs, p.consts["w"]
    h, wd = (1, x.shape[2]) if a["one_d"] else x.shape[2:]
    (t, b, fh), (l, r, fw) = _begin_end(a, h, 0), _begin_end(a, wd, 1)
    grp, kh, kw = w.shape[0], *a["kernel"]
    geometry = [grp, w.shape[2] // (kh * kw), kh, kw, *a["strides"], *a["dilations"], t, l, fh, fw, fh - t - b,
                fw - l - r]
    return nat.conv_transpose, (w, p.consts.get("bias"), geometry, sgemm, runtime.threads(p), _conv_weights(p))


def _as_4d(p: Prepared, x: np.ndarray) -> np.ndarray:
    return x[:, :, None, :] if p.attrs["one_d"] else x


def _bind(p: Prepared, inputs, outs) -> Any:
    """ConvTranspose as one native step for x's shape (a 1-D one's x viewed 4-D, its result back 3-D)."""
    x = inputs[0] if inputs else None
    if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or not outs or outs[0].size == 0:
        return None
    call = _native_call(p, x)
    if call is None:
        return None
    one_d = p.attrs["one_d"]
    return runtime.call_step(p, call[0], (None, *call[1]),
                             [(0, 0, x.dtype, x.shape, _as_4d(p, x).shape if one_d else None)],
                             [(-1, outs[0].shape if one_d else None)])


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    a, w = p.attrs, p.consts["w"]
    x = arg(p, inputs, 0)
    call = _native_call(p, x)
    if call is not None and x.size:
        y = call[0](np.ascontiguousarray(_as_4d(p, x)), *call[1])
        return [y[:, :, 0, :] if a["one_d"] else y]
    xf = x.astype(np.float32)
    if a["one_d"]:
        xf = xf[:, :, None, :]
    if _disjoint_taps(p):
        y = _run_disjoint(p, np.ascontiguousarray(xf))
        return [np.ascontiguousarray(y[:, :, 0, :] if a["one_d"] else y, dtype=a["dtype"])]
    n, _c, h, wd = xf.shape
    grp, cg, cols_n = w.shape
    kh, kw = a["kernel"]
    mg = cols_n // (kh * kw)
    cols = xf.reshape(n, grp, cg, h * wd).transpose(1, 0, 3, 2).reshape(grp, n * h * wd, cg)
    prod = host_blas.matmul(cols, w)  # [g, N*H*W, M/g*kh*kw]
    prod = prod.reshape(grp, n, h, wd, mg, kh, kw)
    (t, b, fh), (l, r, fw) = _begin_end(a, h, 0), _begin_end(a, wd, 1)
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    full = np.zeros((n, grp, mg, fh, fw), np.float32)
    span_h, span_w = (h - 1) * sh + 1, (wd - 1) * sw + 1
    for i in range(kh):
        for j in range(kw):
            tap = prod[:, :, :, :, :, i, j].transpose(1, 0, 4, 2, 3)  # [N, g, M/g, H, W]
            full[:, :, :, i * dh:i * dh + span_h:sh, j * dw:j * dw + span_w:sw] += tap
    y = full.reshape(n, grp * mg, fh, fw)[:, :, max(t, 0):fh - max(b, 0), max(l, 0):fw - max(r, 0)]
    if min(t, b, l, r) < 0:
        y = np.pad(y, ((0, 0), (0, 0), (max(-t, 0), max(-b, 0)), (max(-l, 0), max(-r, 0))))
    if "bias" in p.consts:
        y = y + p.consts["bias"].reshape(1, -1, 1, 1)
    if a["one_d"]:
        y = y[:, :, 0, :]
    return [np.ascontiguousarray(y, dtype=a["dtype"])]


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    pixels = int(np.prod(x[2:], dtype=np.int64))
    grp, cg, cols_n = p.consts["w"].shape
    return planned_cost(p, x[0] * pixels, cols_n, cg, grp)


register(KernelDef("", "ConvTranspose", _prepare, _run, _cost, _check, bind=_bind))
