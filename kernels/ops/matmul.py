"""Float MatMul / Gemm on the matrix unit.

Numerics: the target's ``matrix.float_compute`` picks the mode per input dtype. float32 mode (npu-ref) multiplies
fp32 x fp32 with an fp32 accumulator, so fp32 models keep the CPU EP's numerics (LLM tokens identical);
float16 mode takes fp16 operands with an fp32 accumulator and rounds the result to fp16 once. Both run on BLAS
(sgemm) over whole tiles at once: the accumulation order inside a float32 tile is not observable beyond ulps.
The native kernels on an AVX-512 host run every float32 product with a constant B on a GEMM of their own
instead, with B packed into panels once, on first use (``kernels/native/packed_sgemm.h``), and a product of two
runtime operands of at least ``BATCHED_MIN_ROWS`` rows (attention's Q @ K^T and scores @ V in a prefill) on the
same GEMM, B packed on each call: its summation order is not numpy's BLAS's, so there the product matches the
reference within float tolerance.

Compile time: a constant B is stored ready for the unit — Gemm's transB applied, alpha folded in (unless that would
overflow a weight), fp16 widened to fp32 (exact); Gemm's ``beta * C`` becomes the epilogue bias (with ``beta = 0``
C is ignored, NaN/Inf included, as ORT does). Layouts: A ``[..., M, K]``, B ``[..., K, N]``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import host_blas
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from .. import runtime
from ._matrix import (apply_float_epilogue, check_fits, matmul_dims, matmul_operand_dims, planned_cost,
                  run_native_counted, static_plan)
from ._util import arg


def _dt(node: NodeInfo, i: int) -> str:
    v = node.input(i)
    return v.dtype.name if v is not None and v.dtype is not None else "float32"


def check_float(node: NodeInfo, target: Target) -> str | None:
    dt = _dt(node, 0)
    if target.float_mode(dt) is None:
        return (f"{node.describe()}: target {target.name} has no float matrix mode for {dt} "
                f"(matrix.float_compute lists: {', '.join(target.matrix.get('float_compute', {})) or 'none'})")
    dims = matmul_operand_dims(node, 0, 1, gemm=node.op_type == "Gemm")
    if dims is None or isinstance(dims, str):
        return dims
    m, n, k = dims
    return check_fits(m, n, k, dt, dt, target)


def prepare_float(node: NodeInfo, target: Target, epilogue: dict[str, Any] | None = None,
                  ep_consts: dict[str, np.ndarray] | None = None) -> Prepared:
    """Shared by MatMul, Gemm and the fused MatMulEpilogue (``epilogue``: bias/relu/quantize, consts ep_*)."""
    dt = _dt(node, 0)
    attrs: dict[str, Any] = {"op": node.op_type, "dtype": dt, "mode": target.float_mode(dt), "plan_a": dt,
                             "plan_b": dt, "plan_out": dt, "trans_a": 0, "b_const": False}
    consts: dict[str, np.ndarray] = dict(ep_consts or {})
    ep = dict(epilogue or {})
    alpha, beta = 1.0, 1.0
    if node.op_type == "Gemm":
        alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
        attrs["trans_a"] = int(node.attr("transA", 0))
    a = node.input(0)
    if a.value is not None:
        consts["a"] = np.ascontiguousarray(a.value)
    b = node.input(1)
    if b.value is not None:
        w = np.asarray(b.value, np.float32)
        if node.op_type == "Gemm" and node.attr("transB", 0):
            w = w.T
        with np.errstate(over="ignore"):  # an overflow is what the check below looks for
            scaled = w * np.float32(alpha) if alpha != 1.0 else w
        folded = alpha == 1.0 or np.isfinite(scaled).sum() == np.isfinite(w).sum()
        # alpha stays a runtime multiply where folding it would overflow a weight (0 * inf would make a nan that
        # alpha * (A @ B) does not have)
        consts["b"] = np.ascontiguousarray(scaled if folded else w)
        attrs["b_const"] = True
    else:
        attrs["trans_b"] = int(node.attr("transB", 0)) if node.op_type == "Gemm" else 0
        folded = False
    attrs["alpha"] = 1.0 if folded else alpha
    # beta == 0: C is not read at all, as in ORT (0 * inf or 0 * nan in C must not reach the result)
    c = node.input(2) if node.op_type == "Gemm" and beta != 0.0 else None
    if c is not None:
        if c.value is None:
            attrs["runtime_c"], attrs["beta"] = True, beta
        else:
            bias = np.asarray(c.value, np.float32) * np.float32(beta)
            if "ep_bias" in consts:
                bias = bias + consts["ep_bias"]
            consts["ep_bias"], ep["bias"] = bias, True
    attrs["epilogue"] = ep
    p = Prepared(attrs, consts, target)
    static_plan(p, _node_dims(node))
    return p


def _node_dims(node: NodeInfo) -> tuple[int, int, int, int] | None:
    a, b = node.input(0).shape, node.input(1).shape
    if a is None or b is None or not all(isinstance(d, int) for d in (*a, *b)):
        return None
    if node.op_type == "Gemm":
        m, k = (a[1], a[0]) if node.attr("transA", 0) else a
        return m, (b[0] if node.attr("transB", 0) else b[1]), k, 1
    return matmul_dims(a, b)


def _dims(p: Prepared, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    if p.attrs["op"] == "Gemm":
        m, k = (a[1], a[0]) if p.attrs["trans_a"] else a
        return m, (b[0] if p.attrs.get("trans_b") else b[1]), k, 1
    return matmul_dims(a, b)


PACKED_B = "packed_b"  # Prepared.kernel_cache key: the constant B in the native GEMM's panels
PACKED_ISAS = runtime.AVX512_ISAS  # the native GEMM's own path: AVX-512F


def _packed_b(p: Prepared, a: np.ndarray) -> np.ndarray | None:
    """The constant B packed for the native GEMM, when it makes this product (``packed_panels``)."""
    return packed_panels(p, a, p.consts.get("b") if p.attrs["b_const"] else None)


def packed_panels(p: Prepared, a: np.ndarray, b: np.ndarray | None) -> np.ndarray | None:
    """A constant float32 ``b`` [K, N] packed for the native GEMM, when it makes ``a @ b``: native kernels on an
    AVX-512 host and a float32 product (at any size: a small one on numpy's matmul cost the step a call back into
    Python); else None. Packed on first use and kept while the session lives: B is then held twice, ORT's
    initializer and the panels, as MLAS's prepacked B is."""
    nat = runtime.native(p)
    if (nat is None or b is None or b.ndim != 2 or b.dtype != np.float32 or a.dtype != np.float32 or a.ndim < 1
            or nat.isa() not in PACKED_ISAS):
        return None
    return pack_once(p, nat, b)


def pack_once(p: Prepared, nat, b: np.ndarray) -> np.ndarray:
    """``b`` in the native GEMM's panels, packed on the first call for ``p`` and kept in its kernel_cache."""
    packed = p.kernel_cache.get(PACKED_B)
    if packed is None:
        packed = p.kernel_cache[PACKED_B] = nat.pack_sgemm_b(b)
    return packed


BATCHED_MIN_ROWS = 8  # below this, packing a runtime B costs more than numpy's product (a decode step's attention)


def _batched_product(p: Prepared, a: np.ndarray, b: np.ndarray) -> Any:
    """``float_matmul_batched`` (the packed GEMM, B packed on the call) with the session's threads for a product of
    two runtime operands, where it makes it: native kernels on an AVX-512 host, float32, one rank >= 2 and the same
    batch dims, at least ``BATCHED_MIN_ROWS`` rows, no DMA counting; else None (numpy's matmul)."""
    nat = runtime.native(p)
    if (nat is None or p.attrs["b_const"] or a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2
            or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-2] < BATCHED_MIN_ROWS
            or runtime.counting_dma(p) or nat.isa() not in PACKED_ISAS):
        return None
    return functools.partial(nat.float_matmul_batched, threads=runtime.threads(p))


def run_float(p: Prepared, inputs) -> list[np.ndarray]:
    at = p.attrs
    a = arg(p, inputs, 0) if "a" not in p.consts else p.consts["a"]
    if at["op"] == "Gemm" and a.ndim != 2:  # claimed with A of unknown rank (KernelDef.spec_ranks)
        raise ValueError(f"Gemm: A has shape {list(a.shape)}; Gemm needs a 2-D A")
    if at["trans_a"]:
        a = a.T
    b = p.consts["b"] if at["b_const"] else arg(p, inputs, 1)
    if not at["b_const"] and at.get("trans_b"):
        b = b.T
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    if b.dtype != np.float32:
        b = b.astype(np.float32)
    packed = _packed_b(p, a)
    if packed is not None:  # counts the plan's DMA when asked (StepRuntime.dma_counts)
        a = np.ascontiguousarray(a)
        m, n, k, _ = matmul_dims(a.shape, b.shape)
        y = run_native_counted(p, runtime.native(p).float_matmul_packed, (a, packed, n),
                               (None, False, None, runtime.threads(p)), m, n, k)
    elif (batched := _batched_product(p, a, b)) is not None:
        y = batched(a, b)
    else:
        y = host_blas.matmul(a, b, runtime.native(p), runtime.threads(p))
    if y.ndim == 0 or not y.flags.writeable:
        y = np.array(y)
    if at["alpha"] != 1.0:
        y *= np.float32(at["alpha"])
    if at.get("runtime_c"):
        y += arg(p, inputs, 2).astype(np.float32) * np.float32(at["beta"])
    y = apply_float_epilogue(y, at["epilogue"], p.consts)
    if at["epilogue"].get("quantize"):
        return [y]
    return [y.astype(at["dtype"], copy=False)]


def bind_float(p: Prepared, inputs, outs) -> Any:
    """A float32 product with a constant 2-D B, or of two runtime operands (attention's scores and context), and
    its fused bias / ReLU / per-tensor 8-bit quantize, as one native step making the product as ``run_float`` does
    (numpy's matmul, or the packed GEMM; ep/step_binding.py). None where ``run_float`` does more: a runtime C,
    alpha, transA, a transposed runtime B, an fp16 runtime B, and without AVX-512 a product host_blas cuts in two."""
    nat = runtime.native(p)
    at, c = p.attrs, p.consts
    a = inputs[0] if inputs else None
    if (nat is None or "a" in c or at["trans_a"] or at["alpha"] != 1.0 or at.get("runtime_c")
            or at["dtype"] not in ("float32", "float16") or not isinstance(a, np.ndarray) or a.dtype != at["dtype"]
            or not a.ndim or (at["op"] == "Gemm" and a.ndim != 2)):
        return None
    if at["dtype"] == "float16":
        return _bind_half(p, nat, a)
    if not at["b_const"]:
        return _bind_runtime_b(p, nat, a, inputs[1] if len(inputs) > 1 else None, outs)
    if c["b"].ndim != 2 or not a.flags.c_contiguous:
        return None
    packed = _packed_b(p, a)
    if (packed is None and host_blas.splits(a, c["b"])) or (packed is not None and runtime.counting_dma(p)):
        return None
    n = c["b"].shape[1]
    tail = _fused_tail(p, n)
    if tail is None:
        return None
    if packed is not None:  # written into ORT's buffer when the product is an output of the partition
        where = p.runtime.partition_outputs
        into = [(9, where[0], [*a.shape[:-1], n])] if where and 0 in where and tail[2] is None else []
        return runtime.call_step(p, nat.float_matmul_packed, (None, packed, n, None, False, *tail, None),
                                 [(0, 0, np.float32, a.shape, None)], [(-1, None)], None, into)
    return runtime.call_step(p, nat.float_matmul, (np.matmul, None, c["b"], *tail),
                             [(1, 0, np.float32, a.shape, None)], [(-1, None)])


def _bind_half(p: Prepared, nat, a: np.ndarray) -> Any:
    """A float16 product with a constant 2-D B on the packed GEMM: ``float_matmul_packed`` widens A exactly, and
    rounds the float32 result (bias and ReLU applied) to float16 once, as ``run_float`` does; written into ORT's
    buffer when the product is a partition output. None for a runtime B, a quantize epilogue or without AVX-512."""
    b = p.consts["b"] if p.attrs["b_const"] else None
    if (b is None or b.ndim != 2 or b.dtype != np.float32 or not a.flags.c_contiguous
            or nat.isa() not in PACKED_ISAS or runtime.counting_dma(p)):
        return None
    n = b.shape[1]
    tail = _fused_tail(p, n)
    if tail is None or tail[2] is not None:
        return None
    where = p.runtime.partition_outputs
    into = [(9, where[0], [*a.shape[:-1], n])] if where and 0 in where else []
    return runtime.call_step(p, nat.float_matmul_packed, (None, pack_once(p, nat, b), n, None, False, *tail, None),
                             [(0, 0, np.float16, a.shape, None)], [(-1, None)], None, into)


def _fused_tail(p: Prepared, n: int) -> tuple | None:
    """The native float product's (bias, relu, quantize, threads) for ``n`` output columns, or None where the
    epilogue is more than they say (a bias not one value per column, a per-channel quantize)."""
    at, c = p.attrs, p.consts
    ep = at["epilogue"]
    bias = c["ep_bias"] if ep.get("bias") else None
    if bias is not None:  # one value per output column (or one for all), else the reference's broadcast
        if bias.size not in (1, n) or any(d != 1 for d in bias.shape[:-1]):
            return None
        bias = np.ascontiguousarray(np.broadcast_to(bias.reshape(-1), (n,)), np.float32)
    quantize = None
    if ep.get("quantize"):
        scale, zp = c["ep_qscale"], c["ep_qzp"]
        if ep["quantize"] not in ("int8", "uint8") or scale.ndim or zp.ndim:
            return None
        quantize = (float(scale), int(zp), ep["quantize"] == "int8")
    return bias, bool(ep.get("relu")), quantize, runtime.threads(p)


def _bind_runtime_b(p: Prepared, nat, a: np.ndarray, b: Any, outs) -> Any:
    """``a @ b`` of two runtime float32 operands in any layout (a transposed K is a view) as the product
    ``run_float`` makes for them (the packed GEMM, or numpy's matmul), with the fused tail; the packed GEMM's
    product without a quantize is written into ORT's buffer when it is an output of the partition."""
    if (not isinstance(b, np.ndarray) or b.dtype != np.float32 or not b.ndim or p.attrs.get("trans_b")
            or outs[0].ndim == 0):
        return None
    tail = _fused_tail(p, b.shape[-1])
    product = _batched_product(p, a, b)
    if tail is None or (product is None and host_blas.splits(a, b)):
        return None
    ins = [(0, 0, np.float32, a.shape, None, True), (1, 1, np.float32, b.shape, None, True)]
    bias, relu, quantize, threads = tail
    if product is not None and quantize is None:
        where = p.runtime.partition_outputs
        into = [(3, where[0], list(outs[0].shape))] if where and 0 in where else []
        return runtime.call_step(p, nat.float_matmul_batched, (None, None, threads, None, bias, relu), ins,
                                 [(-1, None)], None, into)
    return runtime.call_step(p, nat.float_matmul, (product or np.matmul, None, None, *tail),
                             [(i + 1, *rest) for i, *rest in ins], [(-1, None)], None)


def cost_float(p: Prepared, shapes) -> OpCost:
    a = tuple(shapes[0]) if shapes[0] is not None else p.consts["a"].shape
    if p.attrs["b_const"]:
        b = p.consts["b"].shape
        if p.attrs["op"] == "Gemm":  # a constant B is stored as [K, N]
            m, k = (a[1], a[0]) if p.attrs["trans_a"] else a
            return planned_cost(p, m, b[1], k, 1)
        return planned_cost(p, *matmul_dims(a, b))
    return planned_cost(p, *_dims(p, a, tuple(shapes[1])))


register(KernelDef("", "MatMul", prepare_float, run_float, cost_float, check_float, rank_free=True, bind=bind_float))
register(KernelDef("", "Gemm", prepare_float, run_float, cost_float, check_float, bind=bind_float, spec_ranks=(2, 2)))
