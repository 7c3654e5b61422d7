"""``npu::AttentionChain``: ``softmax(Q K^T [* or / c] [+ mask]) V`` as exported, built by ``kernels.fusion.attention``.

Inputs Q [.., S, H], K^T [.., H, T], V [.., T, Hv] and an optional additive mask broadcastable to [.., S, T], all
float32 (leading dims broadcast as numpy's matmul does). Attributes: ``scale_kind`` (0 none, 1 multiply, 2 divide),
``scale`` and ``zero_nan_rows`` (the exporters' ``Where(IsNaN(p), 0, p)`` after the Softmax was fused too).

Reference: the unfused chain's own numpy calls in its order (matmul, multiply or divide, add, the Softmax kernel's
``softmax``, the guard's where, matmul), so the reference model computes what the unfused kernels compute, bit for bit.

Native (``kernels.attention_chain``): operands of rank 2..4 with T > 0 and a mask no wider than the scores, on the
session's threads; the scores of a few query rows at a time never leave the kernel. Its summation orders and exp
are its own, so it matches the reference within float tolerance.

Cost: ``_sdpa.attention_cost`` (both products through the planner, the softmax on the vector unit) with the mask's
DMA; the scores never make a DRAM round trip.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..fusion.attention import FUSED_DOMAIN, FUSED_OP
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from . import _native
from ._sdpa import attention_cost
from ._util import arg, stash_constants
from .softmax import softmax

_F32 = np.float32


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"scale_kind": int(node.attrs["scale_kind"]), "scale": float(node.attrs["scale"]),
             "zero_nan_rows": bool(node.attrs.get("zero_nan_rows", False)), "has_mask": len(node.inputs) > 3, "fused_nodes": list(node.attrs.get("fused_nodes", []))}
    return Prepared(attrs, stash_constants(node), target)


def reference(q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale_kind: int,
              scale: float, zero_nan_rows: bool = False) -> np.ndarray:
    """The unfused chain as its kernels compute it."""
    s = np.matmul(q, kt)
    if scale_kind == 1:
        s = np.multiply(s, _F32(scale))
    elif scale_kind == 2:
        s = np.divide(s, _F32(scale))
    if mask is not None:
        s = np.add(s, mask)
    p = softmax(s, -1)
    if zero_nan_rows:
        p = np.where(np.isnan(p), _F32(0), p)
    return np.matmul(p, v)


def _operands(p: Prepared, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    q, kt, v = (arg(p, inputs, i) for i in range(3))
    return q, kt, v, arg(p, inputs, 3) if p.attrs["has_mask"] else None


def _native_for(p: Prepared, q, kt, v, mask) -> Any:
    """The native module when it computes this call (module docstring), else None."""
    nat = _native.native(p)
    arrays = (q, kt, v) if mask is None else (q, kt, v, mask)
    if nat is None or any(not isinstance(x, np.ndarray) or x.dtype != _F32 for x in arrays):
        return None
    if any(not 2 <= x.ndim <= 4 for x in (q, kt, v)) or (mask is not None and mask.ndim > 4):
        return None
    if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2] or kt.shape[-1] == 0:
        return None  # the reference names the mismatch as numpy's matmul does
    if mask is not None and mask.ndim >= 2 and (mask.shape[-2] not in (1, q.shape[-2])
                                                or mask.shape[-1] not in (1, kt.shape[-1])):
        return None
    if mask is not None and mask.ndim == 1 and mask.shape[0] not in (1, kt.shape[-1]):
        return None
    return nat


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    q, kt, v, mask = _operands(p, inputs)
    a = p.attrs
    nat = _native_for(p, q, kt, v, mask)
    if nat is not None:
        return [nat.attention_chain(q, kt, v, _mask_2d(mask), a["scale_kind"], a["scale"], _native.threads(p),
                                    a["zero_nan_rows"])]
    return [reference(q, kt, v, mask, a["scale_kind"], a["scale"], a["zero_nan_rows"])]


def _mask_2d(mask: np.ndarray | None) -> np.ndarray | None:
    """A 0-d or 1-d mask as the rank-2 view the native kernel takes (the same broadcast)."""
    return mask if mask is None or mask.ndim >= 2 else mask.reshape(1, -1)


def _bind(p: Prepared, inputs, outs) -> Any:
    """The native kernel as one call for these shapes (any layout: K^T is usually a transposed view)."""
    q, kt, v, mask = _operands(p, inputs)
    nat = _native_for(p, q, kt, v, mask)
    if nat is None:
        return None
    a = p.attrs
    runtime_mask = mask is not None and len(inputs) > 3 and inputs[3] is not None
    spec = [(i, i, _F32, x.shape, None, True) for i, x in enumerate((q, kt, v))]
    if runtime_mask and mask.ndim >= 2:
        spec.append((3, 3, _F32, mask.shape, None, True))
    elif runtime_mask:
        return None
    const_mask = None if runtime_mask else _mask_2d(mask)
    args = (None, None, None, const_mask, a["scale_kind"], a["scale"], _native.threads(p), a["zero_nan_rows"])
    return _native.call_step(p, nat.attention_chain, args, spec, [(-1, None)])


def _lead(shapes) -> tuple[int, int]:
    """(batch, heads) of the broadcast leading dims: the last leading dim is the heads, the rest the batch."""
    lead: list[int] = []
    for s in shapes:
        if s is None:
            continue
        dims = list(s[:-2])
        width = max(len(lead), len(dims))
        lead = [max(x, y) for x, y in zip([1] * (width - len(lead)) + lead, [1] * (width - len(dims)) + dims)]
    if not lead:
        return 1, 1
    return math.prod(lead[:-1]), lead[-1]


def _cost(p: Prepared, shapes) -> OpCost:
    qs, ks, vs = shapes[0], shapes[1], shapes[2]
    mask = shapes[3] if len(shapes) > 3 else None
    b, n = _lead([qs, ks, vs])
    s, h, t, hv = qs[-2], qs[-1], ks[-1], vs[-1]
    extra = math.prod(mask) * 4 if mask is not None else 0
    return attention_cost(p.target, "float32", b, n, n, s, t, h, hv, extra)


def _check(node: NodeInfo, target: Target) -> str | None:
    if any(v.dtype != _F32 for v in node.inputs):
        return f"{node.describe()}: float32 operands only"
    return None


register(KernelDef(FUSED_DOMAIN, FUSED_OP, _prepare, _run, _cost, _check, bind=_bind))
