"""MaxPool, AveragePool, GlobalAveragePool (2-D, NCHW) on the vector unit, as strided window views.

Padding: MaxPool pads with the dtype's lowest value; AveragePool divides by the window size
(count_include_pad=1: the window clipped to the padded input) or by the number of real elements
(count_include_pad=0), both computed once per output position from a mask. ceil_mode adds extra padding at the
end that never counts. Cost: one vector op per window element per output (``kh*kw`` ops/output).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..cost import vector_cost
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, nbytes


def _check(node: NodeInfo, target: Target) -> str | None:
    x = node.input(0)
    if x.shape is not None and len(x.shape) != 4:
        return f"{node.describe()}: only 2-D pooling over NCHW inputs is supported"
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and not node.outputs[1].missing:
        return f"{node.describe()}: the Indices output is not supported"
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return f"{node.describe()}: auto_pad={node.attr('auto_pad')} not supported (use explicit pads)"
    return None


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    k = list(node.attr("kernel_shape", [1, 1]))
    attrs: dict[str, Any] = {"op": node.op_type, "kernel": k, "strides": list(node.attr("strides", [1, 1])),
                             "pads": list(node.attr("pads", [0, 0, 0, 0])) if node.attr("auto_pad", "NOTSET") ==
                             "NOTSET" else [0, 0, 0, 0],
                             "dilations": list(node.attr("dilations", [1, 1])), "ceil": int(node.attr("ceil_mode", 0)),
                             "include_pad": int(node.attr("count_include_pad", 0))}
    return Prepared(attrs, {}, target)


def _out_size(size: int, k: int, s: int, d: int, p0: int, p1: int, ceil: int) -> int:
    span = size + p0 + p1 - ((k - 1) * d + 1)
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= size + p0:  # last window must start inside the input or left pad
        o -= 1
    return o


def _windows(x: np.ndarray, at: dict[str, Any], fill: Any) -> tuple[np.ndarray, list[int]]:
    (kh, kw), (sh, sw), (dh, dw) = at["kernel"], at["strides"], at["dilations"]
    t, l, b, r = at["pads"]
    h, w = x.shape[2:]
    oh = _out_size(h, kh, sh, dh, t, b, at["ceil"])
    ow = _out_size(w, kw, sw, dw, l, r, at["ceil"])
    eb = max(b, (oh - 1) * sh + (kh - 1) * dh + 1 - h - t)  # ceil_mode extra padding
    er = max(r, (ow - 1) * sw + (kw - 1) * dw + 1 - w - l)
    xp = np.pad(x, ((0, 0), (0, 0), (t, eb), (l, er)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow], [t, eb, l, er, oh, ow]


def _run_max(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win, _ = _windows(x, p.attrs, low)
    return [win.max(axis=(-2, -1))]


def _run_avg(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    at = p.attrs
    win, (t, eb, l, er, oh, ow) = _windows(x.astype(np.float32), at, 0.0)
    s = win.sum(axis=(-2, -1))
    h, w = x.shape[2:]
    b, r = at["pads"][2], at["pads"][3]
    mask = np.zeros((1, 1, h + t + eb, w + l + er), np.float32)
    if at["include_pad"]:
        mask[..., : h + t + b, : w + l + r] = 1  # declared pads count, ceil_mode extension does not
    else:
        mask[..., t:t + h, l:l + w] = 1
    cnt, _ = _windows(mask, {**at, "pads": [0, 0, 0, 0], "ceil": 0}, 0.0)
    cnt = cnt[..., :oh, :ow].sum(axis=(-2, -1))
    return [(s / cnt).astype(x.dtype)]


def _run_gap(p: Prepared, inputs) -> list[np.ndarray]:
    x = arg(p, inputs, 0)
    return [x.astype(np.float32).mean(axis=(2, 3), keepdims=True).astype(x.dtype)]


def _cost(p: Prepared, shapes) -> OpCost:
    s = tuple(shapes[0])
    item = 4
    if p.attrs["op"] == "GlobalAveragePool":
        n_out, ops = s[0] * s[1], s[2] * s[3]
    else:
        kh, kw = p.attrs["kernel"]
        n_out, ops = int(np.prod(s, dtype=np.int64)) // math.prod(p.attrs["strides"]), kh * kw
    return vector_cost(p.target, n_out, nbytes(s, item), n_out * item, float(ops))


register(KernelDef("", "MaxPool", _prepare, _run_max, _cost, _check))
register(KernelDef("", "AveragePool", _prepare, _run_avg, _cost, _check))
register(KernelDef("", "GlobalAveragePool", _prepare, _run_gap, _cost, _check))
