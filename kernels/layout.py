"""The layout pass: a partition's regions of float depthwise and pointwise convs run in NHWC (issue 40 item 4).

After fusion (a conv's element-wise tail is part of its node), a region is a connected set of nodes whose tensors
are kept channels-last:

- float32 2-D convs, each a depthwise conv (one input channel per group, one output each, unit dilation, any stride
  and pads) or a pointwise conv (1x1, stride 1, unpadded, one group), as ``npu::ConvNhwc`` steps
  (``kernels/ops/conv_nhwc.py``). A conv whose input is NCHW starts a region: a depthwise one gathers its NCHW input
  rows into the lanes itself, a pointwise one reads a Transpose to NHWC (one per tensor) - unless that input has one
  pixel, whose bytes are the same in both layouts;
- element-wise ops (``ELEMENTWISE``) with an NHWC operand: their other operands are constants (permuted at compile
  time), tensors of one pixel per channel ([N, C, 1, 1], [C, 1, 1]: a free Reshape to [N, 1, 1, C]) or scalars, so
  an SE block's Mul of the map by its per-channel scale stays in the region;
- GlobalAveragePool / GlobalMaxPool of an NHWC tensor: a ReduceMean / ReduceMax over axes 1, 2 with the dims kept,
  then a free Reshape of its [N, 1, 1, C] to the NCHW [N, C, 1, 1] (the same bytes): the SE block's small 1x1 convs
  stay NCHW steps;
- a nearest or linear Resize (``_resize``: the modes the native kernels take; constant or run-time scales or sizes,
  static or symbolic image sizes) as the same Resize with its ``axes`` moved to their NHWC places (the scales or
  sizes read as they are): the native kernel of axes 1 and 2 of [N, H, W, C]; and a Shape of an NHWC tensor (a
  run-time size's source) as its Shape gathered back to NCHW order, so the map needs no Transpose for its shape;
- a float 2-D MaxPool / AveragePool with any attributes (``_window``: strides, pads, dilations, ceil_mode,
  auto_pad, count_include_pad; no Indices output) on a static number of channels, as ``npu::PoolNhwc``
  (``kernels/ops/pool_nhwc.py``: the window's taps are C-contiguous vectors);
- Concat and Split of NHWC tensors along any axis (the axis moved to its NHWC place; a Concat's constants
  permuted, its NCHW parts read through a Transpose to NHWC).

Every NHWC tensor read by a node outside the region, or that is a partition output, gets one Transpose back to
NCHW under its own name, so the rest of the partition is untouched.

The cost model (``kernels/cost.py``) decides in ``auto``: a depthwise conv joins a region only where NHWC costs it
no more (``conv_saving``: the reorders its NCHW kernel makes itself, a strided conv's transposes to channels in the
lanes and back, ``conv_reorder_bytes``; the lane blocks its taps fill, along the rows in NCHW, along the channels
in NHWC, ``conv_lane_cycles``) and its output size is known; a region is taken when its convs', pools' and
Resizes' savings (``pool_saving``, ``resize_saving``: their lane blocks, ``pool_lane_cycles``,
``resize_lane_cycles``) exceed its boundary transposes (``reorder_cycles``; a depthwise conv gathering its NCHW input
counts as one). The target's ``conv_layout`` (the provider option ``conv_layout``) chooses: ``auto`` (the cost
model; npu-ref's default; ``nchw`` on a host without AVX-512, ``host_mode``), ``nhwc`` (every region of two or more
convs), ``nchw`` (off).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from . import runtime
from .cost import conv_lane_cycles, conv_reorder_bytes, pool_lane_cycles, reorder_cycles, resize_lane_cycles
from .node import NodeInfo, ValueInfo
from .target import Target

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]

# ops that compute each output element from the operands' elements at the same index (after broadcasting): any
# layout, given their operands in it
ELEMENTWISE = frozenset({
    ("", op) for op in ("Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu",
                        "Softplus", "Softsign", "Clip", "Identity", "Abs", "Neg", "Sqrt", "Exp", "Log", "Erf",
                        "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Gelu", "Add", "Sub", "Mul", "Div", "Max",
                        "Min", "Sum", "Mean", "Pow", "PRelu")} | {("npu", "ElementwiseChain")})
_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
_MOVES = ("Concat", "Split")  # along any axis: the axis moves with the layout
_NHWC_AXIS = (0, 3, 1, 2)  # an NCHW axis's place in NHWC
_RESIZE_COORDS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                  "tf_half_pixel_for_nn")  # the native Resize's (all but tf_crop_and_resize)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_MAKES_NHWC = ("conv", "eltwise", "move", "resize", "window")  # roles whose outputs are NHWC


def conv_kind(n: NodeInfo) -> str | None:
    """"depthwise" or "pointwise" for a float32 Conv a region can hold, else None."""
    if n.domain != "" or n.op_type != "Conv" or len(n.outputs) != 1 or n.outputs[0].dtype != np.float32:
        return None
    x, w, b = n.input(0), n.input(1), n.input(2)
    if (x is None or x.is_constant or x.dtype != np.float32 or x.shape is None or len(x.shape) != 4
            or w is None or not w.is_constant or w.value is None or np.asarray(w.value).ndim != 4
            or (b is not None and (not b.is_constant or b.value is None))
            or any(d != 1 for d in n.attr("dilations", [1, 1])) or n.attr("conv_tail_channel_slopes") is not None):
        return None
    m, cg, kh, kw = np.asarray(w.value).shape
    group = int(n.attr("group", 1))
    if group > 1 and cg == 1 and m == group:
        return "depthwise" if x.shape[1] == group or not isinstance(x.shape[1], int) else None
    pads = n.attr("pads", [0, 0, 0, 0])
    if (group == 1 and kh == kw == 1 and list(n.attr("strides", [1, 1])) == [1, 1] and not any(pads)
            and n.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")):
        return "pointwise"
    return None


def _one_pixel(v: ValueInfo) -> bool:
    """A 4-D tensor of one pixel per channel: the same bytes in NCHW and NHWC."""
    return v.shape is not None and len(v.shape) == 4 and v.shape[2] == 1 and v.shape[3] == 1


def _operand(v: ValueInfo) -> str | None:
    """How an element-wise op's operand that is not an NHWC tensor of the region joins it: "as is" (one element),
    "permute" (a constant), "reshape" (one pixel per channel), else None."""
    if v.shape is None or len(v.shape) > 4:
        return None
    if v.is_constant and v.value is not None:
        return "as is" if np.asarray(v.value).size == 1 else "permute"
    dims = (1,) * (4 - len(v.shape)) + tuple(v.shape)
    if all(d == 1 for d in dims):
        return "as is"
    return "reshape" if dims[2] == 1 and dims[3] == 1 else None


@dataclasses.dataclass
class Region:
    nodes: list[int]
    convs: list[int]


def _moves(n: NodeInfo, nhwc: set[str]) -> bool:
    """A 4-D Concat with an NHWC part (its constants permuted, its NCHW parts read through a Transpose), or a 4-D
    Split of an NHWC tensor, its sizes a constant."""
    data = n.inputs[:1] if n.op_type == "Split" else n.inputs
    return (all(v.shape is not None and len(v.shape) == 4 for v in (*data, *n.outputs) if not v.missing)
            and any(v.name in nhwc for v in data)
            and all(v.is_constant and v.value is not None for v in data if v.is_constant)
            and all(v.is_constant for v in n.inputs[1:] if n.op_type == "Split" and not v.missing))


def _wanted(n: NodeInfo, target: Target) -> bool:
    """Whether ``auto`` lets a conv join a region: its output's spatial dims known (the lanes a depthwise conv
    fills in either layout depend on them), and a depthwise conv no cheaper in NCHW."""
    if not all(isinstance(d, int) and d > 0 for d in n.outputs[0].shape[2:]):
        return False
    return conv_kind(n) == "pointwise" or conv_saving(n, target) >= 0


def _resize(n: NodeInfo) -> bool:
    """A 4-D nearest or linear Resize in a mode the native kernels take (no crop-and-resize, no antialias, no
    nearest half_pixel_symmetric; linear of float only), whatever its scales or sizes: in NHWC it is the same Resize
    with ``axes`` naming each given scale's or size's NHWC axis (``_Rewriter._resize``)."""
    x, y = n.inputs[0], n.outputs[0]
    if (n.domain != "" or n.op_type != "Resize" or n.since_version < 11 or len(n.outputs) != 1
            or x.shape is None or len(x.shape) != 4 or y.shape is None or len(y.shape) != 4
            or int(n.attr("antialias", 0))
            or str(n.attr("keep_aspect_ratio_policy", "stretch")) not in ("stretch", "not_larger", "not_smaller")):
        return False
    mode, coord = str(n.attr("mode", "nearest")), str(n.attr("coordinate_transformation_mode", "half_pixel"))
    if mode == "linear":
        return coord in _RESIZE_COORDS and x.dtype in (np.float32, np.float16)
    return (mode == "nearest" and coord in _RESIZE_COORDS and coord != "half_pixel_symmetric"
            and str(n.attr("nearest_mode", "round_prefer_floor")) in _NEAREST_MODES)


def _window(n: NodeInfo) -> bool:
    """A float 2-D MaxPool / AveragePool (no Indices output) of a static number of channels: ``npu::PoolNhwc``."""
    x = n.inputs[0]
    k = n.attr("kernel_shape")
    return (n.domain == "" and n.op_type in ("MaxPool", "AveragePool") and k is not None and len(k) == 2
            and all(v.missing for v in n.outputs[1:]) and x.dtype in (np.float32, np.float16)
            and x.shape is not None and len(x.shape) == 4 and isinstance(x.shape[1], int)
            and not int(n.attr("storage_order", 0))
            and n.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"))


def _roles(nodes: Sequence[NodeInfo], target: Target | None = None) -> dict[int, str]:
    """Each node that can work in NHWC given its producers: "conv", "eltwise", "move" or "pool" (its output NCHW);
    with ``target`` (auto) no conv of unknown output size and no depthwise conv that is cheaper in NCHW."""
    roles: dict[int, str] = {}
    nhwc: set[str] = set()
    for i, n in enumerate(nodes):
        ins = [v for v in n.inputs if not v.missing]
        y = n.outputs[0]
        if conv_kind(n) is not None:
            x = n.inputs[0]
            if (y.shape is not None and len(y.shape) == 4 and (x.name in nhwc or not _one_pixel(x))
                    and (target is None or _wanted(n, target))):
                roles[i] = "conv"
        elif n.key in ELEMENTWISE:
            if (len(n.outputs) == 1 and y.shape is not None and len(y.shape) == 4 and any(v.name in nhwc for v in ins)
                    and all(v.name in nhwc or _operand(v) is not None for v in ins)):
                roles[i] = "eltwise"
        elif n.domain == "" and n.op_type in _POOLS and ins and ins[0].name in nhwc:
            roles[i] = "pool"
        elif n.domain == "" and n.op_type in _MOVES and _moves(n, nhwc):
            roles[i] = "move"
        elif ins and ins[0].name in nhwc and _resize(n):
            roles[i] = "resize"
        elif n.domain == "" and n.op_type == "Shape" and ins and ins[0].name in nhwc:
            roles[i] = "shape"  # its output: the NCHW shape
        elif ins and ins[0].name in nhwc and _window(n):
            roles[i] = "window"
        if roles.get(i) in _MAKES_NHWC:
            nhwc.update(v.name for v in n.outputs if not v.missing)
    return roles


def regions(nodes: Sequence[NodeInfo], target: Target | None = None) -> list[Region]:
    """The connected regions (producer and NHWC reader joined) that hold a conv, in node order (``target``: as
    ``auto`` forms them, without the depthwise convs cheaper in NCHW)."""
    roles = _roles(nodes, target)
    producer = {v.name: i for i, n in enumerate(nodes) if roles.get(i) in _MAKES_NHWC for v in n.outputs
                if not v.missing}
    parent = {i: i for i in roles}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in roles:
        for v in nodes[i].inputs:
            j = producer.get(v.name)
            if j is not None and not v.missing:
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in sorted(roles):
        groups.setdefault(root(i), []).append(i)
    found = []
    for members in groups.values():
        convs = [i for i in members if roles[i] == "conv"]
        if convs:
            found.append(Region(members, convs))
    return found


def chains(nodes: Sequence[NodeInfo]) -> list[list[int]]:
    """The convs of each region (node indices in order), regions of two or more convs."""
    return [r.convs for r in regions(nodes) if len(r.convs) >= 2]


UNKNOWN_EXTENT = 32  # a symbolic spatial dim, to the cost model (a symbolic batch dim counts as 1)


def _dims(shape) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else 1 if k == 0 else UNKNOWN_EXTENT for k, d in enumerate(shape or ())]


def _elements(shape) -> int:
    return int(np.prod(_dims(shape), dtype=np.int64))


def conv_saving(n: NodeInfo, target: Target) -> float:
    """Cycles a conv of a region saves in NHWC: the reorders its NCHW kernel makes itself, and its taps' lane
    blocks (``kernels/cost.py``); negative where NCHW is cheaper (a depthwise conv of few channels on wide rows)."""
    kind = conv_kind(n)
    strides = tuple(n.attr("strides", [1, 1]))
    x, y = _dims(n.inputs[0].shape), _dims(n.outputs[0].shape)
    in_b, out_b = 4 * int(np.prod(x)), 4 * int(np.prod(y))
    kh, kw = (n.attr("kernel_shape") or np.asarray(n.inputs[1].value).shape[2:])[:2]
    dims = (y[0], y[1], y[2], y[3], int(kh), int(kw))
    saved = 0.0
    for layout, sign in (("NCHW", 1.0), ("NHWC", -1.0)):
        saved += sign * (reorder_cycles(target, conv_reorder_bytes(kind, strides, layout, in_b, out_b))
                         + conv_lane_cycles(target, kind, strides, layout, dims))
    return saved


def pool_saving(n: NodeInfo, target: Target) -> float:
    """Cycles a 2-D pool of a region saves in NHWC: its taps' lane blocks (``kernels/cost.py``)."""
    y = _dims(n.outputs[0].shape)
    if len(y) != 4:
        return 0.0
    kh, kw = (int(k) for k in n.attr("kernel_shape"))
    dims = (y[0], y[1], y[2], y[3], kh, kw)
    strides = tuple(n.attr("strides", [1, 1]))
    return pool_lane_cycles(target, strides, "NCHW", dims) - pool_lane_cycles(target, strides, "NHWC", dims)


def resize_saving(n: NodeInfo, target: Target) -> float:
    """Cycles a Resize of a region saves in NHWC: its column pass's lane blocks (``kernels/cost.py``)."""
    y = _dims(n.outputs[0].shape)
    if len(y) != 4:
        return 0.0
    taps = 2 if str(n.attr("mode", "nearest")) == "linear" else 1
    return resize_lane_cycles(target, taps, "NCHW", tuple(y)) - resize_lane_cycles(target, taps, "NHWC", tuple(y))


def _boundary(nodes: Sequence[NodeInfo], members: set[int]) -> tuple[list[ValueInfo], list[ValueInfo]]:
    """(NCHW tensors a conv of the region reads: a pointwise conv through a Transpose to NHWC, a depthwise one
    reordering it as it reads it; NHWC tensors of the region read outside it or partition outputs: each gets a
    Transpose back)."""
    made = {v.name: v for i in members if nodes[i].op_type not in (*_POOLS, "Shape") for v in nodes[i].outputs
            if not v.missing}
    entries: dict[str, ValueInfo] = {}
    for i in sorted(members):
        n = nodes[i]
        x = n.inputs[0]
        if conv_kind(n) is not None and x.name not in made:
            entries.setdefault(x.name, x)
        if n.op_type == "Concat":
            entries.update((v.name, v) for v in n.inputs
                           if v.name not in made and not v.is_constant and not _one_pixel(v))
    exits = {v.name: v for v in made.values() if v.is_graph_output}
    for i, n in enumerate(nodes):
        if i not in members:
            exits.update((v.name, made[v.name]) for v in n.inputs if v.name in made)
    return list(entries.values()), list(exits.values())


def pays(nodes: Sequence[NodeInfo], region: Region, target: Target) -> bool:
    """Whether NHWC over the region costs less: its NCHW convs' own reorders and its convs', pools' and Resizes' lane
    blocks against its boundary transposes."""
    saved = (sum(conv_saving(nodes[i], target) for i in region.convs)
             + sum(pool_saving(nodes[i], target) for i in region.nodes if _window(nodes[i]))
             + sum(resize_saving(nodes[i], target) for i in region.nodes if _resize(nodes[i])))
    entries, exits = _boundary(nodes, set(region.nodes))
    boundary = sum(reorder_cycles(target, (v.dtype.itemsize if v.dtype is not None else 4) * _elements(v.shape))
                   for v in (*entries, *exits))
    return saved > boundary


def _nhwc(v: ValueInfo) -> ValueInfo:
    s = v.shape
    return ValueInfo(f"{v.name}::nhwc", v.dtype, None if s is None else (s[0], s[2], s[3], s[1]))


def _int64(name: str, values: Sequence[int]) -> ValueInfo:
    a = np.asarray(values, np.int64)
    return ValueInfo(name, a.dtype, a.shape, value=a, is_constant=True)


class _Rewriter:
    """Builds the nodes of the chosen regions: each NCHW tensor's Transpose or Reshape into NHWC made once."""

    def __init__(self, nodes: Sequence[NodeInfo], members: set[int]):
        self.nodes, self.members = nodes, members
        self.nhwc: dict[str, ValueInfo] = {}  # NCHW name -> its NHWC value
        self.exits = {v.name for v in _boundary(nodes, members)[1]}

    def _into(self, v: ValueInfo, at: NodeInfo, out: list[NodeInfo]) -> ValueInfo:
        """v (NCHW) as an NHWC operand: permuted constant, a Reshape of one pixel per channel, or a Transpose."""
        got = self.nhwc.get(v.name)
        if got is not None:
            return got
        how = _operand(v)
        if how == "as is":
            return v
        if how == "permute":
            a = np.asarray(v.value)
            a = np.ascontiguousarray(a.reshape((1,) * (4 - a.ndim) + a.shape).transpose(TO_NHWC))
            got = dataclasses.replace(v, name=f"{v.name}::nhwc", shape=a.shape, value=a)
        elif how == "reshape":
            dims = (1,) * (4 - len(v.shape)) + tuple(v.shape)
            got = ValueInfo(f"{v.name}::nhwc", v.dtype, (dims[0], 1, 1, dims[1]))
            shape = _int64(f"{v.name}::nhwc_shape", [0 if len(v.shape) == 4 else 1, 1, 1, -1])
            out.append(NodeInfo(at.index, f"{v.name}::to_nhwc", "Reshape", "", (v, shape), (got,), {}, 14))
        else:
            got = _nhwc(v)
            out.append(NodeInfo(at.index, f"{v.name}::to_nhwc", "Transpose", "", (v,), (got,), {"perm": TO_NHWC}, 13))
        self.nhwc[v.name] = got
        return got

    def _resize(self, n: NodeInfo) -> list[NodeInfo]:
        """The Resize of NHWC [N, H, W, C]: each scale or size (an NCHW axis's, constant or not) read for the axis's
        NHWC place through ``axes``; with H and W resized, the native kernel of axes 1 and 2."""
        axes = [_NHWC_AXIS[int(a) % 4] for a in (n.attr("axes") or range(4))]
        x = self.nhwc[n.inputs[0].name]
        return [dataclasses.replace(n, inputs=(x, *n.inputs[1:]), outputs=(_nhwc(n.outputs[0]),),
                                    attrs={**n.attrs, "axes": axes})]

    def _shape(self, n: NodeInfo) -> list[NodeInfo]:
        """The NCHW Shape (its ``start`` / ``end`` slice) of an NHWC tensor: the NHWC shape's dims gathered in NCHW
        order."""
        x, y = self.nhwc[n.inputs[0].name], n.outputs[0]
        dims = TO_NCHW[slice(n.attr("start", 0), n.attr("end"))]
        full = ValueInfo(f"{y.name}::nhwc", y.dtype, (4,))
        return [NodeInfo(n.index, f"{n.name}::nhwc", "Shape", "", (x,), (full,), {}, 15),
                NodeInfo(n.index, f"{n.name}::to_nchw", "Gather", "", (full, _int64(f"{y.name}::dims", dims)), (y,),
                         {"axis": 0}, 13)]

    def node(self, i: int) -> list[NodeInfo]:
        n, out = self.nodes[i], []
        kind = conv_kind(n)
        if n.op_type == "Shape" and n.domain == "":
            return self._shape(n)
        if n.op_type in _POOLS and n.domain == "":
            x, y = self.nhwc[n.inputs[0].name], n.outputs[0]
            r = ValueInfo(f"{y.name}::nhwc", y.dtype, (x.shape[0], 1, 1, x.shape[3]))
            out.append(NodeInfo(n.index, f"{n.name}::nhwc", _POOLS[n.op_type], "", (x,), (r,),
                                {"axes": [1, 2], "keepdims": 1}, 13))
            shape = _int64(f"{y.name}::nchw_shape", [0, -1, 1, 1])
            out.append(NodeInfo(n.index, f"{n.name}::to_nchw", "Reshape", "", (r, shape), (y,), {}, 14))
            return out
        if _resize(n):
            out.extend(self._resize(n))
        elif _window(n):
            out.append(dataclasses.replace(n, op_type="PoolNhwc", domain="npu", inputs=(self.nhwc[n.inputs[0].name],),
                                           outputs=(_nhwc(n.outputs[0]),), attrs={**n.attrs, "pool_op": n.op_type}))
        elif kind is not None:
            x = n.inputs[0]
            attrs = {**n.attrs, "layout_kind": kind}
            if x.name in self.nhwc:
                cur = self.nhwc[x.name]
            elif kind == "depthwise":  # gathers its NCHW input rows itself
                cur, attrs["layout_in"] = x, "NCHW"
            else:
                cur = self._into(x, n, out)  # a Transpose (a region's conv never starts on one pixel)
            out.append(dataclasses.replace(n, op_type="ConvNhwc", domain="npu", inputs=(cur, *n.inputs[1:]),
                                           outputs=(_nhwc(n.outputs[0]),), attrs=attrs))
        else:
            data = 1 if n.op_type == "Split" else len(n.inputs)  # a Split's sizes are a 1-D constant
            ins = tuple(v if v.missing or k >= data else self.nhwc[v.name] if v.name in self.nhwc
                        else self._into(v, n, out) for k, v in enumerate(n.inputs))
            attrs = dict(n.attrs)
            if n.op_type in _MOVES:
                attrs["axis"] = _NHWC_AXIS[int(n.attr("axis", 0)) % 4]
            outs = tuple(v if v.missing else _nhwc(v) for v in n.outputs)
            out.append(dataclasses.replace(n, inputs=ins, outputs=outs, attrs=attrs))
        for src in n.outputs:
            if src.missing:
                continue
            y = self.nhwc[src.name] = _nhwc(src)
            if src.name in self.exits:
                out.append(NodeInfo(n.index, f"{src.name}::to_nchw", "Transpose", "", (y,), (src,),
                                    {"perm": TO_NCHW}, 13))
        return out


def host_mode(target: Target) -> str:
    """The target's ``conv_layout`` as this host compiles it: ``auto`` picks the layout the native conv kernels are
    fastest in, and the NHWC kernels (``conv_nhwc.cc``) beat the NCHW ones only in their AVX-512 rows, so below
    AVX-512 (or without the extension) ``auto`` is ``nchw``. Part of the compiled-program cache key."""
    mode = target.conv_layout
    return "nchw" if mode == "auto" and not runtime.host_has_avx512() else mode


def assign_layouts(nodes: Sequence[NodeInfo], target: Target, how: str | None = None) -> list[NodeInfo]:
    """The partition's fused nodes with each chosen region in NHWC (``how``: a mode of ``CONV_LAYOUTS``, default the
    target's ``conv_layout`` as this host compiles it, ``host_mode``)."""
    how = host_mode(target) if how is None else how
    if how == "nchw":
        return list(nodes)
    if how == "auto":
        chosen = [r for r in regions(nodes, target) if pays(nodes, r, target)]
    else:
        chosen = [r for r in regions(nodes) if len(r.convs) >= 2]
    members = {i for r in chosen for i in r.nodes}
    if not members:
        return list(nodes)
    rw = _Rewriter(nodes, members)
    return [m for i, n in enumerate(nodes) for m in (rw.node(i) if i in members else [n])]
