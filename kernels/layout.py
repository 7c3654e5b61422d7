"""The layout pass: a partition's chains of float depthwise and pointwise convs run in NHWC (issue 40 item 4).

After fusion (a conv's element-wise tail is part of its node), a chain is a maximal path of float32 2-D convs,
each a depthwise conv (one input channel per group, one output each, unit dilation, any stride and pads) or a
pointwise conv (1x1, stride 1, unpadded, one group), where each conv's output is read by the next conv alone (as its
data input) and is not a partition output. A chain of two or more runs as ``npu::ConvNhwc`` steps
(``kernels/ops/conv_nhwc.py``): one Transpose to NHWC before its first conv (none when that is a depthwise conv: it
gathers its NCHW input rows into the lanes itself), one back to NCHW after its last, so every tensor read outside
the chain, and every partition output, stays NCHW.

The cost model (``kernels/cost.py``) decides per chain: NHWC when the reorders its NCHW kernels make themselves
(a strided depthwise conv's transposes to channels in the lanes and back, ``conv_reorder_bytes``) cost more than
the chain's two boundary transposes (``reorder_cycles``). The target's ``conv_layout`` (the provider option
``conv_layout``) chooses: ``auto`` (the cost model), ``nhwc`` (every chain), ``nchw`` (off, the default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .cost import conv_reorder_bytes, reorder_cycles
from .node import NodeInfo, ValueInfo
from .target import Target

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def conv_kind(n: NodeInfo) -> str | None:
    """"depthwise" or "pointwise" for a float32 Conv a chain can hold, else None."""
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


def chains(nodes: Sequence[NodeInfo]) -> list[list[int]]:
    """Maximal chains (node indices in order, two or more) of convs that ``conv_kind`` takes."""
    readers: dict[str, list[tuple[int, int]]] = {}
    for i, n in enumerate(nodes):
        for j, v in enumerate(n.inputs):
            if not v.missing:
                readers.setdefault(v.name, []).append((i, j))
    kinds = [conv_kind(n) for n in nodes]
    nxt: dict[int, int] = {}
    for i, n in enumerate(nodes):
        out = n.outputs[0]
        if kinds[i] is None or out.is_graph_output:
            continue
        r = readers.get(out.name, [])
        if len(r) == 1 and r[0][1] == 0 and kinds[r[0][0]] is not None:
            nxt[i] = r[0][0]
    heads = sorted(set(nxt) - set(nxt.values()))
    found = []
    for h in heads:
        chain = [h]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        found.append(chain)
    return found


def _elements(shape) -> int:
    """Elements of a shape, symbolic dims counted as 1 (the decision compares a chain's own tensors)."""
    return int(np.prod([d if isinstance(d, int) else 1 for d in shape or ()], dtype=np.int64))


def pays(chain: Sequence[NodeInfo], target: Target) -> bool:
    """Whether NHWC over the chain costs less: the NCHW kernels' own reorders against the two boundary ones."""
    saved = 0.0
    for n in chain:
        in_b, out_b = 4 * _elements(n.inputs[0].shape), 4 * _elements(n.outputs[0].shape)
        strides = tuple(n.attr("strides", [1, 1]))
        kind = conv_kind(n)
        saved += reorder_cycles(target, conv_reorder_bytes(kind, strides, "NCHW", in_b, out_b))
        saved -= reorder_cycles(target, conv_reorder_bytes(kind, strides, "NHWC", in_b, out_b))
    boundary = (reorder_cycles(target, 4 * _elements(chain[0].inputs[0].shape))
                + reorder_cycles(target, 4 * _elements(chain[-1].outputs[0].shape)))
    return saved > boundary


def _nhwc(v: ValueInfo) -> ValueInfo:
    s = v.shape
    return ValueInfo(f"{v.name}::nhwc", v.dtype, None if s is None else (s[0], s[2], s[3], s[1]))


def assign_layouts(nodes: Sequence[NodeInfo], target: Target, how: str | None = None) -> list[NodeInfo]:
    """The partition's fused nodes with each chosen chain in NHWC (``how``: a mode of ``CONV_LAYOUTS``, default the
    target's ``conv_layout``)."""
    how = target.conv_layout if how is None else how
    if how == "nchw":
        return list(nodes)
    out = list(nodes)
    replaced: dict[int, list[NodeInfo]] = {}
    for chain in chains(nodes):
        members = [nodes[i] for i in chain]
        if how == "auto" and not pays(members, target):
            continue
        first, last = members[0], members[-1]
        x = first.inputs[0]
        gathers = conv_kind(first) == "depthwise"  # reads its NCHW input itself: no Transpose before it
        cur = x if gathers else _nhwc(x)
        replaced[chain[0]] = [] if gathers else [NodeInfo(first.index, f"{first.name}::to_nhwc", "Transpose", "",
                                                          (x,), (cur,), {"perm": TO_NHWC}, 13)]
        for i, n in zip(chain, members):
            y = n.outputs[0]
            y_nhwc = _nhwc(y)
            attrs = {**n.attrs, "layout_kind": conv_kind(n), **({"layout_in": "NCHW"} if cur is x else {})}
            conv = dataclasses.replace(n, op_type="ConvNhwc", domain="npu", inputs=(cur, *n.inputs[1:]),
                                       outputs=(y_nhwc,), attrs=attrs)
            replaced.setdefault(i, []).append(conv)
            cur = y_nhwc
        replaced[chain[-1]].append(NodeInfo(last.index, f"{last.name}::to_nchw", "Transpose", "", (cur,),
                                            (last.outputs[0],), {"perm": TO_NCHW}, 13))
    if not replaced:
        return out
    return [m for i, n in enumerate(nodes) for m in replaced.get(i, [n])]
