"""Horizontal (sibling) fusion inside a partition: matmuls that read the same activation with constant weights
become one synthetic ``npu::MatMulGroup`` over the weights concatenated along N.

Why: in a decoder the q/k/v projections read the same normalized hidden state, and so do the MLP's gate and up
projections. On the NPU one matmul over ``[W_q | W_k | W_v]`` loads A into SRAM once, is launched once and fills
the matrix unit's N tiles better (k/v have N = kv_heads * head_dim, often less than one tile row); on the host it
is one BLAS call instead of three. Each member's output is a column slice of the one accumulator.

SwiGLU epilogue: when a group is exactly {gate, up} and its outputs feed only ``Mul(Mul(g, Sigmoid(g)), u)`` (the
exporters' ``silu(gate) * up``), the three vector ops fold into the group's epilogue, applied to the accumulator
before it leaves SRAM; the group then has one output, the last Mul's.

Rules (a group forms only when all hold): members are plain MatMulNBits with equal K, block_size and
accuracy_level and no runtime bias, or MatMul with a constant 2-D B, plain or with a constant bias of one value per
column as its only fused epilogue (the group's bias holds the members' biases, zeros for a member without); they
share input A (same value name); the target lists ``npu::MatMulGroup`` and accepts the synthetic node (its plan for
the concatenated N must fit SRAM, ``support.why_not``). A member output may be a graph output: it stays a value of
its own (a column slice). SwiGLU also needs ``swiglu`` in ``[fusion] epilogues`` and intermediates with no other
consumer and not graph outputs.
"""

from __future__ import annotations

from typing import Any

from ..node import NodeInfo
from ..support import why_not
from ..target import Target
from ._graph import consumers_of
from ._rules import FusionMiss

GROUP_DOMAIN, GROUP_OP = "npu", "MatMulGroup"
_NBITS = ("com.microsoft", "MatMulNBits")
_MATMUL = ("", "MatMul")
_EPILOGUE = ("npu", "MatMulEpilogue")


def _member_key(nd: NodeInfo) -> tuple | None:
    """What members of one group must agree on, or None if ``nd`` cannot join a group."""
    a = nd.input(0)
    if a is None or a.is_constant:
        return None
    if nd.key == _NBITS:
        if any(nd.input(i) is not None and not nd.input(i).is_constant for i in range(1, len(nd.inputs))):
            return None
        if nd.input(4) is not None:  # act-order g_idx: its kernel permutes A's columns, a group's call would not
            return None
        return (_NBITS, a.name, int(nd.attr("K")), int(nd.attr("block_size", 0)), int(nd.attr("accuracy_level", 0)),
                int(nd.attr("bits", 4)))
    if nd.key == _MATMUL or bias_matmul(nd):
        b = nd.input(1)
        if b is None or b.value is None or b.value.ndim != 2:
            return None
        return (_MATMUL, a.name, int(b.value.shape[0]))
    return None


def bias_matmul(nd: NodeInfo) -> bool:
    """A float MatMul whose only epilogue is a constant bias of one value per output column (an
    ``npu::MatMulEpilogue``, as Qwen2's q/k/v projections become): it joins a group as a plain MatMul would, its
    bias a segment of the group's."""
    if nd.key != _EPILOGUE or (nd.attrs["base_domain"], nd.attrs["base_op"]) != _MATMUL:
        return False
    if {k for k, v in nd.attrs["epilogue"].items() if v} != {"bias"} or nd.attrs["extra"] != ["ep_bias"]:
        return False
    b, bias = nd.input(1), nd.inputs[int(nd.attrs["n_base_inputs"])]
    return (b is not None and b.value is not None and b.value.ndim == 2 and bias.value is not None
            and bias.value.size == b.value.shape[1])


def _out_cols(nd: NodeInfo) -> int:
    return int(nd.attr("N")) if nd.key == _NBITS else int(nd.input(1).value.shape[1])


def _swiglu(nodes: list[NodeInfo], users: dict[str, list[int]], gate: NodeInfo, up: NodeInfo
            ) -> tuple[list[int], NodeInfo] | None:
    """Indices of (Sigmoid, Mul, Mul) computing silu(gate) * up from exactly these outputs, and the last Mul."""
    g, u = gate.outputs[0], up.outputs[0]
    if g.is_graph_output or u.is_graph_output:
        return None
    g_users, u_users = users.get(g.name, []), users.get(u.name, [])
    if len(g_users) != 2 or len(u_users) != 1:
        return None
    sig = next((i for i in g_users if nodes[i].key == ("", "Sigmoid")), None)
    mul1 = next((i for i in g_users if nodes[i].key == ("", "Mul")), None)
    if sig is None or mul1 is None:
        return None
    s = nodes[sig].outputs[0]
    if s.is_graph_output or users.get(s.name) != [mul1] or {v.name for v in nodes[mul1].inputs} != {g.name, s.name}:
        return None
    m1 = nodes[mul1].outputs[0]
    mul2 = u_users[0]
    if (m1.is_graph_output or users.get(m1.name) != [mul2] or nodes[mul2].key != ("", "Mul")
            or {v.name for v in nodes[mul2].inputs} != {m1.name, u.name}):
        return None
    return [sig, mul1, mul2], nodes[mul2]


def _group_node(members: list[NodeInfo], outputs: tuple, absorbed: list[NodeInfo], epilogue: dict[str, Any]
                ) -> NodeInfo:
    """The synthetic node: A, then every member's constant inputs; ``members`` keeps the original nodes (compile
    time only: the kernel prepares each with its own op's prepare and concatenates the results)."""
    first = members[0]
    return NodeInfo(
        index=first.index, name="+".join(n.name for n in (*members, *absorbed)), op_type=GROUP_OP,
        domain=GROUP_DOMAIN, inputs=(first.inputs[0], *(v for m in members for v in m.inputs[1:])), outputs=outputs,
        attrs={"members": tuple(members), "splits": [_out_cols(m) for m in members], "epilogue": epilogue,
               "fused_nodes": [n.name for n in (*members, *absorbed)]},
        since_version=first.since_version)


def _no_member_reason(nd: NodeInfo) -> str:
    """Why the matmul ``nd`` cannot join any group (``_member_key`` is None)."""
    a = nd.input(0)
    if a is None or a.is_constant:
        return "its A is a constant"
    if nd.key == _NBITS:
        if nd.input(4) is not None:
            return "it has an act-order g_idx (its kernel permutes A's columns)"
        return "its weights, scales or zero points are not constants"
    return "its B is not a constant 2-D matrix"


def _lone_reason(nd: NodeInfo, key: tuple, keys: dict[tuple, list[int]], nodes: list[NodeInfo]) -> str:
    """Why the matmul ``nd`` (member key ``key``) has no sibling."""
    others = [nodes[j].name for k, idx in keys.items() if k != key and k[1] == key[1] for j in idx]
    if others:
        return (f"the other matmuls reading A '{key[1]}' ({', '.join(others)}) differ in kind, K, block_size, "
                "accuracy_level or bits")
    return f"no other matmul with constant weights reads its A '{key[1]}' (each reads a different activation)"


def _miss(misses: list[FusionMiss] | None, nd: NodeInfo, reason: str) -> None:
    if misses is not None:
        misses.append(FusionMiss("siblings", nd.name, nd.op_type, reason))


def fuse_siblings(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with sibling matmul groups (and their SwiGLU tails) merged into ``npu::MatMulGroup``;
    each matmul left out of every group goes to ``misses`` with the reason."""
    if target.rule(GROUP_DOMAIN, GROUP_OP) is None:
        return nodes
    groups: dict[tuple, list[int]] = {}
    for i, nd in enumerate(nodes):
        key = _member_key(nd)
        if key is not None and why_not(nd, target) is None:
            groups.setdefault(key, []).append(i)
        elif misses is not None and (nd.key in (_NBITS, _MATMUL) or bias_matmul(nd)):
            _miss(misses, nd, _no_member_reason(nd) if key is None else "the target does not run it")
    users = consumers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for key, idx in groups.items():
        if len(idx) < 2:
            if misses is not None:
                _miss(misses, nodes[idx[0]], _lone_reason(nodes[idx[0]], key, groups, nodes))
            continue
        members = [nodes[i] for i in idx]
        tail = None
        if len(members) == 2 and target.allows_epilogue("swiglu"):
            for gate, up in (members, members[::-1]):  # the gated member goes first: its columns come first
                tail = _swiglu(nodes, users, gate, up)
                if tail is not None:
                    members = [gate, up]
                    break
        if tail is not None:
            tail_idx, last = tail
            node = _group_node(members, last.outputs, [nodes[j] for j in tail_idx], {"swiglu": True})
        else:
            tail_idx = []
            node = _group_node(members, tuple(m.outputs[0] for m in members), [], {})
        if (why := why_not(node, target)) is not None:
            for m in members:
                _miss(misses, m, f"the target rejects the group of {len(members)}: {why}")
            continue
        replace[idx[0]] = node
        absorbed.update(idx[1:], tail_idx)
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
