"""Integer matmuls on the int8 matrix unit: MatMulInteger, QLinearMatMul, com.microsoft MatMulIntegerToFloat.

NPU numerics: int8/uint8 operands with zero points removed, int32 accumulation (exact: see ``_matrix``), then
- MatMulInteger: the int32 accumulator;
- QLinearMatMul: requantized to int8/uint8 (float32 multiplier, round half to even, saturation) - bit-exact vs ORT;
- MatMulIntegerToFloat: ``float32(acc) * (a_scale * b_scale) + bias``.

Compile time: a constant 2-D B stays int8, re-laid out for the native int8 GEMM (``pack_b``: uint8 shifted to
int8, blocks of 16 columns x 4 k, column sums and shifted zero points); other constant B (batched) is stored
zero-point-free as float32 ``[..., K, N]`` with its exact magnitude bound. Constant scales fold into one
per-column multiplier.

Run: the native kernel (``kernels/native/int8_gemm.cc``, exact int32, requantization fused for QLinearMatMul;
MatMulIntegerToFloat's scales, biases and ReLU in ``int8_matmul_float.cc``, each a float32 operation as below)
when B was packed and A's zero point is per tensor; otherwise, or with ``kernels=reference``, the numpy reference
below (float32 BLAS on exact integer chunks) - bit-identical results.
Input order: MatMulInteger (A, B, a_zp, b_zp); QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp);
MatMulIntegerToFloat (A, B, a_scale, b_scale, a_zp, b_zp, bias).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._matrix import (check_fits, exact_int_matmul, int_bound, matmul_dims, matmul_operand_dims,
                  planned_cost, quantize_float, requantize, run_native_counted, static_plan)

# op -> (A, B, a_zp, b_zp, a_scale, b_scale, y_scale, y_zp, bias) input indices (None: absent)
_SLOTS = {
    "MatMulInteger": dict(a=0, b=1, azp=2, bzp=3),
    "QLinearMatMul": dict(a=0, b=3, azp=2, bzp=5, ascale=1, bscale=4, yscale=6, yzp=7),
    "MatMulIntegerToFloat": dict(a=0, b=1, azp=4, bzp=5, ascale=2, bscale=3, bias=6),
}


def _const(node: NodeInfo, i: int | None) -> np.ndarray | None:
    v = node.input(i) if i is not None else None
    return None if v is None else v.value


def _dtname(node: NodeInfo, i: int) -> str:
    v = node.input(i)
    return v.dtype.name if v is not None and v.dtype is not None else "uint8"


def check_int(node: NodeInfo, target: Target) -> str | None:
    s = _SLOTS[node.op_type]
    dims = matmul_operand_dims(node, s["a"], s["b"])
    if dims is None or isinstance(dims, str):
        return dims
    m, n, k = dims
    return check_fits(m, n, k, _dtname(node, s["a"]), _dtname(node, s["b"]), target)


def prepare_int(node: NodeInfo, target: Target, epilogue: dict[str, Any] | None = None,
                ep_consts: dict[str, np.ndarray] | None = None) -> Prepared:
    op = node.op_type
    s = _SLOTS[op]
    dta, dtb = _dtname(node, s["a"]), _dtname(node, s["b"])
    out = "int32" if op == "MatMulInteger" else (_dtname(node, s["yzp"]) if op == "QLinearMatMul" else "float32")
    if op == "QLinearMatMul" and node.input(s["yzp"]) is None:
        out = "uint8"
    attrs: dict[str, Any] = {"op": op, "dta": dta, "dtb": dtb, "out": out, "plan_a": dta, "plan_b": dtb,
                             "plan_out": "int32" if out == "int32" else ("float32" if out == "float32" else "int8"),
                             "epilogue": dict(epilogue or {}), "slots": s}
    consts: dict[str, np.ndarray] = dict(ep_consts or {})
    for name, i in s.items():  # every constant input, raw
        v = _const(node, i)
        if v is not None:
            consts[name] = np.ascontiguousarray(v)
    bzp = consts.get("bzp")
    packed = pack_b(consts["b"], bzp) if "b" in consts else None
    if packed is not None:  # int8 stays int8: the raw B and its float copy are not kept
        attrs["b_shape"] = list(consts.pop("b").shape)
        consts.update(packed)
    elif "b" in consts:
        bc = consts["b"].astype(np.float32)
        if bzp is not None:
            bc -= bzp.astype(np.float32)  # 1-D zero points are per column (last axis)
        consts["b_c"] = np.ascontiguousarray(bc)
        attrs["bound_b"] = int(np.abs(bc).max()) if bc.size else 1
    if all(k in consts or s.get(k) is None for k in ("ascale", "bscale", "yscale")) and op != "MatMulInteger":
        mult = consts["ascale"].astype(np.float32) * consts["bscale"].astype(np.float32)
        if op == "QLinearMatMul":
            mult = mult / consts["yscale"].astype(np.float32)
        consts["mult"] = np.asarray(mult, np.float32)
    p = Prepared(attrs, consts, target)
    a, b = node.input(s["a"]).shape, node.input(s["b"]).shape
    if a is not None and b is not None and all(isinstance(d, int) for d in (*a, *b)):
        static_plan(p, matmul_dims(a, b))
    return p


def pack_b(b: np.ndarray, bzp: np.ndarray | None) -> dict[str, np.ndarray] | None:
    """A constant 2-D B ``[K, N]`` as the native int8 GEMM reads it (None if B is batched or its zero point is
    neither per tensor nor per column). ``B'`` is B with uint8 shifted by -128, zero-padded to ``kp`` (K rounded
    up to 64) x ``np`` (N rounded up to 16); ``i8_bp [np/16, kp/4, 16, 4]``: per block of 16 columns, 4
    consecutive k of each column side by side (the order vpdpbusd multiplies); ``i8_bsum`` the column sums of
    ``B'``; ``i8_bzp`` B's zero point per column, shifted alike (so ``B' - i8_bzp == B - b_zp`` exactly)."""
    if b.ndim != 2 or (bzp is not None and np.size(bzp) not in (1, b.shape[1])):
        return None
    K, N = b.shape
    kp, n16 = -(-K // 64) * 64, max(16, -(-N // 16) * 16)  # kp as the kernel's (K + 63) / 64 * 64: 0 for K = 0
    shift = 0 if b.dtype == np.int8 else 128
    bt = np.zeros((n16, kp), np.int8)
    bt[:N, :K] = (b.T.astype(np.int16) - shift).astype(np.int8)
    z = np.zeros(n16, np.int32)
    z[:N] = 0 if bzp is None else np.asarray(bzp, np.int32).reshape(-1)
    z[:N] -= shift
    return {"i8_bp": np.ascontiguousarray(bt.reshape(n16 // 16, 16, kp // 4, 4).transpose(0, 2, 1, 3)),
            "i8_bsum": bt.sum(axis=1, dtype=np.int32), "i8_bzp": z}


def centered_b(bp: np.ndarray, bzp: np.ndarray, K: int, N: int) -> tuple[np.ndarray, int]:
    """``pack_b``'s inverse for the reference model: float32 ``B - b_zp`` ``[K, N]`` (exact integers) and its
    largest magnitude."""
    bt = bp.transpose(0, 2, 1, 3).reshape(bp.shape[0] * 16, bp.shape[1] * 4)[:N, :K]
    bc = np.ascontiguousarray(bt.T.astype(np.float32) - bzp[:N])
    return bc, int(np.abs(bc).max()) if bc.size else 1


def _b_centered(p: Prepared) -> tuple[np.ndarray, int]:
    """The reference model's float32 ``B - b_zp`` ``[K, N]`` from the packed constants (kernel_cache) and its bound."""
    got = p.kernel_cache.get("reference_b")
    if got is None:
        got = p.kernel_cache["reference_b"] = centered_b(p.consts["i8_bp"], p.consts["i8_bzp"], *p.attrs["b_shape"])
    return got


def _native_int(p: Prepared, inputs) -> np.ndarray | None:
    """The native kernel's result (int32, or the requantized output for QLinearMatMul), None if it does not apply."""
    nat = runtime.native(p)
    if nat is None or "i8_bp" not in p.consts:
        return None
    a, azp = _get(p, inputs, "a"), _get(p, inputs, "azp")
    yzp = _get(p, inputs, "yzp")
    if (azp is not None and np.size(azp) != 1) or (yzp is not None and np.size(yzp) != 1):
        return None
    K, N = p.attrs["b_shape"]
    a2 = np.ascontiguousarray(a).reshape(int(np.prod(a.shape[:-1], dtype=np.int64)), K)  # K = 0: no -1 to infer
    z = np.asarray(0 if azp is None else azp, np.int32).reshape(1)
    requant = (None, 0, False)  # multiplier, y_zero_point, y_signed
    if p.attrs["op"] == "QLinearMatMul":
        requant = (np.asarray(_multiplier(p, inputs), np.float32).reshape(-1),
                   0 if yzp is None else int(np.asarray(yzp).reshape(-1)[0]), p.attrs["out"] == "int8")
    args = (a2, z, p.consts["i8_bp"], p.consts["i8_bsum"], p.consts["i8_bzp"], K, N, runtime.threads(p), *requant)
    y = run_native_counted(p, nat.int8_matmul, args, (), a2.shape[0], N, K)
    return y.reshape(*a.shape[:-1], y.shape[-1])


def _multiplier(p: Prepared, inputs) -> np.ndarray:
    mult = p.consts.get("mult")
    if mult is None:
        mult = np.asarray(_get(p, inputs, "ascale"), np.float32) * np.asarray(_get(p, inputs, "bscale"), np.float32)
        if p.attrs["op"] == "QLinearMatMul":
            mult = mult / np.asarray(_get(p, inputs, "yscale"), np.float32)
    return mult


def _get(p: Prepared, inputs, name: str) -> np.ndarray | None:
    i = p.attrs["slots"].get(name)
    if i is None:
        return None
    if name in p.consts:
        return p.consts[name]
    return inputs[i] if i < len(inputs) else None


def int_accumulate(p: Prepared, inputs) -> np.ndarray:
    """Exact ``(A - a_zp) @ (B - b_zp)``: int32, or float32 holding exact integers (single K chunk)."""
    at = p.attrs
    a = _get(p, inputs, "a")
    azp = _get(p, inputs, "azp")
    a_c = a.astype(np.float32)
    if azp is not None:
        z = np.asarray(azp, np.float32)
        a_c -= z[:, None] if z.ndim == 1 and a.ndim > 1 and z.size > 1 else z
    bzp = _get(p, inputs, "bzp")
    if "i8_bp" in p.consts:
        b_c, bound_b = _b_centered(p)
    elif "b_c" in p.consts:
        b_c, bound_b = p.consts["b_c"], at["bound_b"]
    else:
        b_c = _get(p, inputs, "b").astype(np.float32)
        if bzp is not None:
            b_c -= np.asarray(bzp, np.float32)
        bound_b = int_bound(at["dtb"], bzp)
    bound_a = int_bound(at["dta"], azp)
    tk = int(p.target.tile[2]) if p.target is not None else 64
    return exact_int_matmul(a_c, b_c, bound_a, bound_b, tk)


def _float_args(p: Prepared, inputs) -> tuple | None:
    """MatMulIntegerToFloat's ``int8_matmul_float`` arguments after A as ``run_int`` computes them (the exact sums,
    times a_scale * b_scale, + bias, + the epilogue's bias, ReLU): (a_zero_point, K, N, a_scale, b_scale, bias,
    bias2, relu, threads); a runtime a_zero_point/a_scale stays the array it is. None where the native kernel does
    not apply: B not packed, a runtime b_zero_point/b_scale/bias, a zero point or scale of more than one value, a
    fused QuantizeLinear, DMA counted."""
    at, c = p.attrs, p.consts
    ep = at["epilogue"]
    if (at["op"] != "MatMulIntegerToFloat" or "i8_bp" not in c or ep.get("quantize") or runtime.counting_dma(p)
            or any(_runtime(p, inputs, name) for name in ("b", "bzp", "bscale", "bias"))):
        return None
    azp, ascale = _get(p, inputs, "azp"), _get(p, inputs, "ascale")
    bscale, bias = _get(p, inputs, "bscale"), _get(p, inputs, "bias")
    K, N = at["b_shape"]
    if (not isinstance(ascale, np.ndarray) or ascale.size != 1 or ascale.dtype != np.float32
            or (azp is not None and np.size(azp) != 1) or bscale is None or np.size(bscale) not in (1, N)
            or (bias is not None and np.size(bias) != N)):
        return None
    got = p.kernel_cache.get("float_consts")
    if got is None:  # the constants as the kernel reads them, made once
        got = p.kernel_cache["float_consts"] = (
            np.asarray(bscale, np.float32).reshape(-1),
            None if bias is None else np.ascontiguousarray(bias, np.float32).reshape(-1),
            np.ascontiguousarray(c["ep_bias"], np.float32).reshape(-1) if ep.get("bias") else None)
    b_scale, b1, b2 = got
    if b2 is not None and b2.size != N:
        return None
    z = 0 if azp is None else (azp if "azp" not in c else int(np.asarray(azp).reshape(-1)[0]))
    a_scale = ascale if "ascale" not in c else np.ascontiguousarray(ascale, np.float32).reshape(-1)
    return z, K, N, a_scale, b_scale, b1, b2, bool(ep.get("relu")), runtime.threads(p)


def _native_float(p: Prepared, inputs) -> np.ndarray | None:
    """MatMulIntegerToFloat's result from ``int8_matmul_float`` (kernels/native/int8_matmul_float.cc), None where
    it does not apply (``_float_args``)."""
    nat = runtime.native(p)
    args = None if nat is None else _float_args(p, inputs)
    if args is None:
        return None
    a = _get(p, inputs, "a")
    K = args[1]
    a2 = np.ascontiguousarray(a).reshape(int(np.prod(a.shape[:-1], dtype=np.int64)), K)
    y = nat.int8_matmul_float(a2, args[0], p.consts["i8_bp"], p.consts["i8_bsum"], p.consts["i8_bzp"], *args[1:])
    return y.reshape(*a.shape[:-1], y.shape[-1])


def run_int(p: Prepared, inputs) -> list[np.ndarray]:
    at = p.attrs
    op = at["op"]
    if op == "MatMulIntegerToFloat":
        y = _native_float(p, inputs)
        if y is not None:
            return [y]
    native = _native_int(p, inputs)
    if native is not None and op == "QLinearMatMul":
        return [native]
    acc = int_accumulate(p, inputs) if native is None else native
    if op == "MatMulInteger":
        y = acc.astype(np.int32, copy=False)
        ep = at["epilogue"]
        if ep and ep.get("relu"):  # fused epilogue on the int32 result: dequant-free int path only supports relu
            np.maximum(y, 0, out=y)
        return [y]
    mult = _multiplier(p, inputs)
    if op == "QLinearMatMul":
        yzp = _get(p, inputs, "yzp")
        return [requantize(acc, mult, np.zeros((), np.float32) if yzp is None else yzp, at["out"])]
    y = acc.astype(np.float32) * mult  # MatMulIntegerToFloat
    bias = _get(p, inputs, "bias")
    if bias is not None:
        y += bias
    ep = at["epilogue"]
    if ep.get("bias"):
        y += p.consts["ep_bias"]
    if ep.get("relu"):
        np.maximum(y, 0, out=y)
    if ep.get("quantize"):
        return [quantize_float(y, p.consts["ep_qscale"], p.consts["ep_qzp"], ep["quantize"])]
    return [y]


def bind_int(p: Prepared, inputs, outs) -> Any:
    """QLinearMatMul, and MatMulInteger without an epilogue, with B, the zero points and the scales constant (A's
    zero point may come at run time: DynamicQuantizeLinear's, put in per call), as one native step calling the int8
    GEMM as ``_native_int`` does, writing ORT's own buffer when the result is an output of the partition
    (ep/step_binding.py). None elsewhere: the kernel runs."""
    nat, at, c = runtime.native(p), p.attrs, p.consts
    slots = at["slots"]
    a = inputs[slots["a"]] if slots["a"] < len(inputs) else None
    if at["op"] == "MatMulIntegerToFloat":
        return None if nat is None else _bind_float(p, inputs, outs, nat, a)
    if (nat is None or "i8_bp" not in c or runtime.counting_dma(p)
            or (at["op"] == "MatMulInteger" and at["epilogue"]) or (at["op"] == "QLinearMatMul" and "mult" not in c)
            or not isinstance(a, np.ndarray) or not a.ndim
            or not a.flags.c_contiguous or a.dtype not in (np.uint8, np.int8)
            or any(_runtime(p, inputs, name) for name in slots if name not in ("a", "b", "azp"))):
        return None
    K, N = at["b_shape"]
    live = [(0, slots["a"], a.dtype, a.shape, None)]
    azp, yzp = c.get("azp"), c.get("yzp")
    if _runtime(p, inputs, "azp"):
        azp = inputs[slots["azp"]]
        if not isinstance(azp, np.ndarray) or azp.dtype != a.dtype:
            return None
        live.append((1, slots["azp"], azp.dtype, azp.shape, None))  # int8_matmul widens it to int32
    if (azp is not None and azp.size != 1) or (yzp is not None and yzp.size != 1) or a.shape[-1] != K:
        return None
    z = np.asarray(0 if azp is None else azp, np.int32).reshape(1)
    requant = (None, 0, False)
    if at["op"] == "QLinearMatMul":
        requant = (np.asarray(c["mult"], np.float32).reshape(-1), 0 if yzp is None else int(yzp.reshape(-1)[0]),
                   at["out"] == "int8")
    m = a.size // K if K else int(np.prod(a.shape[:-1]))
    shape = [*a.shape[:-1], N]
    where = p.runtime.partition_outputs
    into = [(13, where[0], shape)] if where and 0 in where else []
    args = (None, z, c["i8_bp"], c["i8_bsum"], c["i8_bzp"], K, N, runtime.threads(p), *requant, None, False, None)
    live[0] = (0, slots["a"], a.dtype, a.shape, (m, K))
    return runtime.call_step(p, nat.int8_matmul, args, live, [(-1, shape)], None, into)


def _bind_float(p: Prepared, inputs, outs, nat, a) -> Any:
    """MatMulIntegerToFloat as one ``int8_matmul_float`` step, as ``_native_float`` calls it: A viewed [M, K], a
    runtime a_zero_point and a_scale (DynamicQuantizeLinear's) put in per call, into ORT's buffer when the result is
    a partition output."""
    args = _float_args(p, inputs)
    K = p.attrs["b_shape"][0]
    if (args is None or not isinstance(a, np.ndarray) or not a.ndim or not a.flags.c_contiguous
            or a.dtype not in (np.uint8, np.int8) or a.shape[-1] != K):
        return None
    slots = p.attrs["slots"]
    m = a.size // K if K else int(np.prod(a.shape[:-1]))
    live = [(0, slots["a"], a.dtype, a.shape, (m, K))]
    for name, at_arg in (("azp", 1), ("ascale", 7)):
        if _runtime(p, inputs, name):
            v = inputs[slots[name]]
            if not isinstance(v, np.ndarray):
                return None
            live.append((at_arg, slots[name], v.dtype, v.shape, None))
    shape = list(outs[0].shape)
    where = p.runtime.partition_outputs
    into = [(13, where[0], shape)] if where and 0 in where else []
    call = (None, args[0], p.consts["i8_bp"], p.consts["i8_bsum"], p.consts["i8_bzp"], *args[1:], None)
    return runtime.call_step(p, nat.int8_matmul_float, call, live, [(-1, shape)], None, into)


def _runtime(p: Prepared, inputs, name: str) -> bool:
    """Whether input ``name`` (a slot) comes at run time rather than from the prepared constants."""
    i = p.attrs["slots"].get(name)
    return i is not None and name not in p.consts and i < len(inputs) and inputs[i] is not None


def cost_int(p: Prepared, shapes) -> OpCost:
    s = p.attrs["slots"]
    a = shapes[s["a"]] if shapes[s["a"]] is not None else p.consts["a"].shape
    b = shapes[s["b"]] if s["b"] < len(shapes) and shapes[s["b"]] is not None else (
        p.attrs.get("b_shape") or p.consts["b"].shape)
    return planned_cost(p, *matmul_dims(tuple(a), tuple(b)))


# Like MatMul, an A of unknown rank is fine: its leading dims are rows or a batch at run time (ddddocr: after a
# Reshape).
register(KernelDef("", "MatMulInteger", prepare_int, run_int, cost_int, check_int, rank_free=True, bind=bind_int))
register(KernelDef("", "QLinearMatMul", prepare_int, run_int, cost_int, check_int, bind=bind_int))
register(KernelDef("com.microsoft", "MatMulIntegerToFloat", prepare_int, run_int, cost_int, check_int, bind=bind_int))
