"""The rotary embedding as exporters write it out, inside a partition: ``Add(Mul(x, cos), Mul(Concat(Neg(Slice(x,
h/2:)), Slice(x, :h/2)), sin))`` (Hugging Face's ``q * cos + rotate_half(q) * sin``) becomes one ``npu::RotateHalf``.

Why: a decoder layer applies it to Q and K, seven steps each, and four temporaries of the size of Q or K; a decode
step of a small exported decoder spends more on those steps' calls than on their arithmetic. As one step, each
element is read once and written once. ``npu-rewrite`` turns the rotation into com.microsoft RotaryEmbedding on
graphs it rewrites; this covers the graphs run as exported.

Rules (all must hold): x is float32; the two Slices take the same constant axis of x with step 1, from 0 to h/2 and
from h/2 to at least h where their bounds are constants (torch's TorchScript exporter computes h / 2 from x's shape
at run time: the fused node takes such bounds as inputs); the Concat joins Neg(second) and first; where x's rank is
known, that axis and the Concat's are its last and its last dim is h (ORT often knows no dim of x after the Reshape
that splits heads); one Mul multiplies x by cos, the other the Concat by sin (either operand order), cos and sin
float32 with last dim h where known; the Add sums the two products (either order); every intermediate is read by
the next op alone and is not a graph output; the target lists ``npu::RotateHalf``. What is known only at run time,
the kernel checks on every call: where the rotation is not the one above it runs the ops as written.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..target import Target
from ._graph import consumers_of, only_reader, other_operand, producers_of, splice_chains

FUSED_DOMAIN, FUSED_OP = "npu", "RotateHalf"


def _const_int(v: ValueInfo) -> int | None:
    """The value of a one-element integer constant, else None."""
    if v.value is None or v.value.size != 1 or v.value.dtype.kind not in "iu":
        return None
    return int(v.value.reshape(()))


def _slice(nd: NodeInfo) -> tuple[str, int, ValueInfo, ValueInfo] | None:
    """(x's name, axis, start, end) of a Slice of one constant axis with step 1; start and end are one-element
    integer values, constants or computed at run time (torch's TorchScript exporter computes h / 2 from x's shape)."""
    if nd.key != ("", "Slice") or len(nd.inputs) < 4 or nd.inputs[3].missing:
        return None
    start, end = nd.inputs[1], nd.inputs[2]
    step = _const_int(nd.inputs[4]) if len(nd.inputs) > 4 and not nd.inputs[4].missing else 1
    axis = _const_int(nd.inputs[3])

    def one_int(v: ValueInfo) -> bool:
        return v.dtype is not None and v.dtype.kind in "iu" and (v.shape is None or v.shape in ((1,), ()))

    if axis is None or step != 1 or not (one_int(start) and one_int(end)):
        return None
    return nd.inputs[0].name, axis, start, end


def _product(nd: NodeInfo, name: str) -> ValueInfo | None:
    """The float32 operand of known rank that a Mul ``nd`` multiplies value ``name`` by, else None."""
    other = other_operand(nd, name) if nd.key == ("", "Mul") else None
    return other if other is not None and other.dtype == np.float32 and other.shape else None


def _match(nodes: list[NodeInfo], users: dict[str, list[int]], producer: dict[str, int], i: int
           ) -> tuple[list[int], NodeInfo] | None:
    """The rotation whose Concat is ``nodes[i]``: (indices of its nodes, the fused node), or None."""
    cat = nodes[i]
    if cat.key != ("", "Concat") or len(cat.inputs) != 2 or any(v.name not in producer for v in cat.inputs):
        return None
    neg, first = nodes[producer[cat.inputs[0].name]], nodes[producer[cat.inputs[1].name]]
    if neg.key != ("", "Neg") or neg.inputs[0].name not in producer:
        return None
    second = nodes[producer[neg.inputs[0].name]]
    x = first.inputs[0] if first.inputs else None
    s1, s2 = _slice(first), _slice(second)
    if x is None or x.dtype != np.float32 or s1 is None or s2 is None or s1[0] != x.name or s2[0] != x.name \
            or s1[1] != s2[1]:
        return None
    bounds = (s1[2], s1[3], s2[2], s2[3])
    start1, half, start2, end2 = (_const_int(v) for v in bounds)  # None: known at run time only
    if start1 not in (0, None) or (half is not None and (half <= 0 or start2 not in (half, None)
                                                         or (end2 is not None and end2 < 2 * half))):
        return None
    rank = len(x.shape) if x.shape is not None else None
    axis, cat_axis = s1[1], int(cat.attr("axis", 0))
    last = x.shape[-1] if rank else None
    if rank is not None and (axis % rank != rank - 1 or cat_axis % rank != rank - 1
                             or (isinstance(last, int) and half is not None and last != 2 * half)):
        return None
    second_i, neg_i, first_i = (producer[v.name] for v in (neg.inputs[0], cat.inputs[0], cat.inputs[1]))
    if (only_reader(second.outputs[0], users) != neg_i or only_reader(neg.outputs[0], users) != i
            or only_reader(first.outputs[0], users) != i):
        return None
    chain = [second_i, neg_i, first_i, i]
    rs_i = only_reader(cat.outputs[0], users)
    sin = None if rs_i is None else _product(nodes[rs_i], cat.outputs[0].name)
    add_i = None if sin is None else only_reader(nodes[rs_i].outputs[0], users)
    add = None if add_i is None else nodes[add_i]
    if add is None or add.key != ("", "Add") or len(add.inputs) != 2:
        return None
    xc = next((v for v in add.inputs if v.name != nodes[rs_i].outputs[0].name), None)
    if xc is None or xc.name not in producer or only_reader(xc, users) != add_i:
        return None
    xc_i = producer[xc.name]
    cos = _product(nodes[xc_i], x.name)
    if cos is None or (half is not None and any(isinstance(v.shape[-1], int) and v.shape[-1] != 2 * half
                                                for v in (cos, sin))):
        return None
    chain = sorted(set(chain) | {rs_i, xc_i, add_i})
    members = [nodes[j] for j in chain]
    fused = NodeInfo(index=add.index, name="+".join(n.name for n in members), op_type=FUSED_OP, domain=FUSED_DOMAIN,
                     inputs=(x, cos, sin, *bounds), outputs=add.outputs,
                     attrs={"axis": axis, "concat_axis": cat_axis, "fused_nodes": [n.name for n in members]},
                     since_version=1)
    return chain, fused


def fuse_rotary(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with each rotation written out replaced by ``npu::RotateHalf``, placed where its Add
    was (x, cos and sin exist by then)."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    users, producer = consumers_of(nodes), producers_of(nodes)
    return splice_chains(nodes, target, lambda i: _match(nodes, users, producer, i))
