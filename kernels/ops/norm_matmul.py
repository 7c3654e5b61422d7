"""``npu::NormMatMul``: an RMS norm (Simplified / SkipSimplified) folded into the float matmul that reads it, built
by ``kernels.fusion.norm``.

Compile time: the matmul (MatMul, MatMulNBits or MatMulGroup) is prepared by its own kernel. A float32 weight
gets the norm's gamma folded into its rows (``W' = gamma[:, None] * W``); packed int4 weights stay packed, and
gamma is kept as a vector that scales A instead (as the unfused norm does).

Run: ``s = x (+ skip (+ bias))``, then the norm kernel's own statistics and order of operations: Simplified
``A = (s * gamma) * inv_rms`` for packed weights, Skip* ``A = s / skip_rms * gamma`` (so A has the unfused kernel's
bits: an int8-quantizing matmul, accuracy_level 4, sees the same codes); Skip*'s sum output ``s`` is passed on.
For float weights gamma multiplies W instead of A (equal up to float32 reassociation).

Native: over packed int4 weights in float32, the session's native kernels run the prologue, the matmul, its bias
and a group's SwiGLU in one call (``norm_matmul_nbits``), with the statistics computed as above (the Simplified
dot on numpy's own BLAS sdot), so A has the reference's bits; the SwiGLU's exp is Cephes' expf in 16 lanes on
AVX-512 hosts, the C library's elsewhere (within a few ulps of numpy's). Over float32 weights on AVX-512 hosts,
``norm_matmul_float`` does the same with the product on the packed GEMM (B packed once and kept beside the folded
weights, as the packed MatMul keeps it): its summation order is not numpy's BLAS's, so the result is the
reference's within float32 tolerance. Anything else (float16, a
broadcast skip, relu or quantize epilogues) takes the step-by-step path.

Cost: the matmul's cost plus the prologue on the vector unit (add, square-accumulate, scale: 3 ops per element of
A, 4 with skip, one rsqrt per row); A's normalized copy never goes to DRAM.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fusion.norm import FUSED_DOMAIN, FUSED_OP
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, kernel_for, register
from .. import host_blas
from ..target import Target
from .. import runtime
from ._matrix import run_native_counted
from ._vector import elems, stream_cost
from ..runtime import copy_runtime
from .matmul import PACKED_ISAS, pack_once
from .matmul_nbits import packed_weights
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
    if pin.attrs.get("plan_b") == "int4":  # packed int4 (MatMulNBits or its group): gamma scales A at run time
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
    p = Prepared(attrs, consts, target)
    p.derived = [d.prefixed(_INNER) for d in pin.derived]
    return p


def _inner(p: Prepared) -> Prepared:
    """The matmul's own Prepared (built once per process from ours: consts under ``inner/``)."""
    inner = p.kernel_cache.get("inner")
    if inner is None:
        consts = {k[len(_INNER):]: v for k, v in p.consts.items() if k.startswith(_INNER)}
        inner = p.kernel_cache["inner"] = Prepared(p.attrs["inner_attrs"], consts, p.target)
    copy_runtime(p, inner)
    return inner


_F32 = np.dtype(np.float32)
_NATIVE_EPILOGUE = {"bias", "swiglu"}  # epilogue steps the one-call native path runs
_sdot: list[int] = []


def _one_call(p: Prepared, inner: Prepared) -> bool:
    """Whether this node can run as one native call (decided once per node from its compiled attributes)."""
    ok = p.kernel_cache.get("one_call")
    if ok is None:
        ia = inner.attrs
        ep = {k for k, v in ia.get("epilogue", {}).items() if v}
        ok = p.kernel_cache["one_call"] = ("gamma" in p.consts and ia.get("dtype") == "float32"
                                           and ep <= _NATIVE_EPILOGUE and not ia.get("runtime_bias", False))
    return ok


def _call_args(p: Prepared, inner: Prepared, m: int) -> tuple[tuple, tuple]:
    """The one-call kernel's arguments after x and skip, and after the plan, for ``m`` rows."""
    at, ia, c = p.attrs, inner.attrs, inner.consts
    if not _sdot:
        _sdot.append(host_blas.sdot_address() or 0)
    ep = ia["epilogue"]
    level = ia["accuracy_level"]
    args = (p.consts.get("norm_bias"), p.consts["gamma"], at["epsilon"], at["sum_output"], *packed_weights(inner),
            c["ep_bias"] if ep.get("bias") else None, ia["K"], ia["N"], ia["block_size"], level,
            bool(ep.get("swiglu")), runtime.threads(p))
    sgemm = (host_blas.sgemm_address() or 0) if level != 4 and m >= 16 else 0
    return args, (sgemm, _sdot[0])


def _run_one_call(nat, p: Prepared, inner: Prepared, inputs) -> list[np.ndarray] | None:
    at, ia = p.attrs, inner.attrs
    x = inputs[0]
    skip = inputs[1] if at["skip"] else None
    if x.dtype != _F32 or (skip is not None and (skip.dtype != _F32 or skip.shape != x.shape)):
        return None
    K, N = ia["K"], ia["N"]
    x2 = np.ascontiguousarray(x).reshape(-1, K)
    m = x2.shape[0]
    args, tail = _call_args(p, inner, m)
    y, s = run_native_counted(inner, nat.norm_matmul_nbits,
                              (x2, None if skip is None else np.ascontiguousarray(skip).reshape(-1, K), *args),
                              tail, m, N, K)
    return _outputs(p, inner, y, s, x.shape)


def _outputs(p: Prepared, inner: Prepared, y: np.ndarray, s: np.ndarray | None, x_shape: tuple) -> list[np.ndarray]:
    """The node's outputs from a one-call kernel's rows: the product (or a SwiGLU's half) [m, n], a group's column
    slices of it, and Skip*'s sum [m, K] when it is an output."""
    ia, lead = inner.attrs, x_shape[:-1]
    y = y.reshape(*lead, y.shape[-1])
    outs = ([y[..., s0:s1] for s0, s1 in ia["slices"]] if "slices" in ia and not ia["epilogue"].get("swiglu")
            else [y])
    return [*outs, s.reshape(x_shape)] if p.attrs["sum_output"] else outs


def _float_call(p: Prepared, inner: Prepared, nat) -> tuple | None:
    """``norm_matmul_float``'s arguments after x and skip for this node, or None where it does not apply (not an
    AVX-512 host, not float32 weights, an epilogue other than bias / SwiGLU, DMA counting)."""
    ia, c = inner.attrs, inner.consts
    w = c.get("w", c.get("b"))
    ep = {k for k, v in ia.get("epilogue", {}).items() if v}
    if (nat.isa() not in PACKED_ISAS or ia.get("dtype") != "float32" or not isinstance(w, np.ndarray) or w.ndim != 2
            or w.dtype != _F32 or ep - _NATIVE_EPILOGUE or "a" in c or ia.get("runtime_bias") or ia.get("runtime_c")
            or ia.get("trans_a") or ia.get("alpha", 1.0) != 1.0 or runtime.counting_dma(inner)):
        return None
    n = w.shape[1]
    bias = c["ep_bias"] if "bias" in ep else None
    if bias is not None and bias.size != n:
        return None
    packed = pack_once(inner, nat, w)
    if not _sdot:
        _sdot.append(host_blas.sdot_address() or 0)
    at = p.attrs
    return (packed, n, p.consts.get("norm_bias"), at["epsilon"], at["sum_output"],
            None if bias is None else np.ascontiguousarray(bias.reshape(-1), np.float32), "swiglu" in ep, _sdot[0],
            runtime.threads(p))


def _step_io(p: Prepared, inner: Prepared, inputs, outs, K: int, N: int) -> tuple[list, list] | None:
    """A one-call step's inputs (x and skip as [m, K] rows) and outputs (as ``_outputs`` makes them: a group's
    column slices are views of one [..., N] product), or None where these inputs do not fit one."""
    x = inputs[0] if inputs else None
    skip = inputs[1] if p.attrs["skip"] and len(inputs) > 1 else None
    if (not isinstance(x, np.ndarray) or x.dtype != _F32 or not x.flags.c_contiguous or x.ndim < 1
            or x.shape[-1] != K or p.attrs["skip"] != (skip is not None)):
        return None
    if skip is not None and (skip.dtype != _F32 or skip.shape != x.shape or not skip.flags.c_contiguous):
        return None
    ia = inner.attrs
    m = x.size // K
    ins = [(0, 0, _F32, x.shape, (m, K))] + ([(1, 1, _F32, x.shape, (m, K))] if skip is not None else [])
    if "slices" in ia and not ia["epilogue"].get("swiglu"):
        outputs = [(0, (*x.shape[:-1], N), (s0, s1)) for s0, s1 in ia["slices"]]
    else:
        outputs = [(0, outs[0].shape)]
    outputs += [(1, x.shape)] if p.attrs["sum_output"] else []
    return (ins, outputs) if len(outputs) == len(outs) else None


def _bind(p: Prepared, inputs, outs) -> Any:
    """The one-call path as a native step for x's shape (ep/step_binding.py): ``BoundNBits`` over int4 weights
    (converted once), ``norm_matmul_float`` over float32 weights."""
    inner = _inner(p)
    nat = runtime.native(p)
    if nat is None or runtime.counting_dma(inner):
        return None
    guards = [runtime.guard(inner)]
    if not _one_call(p, inner):
        call = _float_call(p, inner, nat)
        io = None if call is None else _step_io(p, inner, inputs, outs, call[0].shape[1], call[1])
        return None if io is None else runtime.call_step(p, nat.norm_matmul_float, (None, None, *call), *io, guards)
    ia = inner.attrs
    io = _step_io(p, inner, inputs, outs, ia["K"], ia["N"])
    if io is None:
        return None
    args, tail = _call_args(p, inner, inputs[0].size // ia["K"])
    norm_bias, gamma, eps, want_sum, *matmul, swiglu, threads = args
    sgemm, sdot = tail
    bound = nat.BoundNBits(*matmul, threads, sgemm, (norm_bias, gamma, eps, want_sum, swiglu, sdot))
    return runtime.call_step(p, bound, (None, None), *io, guards)


def _run_float(nat, p: Prepared, inner: Prepared, inputs) -> list[np.ndarray] | None:
    call = _float_call(p, inner, nat)
    x = inputs[0]
    skip = inputs[1] if p.attrs["skip"] else None
    if (call is None or x.dtype != _F32 or x.shape[-1] != call[0].shape[1]
            or (skip is not None and (skip.dtype != _F32 or skip.shape != x.shape))):
        return None
    K = x.shape[-1]
    res = nat.norm_matmul_float(np.ascontiguousarray(x).reshape(-1, K),
                                None if skip is None else np.ascontiguousarray(skip).reshape(-1, K), *call)
    return _outputs(p, inner, res[0], res[1] if len(res) > 1 else None, x.shape)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    inner = _inner(p)
    nat = runtime.native(p)
    if nat is not None:
        outs = (_run_one_call(nat, p, inner, inputs) if _one_call(p, inner)
                else _run_float(nat, p, inner, inputs))
        if outs is not None:
            return outs
    at = p.attrs
    s = inputs[0]
    if at["skip"]:
        s = np.add(s, inputs[1])
        if "norm_bias" in p.consts:
            s += p.consts["norm_bias"]
    gamma = p.consts.get("gamma")
    if at["skip"]:
        a = np.divide(s, skip_rms(s, at["epsilon"]))
        if gamma is not None:
            a *= gamma
    elif gamma is not None:  # (s * gamma) * inv: the unfused SimplifiedLayerNormalization's order
        a = s * gamma
        a *= inv_rms(s, s.ndim - 1, at["epsilon"])
    else:
        a = s * inv_rms(s, s.ndim - 1, at["epsilon"])
    outs = kernel_for(*at["inner_key"]).run(inner, [a] + [None] * (at["n_inner_inputs"] - 1))
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


register(KernelDef(FUSED_DOMAIN, FUSED_OP, _prepare, _run, _cost, _check, bind=_bind))
