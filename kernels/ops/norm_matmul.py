"""``npu::NormMatMul``: an RMS norm (Simplified / SkipSimplified) folded into the float matmul that reads it, built
by ``kernels.fusion.norm``.

Compile time: the matmul (MatMul, MatMulNBits or MatMulGroup) is prepared by its own kernel. A float32 weight
gets the norm's gamma folded into its rows (``W' = gamma[:, None] * W``); packed int4 weights stay packed, and
gamma is kept as a vector that scales A instead (as the unfused norm does).

Run: ``s = x (+ skip (+ bias))``, then the norm kernel's own statistics: Simplified ``A = s * inv_rms`` (``*
gamma`` for packed weights), Skip* ``A = s / skip_rms * gamma`` (ORT's operations, so A has the unfused kernel's
bits: an int8-quantizing matmul, accuracy_level 4, sees the same codes); Skip*'s sum output ``s`` is passed on.
For float weights gamma multiplies W instead of A (equal up to float32 reassociation).

Cost: the matmul's cost plus the prologue on the vector unit (add, square-accumulate, scale: 3 ops per element of
A, 4 with skip, one rsqrt per row); A's normalized copy never goes to DRAM.
"""

from __future__ import annotations

import numpy as np

from ..fusion.norm import FUSED_DOMAIN, FUSED_OP
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, kernel_for, register
from ..target import Target
from ._vector import elems, stream_cost
from ._native import copy_runtime
from .norm import inv_rms, skip_rms

_INNER = "inner/"


def _check(node: NodeInfo, target: Target) -> str | None:
    inner = node.attrs["matmul"]
    return kernel_for(*inner.key).check(inner, target)


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    norm, inner = node.attrs["norm"], node.attrs["matmul"]
    skip = norm.op_type == "SkipSimplifiedLayerNormalization"
    pin = kernel_for(*inner.key).prepare(inner, target)
    gamma = np.asarray(norm.input(2 if skip else 1).value, np.float32).reshape(-1)
    consts = {}
    if "nb_b" in pin.consts:  # packed int4: gamma scales A at run time
        if int(pin.attrs["K"]) != gamma.size:
            raise ValueError(f"{node.describe()}: gamma has {gamma.size} elements, the matmul's K is {pin.attrs['K']}")
        consts["gamma"] = gamma
    else:
        key = "w" if "w" in pin.consts else "b"
        w = pin.consts[key]
        if w.ndim != 2 or w.shape[0] != gamma.size:
            raise ValueError(f"{node.describe()}: gamma has {gamma.size} elements, the matmul's K is {w.shape[0]}")
        pin.consts[key] = np.ascontiguousarray(w * gamma[:, None])
    consts.update({_INNER + k: v for k, v in pin.consts.items()})
    bias = norm.input(3) if skip else None
    if bias is not None:
        consts["norm_bias"] = np.asarray(bias.value, np.float32).reshape(-1)
    n_inner_out = len(inner.outputs)
    owners = pin.attrs.get("output_owners") or [[inner.name, j] for j in range(n_inner_out)]
    attrs = {"op": FUSED_OP, "skip": skip, "epsilon": float(norm.attr("epsilon", 1e-5)),
             "inner_key": list(inner.key), "inner_attrs": pin.attrs, "n_inner_inputs": len(inner.inputs),
             "sum_output": len(node.outputs) > n_inner_out, "fused_nodes": list(node.attrs["fused_nodes"]),
             "output_owners": [*owners, *([[norm.name, 3]] if len(node.outputs) > n_inner_out else [])]}
    return Prepared(attrs, consts, target)


def _inner(p: Prepared) -> Prepared:
    """The matmul's own Prepared (built once per process from ours: consts under ``inner/``)."""
    inner = p.memo.get("inner")
    if inner is None:
        consts = {k[len(_INNER):]: v for k, v in p.consts.items() if k.startswith(_INNER)}
        inner = p.memo["inner"] = Prepared(p.attrs["inner_attrs"], consts, p.target)
    copy_runtime(p, inner)
    return inner


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    at = p.attrs
    s = inputs[0]
    if at["skip"]:
        s = np.add(s, inputs[1])
        if "norm_bias" in p.consts:
            s += p.consts["norm_bias"]
    if at["skip"]:
        a = np.divide(s, skip_rms(s, at["epsilon"]))
    else:
        a = s * inv_rms(s, s.ndim - 1, at["epsilon"])
    if "gamma" in p.consts:
        a *= p.consts["gamma"]
    outs = kernel_for(*at["inner_key"]).run(_inner(p), [a] + [None] * (at["n_inner_inputs"] - 1))
    return [*outs, s] if at["sum_output"] else list(outs)


def _cost(p: Prepared, shapes) -> OpCost:
    at = p.attrs
    inner = _inner(p)
    cost = kernel_for(*at["inner_key"]).cost(inner, [shapes[0]] + [None] * (at["n_inner_inputs"] - 1))
    n = elems(shapes[0])
    rows = n // shapes[0][-1] if shapes[0] and shapes[0][-1] else 1
    pro = stream_cost(p, n, 0, 0, 4.0 if at["skip"] else 3.0, rows / max(n, 1))
    cost.compute_cycles += pro.compute_cycles
    cost.cycles += pro.compute_cycles
    return cost


register(KernelDef(FUSED_DOMAIN, FUSED_OP, _prepare, _run, _cost, _check))
