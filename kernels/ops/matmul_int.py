"""Integer matmuls on the int8 matrix unit: MatMulInteger, QLinearMatMul, com.microsoft MatMulIntegerToFloat.

NPU numerics: int8/uint8 operands with zero points removed, int32 accumulation (exact: see ``_mm``), then
- MatMulInteger: the int32 accumulator;
- QLinearMatMul: requantized to int8/uint8 (float32 multiplier, round half to even, saturation) - bit-exact vs ORT;
- MatMulIntegerToFloat: ``float32(acc) * (a_scale * b_scale) + bias``.

Compile time: a constant B is stored zero-point-free as float32 ``[..., K, N]`` (the tile layout BLAS reads) with
its exact magnitude bound; constant scales are folded into one per-column multiplier.
Input order: MatMulInteger (A, B, a_zp, b_zp); QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp);
MatMulIntegerToFloat (A, B, a_scale, b_scale, a_zp, b_zp, bias).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._mm import (check_fits, exact_int_matmul, int_bound, matmul_dims, matmul_operand_dims, planned_cost,
                  quantize_float, requantize, static_plan)

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


def _col(x: np.ndarray | None, dtype=np.float32) -> np.ndarray | None:
    """Per-tensor scalars stay scalars; per-column 1-D vectors broadcast over the last (N) axis."""
    return None if x is None else np.asarray(x, dtype)


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
    if "b" in consts:
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
    if "b_c" in p.consts:
        b_c, bound_b = p.consts["b_c"], at["bound_b"]
    else:
        b_c = _get(p, inputs, "b").astype(np.float32)
        if bzp is not None:
            b_c -= np.asarray(bzp, np.float32)
        bound_b = int_bound(at["dtb"], bzp)
    bound_a = int_bound(at["dta"], azp)
    tk = int(p.target.tile[2]) if p.target is not None else 64
    return exact_int_matmul(a_c, b_c, bound_a, bound_b, tk)


def run_int(p: Prepared, inputs) -> list[np.ndarray]:
    at = p.attrs
    acc = int_accumulate(p, inputs)
    op = at["op"]
    if op == "MatMulInteger":
        y = acc.astype(np.int32, copy=False)
        ep = at["epilogue"]
        if ep:  # fused epilogue on the int32 result: dequant-free int path only supports relu
            if ep.get("relu"):
                np.maximum(y, 0, out=y)
        return [y]
    mult = p.consts.get("mult")
    if mult is None:
        mult = np.asarray(_get(p, inputs, "ascale"), np.float32) * np.asarray(_get(p, inputs, "bscale"), np.float32)
        if op == "QLinearMatMul":
            mult = mult / np.asarray(_get(p, inputs, "yscale"), np.float32)
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


def cost_int(p: Prepared, shapes) -> OpCost:
    s = p.attrs["slots"]
    a = shapes[s["a"]] if shapes[s["a"]] is not None else p.consts["a"].shape
    b = shapes[s["b"]] if s["b"] < len(shapes) and shapes[s["b"]] is not None else p.consts["b"].shape
    return planned_cost(p, *matmul_dims(tuple(a), tuple(b)))


register(KernelDef("", "MatMulInteger", prepare_int, run_int, cost_int, check_int))
register(KernelDef("", "QLinearMatMul", prepare_int, run_int, cost_int, check_int))
register(KernelDef("com.microsoft", "MatMulIntegerToFloat", prepare_int, run_int, cost_int, check_int))
