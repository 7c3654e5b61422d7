"""BatchNormalization folded into the Conv that feeds it: ``BN(conv(x, W) + b) = conv(x, W * a) + (b * a + c)``
with ``a = scale / sqrt(var + eps)`` and ``c = B - mean * a`` per output channel, so the pair compiles to one Conv
with new constant weights and bias (no BN kernel, no second pass over the feature map).

ORT's own level-1 optimizer (ConvBNFusion) does this before GetCapability when graph optimizations are on; this
pass covers sessions that disable them and graphs where ORT left the pair alone. Rules (all must hold): a float32
Conv with constant weights and constant (or no) bias; its output is not a graph output and is read only by the BN
(as input 0); the BN is inference-only (one output) with constant scale, B, mean and var; the target takes the
resulting Conv. The fold is computed in float64 and rounded once to float32.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..node import NodeInfo, ValueInfo
from ..support import why_not
from ..target import Target
from ._graph import consumers_of


def _conv_ok(nd: NodeInfo) -> bool:
    if nd.key != ("", "Conv"):
        return False
    x, w, b = nd.input(0), nd.input(1), nd.input(2)
    return (x is not None and x.dtype is not None and x.dtype.name == "float32" and w is not None
            and w.value is not None and (b is None or b.value is not None))


def _bn_params(nd: NodeInfo) -> list[np.ndarray] | None:
    if nd.key != ("", "BatchNormalization") or int(nd.attr("training_mode", 0)):
        return None
    if sum(not v.missing for v in nd.outputs) != 1:
        return None
    params = [nd.input(i) for i in range(1, 5)]
    if any(v is None or v.value is None for v in params):
        return None
    return [np.asarray(v.value, np.float64).reshape(-1) for v in params]


def _const(like: ValueInfo, name: str, value: np.ndarray) -> ValueInfo:
    return dataclasses.replace(like, name=name, shape=tuple(value.shape), value=value, is_constant=True,
                               is_graph_input=False, is_graph_output=False)


def _folded(conv: NodeInfo, bn: NodeInfo, params: list[np.ndarray]) -> NodeInfo | None:
    scale, bias, mean, var = params
    w = conv.input(1)
    m = w.value.shape[0]
    if any(p.size != m for p in params):
        return None
    a = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    b0 = np.zeros(m) if conv.input(2) is None else np.asarray(conv.input(2).value, np.float64)
    w_new = (np.asarray(w.value, np.float64) * a.reshape((m,) + (1,) * (w.value.ndim - 1))).astype(np.float32)
    b_new = (b0 * a + (bias - mean * a)).astype(np.float32)
    inputs = (conv.inputs[0], _const(w, f"{w.name}/bn_folded", w_new),
              _const(w, f"{conv.outputs[0].name}/bn_bias", b_new))
    return dataclasses.replace(conv, name=f"{conv.name}+{bn.name}", inputs=inputs, outputs=tuple(bn.outputs[:1]),
                               attrs={**conv.attrs, "fused_nodes": [conv.name, bn.name]})


def fuse_conv_bn(nodes: list[NodeInfo], target: Target) -> list[NodeInfo]:
    """Return the node list with foldable Conv -> BatchNormalization pairs merged into one Conv."""
    users = consumers_of(nodes)
    replace: dict[int, NodeInfo] = {}
    absorbed: set[int] = set()
    for i, conv in enumerate(nodes):
        if not _conv_ok(conv):
            continue
        y = conv.outputs[0]
        readers = users.get(y.name, [])
        if y.is_graph_output or len(readers) != 1 or readers[0] in absorbed:
            continue
        bn = nodes[readers[0]]
        params = _bn_params(bn)
        if params is None or bn.inputs[0].name != y.name:
            continue
        fused = _folded(conv, bn, params)
        if fused is None or why_not(fused, target) is not None:
            continue
        replace[i] = fused
        absorbed.add(readers[0])
    return [replace.get(i, nd) for i, nd in enumerate(nodes) if i not in absorbed]
