"""com.microsoft QGemm on the int8 matrix unit: Y = alpha * (A - a_zp) @ (B - b_zp) * a_scale * b_scale (+ C).

Layout: A [M, K] (transA: [K, M]) int8/uint8 with a per-tensor scale and zero point; B [K, N] (transB: [N, K])
int8/uint8 with per-tensor or per-column (N) scales and zero points; C optional int32 bias broadcast to [M, N]
(added to the accumulator, as ORT); y_scale/y_zero_point optional: present -> int8/uint8 output, absent -> float32.

Numerics as ORT 1.31's CPU kernel (quant_gemm.cc): the int32 accumulator is exact (``_matrix.exact_int_matmul``); the
output scale per column is ``float32(float32(alpha * a_scale) * b_scale[n])`` (divided by y_scale when quantized);
a float output is ``float32(acc) * scale``, a quantized one is MLAS requantization (``_matrix.requantize``). Bit-exact
against ORT on hosts where MLAS's integer GEMM is exact (AVX-VNNI/AVX512-VNNI, or u8u8); AVX2 hosts without VNNI
saturate u8s8 pair sums in int16 inside MLAS.

On the native kernels a QGemm with a quantized output, a constant B, per-tensor/per-column constant parameters, no
transA and no C runs ``int8_matmul`` (kernels/native/int8_gemm.cc: the exact int32 product with MLAS's
requantization fused), B packed once at prepare (``matmul_int.pack_b``), bound as the step for A's shape, into ORT's
buffer; a float output or a C bias stays on the reference (its epilogue is not in the int8 unit's kernel).

Cost: the planned matmul (``_matrix.planned_cost``) with the requantize epilogue when the output is quantized.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._matrix import check_fits, exact_int_matmul, int_bound, matmul_operand_dims, planned_cost, requantize, static_plan
from ._util import arg, stash_constants
from .. import runtime
from .matmul_int import pack_b


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    quantized = node.input(8) is not None
    dta, dtb = node.input(0).dtype.name, node.input(3).dtype.name
    attrs: dict[str, Any] = {"alpha": float(node.attr("alpha", 1.0)), "trans_a": int(node.attr("transA", 0)),
                             "trans_b": int(node.attr("transB", 0)), "plan_a": dta, "plan_b": dtb,
                             "out": node.input(8).dtype.name if quantized else "float32",
                             "plan_out": "int8" if quantized else "float32",
                             "epilogue": {"bias": node.input(6) is not None,
                                          "quantize": node.input(8).dtype.name if quantized else None}}
    p = Prepared(attrs, stash_constants(node), target)
    _pack_native(node, p)
    dims = matmul_operand_dims(node, 0, 3, gemm=True)
    static_plan(p, None if dims is None or isinstance(dims, str) else (*dims, 1))
    return p


def _pack_native(node: NodeInfo, p: Prepared) -> None:
    """B packed for ``int8_matmul`` and the per-column multiplier, when the native path takes this node (module
    docstring); the raw B stays for the reference."""
    consts = lambda *ix: all(node.input(i) is not None and node.input(i).value is not None for i in ix)
    if not consts(1, 2, 3, 4, 5, 7, 8) or node.input(6) is not None or p.attrs["trans_a"]:
        return
    b = np.asarray(node.input(3).value)
    b = b.T if p.attrs["trans_b"] else b
    packed = pack_b(np.ascontiguousarray(b), np.asarray(node.input(5).value).reshape(-1))
    if packed is None:
        return
    scale = np.float32(p.attrs["alpha"]) * np.float32(scalar_of(node.input(1).value))
    scale = (scale * np.asarray(node.input(4).value, np.float32).reshape(-1)).astype(np.float32)
    mult = (scale / np.float32(scalar_of(node.input(7).value))).astype(np.float32)
    p.consts.update(packed)
    p.consts["i8_mult"] = np.ascontiguousarray(mult)
    p.consts["i8_azp"] = np.asarray(node.input(2).value, np.int32).reshape(1)
    p.attrs["native"] = {"K": int(b.shape[0]), "N": int(b.shape[1]), "y_zp": int(scalar_of(node.input(8).value)),
                         "y_signed": p.attrs["out"] == "int8"}


def _native_args(p: Prepared, a) -> tuple | None:
    """(int8_matmul, its arguments after A) when the native path takes this A, else None."""
    nat, spec = runtime.native(p), p.attrs.get("native")
    if nat is None or spec is None or not isinstance(a, np.ndarray) or a.ndim != 2 or a.shape[1] != spec["K"] \
            or a.dtype.name != p.attrs["plan_a"]:
        return None
    c = p.consts
    return nat.int8_matmul, (c["i8_azp"], c["i8_bp"], c["i8_bsum"], c["i8_bzp"], spec["K"], spec["N"],
                             runtime.threads(p), c["i8_mult"], spec["y_zp"], spec["y_signed"])


def _bind(p: Prepared, inputs, outs):
    """The native QGemm as one ``int8_matmul`` call for A's shape, into ORT's buffer when Y is a partition output."""
    a = arg(p, inputs, 0)
    fast = _native_args(p, a)
    if fast is None or not inputs or inputs[0] is None or any(v is not None for v in inputs[1:]):
        return None
    fn, args = fast
    where = p.runtime.partition_outputs
    into = [(13, where[0], list(outs[0].shape))] if where and 0 in where else []
    return runtime.call_step(p, fn, (None, *args, None, False, None), [(0, 0, a.dtype, a.shape, None)],
                             [(-1, None)], None, into)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    a, b = node.input(0), node.input(3)
    if a is None or b is None or a.dtype not in (np.int8, np.uint8) or b.dtype not in (np.int8, np.uint8):
        return f"{op}: QGemm needs int8/uint8 A and B"
    if (node.input(7) is None) != (node.input(8) is None):
        return f"{op}: y_scale and y_zero_point must be given together (float output otherwise)"
    for i in (1, 2, 7, 8):
        v = node.input(i)
        if v is not None and v.shape is not None and any(d != 1 for d in v.shape):
            return f"{op}: {v.describe()} must be a scalar (per-tensor)"
    dims = matmul_operand_dims(node, 0, 3, gemm=True)
    if dims is None or isinstance(dims, str):
        return dims
    return check_fits(*dims, a.dtype.name, b.dtype.name, target)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    at = p.attrs
    a, b = arg(p, inputs, 0), arg(p, inputs, 3)
    fast = _native_args(p, a)
    if fast is not None and a.flags.c_contiguous:
        fn, args = fast
        return [fn(a, *args)]
    a = a.T if at["trans_a"] else a
    b = b.T if at["trans_b"] else b
    za, zb = arg(p, inputs, 2), arg(p, inputs, 5)
    za = np.asarray(0 if za is None else za).reshape(-1)[:1]
    zb = np.asarray(0 if zb is None else zb).reshape(-1)
    a_c = (a.astype(np.int32) - za.astype(np.int32)).astype(np.float32)
    b_c = (b.astype(np.int32) - zb.astype(np.int32)).astype(np.float32)
    acc = exact_int_matmul(a_c, b_c, int_bound(at["plan_a"], za), int_bound(at["plan_b"], zb), p.target.tile[2])
    acc = np.asarray(acc).astype(np.int32)
    c = arg(p, inputs, 6)
    if c is not None:
        acc = acc + c.astype(np.int32)
    scale = np.float32(at["alpha"]) * np.float32(scalar_of(arg(p, inputs, 1)))
    scale = (scale * np.asarray(arg(p, inputs, 4), np.float32).reshape(-1)).astype(np.float32)
    if at["out"] == "float32":
        return [acc.astype(np.float32) * scale]
    scale = (scale / np.float32(scalar_of(arg(p, inputs, 7)))).astype(np.float32)
    return [requantize(acc, scale, np.float32(scalar_of(arg(p, inputs, 8))), at["out"])]


def scalar_of(v: np.ndarray) -> np.generic:
    return np.asarray(v).reshape(-1)[0]


def _cost(p: Prepared, shapes) -> OpCost:
    a, b = shapes[0], shapes[3]
    m, k = (a[1], a[0]) if p.attrs["trans_a"] else (a[0], a[1])
    n = b[0] if p.attrs["trans_b"] else b[1]
    return planned_cost(p, m, n, k, 1)


register(KernelDef("com.microsoft", "QGemm", _prepare, _run, _cost, _check, bind=_bind))
