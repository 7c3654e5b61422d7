"""The rotary embedding as exporters write it out, inside a partition: ``Add(Mul(x, cos), Mul(Concat(Neg(Slice(x,
h/2:)), Slice(x, :h/2)), sin))`` (Hugging Face's ``q * cos + rotate_half(q) * sin``) becomes one ``npu::RotateHalf``.

Why: a decoder layer applies it to Q and K, seven steps each, and four temporaries of the size of Q or K; a decode
step of a small exported decoder spends more on those steps' calls than on their arithmetic. As one step, each
element is read once and written once. ``npu-rewrite`` turns the rotation into com.microsoft RotaryEmbedding on
graphs it rewrites; this covers the graphs run as exported.

Rules (all must hold): x is float32; the two Slices take one axis of x from 0 to h/2 and from h/2 to at least h
(constant starts, ends and axes; steps 1); the Concat joins Neg(second) and first; where x's rank is known, that
axis and the Concat's are its last and its last dim is h (x's shape is often unknown to ORT after the Reshape that
splits heads: the kernel checks at run time, and runs the ops as written where they do not hold); one Mul multiplies
x by cos, the other the Concat by sin (either operand order), cos and sin float32 with last dim h where known; the
Add sums the two products (either order); every intermediate is read by the next op alone and is not a graph output;
the target lists ``npu::RotateHalf``.
"""

from __future__ import annotations

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..support import why_not
from ..target import Target
from ._graph import consumers_of, producers_of

FUSED_DOMAIN, FUSED_OP = "npu", "RotateHalf"


def _only_reader(v: ValueInfo, users: dict[str, list[int]]) -> int | None:
    readers = users.get(v.name, [])
    return readers[0] if len(readers) == 1 and not v.is_graph_output else None


def _const_ints(v: ValueInfo | None) -> list[int] | None:
    if v is None or v.missing or v.value is None or v.value.dtype.kind not in "iu":
        return None
    return [int(a) for a in v.value.reshape(-1)]


def _slice(nd: NodeInfo) -> tuple[str, int, int, int] | None:
    """(x's name, axis, start, end) of a Slice of one axis with constant bounds and step 1, else None."""
    if nd.key != ("", "Slice") or len(nd.inputs) < 4 or nd.inputs[3].missing:
        return None
    starts, ends, axes = _const_ints(nd.input(1)), _const_ints(nd.input(2)), _const_ints(nd.input(3))
    steps = _const_ints(nd.input(4)) if len(nd.inputs) > 4 and not nd.inputs[4].missing else [1]
    if starts is None or ends is None or axes is None or steps != [1] or not len(starts) == len(ends) == len(axes) == 1:
        return None
    return nd.inputs[0].name, axes[0], starts[0], ends[0]


def _product(nd: NodeInfo, name: str) -> ValueInfo | None:
    """The float32 operand with last dim ``h`` that a Mul ``nd`` multiplies value ``name`` by, else None."""
    if nd.key != ("", "Mul") or len(nd.inputs) != 2:
        return None
    a, b = nd.inputs
    if (a.name == name) == (b.name == name):
        return None
    other = b if a.name == name else a
    return other if other.dtype == np.float32 and other.shape is not None and other.shape else None


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
    if x is None or x.dtype != np.float32 or s1 is None or s2 is None or s1[0] != x.name or s2[0] != x.name:
        return None
    half = s1[3]
    if s1[1] != s2[1] or s1[2] != 0 or half <= 0 or s2[2] != half or s2[3] < 2 * half:
        return None
    rank = len(x.shape) if x.shape is not None else None
    axis, cat_axis = s1[1], int(cat.attr("axis", 0))
    last = x.shape[-1] if rank else None
    if rank is not None and (axis % rank != rank - 1 or cat_axis % rank != rank - 1
                             or (isinstance(last, int) and last != 2 * half)):
        return None
    second_i, neg_i, first_i = (producer[v.name] for v in (neg.inputs[0], cat.inputs[0], cat.inputs[1]))
    if (_only_reader(second.outputs[0], users) != neg_i or _only_reader(neg.outputs[0], users) != i
            or _only_reader(first.outputs[0], users) != i):
        return None
    chain = [second_i, neg_i, first_i, i]
    rs_i = _only_reader(cat.outputs[0], users)
    sin = None if rs_i is None else _product(nodes[rs_i], cat.outputs[0].name)
    add_i = None if sin is None else _only_reader(nodes[rs_i].outputs[0], users)
    add = None if add_i is None else nodes[add_i]
    if add is None or add.key != ("", "Add") or len(add.inputs) != 2:
        return None
    xc = next((v for v in add.inputs if v.name != nodes[rs_i].outputs[0].name), None)
    if xc is None or xc.name not in producer or _only_reader(xc, users) != add_i:
        return None
    xc_i = producer[xc.name]
    cos = _product(nodes[xc_i], x.name)
    if cos is None or any(isinstance(v.shape[-1], int) and v.shape[-1] != 2 * half for v in (cos, sin)):
        return None
    chain = sorted(set(chain) | {rs_i, xc_i, add_i})
    members = [nodes[j] for j in chain]
    fused = NodeInfo(index=add.index, name="+".join(n.name for n in members), op_type=FUSED_OP, domain=FUSED_DOMAIN,
                     inputs=(x, cos, sin), outputs=add.outputs,
                     attrs={"half": half, "axis": axis, "concat_axis": cat_axis, "end": s2[3],
                            "fused_nodes": [n.name for n in members]}, since_version=1)
    return chain, fused


def fuse_rotary(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with each rotation written out replaced by ``npu::RotateHalf``, placed where its Add
    was (x, cos and sin exist by then)."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    users = consumers_of(nodes)
    producer = producers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for i in range(len(nodes)):
        found = _match(nodes, users, producer, i)
        if found is None or why_not(found[1], target) is not None:
            continue
        chain, fused = found
        if any(j in absorbed or j in replace for j in chain):
            continue
        add_i = max(chain)  # the Add comes after every other node of the chain
        replace[add_i] = fused
        absorbed.update(j for j in chain if j != add_i)
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
