"""``npu::MatMulGroup``: sibling matmuls sharing input A as one matmul over concatenated weights (built by
``kernels.fusion.siblings``), optionally with the SwiGLU epilogue.

Compile time: every member is prepared by its own op's prepare and the member biases become one vector.
MatMulNBits members stay packed, each in its level's layout (``matmul_nbits.level_layout``: ORT's initializers read
in place, or at accuracy_level 4 the member's int8 tiles): the native kernel takes them as side-by-side column
segments of one B, so nothing is concatenated; a member without zero points gets the packed default 8s when
another member has some. MatMul members concatenate their float32 ``[K, N_i]`` into ``[K, sum N_i]``.

Run: one matmul (for MatMulNBits the single-op kernel over the members' packed weights, native or reference as
the session chose, natively with its bias and a SwiGLU epilogue in the same call, ``BoundNBits.swiglu``; float32
weights on the packed native GEMM where ``matmul.packed_panels`` applies, bias and SwiGLU in the same call, a float16
A widened and the result rounded once; a bound step makes these calls straight from the program's loop), bias added
in place, then either the members' outputs as column slices of the accumulator or,
with the SwiGLU epilogue on a {gate, up} group, ``g * sigmoid(g) * u`` (``g / (1 + exp(-g))``, the exponent
clipped at 80 so it never overflows: beyond it the product is 0 to float32 precision anyway; the native SwiGLU is
within a few ulps of it). Numerics equal the separate kernels' up to summation order.

Cost: the plan of one matmul with N = sum N_i (A is loaded once), the epilogue as overlapped vector work: bias 1 op
per accumulator element, SwiGLU (4 ops + 1 transcendental) per (gate, up) pair.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import host_blas
from ..cost import matmul_cost
from ..fusion.siblings import GROUP_DOMAIN, GROUP_OP
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, kernel_for, register
from ..target import Target
from .. import runtime
from ._matrix import apply_float_epilogue, check_fits, epilogue_ops, matmul_dims, plan_for, static_plan
from ._vector import transcendental
from .matmul import PACKED_ISAS, pack_once, packed_panels
from .matmul_nbits import NBITS_MEMBERS, _native_args, _native_tail, nbits_matmul, nbits_step

_NBITS = ("com.microsoft", "MatMulNBits")
_EXP_CLIP = np.float32(80.0)


def _check(node: NodeInfo, target: Target) -> str | None:
    members = node.attrs["members"]
    for m in members:
        reason = kernel_for(*m.key).check(m, target)
        if reason is not None:
            return reason
    first = members[0]
    a = first.input(0)
    rows = a.shape[-2] if a.shape is not None and len(a.shape) > 1 else 1
    k = int(first.attr("K")) if first.key == _NBITS else int(first.input(1).value.shape[0])
    dt = a.dtype.name if a.dtype is not None else "float32"
    return check_fits(rows, sum(node.attrs["splits"]), k, dt, "int4" if first.key == _NBITS else dt, target,
                      block_size=first.attr("block_size"))


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    members = node.attrs["members"]
    first = members[0]
    nbits = first.key == _NBITS
    parts = [kernel_for(*m.key).prepare(m, target) for m in members]
    splits = [int(n) for n in node.attrs["splits"]]
    consts = _member_packed(parts) if nbits else {
        "w": np.ascontiguousarray(np.concatenate([p.consts["b"] for p in parts], axis=1))}
    ep = dict(node.attrs["epilogue"])
    if any(p.attrs["epilogue"].get("bias") for p in parts):
        consts["ep_bias"] = np.concatenate([np.broadcast_to(p.consts["ep_bias"].reshape(-1), (n,))
                                            if p.attrs["epilogue"].get("bias") else np.zeros(n, np.float32)
                                            for p, n in zip(parts, splits)]).astype(np.float32)
        ep["bias"] = True
    dt = parts[0].attrs["dtype"]
    k = int(parts[0].attrs["K"]) if nbits else consts["w"].shape[0]
    edges = np.cumsum([0, *splits]).tolist()
    attrs = {"op": GROUP_OP, "base": list(first.key), "K": k, "N": edges[-1], "splits": splits,
             "slices": [[edges[i], edges[i + 1]] for i in range(len(splits))], "dtype": dt,
             "accuracy_level": int(parts[0].attrs.get("accuracy_level", 0)),
             "block_size": parts[0].attrs.get("block_size"), "plan_a": dt, "plan_b": "int4" if nbits else dt,
             "plan_out": dt, "epilogue": ep, "fused_nodes": list(node.attrs["fused_nodes"]),
             **({NBITS_MEMBERS: len(parts)} if nbits else {}),
             # which original node's output each of ours is (reports compare per node)
             "output_owners": ([[node.attrs["fused_nodes"][-1], 0]] if ep.get("swiglu")
                               else [[m.name, 0] for m in members])}
    p = Prepared(attrs, consts, target)
    p.derived = [d.prefixed(f"m{i}/") for i, part in enumerate(parts) for d in part.derived]
    a = first.input(0).shape
    if a is not None and all(isinstance(d, int) for d in a):
        static_plan(p, matmul_dims(a, (k, edges[-1])))
    return p


def _member_packed(parts: list[Prepared]) -> dict[str, np.ndarray]:
    """MatMulNBits members' packed constants under ``m{i}/``, as they are (``matmul_nbits.packed_weights``)."""
    consts = {f"m{i}/{key}": p.consts[key] for i, p in enumerate(parts) for key in ("nb_b", "nb_scales")}
    if any("nb_zp" in p.consts for p in parts):
        at = parts[0].attrs
        zb = (-(-at["K"] // at["block_size"]) + 1) // 2
        flat = at["accuracy_level"] == 4  # the tiles' zero points: one run of column groups, all 0x88 alike
        consts.update({f"m{i}/nb_zp": p.consts["nb_zp"] if "nb_zp" in p.consts
                       else np.full(p.attrs["N"] * zb if flat else (p.attrs["N"], zb), 0x88, np.uint8)
                       for i, p in enumerate(parts)})
    return consts


def _silu_mul(y: np.ndarray, n: int) -> np.ndarray:
    """``g * sigmoid(g) * u`` for ``g, u = y[..., :n], y[..., n:]`` with one temporary."""
    g, u = y[..., :n], y[..., n:]
    e = np.negative(g)
    np.minimum(e, _EXP_CLIP, out=e)
    np.exp(e, out=e)
    e += np.float32(1.0)
    np.divide(g, e, out=e)
    e *= u
    return e


_PACKED_EPILOGUE = {"bias", "swiglu"}  # what float_matmul_packed runs in the same call


def _packed_call(p: Prepared, a: np.ndarray) -> tuple | None:
    """``float_matmul_packed``'s arguments after A for a float32 or float16 group on the packed GEMM (a float16 A
    widened exactly, the float32 result rounded once, as ``_run``'s reference path does), or None where it does not
    make this product (int4 members, another dtype or epilogue, DMA counting, not an AVX-512 host)."""
    at = p.attrs
    ep = {k for k, v in at["epilogue"].items() if v}
    if (NBITS_MEMBERS in at or at["dtype"] not in ("float32", "float16") or a.dtype != at["dtype"]
            or ep - _PACKED_EPILOGUE or runtime.counting_dma(p)):
        return None
    bias = p.consts["ep_bias"] if "bias" in ep else None
    nat, w = runtime.native(p), p.consts["w"]
    if a.dtype == np.float32:
        packed = packed_panels(p, a, w)
    else:  # packed_panels' conditions for a float16 A, which the kernel widens
        packed = pack_once(p, nat, w) if nat is not None and a.ndim and nat.isa() in PACKED_ISAS else None
    if packed is None or (bias is not None and bias.size != at["N"]):
        return None
    bias = None if bias is None else np.ascontiguousarray(bias.reshape(-1), np.float32)
    return packed, at["N"], None, False, bias, False, None, runtime.threads(p), None, "swiglu" in ep


def _outputs(at: dict, y: np.ndarray) -> list[np.ndarray]:
    return [y] if at["epilogue"].get("swiglu") else [y[..., s0:s1] for s0, s1 in at["slices"]]


def _nbits_bias(p: Prepared) -> np.ndarray | bool | None:
    """For a float32 or float16 group of MatMulNBits members whose epilogue is at most a constant bias: that bias
    (None: none), which the native kernel adds; False for other groups."""
    at = p.attrs
    if (NBITS_MEMBERS not in at or at["dtype"] not in ("float32", "float16")
            or {k for k, v in at["epilogue"].items() if v} - {"bias"}):
        return False
    return p.consts["ep_bias"] if at["epilogue"].get("bias") else None


def _nbits_swiglu(p: Prepared, a: np.ndarray) -> Any:
    """For a float32 or float16 {gate, up} group of MatMulNBits members with the SwiGLU epilogue (and at most a
    constant bias) on the native kernels: ``BoundNBits.swiglu`` for A's rows (the product, its bias and SwiGLU in
    one call, a float16 A widened and the result rounded once; counting DMA, the counted product and
    ``swiglu_halves``: the same bits); else None."""
    at = p.attrs
    nat = runtime.native(p)
    if (nat is None or NBITS_MEMBERS not in at or not at["epilogue"].get("swiglu")
            or at["dtype"] not in ("float32", "float16") or a.dtype != at["dtype"] or not a.ndim
            or a.shape[-1] != at["K"] or {k for k, v in at["epilogue"].items() if v} - {"bias", "swiglu"}):
        return None
    bias = p.consts["ep_bias"] if at["epilogue"].get("bias") else None
    if runtime.counting_dma(p):
        half = a.dtype == np.float16
        return lambda x: nat.swiglu_halves(nbits_matmul(p, x, bias), half, runtime.threads(p))
    m = a.size // at["K"]
    return nat.BoundNBits(*_native_args(p, bias), *_native_tail(p, m), None).swiglu


def _bind(p: Prepared, inputs, outs):
    """A float32 or float16 group on the packed GEMM, or of MatMulNBits members with at most a bias on their native
    kernel (a float16 A on its ``half``) or with SwiGLU (``_nbits_swiglu``), as one native call for this input
    shape; its outputs are column views of the one product, as the kernel's."""
    a = inputs[0] if inputs else None
    nat = runtime.native(p)
    if (nat is None or not isinstance(a, np.ndarray) or a.dtype not in (np.float32, np.float16) or not a.ndim
            or not a.flags.c_contiguous):
        return None
    at = p.attrs
    swiglu = None if runtime.counting_dma(p) else _nbits_swiglu(p, a)
    if swiglu is not None:
        m = a.size // at["K"]
        return runtime.call_step(p, swiglu, (None,), [(0, 0, a.dtype.type, a.shape, (m, at["K"]))],
                                 [(-1, (*a.shape[:-1], at["N"] // 2))], None)
    bias = _nbits_bias(p)
    if bias is not False:
        if runtime.counting_dma(p) or a.dtype != at["dtype"] or a.shape[-1] != at["K"]:
            return None
        product = (*a.shape[:-1], at["N"])
        return nbits_step(p, a, bias, [(-1, product, (s0, s1)) for s0, s1 in at["slices"]])
    call = _packed_call(p, a)
    if call is None:
        return None
    swiglu = at["epilogue"].get("swiglu")
    outputs = [(-1, None)] if swiglu else [(-1, None, (s0, s1)) for s0, s1 in at["slices"]]
    where = p.runtime.partition_outputs  # SwiGLU's one result written into ORT's buffer when it leaves the partition
    into = [(9, where[0], [*a.shape[:-1], at["N"] // 2])] if swiglu and where and 0 in where else []
    return runtime.call_step(p, nat.float_matmul_packed, (None, *call), [(0, 0, a.dtype.type, a.shape, None)],
                             outputs, None, into)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    at = p.attrs
    a = inputs[0]
    call = None if NBITS_MEMBERS in at else _packed_call(p, a)
    if call is not None:
        return _outputs(at, runtime.native(p).float_matmul_packed(np.ascontiguousarray(a), *call))
    swiglu = None if call is not None or not isinstance(a, np.ndarray) else _nbits_swiglu(p, a)
    if swiglu is not None:  # the bound step's call
        return [swiglu(np.ascontiguousarray(a).reshape(-1, at["K"])).reshape(*a.shape[:-1], at["N"] // 2)]
    bias = _nbits_bias(p)
    if bias is not False:  # the bias added by the kernel, as the bound step adds it; float16 rounded once
        return _outputs(at, nbits_matmul(p, a, bias).astype(at["dtype"], copy=False))
    if NBITS_MEMBERS in at:
        y = nbits_matmul(p, a)
    else:
        y = host_blas.matmul(a if a.dtype == np.float32 else a.astype(np.float32), p.consts["w"], runtime.native(p),
                             runtime.threads(p))
    ep = at["epilogue"]
    if ep.get("bias"):
        y = apply_float_epilogue(y, ep, p.consts)
    outs = [_silu_mul(y, at["splits"][0])] if ep.get("swiglu") else _outputs(at, y)
    if at["dtype"] != "float32":
        outs = [o.astype(at["dtype"]) for o in outs]
    return outs


def _cost(p: Prepared, shapes) -> OpCost:
    at = p.attrs
    ops = epilogue_ops(at["epilogue"])
    if at["epilogue"].get("swiglu"):
        ops += (4.0 + transcendental(p.target)) / 2.0  # per accumulator element: one (gate, up) pair per two
    m, n, k, batch = matmul_dims(tuple(shapes[0]), (at["K"], at["N"]))
    return matmul_cost(plan_for(p, m, n, k, batch), p.target, ops)


register(KernelDef(GROUP_DOMAIN, GROUP_OP, _prepare, _run, _cost, _check, bind=_bind))
