"""RMS-norm prologue fusion inside a partition: SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization whose
normalized output feeds exactly one float matmul become one synthetic ``npu::NormMatMul``.

Why: in a decoder every RMS norm feeds a projection (q/k/v, gate/up, lm_head). On the NPU the row statistics are
a prologue of the matmul's A load: ``y = ((s * inv) * gamma) @ W = (s * inv) @ (gamma[:, None] * W)`` with
``inv = rsqrt(mean(s^2) + eps)`` per row, so gamma folds into W's rows at compile time and the normalized tensor
never makes a DRAM round trip. On the host it is one kernel call instead of two.

Rules (all must hold): the norm normalizes the last axis of a float32 input with a constant gamma (and constant
bias, Skip*); its normalized output is not a graph output and has exactly one consumer, which reads it as input 0
(A); the consumer is a float ``MatMul`` with a constant 2-D B (plain, or with a constant bias as its only
epilogue), a plain ``MatMulNBits`` or an ``npu::MatMulGroup`` of them, at any accuracy_level (int4 weights keep
gamma as a vector that scales A in the unfused norm's order, so the A that level 4 quantizes per block is the
unfused norm's, bit for bit), except a level-4 group with the SwiGLU
epilogue (``_foldable_consumer``); the norm's statistics outputs (mean, inv_std_var) are unused; the target lists
``npu::NormMatMul``. Shape nodes reading the normalized output besides the matmul read the norm's input instead.
Skip*'s sum output (the residual) stays an output of the fused node.
"""

from __future__ import annotations

import dataclasses

from ..node import NodeInfo
from ..support import why_not
from ..target import Target
from ._graph import consumers_of
from ._rules import FusionMiss
from .siblings import bias_matmul

FUSED_DOMAIN, FUSED_OP = "npu", "NormMatMul"
_NORMS = {("", "SimplifiedLayerNormalization"), ("com.microsoft", "SkipSimplifiedLayerNormalization")}
_GROUP = ("npu", "MatMulGroup")


def _plain_consumer(nd: NodeInfo) -> bool:
    """A float matmul whose constant weights can take gamma in their rows (also one with a bias as its epilogue)."""
    if nd.key == ("", "MatMul") or bias_matmul(nd):
        b = nd.input(1)
        return b is not None and b.value is not None and b.value.ndim == 2
    if nd.key == ("com.microsoft", "MatMulNBits"):  # not with an act-order g_idx: its kernel permutes A's columns
        return all(v.missing or v.is_constant for v in nd.inputs[1:]) and nd.input(4) is None
    return False


def _foldable_consumer(nd: NodeInfo) -> bool:
    if nd.key == _GROUP:
        members = nd.attrs["members"]
        # the fused SwiGLU's exp is not numpy's (within a few ulps of it): at accuracy_level 4 that moved a
        # 1B-width decoder's greedy tokens off the CPU EP's after 8 steps (16 of 16 unfused), so it stays unfused
        if nd.attrs["epilogue"].get("swiglu") and any(_level(m) == 4 for m in members):
            return False
        return all(_plain_consumer(m) for m in members)
    return _plain_consumer(nd)


def _level(nd: NodeInfo) -> int:
    return int(nd.attr("accuracy_level", 0)) if nd.key == ("com.microsoft", "MatMulNBits") else 0


def _norm_problem(nd: NodeInfo, users: dict[str, list[int]]) -> str | None:
    """Why the norm ``nd`` cannot lead a fused node, or None."""
    x = nd.input(0)
    if x is None or x.dtype is None or x.dtype.name != "float32" or x.shape is None:
        return f"input '{x.name if x is not None else ''}' is not float32 of a known shape"
    skip = nd.op_type == "SkipSimplifiedLayerNormalization"
    if not skip and int(nd.attr("axis", -1)) not in (-1, len(x.shape) - 1):
        return f"axis {nd.attr('axis')} is not the last axis of rank {len(x.shape)}"
    consts = (2, 3) if skip else (1,)
    if any(nd.input(i) is not None and nd.input(i).value is None for i in consts) or nd.input(consts[0]) is None:
        return "gamma (or bias) is not a constant"
    stats = nd.outputs[1:3] if skip else nd.outputs[1:2]
    used = [v.name for v in stats if not (v.missing or (not v.is_graph_output and not users.get(v.name)))]
    return f"its statistics output(s) {used} are read" if used else None


def _consumer_problem(mm: NodeInfo, y: str) -> str | None:
    """Why the normalized output's one reader ``mm`` cannot take the norm as its prologue, or None."""
    if mm.inputs[0].name != y or any(v.name == y for v in mm.inputs[1:]):
        return f"{mm.op_type} '{mm.name}' reads '{y}' other than as its input A alone"
    if not _foldable_consumer(mm):
        return (f"{mm.op_type} '{mm.name}' is no float MatMul with a constant 2-D B (plain or with a bias), plain "
                "MatMulNBits (no g_idx) or group of them (a SwiGLU group at accuracy_level 4 stays unfused)")
    return None


def fuse_norms(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with foldable norm -> matmul pairs merged into ``npu::NormMatMul``; each norm that
    stays goes to ``misses`` with the reason."""
    if target.rule(FUSED_DOMAIN, FUSED_OP) is None:
        return nodes
    users = consumers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    def miss(nd: NodeInfo, reason: str) -> None:
        if misses is not None:
            misses.append(FusionMiss("norm", nd.name, nd.op_type, reason))

    for i, nd in enumerate(nodes):
        if nd.key not in _NORMS:
            continue
        if (problem := _norm_problem(nd, users)) is not None:
            miss(nd, problem)
            continue
        y = nd.outputs[0]
        # a Shape of the normalized tensor is the Shape of the norm's input (exporters read it for the Reshape that
        # splits heads): it moves there rather than keep the tensor alive
        shapes = [j for j in users.get(y.name, []) if nodes[j].key == ("", "Shape")]
        readers = [j for j in users.get(y.name, []) if j not in shapes]
        if y.is_graph_output or len(readers) != 1:
            miss(nd, f"output '{y.name}' is a graph output" if y.is_graph_output else
                 f"output '{y.name}' has {len(readers)} readers besides Shape, not one")
            continue
        mm = nodes[readers[0]]
        if readers[0] in absorbed or readers[0] in replace:
            miss(nd, f"its reader {mm.op_type} '{mm.name}' is already fused with another norm")
            continue
        if (problem := _consumer_problem(mm, y.name)) is not None:
            miss(nd, problem)
            continue
        skip = nd.op_type == "SkipSimplifiedLayerNormalization"
        outputs = tuple(mm.outputs) + ((nd.outputs[3],) if skip and len(nd.outputs) > 3 and not nd.outputs[3].missing
                                       else ())
        norm_inputs = nd.inputs[:4] if skip else nd.inputs[:2]
        fused = NodeInfo(
            index=nd.index, name=f"{nd.name}+{mm.name}", op_type=FUSED_OP, domain=FUSED_DOMAIN,
            inputs=(*norm_inputs, *mm.inputs[1:]), outputs=outputs,
            attrs={"norm": nd, "matmul": mm, "n_norm_inputs": len(norm_inputs),
                   "fused_nodes": [nd.name, *mm.attrs.get("fused_nodes", [mm.name])]},
            since_version=nd.since_version)
        if (why := why_not(fused, target)) is not None:
            miss(nd, f"the target rejects {why}")
            continue
        replace[i] = fused
        absorbed.add(readers[0])
        for j in shapes:
            replace[j] = dataclasses.replace(nodes[j], inputs=(nd.inputs[0], *nodes[j].inputs[1:]))
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
