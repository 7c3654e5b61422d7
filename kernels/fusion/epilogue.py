"""Epilogue fusion inside a partition: MatMul-like op -> [bias Add] -> [Relu] -> [QuantizeLinear] becomes one
synthetic node ``npu::MatMulEpilogue`` whose epilogue runs on the accumulator tile before it leaves SRAM.

Why: unfused, every intermediate ``[M, N]`` makes a DRAM round trip (write by the matmul, read + write by each
vector op) and the host allocates a fresh array per op. Fused, the cost model charges only the vector cycles of
the epilogue (overlapped with the next tile's MACs, see ``cost.plan_cycles``) and the host applies it in place.

Rules (each link must hold, else the chain stops there): the intermediate has exactly one consumer and is not a
graph output; the target lists the epilogue kind in ``[fusion] epilogues`` and runs both the base op and
``npu::MatMulEpilogue``; bias is a constant with N elements broadcasting over the last axis; QuantizeLinear has a
constant per-tensor (or last-axis) scale and zero point.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..support import dtype_name, why_not
from ..target import Target
from ._graph import consumers_of
from ._rules import FusionMiss

BASES = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "MatMulNBits"), ("com.microsoft", "MatMulIntegerToFloat")}
FUSED_DOMAIN, FUSED_OP = "npu", "MatMulEpilogue"


def _bias_of(add: NodeInfo, y: str, n: int | None) -> ValueInfo | None:
    others = [v for v in add.inputs if v.name != y]
    if len(others) != 1 or others[0].value is None:
        return None
    b = others[0]
    if n is None or b.value.size != n or (b.value.ndim and b.value.shape[-1] != n):
        return None
    return b


def _out_cols(nd: NodeInfo) -> int | None:
    """N of the matmul's output: inferred shape, else the N attribute (contrib ops), else a constant B's last dim."""
    shape = nd.outputs[0].shape
    if shape and isinstance(shape[-1], int):
        return shape[-1]
    if nd.attr("N") is not None:
        return int(nd.attr("N"))
    b = nd.input(1)
    if b is not None and b.value is not None and nd.op_type != "Gemm":
        return int(b.value.shape[-1])
    return None


def _qparams_ok(q: NodeInfo) -> bool:
    s, z = q.input(1), q.input(2)
    if s is None or s.value is None or (z is not None and z.value is None):
        return False
    if s.value.size > 1:
        rank = len(q.inputs[0].shape) if q.inputs[0].shape is not None else None
        axis = int(q.attr("axis", 1))
        return rank is not None and axis in (-1, rank - 1) and not q.attr("block_size", 0)
    return True


def _first_link_reason(nd: NodeInfo, nodes: list[NodeInfo], consumers: dict[str, list[int]], target: Target,
                       n: int | None, absorbed: set[int]) -> str:
    """Why no epilogue op follows the matmul ``nd`` (built only for a declined candidate)."""
    y = nd.outputs[0]
    users = consumers.get(y.name, [])
    if y.is_graph_output:
        return f"{nd.op_type} output '{y.name}' is a graph output"
    if len(users) != 1:
        return f"{nd.op_type} output '{y.name}' has {len(users)} readers, not one"
    nxt = nodes[users[0]]
    kinds = {"Add": "bias", "Relu": "relu", "QuantizeLinear": "quantize"}
    if nxt.domain != "" or nxt.op_type not in kinds:
        return f"{nd.op_type} output '{y.name}' is read by {nxt.op_type} '{nxt.name}', not a bias Add, " \
               "Relu or QuantizeLinear"
    kind = kinds[nxt.op_type]
    if not target.allows_epilogue(kind):
        return f"the target's [fusion] epilogues do not list '{kind}' ({nxt.op_type} '{nxt.name}')"
    if users[0] in absorbed:
        return f"{nxt.op_type} '{nxt.name}' is already fused into another matmul's epilogue"
    if kind == "bias":
        others = [v.name for v in nxt.inputs if v.name != y.name]
        return (f"Add '{nxt.name}' reads {others} besides '{y.name}', not one constant bias of N={n} "
                "elements broadcasting over the last axis")
    return (f"QuantizeLinear '{nxt.name}' has no constant per-tensor (or last-axis) scale and zero "
            "point")


def fuse(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with fusable producer/consumer chains merged into synthetic fused nodes; a matmul
    followed by no fusable epilogue op goes to ``misses`` with the reason."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    consumers = consumers_of(nodes)
    out, absorbed = [], set()
    for i, nd in enumerate(nodes):
        if i in absorbed:
            continue
        if nd.key not in BASES or why_not(nd, target) is not None:
            out.append(nd)
            continue
        chain, ep, extra = [], {}, []
        cur = nd
        n = _out_cols(nd)
        for kind, op in (("bias", "Add"), ("relu", "Relu"), ("quantize", "QuantizeLinear")):
            y = cur.outputs[0]
            users = consumers.get(y.name, [])
            if y.is_graph_output or len(users) != 1 or not target.allows_epilogue(kind):
                continue
            nxt = nodes[users[0]]
            if nxt.op_type != op or nxt.domain != "" or users[0] in absorbed:
                continue
            if kind == "bias":
                b = _bias_of(nxt, y.name, n if isinstance(n, int) else None)
                if b is None:
                    continue
                ep["bias"], extra = True, [*extra, ("ep_bias", b)]
            elif kind == "relu":
                ep["relu"] = True
            else:
                if not _qparams_ok(nxt):
                    continue
                z = nxt.input(2)
                ep["quantize"] = dtype_name(z) if z is not None else "uint8"
                extra = [*extra, ("ep_qscale", nxt.input(1))] + ([("ep_qzp", z)] if z is not None else [])
            chain.append(users[0])
            cur = nxt
        if not chain:
            if misses is not None:
                reason = _first_link_reason(nd, nodes, consumers, target, n if isinstance(n, int) else None, absorbed)
                misses.append(FusionMiss("epilogue", nd.name, nd.op_type, reason))
            out.append(nd)
            continue
        fused = NodeInfo(
            index=nd.index, name=f"{nd.name}+" + "+".join(nodes[j].name for j in chain), op_type=FUSED_OP,
            domain=FUSED_DOMAIN, inputs=(*nd.inputs, *(v for _, v in extra)), outputs=cur.outputs,
            attrs={"base_op": nd.op_type, "base_domain": nd.domain, "n_base_inputs": len(nd.inputs),
                   "epilogue": ep, "extra": [k for k, _ in extra], "base_attrs": dict(nd.attrs),
                   "fused_nodes": [nd.name, *(nodes[j].name for j in chain)]},
            since_version=nd.since_version)
        if (why := why_not(fused, target)) is not None:
            if misses is not None:
                misses.append(FusionMiss("epilogue", nd.name, nd.op_type, f"the target rejects {why}"))
            out.append(nd)
            continue
        absorbed.update(chain)
        out.append(fused)
    return out


def base_node(fused: NodeInfo) -> NodeInfo:
    """The original matmul node inside a fused node (its output typed as the float accumulator result)."""
    a: dict[str, Any] = fused.attrs
    n = int(a["n_base_inputs"])
    out = dataclasses.replace(fused.outputs[0], dtype=np.dtype(np.float32) if a["epilogue"].get("quantize")
                              else fused.outputs[0].dtype)
    return NodeInfo(fused.index, fused.name, a["base_op"], a["base_domain"], fused.inputs[:n], (out,),
                    a["base_attrs"], fused.since_version)


def epilogue_consts(fused: NodeInfo) -> dict[str, np.ndarray]:
    """``ep_bias`` (float32, broadcast over N), ``ep_qscale``/``ep_qzp`` (float32) from the absorbed nodes."""
    n = int(fused.attrs["n_base_inputs"])
    consts = {}
    for key, v in zip(fused.attrs["extra"], fused.inputs[n:]):
        arr = np.asarray(v.value)
        if arr.dtype.name in ("int4", "uint4"):
            arr = arr.astype(np.int8 if arr.dtype.name == "int4" else np.uint8)
        consts[key] = arr.astype(np.float32)
    if fused.attrs["epilogue"].get("quantize") and "ep_qzp" not in consts:
        consts["ep_qzp"] = np.zeros((), np.float32)
    return consts
