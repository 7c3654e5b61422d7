"""The compiler's in-partition fusion passes, declared in the order they run.

Each pass takes the partition's node list (topological) and returns it with some chains replaced by one
synthetic ``npu::*`` node that a kernel in ``kernels/ops`` executes. Order matters: the sibling pass groups plain
matmuls that the epilogue pass left alone, the rms pass makes an RMS norm written out op by op one norm, and
the norm pass folds a norm into a matmul or a sibling group; the element-wise chain pass runs last, on what the
others left.
A pass applies only where the target lists its fused op (``support.why_not`` on the synthetic node).

Every pass reports each candidate it declines as a ``FusionMiss`` with the failed condition: ``fuse_partition`` logs
them at debug level and appends them to ``misses`` (``npu-report --explain-fusions``). Most passes are rules
(``_rules.FusionRule``: an onnxscript pattern from ``patterns``, which the offline rewriter shares, a check with a
reason, the fused node); epilogue, conv_tail, eltwise_chain, siblings, norm and qdq_lut walk chains or groups the rule
framework does not express, and name the failed condition at the node they anchor on (the matmul, Conv, the chain's
first node, norm or the QDQ unit's op).

May import: the rest of ``kernels`` (the op modules' constants included) and ``log``'s logger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ...log import escape, logger
from ..node import NodeInfo
from ..target import Target
from . import (attention, conv_bn, conv_tail, eltwise_chain, epilogue, norm, qdq, qdq_bytes, qdq_lut, rms, rotary,
               siblings)
from ._rules import FusionMiss


@dataclasses.dataclass(frozen=True)
class FusionPass:
    name: str
    consumes: str  # the chain it looks for
    produces: tuple[str, str]  # (domain, op_type) of the synthetic node
    run: Callable[..., list[NodeInfo]]  # (nodes, target, misses) -> nodes; each declined candidate -> misses


PASSES: tuple[FusionPass, ...] = (
    FusionPass("qdq", "DQ(x) -> Conv | MatMul (DQ(constant W)) -> Q units (8-bit ones become QLinearConv / "
               "QLinearMatMul); then every single-reader DQ of a constant folded into its reader as a float constant",
               (qdq.FUSED_DOMAIN, qdq.FUSED_MATMUL), qdq.fuse_qdq),
    FusionPass("qdq_bytes", "DQ(8-bit x) -> MaxPool | nearest Resize | Flatten | Reshape | Transpose | Squeeze | "
               "Unsqueeze -> Q with the DQ's own parameters: the op on the bytes", ("", "MaxPool"),
               qdq_bytes.fuse_qdq_bytes),
    FusionPass("qdq_lut", "DQ(8-bit x) [, DQ(8-bit y)] -> Add | Sub | Mul | Div | Clip | Relu | Max | Min | Abs | Neg "
               "(other inputs scalar constants) -> Q(8-bit) units, chains composed",
               (qdq_lut.FUSED_DOMAIN, qdq_lut.FUSED_OP), qdq_lut.fuse_qdq_lut),
    FusionPass("conv_bn", "float Conv (constant W, b) -> BatchNormalization (constant parameters)", ("", "Conv"),
               conv_bn.fuse_conv_bn),
    FusionPass("conv_tail", "float Conv -> scalar Mul | Add | Sub | Div | Clip | Relu | Max | Min links, LeakyRelu, "
               "PRelu of one slope, Erf, Gelu, Pow by 3, and x * f(x) diamonds (PP-LCNetV3 affine + hard-swish tails, "
               "exact GELU)", ("", "Conv"), conv_tail.fuse_conv_tails),
    FusionPass("attention", "float MatMul(Q, K^T) -> [Mul | Div by a scalar constant] -> [Add(mask)] -> Softmax "
               "(last axis) -> MatMul(., V), as exporters write attention out", (attention.FUSED_DOMAIN,
               attention.FUSED_OP), attention.fuse_attention),
    FusionPass("rotary", "Add(Mul(x, cos), Mul(Concat(Neg(x[..., h/2:]), x[..., :h/2]), sin)): the rotary embedding "
               "as exporters write it out", (rotary.FUSED_DOMAIN, rotary.FUSED_OP), rotary.fuse_rotary),
    FusionPass("epilogue", "MatMul | Gemm | MatMulNBits | MatMulIntegerToFloat -> [bias Add] -> [Relu] -> "
               "[QuantizeLinear]", (epilogue.FUSED_DOMAIN, epilogue.FUSED_OP), epilogue.fuse),
    FusionPass("siblings", "matmuls with constant weights reading the same A, and a SwiGLU tail on {gate, up}",
               (siblings.GROUP_DOMAIN, siblings.GROUP_OP), siblings.fuse_siblings),
    FusionPass("rms", "Pow(x, 2) -> ReduceMean(last axis) -> Add(eps) -> Sqrt -> Div(1, .) | Reciprocal -> "
               "Mul(x, .) -> Mul(gamma, .): an RMS norm written out op by op", (rms.FUSED_DOMAIN, rms.FUSED_OP),
               rms.fuse_rms),
    FusionPass("norm", "(Skip)SimplifiedLayerNormalization -> its only consumer, a float matmul or sibling group",
               (norm.FUSED_DOMAIN, norm.FUSED_OP), norm.fuse_norms),
    FusionPass("eltwise_chain", "float32 element-wise chains no Conv feeds (the conv tail's links and diamonds, and "
               "Exp, Log, Tanh, Abs, Neg, Reciprocal, Floor, Ceil, Round, Softsign, Softplus, Elu, Selu), last so the "
               "other passes take theirs first", (eltwise_chain.FUSED_DOMAIN, eltwise_chain.FUSED_OP),
               eltwise_chain.fuse_elementwise_chains),
)


def fuse_partition(nodes: Sequence[NodeInfo], target: Target,
                   misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Run every pass in order over one partition's nodes; the rule passes' declined candidates go to ``misses``
    and to the debug log."""
    out = list(nodes)
    found: list[FusionMiss] = []
    for p in PASSES:
        out = p.run(out, target, found)
    for m in found:
        logger.debug("fusion %s: node '%s' (%s) not fused: %s", m.fusion, escape(m.node), escape(m.op),
                     escape(m.reason))
    if misses is not None:
        misses.extend(found)
    return out
