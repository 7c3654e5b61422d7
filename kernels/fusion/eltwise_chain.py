"""Chains of element-wise ops that no Conv feeds, as one ``npu::ElementwiseChain`` node: ``x * sigmoid(x)`` (SiLU),
tanh-GELU written out as ``Mul/Pow/Add/Tanh``, ``Exp -> Add(1) -> Log`` and the like run as one native pass of the
element-wise engine over the data (``kernels/ops/elementwise_chain.py``, ``tail_of``) instead of one step and one
fresh tensor per op.

The chain is the conv tail's (``fusion.conv_tail``: its links and diamonds, walked by its ``_Walker``) started at
any float32 value instead of a Conv's output, with the engine's unary instructions as links too: Exp, Log, Tanh,
Abs, Neg, Reciprocal, Floor, Ceil, Round, Softsign, Softplus, Elu, Selu (``tail_program``). Each instruction is the
float32 operation of the node it replaces, so the chain gives the op-by-op result; exp, log and expm1 are the
engine's (within 1-3 ulp of the exact function, as the ops alone on the engine are).

Rules: float32; at least two nodes; each link reads the previous value and scalar float32 constants only; every
intermediate is read only inside the chain and is not a graph output (a value read twice continues only as a
``x op f(x)`` diamond); the target lists ``npu::ElementwiseChain``. A chain (or a lone node) that stops before an
element-wise reader that is no link (a tensor operand, a third reader, a graph output) is a ``FusionMiss`` with
that reason. Float16 chains and tensor operands (``(x - mean) * rsqrt(var)``) are not chained yet.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..support import why_not
from ..tail_program import unary_program
from ..target import Target
from ._graph import consumers_of
from ._rules import FusionMiss
from .conv_tail import _link as conv_tail_link
from .conv_tail import _Walker

FUSED_DOMAIN, FUSED_OP = "npu", "ElementwiseChain"

_UNARY = {"Exp": [("exp", 0.0, 0.0)], "Log": [("log", 0.0, 0.0)], "Tanh": [("tanh", 0.0, 0.0)],
          "Abs": [("abs", 0.0, 0.0)], "Neg": [("mul", -1.0, 0.0)], "Reciprocal": [("rdiv", 1.0, 0.0)],
          "Floor": [("floor", 0.0, 0.0)], "Ceil": [("ceil", 0.0, 0.0)], "Round": [("round", 0.0, 0.0)]}
_PARAM_UNARY = ("Softsign", "Softplus", "Elu", "Selu")
# the links a chain takes, as a miss names them
_LINKS = ("of a scalar constant or a unary op (Mul, Add, Sub, Div, Clip, Relu, Max, Min, Sigmoid, HardSigmoid, "
          "HardSwish, Erf, LeakyRelu, one-slope PRelu, Gelu, Pow by 3 or 0.5, Exp, Log, Tanh, Abs, Neg, Reciprocal, "
          "Floor, Ceil, Round, Softsign, Softplus, Elu, Selu)")
# ops that would continue a chain if their operands allowed it (a reader among these that is no link is a miss)
ELEMENTWISE = {*_UNARY, *_PARAM_UNARY, "Mul", "Add", "Sub", "Div", "Max", "Min", "Clip", "Relu", "Sigmoid", "Erf",
               "HardSigmoid", "HardSwish", "LeakyRelu", "PRelu", "Gelu", "Pow"}


def _link(nd: NodeInfo, x: str) -> list[tuple[str, float, float]] | None:
    """The instructions of a float32 node reading ``x`` (and scalar constants): the conv tail's links, and the
    engine's unary ops."""
    if (nd.domain == "" and nd.inputs and nd.inputs[0].name == x and len(nd.inputs) == 1 and len(nd.outputs) == 1
            and nd.outputs[0].dtype == np.float32):
        if nd.op_type in _UNARY:
            return list(_UNARY[nd.op_type])
        if nd.op_type in _PARAM_UNARY:
            return unary_program(nd.op_type, np.float32, dict(nd.attrs))
    return conv_tail_link(nd, x)


def _starts(nodes: list[NodeInfo]) -> list[ValueInfo]:
    """The float32 values a chain may start after, in topological order: the partition's inputs, then each node's
    outputs."""
    produced = {v.name for nd in nodes for v in nd.outputs}
    seen: set[str] = set()
    out: list[ValueInfo] = []
    for nd in nodes:
        for v in nd.inputs:
            if not v.missing and v.value is None and v.name not in produced and v.name not in seen:
                seen.add(v.name)
                out.append(v)
    out += [v for nd in nodes for v in nd.outputs if not v.missing]
    return [v for v in out if v.dtype == np.float32]


def fuse_elementwise_chains(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None
                            ) -> list[NodeInfo]:
    """Return the node list with each float32 chain of two or more element-wise nodes replaced by one
    ``npu::ElementwiseChain``; each stop before an element-wise reader goes to ``misses`` with the reason."""
    users = consumers_of(nodes)
    taken: set[int] = set()
    walker = _Walker(nodes, users, taken, link=_link, group="element-wise chain", links=_LINKS)
    replace: dict[int, NodeInfo] = {}
    for start in _starts(nodes):
        program, absorbed, cur = [], [], start
        got = walker.step(cur) or _first_link(nodes, users, taken, start)
        while got is not None:
            ins, idx, cur = got
            program += ins
            absorbed += idx
            taken.update(idx)
            got = walker.step(cur)
        if absorbed and misses is not None and _continues(nodes, users, cur, taken):
            first = nodes[absorbed[0]]
            ends = "" if len(absorbed) < 2 else f"its chain of {len(absorbed)} ends: "
            misses.append(FusionMiss("eltwise_chain", first.name, first.op_type, ends + walker.why_stuck(cur)))
        if len(absorbed) < 2:
            taken.difference_update(absorbed)
            continue
        first = nodes[absorbed[0]]
        fused = dataclasses.replace(
            first, name=f"{first.name}+chain", op_type=FUSED_OP, domain=FUSED_DOMAIN, inputs=(start,), outputs=(cur,),
            attrs={"program": [list(t) for t in program], "fused_nodes": [nodes[j].name for j in absorbed]})
        if (why := why_not(fused, target)) is not None:
            taken.difference_update(absorbed)
            if misses is not None:
                misses.append(FusionMiss("eltwise_chain", first.name, first.op_type, f"the target rejects {why}"))
            continue
        replace[max(absorbed)] = fused
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in taken or i in replace]


def _first_link(nodes: list[NodeInfo], users: dict[str, list[int]], taken: set[int], start: ValueInfo):
    """The chain's first link when ``start`` is also read outside it (a chain's input may have other readers): the
    first reader that is a link, as ``_Walker.step`` returns it, or None."""
    for j in users.get(start.name, []):
        if j not in taken and (ins := _link(nodes[j], start.name)):
            return ins, [j], nodes[j].outputs[0]
    return None


def _continues(nodes: list[NodeInfo], users: dict[str, list[int]], v: ValueInfo, taken: set[int]) -> bool:
    """Whether ``v`` is read by an element-wise op not yet in a chain (so stopping before it needs a reason)."""
    return any(j not in taken and nodes[j].domain == "" and nodes[j].op_type in ELEMENTWISE
               for j in users.get(v.name, []))
