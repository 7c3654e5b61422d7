"""BatchNormalization folded into the Conv that feeds it: ``BN(conv(x, W) + b) = conv(x, W * a) + (b * a + c)``
with ``a = scale / sqrt(var + eps)`` and ``c = B - mean * a`` per output channel, so the pair compiles to one Conv
with new constant weights and bias (no BN kernel, no second pass over the feature map).

ORT's own level-1 optimizer (ConvBNFusion) does this before GetCapability when graph optimizations are on; this
pass covers sessions that disable them and graphs where ORT left the pair alone. Rules (all must hold): a float32
Conv with constant weights and constant (or no) bias; its output is not a graph output and is read only by the BN
(as input 0); the BN is inference-only (one output) with constant scale, B, mean and var; the target takes the
resulting Conv. The fold is computed in float64 and rounded once to float32. A candidate (a BN fed by a Conv) that
fails a rule above is a ``FusionMiss`` with the rule's reason (``_rules.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchResult

from ..node import NodeInfo, ValueInfo
from ..target import Target
from ._rules import FusionMiss, FusionRule, apply_rules, failed, passed, producer_info


def _conv_reason(nd: NodeInfo) -> str | None:
    x, w, b = nd.input(0), nd.input(1), nd.input(2)
    if x is None or x.dtype is None or x.dtype.name != "float32":
        return f"{nd.describe()}: input {x.describe() if x is not None else '?'} is not float32"
    if w is None or w.value is None or (b is not None and b.value is None):
        return f"{nd.describe()}: weights or bias are not constants"
    return None


def _bn_params(nd: NodeInfo) -> list[np.ndarray] | str:
    """The BN's scale, B, mean and var as float64 vectors, or why it does not fold."""
    if int(nd.attr("training_mode", 0)) or sum(not v.missing for v in nd.outputs) != 1:
        return f"{nd.describe()} is not inference-only (training mode or more than one output)"
    params = [nd.input(i) for i in range(1, 5)]
    if any(v is None or v.value is None for v in params):
        return f"{nd.describe()}: scale, B, mean and var are not all constants"
    return [np.asarray(v.value, np.float64).reshape(-1) for v in params]


def _const(like: ValueInfo, name: str, value: np.ndarray) -> ValueInfo:
    return dataclasses.replace(like, name=name, shape=tuple(value.shape), value=value, is_constant=True,
                               is_graph_input=False, is_graph_output=False)


def _folded(conv: NodeInfo, bn: NodeInfo, params: list[np.ndarray]) -> NodeInfo:
    scale, bias, mean, var = params
    w = conv.input(1)
    m = w.value.shape[0]
    a = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    b0 = np.zeros(m) if conv.input(2) is None else np.asarray(conv.input(2).value, np.float64)
    w_new = (np.asarray(w.value, np.float64) * a.reshape((m,) + (1,) * (w.value.ndim - 1))).astype(np.float32)
    b_new = (b0 * a + (bias - mean * a)).astype(np.float32)
    inputs = (conv.inputs[0], _const(w, f"{w.name}/bn_folded", w_new),
              _const(w, f"{conv.outputs[0].name}/bn_bias", b_new))
    return dataclasses.replace(conv, name=f"{conv.name}+{bn.name}", inputs=inputs, outputs=tuple(bn.outputs[:1]),
                               attrs={**conv.attrs, "fused_nodes": [conv.name, bn.name]})


class ConvBnRule(FusionRule):
    """``BatchNormalization(Conv(x, W[, b]))`` -> one Conv with the BN folded into W and b, in the Conv's place."""

    name = "conv_bn"
    produces = ("", "Conv")
    place = min  # the folded Conv reads what the Conv read: it stays where the Conv was

    def pattern(self, op, x, w):
        return op.BatchNormalization(op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"]),
                                     _allow_other_inputs=True, _outputs=["bn"])

    def check(self, context, conv: ir.Value, bn: ir.Value, **_: Any) -> MatchResult:
        conv_node, bn_node = producer_info(conv), producer_info(bn)
        if (reason := _conv_reason(conv_node)) is not None:
            return failed(reason, conv)
        params = _bn_params(bn_node)
        if isinstance(params, str):
            return failed(params, bn)
        m = conv_node.input(1).value.shape[0]
        if any(p.size != m for p in params):
            return failed(f"{bn_node.describe()}: parameters of {[p.size for p in params]} values for {m} output "
                          "channels", bn)
        return passed()

    def fuse(self, members: list[NodeInfo], conv: ir.Value, bn: ir.Value, **_: Any) -> NodeInfo:
        conv_node, bn_node = producer_info(conv), producer_info(bn)
        return _folded(conv_node, bn_node, _bn_params(bn_node))


RULES = (ConvBnRule(),)


def fuse_conv_bn(nodes: list[NodeInfo], target: Target, misses: list[FusionMiss] | None = None) -> list[NodeInfo]:
    """Return the node list with foldable Conv -> BatchNormalization pairs merged into one Conv."""
    return apply_rules(nodes, target, RULES, misses)
