"""1-D and 2-D Conv and QLinearConv as implicit GEMM on the matrix unit (a 1-D conv runs as a 2-D one of height 1).

Layouts: X ``[N, C, H, W]``, W ``[M, C/g, kh, kw]``, Y ``[N, M, OH, OW]``. Per group g the GEMM is
``[N*OH*OW, C/g*kh*kw] x [C/g*kh*kw, M/g]`` (m, k, n of the tile plan; ``batch`` = groups). Patches are gathered
with a strided view (no Python loop over pixels); weights are re-laid out at compile time to ``[g, K, M/g]``
(QLinearConv: zero point removed, float32 holding exact integers).

Float Conv avoids the pixel-major patch gather: a pointwise conv (1x1, stride 1, no pads, one group) is one GEMM in
NCHW, a depthwise conv (a group per input channel) is kh*kw multiply-adds of strided windows, and any other
one-group conv builds its patch matrix K-major (one window copy per tap) for ``W[M, K] @ patches``; all sum in
float32 like the batched GEMM, in a different order (last-bit differences). Grouped convs and QLinearConv keep the
``[g, N*OH*OW, K]`` patches.

Native kernels (``kernels/native/conv.cc``, chosen per session through ``runtime.native``): a float32 Conv
runs its depthwise case directly (the reference's float32 operations in its order, bit-equal), and its other cases
as blocked implicit GEMM: on AVX-512 our own GEMM (``conv_gemm_avx512.cc``), reading zero-padded input rows in
place at unit width stride, and any conv over fewer than 16 output pixels (an SE block's or a head's 1x1 map, a
1-D conv over a few frames), or a 1x1 conv over a small map whose pixels fill vectors badly (7x7), on its weights
packed once in panels of 64 output channels (``conv_panels``: the output channels in the lanes, each panel one
stream, as a GEMV wants); below AVX-512, per block of output pixels a cache-sized patch matrix (a pointwise conv:
x's own rows) times W on numpy's own OpenBLAS sgemm, called from C++ (``host_blas.sgemm_address``; without that
symbol, one native patch matrix per image times numpy's matmul); QLinearConv runs on the int8 GEMM with exact
int32 sums.
QLinearConv's weights stay integers: ``qw`` is laid out for the native kernel (``[M, kh, kw, C/g rounded up to
4]``, or ``[M, kh*kw]`` when each group has one input channel) and the reference model's float weights are derived
from it on first use.

QLinearConv numerics: input padding holds x_zero_point (zero after subtraction), int32 accumulation (exact, see
``_matrix``), int32 bias added, then MLAS requantization with ``multiplier = x_scale * w_scale[m] / y_scale`` in
float32 - bit-exact vs ORT CPU; then, when a ``npu::QdqLut`` was folded in (``output_lut``), its table. Conv: float32
(fp16 inputs widened, result rounded to fp16 once; the native kernels do the same inside one call).

A float32 Conv may carry an element-wise tail (``conv_tail`` attribute, ``kernels/fusion/conv_tail.py``): the native
kernels apply it to each finished block while it is in cache (``kernels/native/conv_tail.cc``), the reference
model by ``tail_reference`` over the whole output. A per-channel PRelu in the tail is a ``leaky_relu`` whose slope
is one constant per output channel (``conv_tail_channel_slopes``), passed to the kernels beside the tail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import host_blas
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..shape_memo import memo_per_shape, shape_memo
from ..target import Target
from ..tail_program import CODES
from .. import runtime
from ._matrix import check_fits, exact_int_matmul, int_bound, planned_cost, requantize
from ._util import arg, stash_constants
from .elementwise_chain import program_of, run_program


def _geometry(node: NodeInfo, wshape: tuple[int, ...]) -> dict[str, Any]:
    """Kernel, strides, dilations and pads as 2-D lists; a 1-D conv is a 2-D one with a height-1 kernel."""
    if len(wshape) == 3:
        (s,), (d,) = node.attr("strides", [1]), node.attr("dilations", [1])
        b, e = node.attr("pads", [0, 0])
        return {"kernel": [1, wshape[2]], "strides": [1, int(s)], "dilations": [1, int(d)],
                "pads": [0, int(b), 0, int(e)], "auto_pad": node.attr("auto_pad", "NOTSET"),
                "group": int(node.attr("group", 1)), "one_d": True}
    kh, kw = wshape[2], wshape[3]
    return {"kernel": [kh, kw], "strides": list(node.attr("strides", [1, 1])),
            "dilations": list(node.attr("dilations", [1, 1])), "pads": list(node.attr("pads", [0, 0, 0, 0])),
            "auto_pad": node.attr("auto_pad", "NOTSET"), "group": int(node.attr("group", 1))}


def _pads(g: dict[str, Any], h: int, w: int) -> list[int]:
    if g["auto_pad"] in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in ((h, *(g["kernel"][0], g["strides"][0], g["dilations"][0])),
                              (w, *(g["kernel"][1], g["strides"][1], g["dilations"][1]))):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            out.append((small, total - small) if g["auto_pad"] == "SAME_UPPER" else (total - small, small))
        return [out[0][0], out[1][0], out[0][1], out[1][1]]
    if g["auto_pad"] == "VALID":
        return [0, 0, 0, 0]
    return g["pads"]


def _padded(x: np.ndarray, g: dict[str, Any], pad_value: float = 0.0) -> tuple[np.ndarray, int, int]:
    """NCHW ``x`` with the conv's pads applied, and the output height and width."""
    t, l, b, r = _pads(g, x.shape[2], x.shape[3])
    if t or l or b or r:
        x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=pad_value)
    (kh, kw), (sh, sw), (dh, dw) = g["kernel"], g["strides"], g["dilations"]
    return x, (x.shape[2] - (kh - 1) * dh - 1) // sh + 1, (x.shape[3] - (kw - 1) * dw - 1) // sw + 1


def im2col(x: np.ndarray, g: dict[str, Any], pad_value: float = 0.0) -> tuple[np.ndarray, int, int]:
    """Patches ``[N, OH, OW, C, kh, kw]`` (a strided view over the padded input) and the output size."""
    x, _, _ = _padded(x, g, pad_value)
    (kh, kw), (sh, sw), (dh, dw) = g["kernel"], g["strides"], g["dilations"]
    ekh, ekw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = np.lib.stride_tricks.sliding_window_view(x, (ekh, ekw), axis=(2, 3))[..., ::dh, ::dw]
    win = win[:, :, ::sh, ::sw]  # [N, C, OH, OW, kh, kw]
    return win.transpose(0, 2, 3, 1, 4, 5), win.shape[2], win.shape[3]


def _gemm_dims(p: Prepared, xshape) -> tuple[int, int, int, int]:
    g = p.attrs["geom"]
    if g.get("one_d"):
        xshape = (xshape[0], xshape[1], 1, xshape[2])
    n, _, h, w = xshape
    t, l, b, r = _pads(g, h, w)
    (kh, kw), (sh, sw), (dh, dw) = g["kernel"], g["strides"], g["dilations"]
    oh = (h + t + b - (kh - 1) * dh - 1) // sh + 1
    ow = (w + l + r - (kw - 1) * dw - 1) // sw + 1
    m, cg, kh, kw = p.attrs["wdims"]
    grp = g["group"]
    return n * oh * ow, m // grp, cg * kh * kw, grp


def _check(node: NodeInfo, target: Target) -> str | None:
    q = node.op_type == "QLinearConv"
    wi = 3 if q else 1
    wv = node.input(wi)
    if wv is None or not wv.is_constant or wv.shape is None or len(wv.shape) not in (3, 4):
        return (f"{node.describe()}: only 1-D and 2-D convolutions with constant weights [M, C/g, (kh,) kw] "
                f"are supported")
    if not q and target.float_mode(node.input(0).dtype.name) is None:
        return f"{node.describe()}: target {target.name} has no float matrix mode (matrix.float_compute)"
    m, cg, kh, kw = wv.shape if len(wv.shape) == 4 else (wv.shape[0], wv.shape[1], 1, wv.shape[2])
    grp = int(node.attr("group", 1))
    dt_a = node.input(0).dtype.name
    return check_fits(1, m // grp, cg * kh * kw, dt_a, wv.dtype.name if q else dt_a, target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    q = node.op_type == "QLinearConv"
    wi = 3 if q else 1
    w = np.asarray(node.input(wi).value)
    geom = _geometry(node, w.shape)
    if w.ndim == 3:
        w = w[:, :, None, :]
    grp = geom["group"]
    m, cg, kh, kw = w.shape
    consts: dict[str, np.ndarray] = {}
    wf = w.astype(np.float32)
    dt = node.input(0).dtype.name
    attrs: dict[str, Any] = {"op": node.op_type, "geom": geom, "dtype": dt, "epilogue": {},
                             "wdims": (m, cg, kh, kw)}
    if q:
        wzp = node.input(5)
        wz = np.zeros((), np.float32) if wzp is None else np.asarray(wzp.value, np.float32)
        wf -= wz.reshape(-1, 1, 1, 1) if wz.ndim == 1 else wz
        consts["qw"] = _native_weights(w)
        consts["wzp"] = np.ascontiguousarray(np.broadcast_to(wz.astype(np.int32).reshape(-1), (m,)))
        xs, ws, ys = (np.asarray(node.input(i).value, np.float32) for i in (1, 4, 6))
        consts["mult"] = np.asarray(xs * ws / ys, np.float32)
        xzp = node.input(2)
        consts["xzp"] = np.asarray(0 if xzp is None else xzp.value).astype(np.float32)
        yzp = node.input(7)
        consts["yzp"] = np.asarray(0 if yzp is None else yzp.value, np.float32)
        attrs["out"] = yzp.dtype.name if yzp is not None else "uint8"
        attrs["bound_a"] = int_bound(dt, consts["xzp"])
        attrs["bound_b"] = int(np.abs(wf).max()) if wf.size else 1
        bias = node.input(8)
        attrs.update(plan_a=dt, plan_b=node.input(3).dtype.name, plan_out="int8")
        lut = node.attr("output_lut")
        if lut is not None:  # a fused npu::QdqLut (kernels/fusion/qdq_lut.py): y = lut[requantized y]
            consts["out_lut"] = np.ascontiguousarray(lut)
    else:
        bias = node.input(2)
        attrs.update(plan_a=dt, plan_b=dt, plan_out=dt)
    if bias is not None:
        consts["bias"] = np.asarray(bias.value)
    if not q:
        consts["w"] = _gemm_weights(wf, grp)
    tail = node.attr("conv_tail")
    if tail:  # kernels/fusion/conv_tail.py
        consts["tail_codes"] = np.asarray([CODES[t[0]] for t in tail], np.int32)
        consts["tail_c"] = np.asarray([t[1:] for t in tail], np.float32).reshape(-1, 2)
        slopes = node.attr("conv_tail_channel_slopes")
        if slopes is not None:  # a per-channel PRelu's slopes: instruction conv_tail_channel_at's constant per channel
            consts["tail_slopes"] = np.asarray(slopes, np.float32).reshape(-1)
            attrs["tail_channel_at"] = int(node.attr("conv_tail_channel_at"))
    return Prepared(attrs, stash_constants(node, consts, only=(0,)), target)  # a constant X is read at run time


def tail_reference(y: np.ndarray, codes: np.ndarray, c: np.ndarray,
                   channel: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """A fused element-wise tail applied in place to float32 ``y`` [N, M, ...] (the native ``conv_tail``'s
    reference): the element-wise engine's interpreter (``elementwise_chain.run_program``), each instruction the
    float32 operation of the node it replaced. ``channel``: (instruction index, [M] constants) of a per-output-channel
    operand, which replaces that instruction's first constant."""
    per_channel = None
    if channel is not None:
        per_channel = (channel[0], np.asarray(channel[1], np.float32).reshape(1, -1, *([1] * (y.ndim - 2))))
    y[...] = run_program(y, program_of(codes, c), per_channel)
    return y


def _gemm_weights(wf: np.ndarray, grp: int) -> np.ndarray:
    """``[M, C/g, kh, kw]`` float as ``[g, K = C/g*kh*kw, M/g]``, K ordered (c, kh, kw) like the patches."""
    m, cg, kh, kw = wf.shape
    return np.ascontiguousarray(wf.reshape(grp, m // grp, cg * kh * kw).transpose(0, 2, 1))


def _native_weights(w: np.ndarray) -> np.ndarray:
    """Integer weights ``[M, C/g, kh, kw]`` as the native QLinearConv reads them: ``[M, kh*kw]`` with one input
    channel per group, else ``[M, kh, kw, C/g rounded up to 4]`` zero-padded (4 channels of a tap are one int32
    lane of the int8 GEMM)."""
    m, cg, kh, kw = w.shape
    if cg == 1:
        return np.ascontiguousarray(w.reshape(m, kh * kw))
    cg4 = -(-cg // 4) * 4
    out = np.zeros((m, kh, kw, cg4), w.dtype)
    out[..., :cg] = w.transpose(0, 2, 3, 1)
    return out.reshape(m, -1)


def _reference_weights(p: Prepared) -> np.ndarray:
    """QLinearConv's and ConvInteger's ``[g, K, M/g]`` float32 ``w - w_zp`` for the reference model, from ``qw``
    (kernel_cache)."""
    got = p.kernel_cache.get("reference_w")
    if got is None:
        m, cg, kh, kw = p.attrs["wdims"]
        qw = p.consts["qw"]
        w = qw.reshape(m, 1, kh, kw) if cg == 1 else qw.reshape(m, kh, kw, -1)[..., :cg].transpose(0, 3, 1, 2)
        wf = w.astype(np.float32) - p.consts["wzp"].astype(np.float32).reshape(-1, 1, 1, 1)
        got = p.kernel_cache["reference_w"] = _gemm_weights(wf, p.attrs["geom"]["group"])
    return got


def _pointwise(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A 1x1, stride-1, unpadded, ungrouped conv straight in NCHW: ``W[M, C] @ x[n][C, H*W]`` (no patches)."""
    n, ch, h, wd = x.shape
    return host_blas.matmul(w[0].T, x.reshape(n, ch, h * wd)).reshape(n, -1, h, wd)


def _depthwise(x: np.ndarray, w: np.ndarray, g: dict[str, Any]) -> np.ndarray:
    """A depthwise conv (one input channel per group, ``mult`` outputs each) as kh*kw multiply-adds of whole
    strided feature-map windows: no patch matrix, no per-group GEMMs of width ``mult``."""
    n, ch = x.shape[:2]
    x, oh, ow = _padded(x, g)
    (kh, kw), (sh, sw), (dh, dw) = g["kernel"], g["strides"], g["dilations"]
    mult = w.shape[2]
    y = np.empty((n, ch, mult, oh, ow), np.float32)
    tmp = np.empty_like(y)
    for t in range(kh * kw):
        i, j = divmod(t, kw)
        win = x[:, :, None, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
        np.multiply(win, w[None, :, t, :, None, None], out=y if t == 0 else tmp)
        if t:
            y += tmp
    return y.reshape(n, ch * mult, oh, ow)


def _dense(x: np.ndarray, w: np.ndarray, g: dict[str, Any]) -> np.ndarray:
    """A one-group conv as ``W[M, K] @ patches[K, N*OH*OW]``: the patch matrix is built K-major, one strided
    window copy per (kh, kw) tap (row runs stay contiguous), and the product lands in [M, N, OH, OW] order."""
    n, ch = x.shape[:2]
    x, oh, ow = _padded(x, g)
    (kh, kw), (sh, sw), (dh, dw) = g["kernel"], g["strides"], g["dilations"]
    cols = np.empty((ch, kh, kw, n, oh, ow), np.float32)
    for i in range(kh):
        for j in range(kw):
            win = x[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            cols[:, i, j] = win.transpose(1, 0, 2, 3)
    y = host_blas.matmul(w[0].T, cols.reshape(ch * kh * kw, n * oh * ow))
    return y.reshape(-1, n, oh, ow).transpose(1, 0, 2, 3)


def _fast_float_conv(x: np.ndarray, c: dict[str, np.ndarray], at: dict[str, Any]) -> np.ndarray | None:
    """The float conv in NCHW without the pixel-major patch gather when its shape allows (pointwise, depthwise or
    one group), else None (grouped convs take the batched-GEMM path)."""
    g = at["geom"]
    grp, kdim, _ = c["w"].shape
    if grp == 1 and kdim == x.shape[1] and g["kernel"] == [1, 1] and g["strides"] == [1, 1] \
            and g["auto_pad"] in ("NOTSET", "VALID") and not any(g["pads"]):
        return _pointwise(x, c["w"])
    if grp == x.shape[1] and grp > 1 and kdim == g["kernel"][0] * g["kernel"][1]:
        return _depthwise(x, c["w"], g)
    if grp == 1:
        return _dense(x, c["w"], g)
    return None


def check_channels(p: Prepared, x: np.ndarray) -> None:
    """Refuse an input whose channels are not the weights' ``C/group * group`` (a symbolic channel dim is only
    known at run time). The native integer weights are padded to 4 channels a tap, so their size alone would let
    C=2 or 3 pass against 4 and read the padding as channels: ValueError naming the op and both shapes."""
    m, cg, kh, kw = p.attrs["wdims"]
    grp = p.attrs["geom"]["group"]
    if x.ndim < 3 or x.shape[1] != cg * grp:
        wshape = [m, cg, kw] if p.attrs["geom"].get("one_d") else [m, cg, kh, kw]
        raise ValueError(f"{p.attrs['op']}: input X {list(x.shape)} has {x.shape[1] if x.ndim > 1 else '?'} "
                         f"channels; weights {wshape} with group {grp} need {cg * grp}")


def _geometry_list(p: Prepared, x: np.ndarray) -> list[int]:
    """The native kernels' geometry: [M, group, kh, kw, sh, sw, dh, dw, pad top, left, bottom, right], for an x
    whose channels match the weights (checked)."""
    check_channels(p, x)
    g = p.attrs["geom"]
    return [p.attrs["wdims"][0], g["group"], *g["kernel"], *g["strides"], *g["dilations"],
            *_pads(g, x.shape[2], x.shape[3])]


def bias_and_tail_args(p: Prepared) -> tuple[np.ndarray | None, tuple]:
    """The float kernels' bias argument (contiguous float32, or None) and their tail arguments: (codes, constants)
    or (None, None), then a per-channel PRelu's slopes and instruction index when the tail has one."""
    c = p.consts
    bias = c.get("bias")
    b32 = None if bias is None else np.ascontiguousarray(bias, np.float32).reshape(-1)
    tail = (c["tail_codes"], c["tail_c"]) if "tail_codes" in c else (None, None)
    if "tail_slopes" in c:
        tail = (*tail, c["tail_slopes"], p.attrs["tail_channel_at"])
    return b32, tail


def _float_call(p: Prepared, nat, x: np.ndarray, threads: int) -> tuple | None:
    """(weights, bias, kernel, its arguments after x) of the float conv's native call for x's shape, made once per
    shape (geometry, contiguous bias, tail, BLAS address: ~5 us of Python per call otherwise); None when neither the
    depthwise nor the dense kernel applies. Rebuilt if the weights or bias objects were replaced."""
    c = p.consts
    w, bias = c["w"], c.get("bias")
    calls = shape_memo(p, "float_call")
    call = calls.recall((x.shape, threads))
    if call is not None and call[0] is w and call[1] is bias:
        return call
    g = p.attrs["geom"]
    grp, kdim, _ = w.shape
    geom = _geometry_list(p, x)
    b32, tail = bias_and_tail_args(p)
    sgemm = host_blas.sgemm_address()
    if grp == x.shape[1] and grp > 1 and kdim == g["kernel"][0] * g["kernel"][1]:
        call = (w, bias, nat.conv_depthwise, (w, b32, geom, threads, *tail))
    elif (_panels_pay(_out_pixels(p, x), kdim, w.shape[2], _is_pointwise(g, geom))
          and nat.isa() in runtime.AVX512_ISAS):
        call = (w, bias, nat.conv_panels, (_panels(p, w), b32, geom, threads, *tail))
    elif sgemm is not None:
        call = (w, bias, nat.conv_dense, (w, b32, geom, sgemm, threads, *tail))
    else:
        return None
    return calls.keep((x.shape, threads), call)


# Where the optional tail arguments start among each float kernel's arguments after x (out= follows all four).
_TAIL_AT = {"conv_depthwise": 4, "conv_dense": 5, "conv_panels": 4}

SMALL_MAP_PIXELS = 16  # a conv over fewer output pixels runs on panel-packed weights (conv_panels)
PANEL = 64  # output channels per panel (kernels/native/conv_gemm.h kPanel)


def _out_pixels(p: Prepared, x: np.ndarray) -> int:
    """Output pixels per image of the conv on 4-D ``x``."""
    oh, ow = _padded_size(p, x)
    return oh * ow


def _panels_pay(pixels: int, k: int, mg: int, pointwise: bool = True) -> bool:
    """Whether a conv over ``pixels`` output pixels (per image) runs on panel-packed weights: any conv under
    SMALL_MAP_PIXELS (the pixel GEMM's vectors would run part empty); a 1x1 conv also below 128 (one pixel block of
    the own GEMM) where the output channels in the lanes take at most 1/8 more vector multiply-adds than the pixel
    GEMM's 16-pixel slots (``ChannelLanesPay``'s count in conv_gemm.cc: a 7x7 map's 49 pixels fill four slots with
    one); the panels' weights stream in order, which ran 16-30% under the unpacked lanes (8x8 256 -> 256: 79 us on
    the pixel GEMM, 61 on panels)."""
    if pixels < SMALL_MAP_PIXELS:
        return pixels > 0
    if not pointwise or pixels >= 128 or mg % 16 or k < 64:
        return False
    slots, kc = -(-pixels // 16), min(k, 256)
    lanes = mg // 16 * pixels * (kc + 16)
    pixel_gemm = -(-mg // 8) * (slots // 2 * 16 + slots % 2 * 8) * kc
    return 7 * lanes < 6 * pixel_gemm if mg == 16 else 8 * lanes < 9 * pixel_gemm


def _is_pointwise(g: dict[str, Any], geom: list[int]) -> bool:
    """A 1x1, stride-1, undilated, unpadded conv (geom: ``_geometry_list``'s)."""
    return g["kernel"] == [1, 1] and g["strides"] == [1, 1] and not any(geom[8:])


def _panels(p: Prepared, w: np.ndarray) -> np.ndarray:
    """``w`` [g, K, Mg] as ``conv_panels`` reads it, [g, Mg/PANEL rounded up, K, PANEL] (zeros past Mg):
    a panel's weights one contiguous stream, as a GEMV over them wants. Packed on first use, kept while ``w`` is
    the conv's weights (held twice then, as MLAS keeps its prepacked weights)."""
    got = p.kernel_cache.get("w_panels")
    if got is None or got[0] is not w:
        grp, k, mg = w.shape
        panels = -(-mg // PANEL)
        padded = np.zeros((grp, k, panels * PANEL), np.float32)
        padded[:, :, :mg] = w
        got = p.kernel_cache["w_panels"] = (w, np.ascontiguousarray(padded.reshape(grp, k, panels, PANEL)
                                                                    .transpose(0, 2, 1, 3)))
    return got[1]


def _qlinear_call(p: Prepared, nat, x: np.ndarray, threads: int) -> tuple:
    """(kernel, its arguments after x, dtype to view its result as or None) of the QLinearConv's native call for
    x's shape, made once per shape (``shape_memo``)."""
    return memo_per_shape(p, "qlinear_call", (x.shape, threads), _qlinear_call_made, p, nat, x, threads)


def _qlinear_call_made(p: Prepared, nat, x: np.ndarray, threads: int) -> tuple:
    at, c = p.attrs, p.consts
    mult = np.ascontiguousarray(np.broadcast_to(np.asarray(c["mult"], np.float32).reshape(-1), (at["wdims"][0],)))
    bias = c.get("bias")
    lut = c.get("out_lut")
    y_signed = at["out"] == "int8"
    depthwise = at["wdims"][1] == 1
    w, wzp, sums = (c["qw"], c["wzp"], None) if depthwise else _dense_weights(p, nat)
    args = (int(c["xzp"]), w, wzp, None if bias is None else np.ascontiguousarray(bias, np.int32), mult,
            int(c["yzp"]), y_signed, _geometry_list(p, x), depthwise, threads, lut, sums)
    view = None if lut is None or lut.dtype == (np.int8 if y_signed else np.uint8) else lut.dtype
    return nat.qlinear_conv, args, view


def _dense_weights(p: Prepared, nat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dense QLinearConv's weights, zero points and the int32 sums of the weights' rows as the native call takes
    them, made once for the constant weights instead of by passes over them in every call; kept while ``qw`` is the
    conv's weights. On the VNNI path (``DenseFlat``: width stride <= 2) uint8 weights go as int8 ``w - 128`` with
    zero points ``z - 128`` (the same differences), which that path would otherwise make on each call."""
    qw = p.consts["qw"]
    got = p.kernel_cache.get("dense_w")
    if got is None or got[0] is not qw:
        w, wzp = qw, p.consts["wzp"]
        if qw.dtype == np.uint8 and nat.isa() in ("avx512_vnni", "amx_int8") and p.attrs["geom"]["strides"][1] <= 2:
            w, wzp = (qw ^ np.uint8(0x80)).view(np.int8), wzp - np.int32(128)
        sums = w.reshape(w.shape[0], -1).sum(axis=1, dtype=np.int64).astype(np.int32)
        got = p.kernel_cache["dense_w"] = (qw, (w, wzp, sums))
    return got[1]


def _native_run(p: Prepared, nat, x: np.ndarray) -> tuple[np.ndarray | None, bool]:
    """The conv on the native kernels (x is 4-D), or None where they do not apply (float64, or float16 without
    the depthwise or sgemm kernel); and whether the fused tail was applied with it."""
    at, c = p.attrs, p.consts
    threads = runtime.threads(p)
    if at["op"] == "QLinearConv":
        fn, args, view = _qlinear_call(p, nat, x, threads)
        y = fn(np.ascontiguousarray(x), *args)
        return (y if view is None else y.view(view)), False
    if x.dtype not in (np.float32, np.float16):
        return None, False
    x = np.ascontiguousarray(x)
    call = _float_call(p, nat, x, threads)
    if call is not None:  # float16: widened, the float32 conv, rounded once (in the kernel)
        return call[2](x, *call[3]), True
    if x.dtype != np.float32:
        return None, False
    geom = _geometry_list(p, x)
    w, g = c["w"], at["geom"]
    grp, kdim, mg = w.shape
    bias = c.get("bias")
    bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
    if grp == 1 and kdim == x.shape[1] and g["kernel"] == [1, 1] and g["strides"] == [1, 1] and not any(geom[8:]):
        y = _pointwise(x, w)
    else:
        n = x.shape[0]
        ys = []
        for i in range(n):
            cols = nat.conv_im2col(x, i, geom, threads)
            ys.append(host_blas.matmul(w[0].T, cols[0]) if grp == 1 else
                      np.matmul(w.transpose(0, 2, 1), cols).reshape(grp * mg, -1))
        oh, ow = _padded_size(p, x)
        y = (ys[0][None] if n == 1 else np.stack(ys)).reshape(n, grp * mg, oh, ow)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    return y, False


def _padded_size(p: Prepared, x: np.ndarray) -> tuple[int, int]:
    g = p.attrs["geom"]
    t, l, b, r = _pads(g, x.shape[2], x.shape[3])
    (kh, kw), (sh, sw), (dh, dw) = g["kernel"], g["strides"], g["dilations"]
    return (x.shape[2] + t + b - (kh - 1) * dh - 1) // sh + 1, (x.shape[3] + l + r - (kw - 1) * dw - 1) // sw + 1


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    out, tail_done = _run_conv(p, inputs)
    if "tail_codes" in p.consts and not tail_done:
        y = np.ascontiguousarray(out[0])
        if not y.flags.writeable:
            y = y.copy()
        nat = runtime.native(p)
        channel = (p.attrs["tail_channel_at"], p.consts["tail_slopes"]) if "tail_slopes" in p.consts else None
        with np.errstate(all="ignore"):
            if nat is not None and channel is None:
                nat.conv_tail(y, p.consts["tail_codes"], p.consts["tail_c"], runtime.threads(p))
            else:
                tail_reference(y, p.consts["tail_codes"], p.consts["tail_c"], channel)
        out = [y]
    return out


def _bind(p: Prepared, inputs, outs) -> Any:
    """The float conv (with its fused tail; float16 widened and rounded once in the kernel) or the QLinearConv as
    one native call for x's shape: a 1-D conv's x viewed as 4-D and its result back as 3-D, as ``_run_conv`` does
    (ep/step_binding.py)."""
    nat = runtime.native(p)
    x = inputs[0] if inputs else None
    q = p.attrs["op"] == "QLinearConv"
    if (nat is None or not isinstance(x, np.ndarray) or x.ndim not in (3, 4) or not x.flags.c_contiguous
            or x.dtype not in ((np.uint8, np.int8) if q else (np.float32, np.float16))
            or (q and "tail_codes" in p.consts)):
        return None
    x4 = x[:, :, None, :] if x.ndim == 3 else x
    threads = runtime.threads(p)
    if q:
        fn, args, view = _qlinear_call(p, nat, x4, threads)
        if view is not None:  # an output table of the other byte type: its bytes are viewed as that type
            return None
    else:
        call = _float_call(p, nat, x4, threads)
        if call is None:
            return None
        fn, args = call[2], call[3]
    shape4 = x4.shape if x.ndim == 3 else None
    into = []
    where = p.runtime.partition_outputs  # a conv computing a partition output writes it into ORT's buffer
    if q and where and 0 in where:
        args = (*args, None)
        into = [(len(args), where[0], list(outs[0].shape))]
    elif not q and x.ndim == 4 and where and 0 in where:
        args = (*args, *(None, None, None, -1)[len(args) - _TAIL_AT[fn.__name__]:], None)
        into = [(len(args), where[0], list(outs[0].shape))]
    return runtime.call_step(p, fn, (None, *args), [(0, 0, x.dtype, x.shape, shape4)],
                             [(-1, outs[0].shape if x.ndim == 3 else None)], None, into)


def _run_conv(p: Prepared, inputs) -> tuple[list[np.ndarray], bool]:
    """The conv's output, and whether its fused tail was applied already (the native kernels do it per block)."""
    at, c = p.attrs, p.consts
    q = at["op"] == "QLinearConv"
    nat = runtime.native(p)
    if nat is not None:
        x = arg(p, inputs, 0)
        one_d = x.ndim == 3
        y, tail_done = _native_run(p, nat, x[:, :, None, :] if one_d else x)
        if y is not None:
            return [np.ascontiguousarray(y[:, :, 0, :]) if one_d else y], tail_done
    x = arg(p, inputs, 0).astype(np.float32)
    check_channels(p, x)
    one_d = x.ndim == 3
    if one_d:
        x = x[:, :, None, :]
    if not q:
        y = _fast_float_conv(x, c, at)
        if y is not None:
            if "bias" in c:
                y += c["bias"].astype(np.float32).reshape(1, -1, 1, 1)
            y = y.astype(at["dtype"], copy=False)
            return [np.ascontiguousarray(y[:, :, 0, :] if one_d else y)], False
    if q:
        x -= c["xzp"]
    cols, oh, ow = im2col(x, at["geom"])
    n = x.shape[0]
    w = _reference_weights(p) if q else c["w"]
    grp, kdim, mg = w.shape
    cols = cols.reshape(n * oh * ow, grp, kdim).transpose(1, 0, 2)  # [g, NP, K] (copy: the gather)
    if q:
        acc = exact_int_matmul(cols, w, at["bound_a"], at["bound_b"], p.target.tile[2])
        acc = acc.astype(np.int32, copy=False)
    else:
        acc = host_blas.matmul(cols, w)
    y = acc.transpose(1, 0, 2).reshape(n, oh, ow, grp * mg)
    if "bias" in c:
        y = y + c["bias"].astype(y.dtype)
    if q:
        y = requantize(y, c["mult"], c["yzp"], at["out"])
        if "out_lut" in c:
            y = c["out_lut"][y.view(np.uint8)]
    else:
        y = y.astype(at["dtype"], copy=False)
    y = y.transpose(0, 3, 1, 2)
    return [np.ascontiguousarray(y[:, :, 0, :] if one_d else y)], False


def _cost(p: Prepared, shapes) -> OpCost:
    return planned_cost(p, *_gemm_dims(p, shapes[0]))


# The input's rank is the constant weight's (1-D or 2-D conv), so an input of unknown rank is fine.
register(KernelDef("", "Conv", _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
register(KernelDef("", "QLinearConv", _prepare, _run, _cost, _check, bind=_bind))
