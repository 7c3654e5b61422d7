"""``npu::AttentionChain``: ``softmax(Q K^T [* or / c] [+ mask]) V`` as exported, built by ``kernels.fusion.attention``.

Inputs Q [.., S, H], K^T [.., H, T], V [.., T, Hv] and an optional additive mask broadcastable to [.., S, T], all
float32 (leading dims broadcast as numpy's matmul does), then the runtime shape operands of the repeat_kv paths.
Attributes: ``scale_kind`` (0 none, 1 multiply, 2 divide), ``scale``, ``zero_nan_rows`` (the exporters'
``Where(IsNaN(p), 0, p)`` after the Softmax was fused too) and ``k_path`` / ``v_path``: where the fusion took the
exporters' repeat_kv (Unsqueeze -> Expand -> Reshape [-> Transpose]) in front of K^T or V, input 1 or 2 is the KV
head tensor [B, Nkv, T, H] before it, and these are the path's own kernels (prepared as the unfused nodes were);
where it took K^T's Transpose of K alone, input 1 is K [.., T, H] and ``k_path`` is that Transpose (``k_repeat``
false: only a repeat_kv path repeats heads).

Reference: the path's kernels, then the unfused chain's own numpy calls in its order (matmul, multiply or divide,
add, the Softmax kernel's ``softmax``, the guard's where, matmul), so the reference model computes what the unfused
kernels compute, bit for bit.

Native (``kernels.attention_chain``): operands of rank 2..4 with T > 0 and a mask no wider than the scores, on the
session's threads; the scores of a few query rows at a time never leave the kernel. A repeat_kv path whose shapes
repeat each KV head G times in place (checked on every call) is not materialized: query head n reads KV head n / G.
Its summation orders and exp are its own, so it matches the reference within float tolerance.

Cost: ``_sdpa.attention_cost`` (both products through the planner, the softmax on the vector unit) with the mask's
DMA; the scores never make a DRAM round trip.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..fusion.attention import FUSED_DOMAIN, FUSED_OP
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, kernel_for, register
from ..target import Target
from .. import runtime
from ._sdpa import attention_cost
from ._util import arg, stash_constants
from .softmax import last_axis, onnx_softmax

_F32 = np.float32


_PATHS = ("k", "v")
_FIRST_EXTRA = 4  # the fused node's inputs: q, k, v, mask (or omitted), then the paths' runtime operands


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {"scale_kind": int(node.attrs["scale_kind"]), "scale": float(node.attrs["scale"]),
             "zero_nan_rows": bool(node.attrs.get("zero_nan_rows", False)),
             "softmax": list(node.attrs.get("softmax", (-1, False))),
             "has_mask": len(node.inputs) > 3 and not node.inputs[3].missing,
             "fused_nodes": list(node.attrs.get("fused_nodes", []))}
    consts = stash_constants(node)
    extra = _FIRST_EXTRA
    transpose = node.attrs.get("k_transpose")
    for which in _PATHS:
        steps = []
        repeat = node.attrs.get("repeat_kv", {}).get(which, [])
        attrs[f"{which}_repeat"] = bool(repeat)
        for j, nd in enumerate(repeat or ([transpose] if which == "k" and transpose is not None else [])):
            pin = kernel_for(*nd.key).prepare(nd, target)
            consts.update({f"{which}{j}/{k}": v for k, v in pin.consts.items()})
            args = []  # each operand after the first: the fused node's input index, or -1 (a constant of pin)
            for v in nd.inputs[1:]:
                args.append(-1 if v.missing or v.value is not None else extra)
                extra += args[-1] >= 0
            steps.append({"key": list(nd.key), "attrs": pin.attrs, "args": args})
        attrs[f"{which}_path"] = steps
    return Prepared(attrs, consts, target)


def _path_step(p: Prepared, which: str, j: int) -> Prepared:
    """Step ``j`` of a repeat_kv path as its own kernel's Prepared (built once per process from ours)."""
    key = ("path", which, j)
    inner = p.kernel_cache.get(key)
    if inner is None:
        prefix = f"{which}{j}/"
        consts = {k[len(prefix):]: v for k, v in p.consts.items() if k.startswith(prefix)}
        inner = p.kernel_cache[key] = Prepared(p.attrs[f"{which}_path"][j]["attrs"], consts, p.target)
    return inner


def _path_args(p: Prepared, inputs, which: str, j: int) -> list:
    return [arg(p, inputs, a) if a >= 0 else None for a in p.attrs[f"{which}_path"][j]["args"]]


def _through_path(p: Prepared, inputs, which: str, x: np.ndarray) -> np.ndarray:
    """x through the path's own kernels, as the unfused nodes compute it."""
    for j, step in enumerate(p.attrs[f"{which}_path"]):
        x = kernel_for(*step["key"]).run(_path_step(p, which, j), [x, *_path_args(p, inputs, which, j)])[0]
    return x


def _path_ints(p: Prepared, inputs, which: str, j: int) -> tuple[int, ...]:
    """Step j's shape operand (input 1): the runtime value or the step's constant."""
    v = _path_args(p, inputs, which, j)[0]
    if v is None:
        v = _path_step(p, which, j).consts["in1"]
    return tuple(int(d) for d in np.asarray(v).reshape(-1))


def heads_repeated(p: Prepared, inputs, which: str, x: np.ndarray) -> int | None:
    """G when the path takes x [B, Nkv, T, H] to [B, Nkv * G, T, H] with each head repeated G times in place
    (Unsqueeze at axis 2, Expand to [B, Nkv, G, T, H], Reshape merging Nkv and G), else None."""
    if x.ndim != 4:
        return None
    b, nkv, t, h = x.shape
    try:
        e = np.broadcast_shapes((b, nkv, 1, t, h), _path_ints(p, inputs, which, 1))
    except ValueError:
        return None
    if len(e) != 5 or e[:2] != (b, nkv) or e[3:] != (t, h):
        return None
    allowzero = p.attrs[f"{which}_path"][2]["attrs"].get("allowzero", 0)
    target = [e[i] if d == 0 and not allowzero else d for i, d in enumerate(_path_ints(p, inputs, which, 2))]
    if target.count(-1) == 1:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(e) // known if known else -1
    return e[2] if tuple(target) == (b, nkv * e[2], t, h) else None


def reference(q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale_kind: int,
              scale: float, zero_nan_rows: bool = False, softmax: tuple[int, bool] = (-1, False)) -> np.ndarray:
    """The unfused chain as its kernels compute it (``softmax``: the Softmax's axis and opset < 13)."""
    s = np.matmul(q, kt)
    if scale_kind == 1:
        s = np.multiply(s, _F32(scale))
    elif scale_kind == 2:
        s = np.divide(s, _F32(scale))
    if mask is not None:
        s = np.add(s, mask)
    p = onnx_softmax(s, *softmax)
    if zero_nan_rows:
        p = np.where(np.isnan(p), _F32(0), p)
    return np.matmul(p, v)


def _operands(p: Prepared, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    q, k, v = (arg(p, inputs, i) for i in range(3))
    return q, k, v, arg(p, inputs, 3) if p.attrs["has_mask"] else None


def _native_call(p: Prepared, inputs, q, k, v, mask) -> tuple[Any, tuple] | None:
    """(native module, (K as given is rows [.., T, H], K's head group, V's head group)) when the native kernel
    computes this call (module docstring), else None."""
    nat = runtime.native(p)
    arrays = (q, k, v) if mask is None else (q, k, v, mask)
    if nat is None or any(not isinstance(x, np.ndarray) or x.dtype != _F32 for x in arrays):
        return None
    if any(not 2 <= x.ndim <= 4 for x in (q, k, v)) or (mask is not None and mask.ndim > 4):
        return None
    if not last_axis(p.attrs["softmax"][0], max(x.ndim for x in arrays)):
        return None  # the scores' rank was unknown at compile time, and the Softmax is not over their last axis
    groups = []
    for which, x in (("k", k), ("v", v)):
        g = heads_repeated(p, inputs, which, x) if p.attrs[f"{which}_repeat"] else 1
        if g is None:
            return None  # the path is not a repeat of heads in place: it runs as written
        groups.append(g)
    k_rows = bool(p.attrs["k_path"])
    h, t = (k.shape[-1], k.shape[-2]) if k_rows else (k.shape[-2], k.shape[-1])
    if q.shape[-1] != h or t != v.shape[-2] or t == 0:
        return None  # the reference names the mismatch as numpy's matmul does
    if mask is not None and mask.ndim >= 2 and (mask.shape[-2] not in (1, q.shape[-2]) or mask.shape[-1] not in (1, t)):
        return None
    if mask is not None and mask.ndim == 1 and mask.shape[0] not in (1, t):
        return None
    return nat, (k_rows, *groups)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    q, k, v, mask = _operands(p, inputs)
    a = p.attrs
    native = _native_call(p, inputs, q, k, v, mask)
    if native is not None:
        nat, layout = native
        return [nat.attention_chain(q, k, v, _mask_2d(mask), a["scale_kind"], a["scale"], runtime.threads(p),
                                    a["zero_nan_rows"], *layout)]
    if a["k_path"]:
        k = _through_path(p, inputs, "k", k)
    if a["v_path"]:
        v = _through_path(p, inputs, "v", v)
    return [reference(q, k, v, mask, a["scale_kind"], a["scale"], a["zero_nan_rows"], tuple(a["softmax"]))]


def _mask_2d(mask: np.ndarray | None) -> np.ndarray | None:
    """A 0-d or 1-d mask as the rank-2 view the native kernel takes (the same broadcast)."""
    return mask if mask is None or mask.ndim >= 2 else mask.reshape(1, -1)


def _bind(p: Prepared, inputs, outs) -> Any:
    """The native kernel as one call for these shapes and path operands (any layout: K^T is usually a view)."""
    q, k, v, mask = _operands(p, inputs)
    native = _native_call(p, inputs, q, k, v, mask)
    fixed = runtime.fixed_inputs(inputs, _FIRST_EXTRA)  # the paths' shapes: bound for these values
    if native is None or fixed is None:
        return None
    nat, layout = native
    a = p.attrs
    runtime_mask = mask is not None and len(inputs) > 3 and inputs[3] is not None
    spec = [(i, i, _F32, x.shape, None, True) for i, x in enumerate((q, k, v))]
    if runtime_mask and mask.ndim >= 2:
        spec.append((3, 3, _F32, mask.shape, None, True))
    elif runtime_mask:
        return None
    const_mask = None if runtime_mask else _mask_2d(mask)
    args = (None, None, None, const_mask, a["scale_kind"], a["scale"], runtime.threads(p), a["zero_nan_rows"],
            *layout)
    return runtime.call_step(p, nat.attention_chain, args, spec, [(-1, None)], fixed=fixed)


def _lead(shapes) -> tuple[int, int]:
    """(batch, heads) of the broadcast leading dims: the last leading dim is the heads, the rest the batch."""
    lead = np.broadcast_shapes(*(tuple(s[:-2]) for s in shapes if s is not None))
    return (math.prod(lead[:-1]), lead[-1]) if lead else (1, 1)


def _cost(p: Prepared, shapes) -> OpCost:
    qs, ks, vs = shapes[0], shapes[1], shapes[2]
    mask = shapes[3] if len(shapes) > 3 and p.attrs["has_mask"] else None
    b, n = _lead([qs] if p.attrs["k_repeat"] or p.attrs["v_repeat"] else [qs, ks, vs])
    s, h, hv = qs[-2], qs[-1], vs[-1]
    t = ks[-2] if p.attrs["k_path"] else ks[-1]
    nkv = ks[1] if p.attrs["k_repeat"] and len(ks) == 4 and ks[1] and n % ks[1] == 0 else n  # K's own heads
    extra = math.prod(mask) * 4 if mask is not None else 0
    return attention_cost(p.target, "float32", b, n, nkv, s, t, h, hv, extra)


def _check(node: NodeInfo, target: Target) -> str | None:
    if any(not v.missing and v.dtype != _F32 for v in node.inputs[:4]):
        return f"{node.describe()}: float32 operands only"
    return None


register(KernelDef(FUSED_DOMAIN, FUSED_OP, _prepare, _run, _cost, _check, rank_free=True, bind=_bind))
