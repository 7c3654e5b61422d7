"""npu::PoolNhwc: a float32 or float16 2-D MaxPool / AveragePool inside a layout region (``kernels/layout.py``),
reading x ``[N, H, W, C]`` and writing y ``[N, OH, OW, C]``.

Node attributes are the pool's (every combination ``kernels/ops/pool.py`` accepts: pads, strides, dilations,
ceil_mode, auto_pad, count_include_pad), plus ``pool_op`` ("MaxPool" | "AveragePool"). The reference model is the
pool's own in NCHW: x transposed to NCHW, ``pool.py``'s kernel, the result transposed back. The native kernels
(``kernels/native/pool_nhwc.cc``) walk ``pool.py``'s geometry in NHWC with the channels in the lanes, the
reference's operations in its order: the same bits (a MaxPool's maximum, NaN where it has one; an AveragePool's
float32 sums in its tap order, then its divisor).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import runtime
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..shape_memo import shape_memo
from ..target import Target
from . import pool

OPS = ("MaxPool", "AveragePool")


def as_nchw(node: NodeInfo) -> NodeInfo:
    """The pool node this step computes, its input's and output's shapes back in NCHW."""

    def back(v):
        s = v.shape
        return v if s is None or len(s) != 4 else dataclasses.replace(v, shape=(s[0], s[3], s[1], s[2]))

    attrs = {k: v for k, v in node.attrs.items() if k != "pool_op"}
    return dataclasses.replace(node, op_type=str(node.attr("pool_op")), domain="", attrs=attrs,
                               inputs=tuple(back(v) for v in node.inputs), outputs=(back(node.outputs[0]),))


def _check(node: NodeInfo, target: Target) -> str | None:
    if node.attr("pool_op") not in OPS:
        return f"{node.describe()}: pool_op must be one of {', '.join(OPS)}"
    k = node.attr("kernel_shape")
    if k is None or len(k) != 2 or len(node.outputs) != 1:
        return f"{node.describe()}: an NHWC pool is 2-D with one output"
    x = node.input(0)
    if x is not None and x.dtype is not None and x.dtype not in (np.float32, np.float16):
        return f"{node.describe()}: an NHWC pool is float32 or float16"
    return pool._check(as_nchw(node), target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    p = pool._prepare(as_nchw(node), target)
    p.attrs["layout"] = "NHWC"
    return p


def _call(p: Prepared, nat, x: np.ndarray) -> tuple | None:
    """(native kernel, its arguments after x) for x's shape, made once per shape; None for an empty output."""
    threads = runtime.threads(p)
    calls = shape_memo(p, "nhwc_call")
    key = (x.shape, x.dtype, threads)
    call = calls.recall(key)
    if call is not None:
        return call[0]
    xt = x.transpose(0, 3, 1, 2)  # a view: the geometry reads the NCHW shape
    at = p.attrs
    geo = pool._geometry(xt, at)
    (oh, top, _), (ow, left, _) = geo
    geom = [oh, ow, *at["kernel"], *at["strides"], *at["dilations"], top, left]
    if oh == 0 or ow == 0:
        call = None
    elif at["op"] == "MaxPool":
        call = (nat.max_pool_nhwc, (geom, float(np.finfo(x.dtype).min), threads))
    else:
        call = (nat.avg_pool_nhwc, (geom, pool._divisor(xt, at, geo), threads))
    return calls.keep(key, (call,))[0]


def _native_ok(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float16) and x.ndim == 4


def reference(p: Prepared, x: np.ndarray) -> np.ndarray:
    """The pool's kernel in NCHW on x [N, H, W, C], its result back in NHWC."""
    run = pool._run_max if p.attrs["op"] == "MaxPool" else pool._run_avg
    y = run(p, [x.transpose(0, 3, 1, 2)])[0]
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = inputs[0]
    nat = runtime.native(p)
    if nat is not None and _native_ok(x):
        call = _call(p, nat, x)
        if call is not None:
            return [call[0](np.ascontiguousarray(x), *call[1])]
    return [reference(p, x)]


def _bind(p: Prepared, inputs, outs) -> Any:
    nat = runtime.native(p)
    x = inputs[0] if inputs else None
    if nat is None or not _native_ok(x) or not x.flags.c_contiguous:
        return None
    call = _call(p, nat, x)
    if call is None:
        return None
    return runtime.call_step(p, call[0], (None, *call[1]), [(0, 0, x.dtype, x.shape, None)], [(-1, None)])


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    if x is not None and len(x) == 4:
        x = (x[0], x[3], x[1], x[2])
    return pool._cost(p, [x, *shapes[1:]])


register(KernelDef("npu", "PoolNhwc", _prepare, _run, _cost, _check, bind=_bind))
