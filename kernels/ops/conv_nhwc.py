"""npu::ConvNhwc: a float32 depthwise or pointwise Conv (with its fused tail) inside a layout chain
(``kernels/layout.py``), reading x ``[N, H, W, C]`` and writing y ``[N, OH, OW, M]``.

The reference model is the Conv's own (``kernels/ops/conv.py``) in NCHW: x transposed to NCHW, the conv, the result
transposed back. The native kernels (``kernels/native/conv_nhwc.cc``) work in NHWC directly: the depthwise conv
with channels in the lanes (the reference's operations in its order: the same bits), the pointwise conv as
``x[P, C] @ W[C, M]`` on the packed GEMM (within the dot-product bound, as conv.py's own GEMMs). Node attributes
are the Conv's, plus ``layout_kind`` ("depthwise" | "pointwise") and ``layout_in`` ("NCHW": a chain's first
depthwise conv reads its NCHW input itself, gathering each row's channels into the lanes, instead of a Transpose
step before it); ``attrs["layout"]`` is what reports show.
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
from . import conv

KINDS = ("depthwise", "pointwise")


def as_nchw(node: NodeInfo) -> NodeInfo:
    """The Conv node this step computes, its input's shape back in NCHW."""
    x = node.inputs[0]
    if node.attr("layout_in") == "NCHW":
        return dataclasses.replace(node, op_type="Conv", domain="")
    shape = None if x.shape is None else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    return dataclasses.replace(node, op_type="Conv", domain="",
                               inputs=(dataclasses.replace(x, shape=shape), *node.inputs[1:]))


def _check(node: NodeInfo, target: Target) -> str | None:
    if node.attr("layout_kind") not in KINDS:
        return f"{node.describe()}: layout_kind must be one of {', '.join(KINDS)}"
    if node.attr("layout_in") not in (None, "NHWC", "NCHW") or (node.attr("layout_in") == "NCHW"
                                                                and node.attr("layout_kind") != "depthwise"):
        return f"{node.describe()}: layout_in NCHW is for a depthwise conv"
    return conv._check(as_nchw(node), target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    p = conv._prepare(as_nchw(node), target)
    p.attrs["layout"] = "NHWC"
    p.attrs["layout_in"] = str(node.attr("layout_in", "NHWC"))
    p.attrs["layout_kind"] = kind = str(node.attr("layout_kind"))
    if kind == "depthwise":  # w [C, kh*kw, 1] -> taps [C / 32 groups, kh*kw, 32]: a group's tap in the lanes
        p.consts["w_taps"] = _grouped_taps(p.consts["w"][:, :, 0])
    return p


DW_GROUP = 32  # the native depthwise kernel's channels a weight group (conv_nhwc.h kNhwcGroup)


def _grouped_taps(w: np.ndarray) -> np.ndarray:
    """Depthwise weights [C, kh*kw] as the native kernel reads them: [ceil(C / 32), kh*kw, 32], each group's taps with
    its channels in the lanes, the last group's missing channels zero."""
    c, taps = w.shape
    groups = -(-c // DW_GROUP)
    out = np.zeros((groups * DW_GROUP, taps), np.float32)
    out[:c] = w
    return np.ascontiguousarray(out.reshape(groups, DW_GROUP, taps).transpose(0, 2, 1))


def _channels(p: Prepared) -> int:
    m, cg, _, _ = p.attrs["wdims"]
    return m if p.attrs["layout_kind"] == "depthwise" else cg


def _packed(p: Prepared, nat) -> np.ndarray:
    """The pointwise weights [C, M] in the packed GEMM's panels, packed on first use."""
    w = p.consts["w"]
    got = p.kernel_cache.get("nhwc_packed")
    if got is None or got[0] is not w:
        got = p.kernel_cache["nhwc_packed"] = (w, nat.pack_sgemm_b(np.ascontiguousarray(w[0])))
    return got[1]


def _call(p: Prepared, nat, x: np.ndarray) -> tuple:
    """(native kernel, its arguments after x) for x's shape, made once per shape."""
    threads = runtime.threads(p)
    calls = shape_memo(p, "nhwc_call")
    call = calls.recall((x.shape, threads))
    if call is not None and call[0] is p.consts["w"]:
        return call[1:]
    c = p.consts
    b32, tail = conv.bias_and_tail_args(p)  # no per-channel slopes here (_native_ok)
    if p.attrs["layout_kind"] == "depthwise":
        g = p.attrs["geom"]
        nchw_in = p.attrs["layout_in"] == "NCHW"
        h, w = x.shape[2:] if nchw_in else x.shape[1:3]
        geom = [*g["kernel"], *g["strides"], *conv._pads(g, h, w)]
        call = (c["w"], nat.conv_nhwc_depthwise, (c["w_taps"], b32, geom, threads, *tail, nchw_in))
    else:
        call = (c["w"], nat.conv_nhwc_pointwise, (_packed(p, nat), p.attrs["wdims"][0], b32, threads, *tail))
    return calls.keep((x.shape, threads), call)[1:]


def _native_ok(x: Any, p: Prepared) -> bool:
    return (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 4 and "tail_slopes" not in p.consts
            and x.shape[1 if p.attrs["layout_in"] == "NCHW" else 3] == _channels(p))


def reference(p: Prepared, x: np.ndarray) -> np.ndarray:
    """The Conv's kernel in NCHW on x [N, H, W, C] (layout_in NCHW: as it is), its result back in NHWC."""
    y = conv._run(p, [x if p.attrs["layout_in"] == "NCHW" else x.transpose(0, 3, 1, 2)])[0]
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1))


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    x = inputs[0]
    nat = runtime.native(p)
    if nat is not None and _native_ok(x, p):
        fn, args = _call(p, nat, x)
        with np.errstate(all="ignore"):
            return [fn(np.ascontiguousarray(x), *args)]
    return [reference(p, x)]


def _bind(p: Prepared, inputs, outs) -> Any:
    nat = runtime.native(p)
    x = inputs[0] if inputs else None
    if nat is None or not _native_ok(x, p) or not x.flags.c_contiguous:
        return None
    fn, args = _call(p, nat, x)
    return runtime.call_step(p, fn, (None, *args), [(0, 0, x.dtype, x.shape, None)], [(-1, None)])


def _cost(p: Prepared, shapes) -> OpCost:
    x = shapes[0]
    if x is not None and p.attrs["layout_in"] != "NCHW":
        x = (x[0], x[3], x[1], x[2])
    return conv._cost(p, [x, *shapes[1:]])


register(KernelDef("npu", "ConvNhwc", _prepare, _run, _cost, _check, bind=_bind))
