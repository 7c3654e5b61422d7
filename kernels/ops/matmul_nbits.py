"""com.microsoft MatMulNBits (bits=4) on the int4-weight matrix mode.

Weights stay packed, as an NPU holds them in DRAM: the compiled program (and so a context binary) keeps B
``[N, kb * bs / 2]`` uint8, the scales as float32 ``[N, kb]`` and the packed zero points ``[N, ceil(kb / 2)]``
(absent: 8) exactly in ORT's layout (``npu_ep.quantization.matmul_nbits``), and at accuracy_level 4 the same
bytes re-laid out as the int8 unit's tiles (``int8_tiles``); a bias and a fused epilogue bias are folded into one
vector. The native kernel (``kernels/native/matmul_nbits.cc``) dequantizes per chunk in
registers. The reference model (provider option ``kernels=reference``) dequantizes the whole weight once per
process into a float32 memo and multiplies with BLAS.

Numerics (match ORT CPU within tolerance; tests state it):
- accuracy_level 0..3: ``A @ W`` in float32 with ``W = (code - zp) * scale`` rounded once (ORT's CompFp32 path
  dequantizes blocks and runs an fp32 GEMM).
- accuracy_level 4: A is quantized per block of ``block_size`` along K to int8 like ORT's CompInt8 path
  (``scale = max|a| / 127``, codes ``rint(a * (127 / max|a|))``; NaN and Inf exactly as MLAS's AVX-512 quantizer
  treats them, ``quantize_a_codes``; an output meeting a non-finite block scale is NaN), so
  ``y = sum_b sa[m,b] * sw[n,b] * sum_j qa * (q - zp)``. The native kernel sums the integer products exactly; the
  reference evaluates ``dequant(quant(A)) @ W`` with float32 BLAS, equal in real arithmetic (differences: float
  summation order only).
fp16 A: computed in float32 and rounded to fp16 once (the bound native step: ``BoundNBits.half``, the same bits).

g_idx (input 4, act-order): where it gives each group block_size rows (GPTQ's act-order) the node is the plain one
after a permutation of K: the compiler permutes B's rows into blocks, the kernel multiplies A's columns in that
order (``_act_order``), at level 0 whatever accuracy_level says, as ORT's CPU kernel runs a node with g_idx. Other
g_idx, and zero points other than 8 (ORT's CPU kernel drops them with g_idx), are declined (``_g_idx_declined``).
The fusion passes leave such a node alone (their kernels read the weights without the permutation).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import host_blas
from ...quantization.matmul_nbits import (TILE_COLS, MatMulNBitsWeights, dequantize_b, from_int8_tiles,
                                          int8_tiles, pack_b, unpack_b, unpack_zero_points)
from ..own_pages import copy_to_pages, on_own_pages, page_array
from .. import runtime
from ..node import NodeInfo
from ..registry import RECIPES, DerivedConsts, KernelDef, OpCost, Prepared, register
from ..target import Target
from ._matrix import (apply_float_epilogue, check_fits, matmul_dims, planned_cost, run_native_counted,
                  static_plan)
from ._util import arg
from .movement import ort_buffer


def check_nbits(node: NodeInfo, target: Target) -> str | None:
    bits, bs = int(node.attr("bits", 4)), int(node.attr("block_size", 0))
    if bits != 4:
        return f"{node.describe()}: bits={bits}; the matrix unit's int4 mode takes 4-bit weights only"
    if bs < 16 or bs > 256 or bs & (bs - 1):
        return f"{node.describe()}: block_size={bs}; supported: powers of two 16..256"
    for i, what in ((1, "B"), (2, "scales"), (3, "zero_points")):
        v = node.input(i)
        if v is not None and not v.is_constant:
            return f"{node.describe()}: {what} must be a constant initializer (weights are re-laid out at compile time)"
    zp = node.input(3)
    if zp is not None and zp.dtype is not None and zp.dtype.kind == "f":
        return f"{node.describe()}: float zero points are not supported by the int4 weight mode"
    why = _g_idx_declined(node, int(node.attr("K")), bs)
    if why is not None:
        return why
    a = node.input(0)
    m = a.shape[-2] if a.shape is not None and len(a.shape) > 1 else 1
    return check_fits(m, int(node.attr("N")), int(node.attr("K")), a.dtype.name if a.dtype is not None else "float32",
                      "int4", target, block_size=bs)


def _g_idx_declined(node: NodeInfo, K: int, bs: int) -> str | None:
    """Why input 4, g_idx (act-order: row k's scale and zero point are those of group g_idx[k]), is declined, or
    None. Accepted: a g_idx that puts block_size rows in each group (the last one: what is left of K), GPTQ's
    act-order, which is the plain blocks after a permutation of K (``_act_order``). Declined: other group sizes (no
    permutation makes them blocks), and zero points other than 8: ORT's CPU kernel (1.31) drops the zero points
    once g_idx is given (it computes (code - 8) * scale), against the op's own definition, so there is no single
    answer to match (with every zero point 8 the two agree)."""
    g = node.input(4)
    if g is None:
        return None
    if not g.is_constant or g.value is None:
        return f"{node.describe()}: g_idx {g.describe()} must be a constant initializer"
    idx = np.asarray(g.value).reshape(-1)
    if idx.size != K or not np.array_equal(np.sort(idx), np.arange(K) // bs):
        return (f"{node.describe()}: g_idx must give each group {bs} rows (the last one the rest of K): the int4 "
                f"weight mode reads blocks of consecutive rows")
    zp = node.input(3)
    if zp is not None and (zp.value is None or not _all_eight(zp.value, int(node.attr("N")), -(-K // bs))):
        return (f"{node.describe()}: g_idx with zero points other than 8: ORT's CPU kernel ignores the zero points "
                f"when g_idx is given, against the op's definition; left to the CPU EP")
    return None


def _all_eight(zero_points: np.ndarray, N: int, kb: int) -> bool:
    return bool((unpack_zero_points(np.asarray(zero_points, np.uint8), N, kb) == 8).all())


def _act_order(w: MatMulNBitsWeights, g_idx: np.ndarray) -> tuple[MatMulNBitsWeights, np.ndarray]:
    """A node with an accepted g_idx as the plain node it is after a permutation of K: ``perm`` (stable sort of
    g_idx) puts each group's rows together, so row i of the returned weights is row perm[i] of the node's, in block
    i // block_size = g_idx[perm[i]] (its scales and zero points unchanged); the kernel multiplies A[..., perm]."""
    K, N, bs = w.K, w.N, w.block_size
    kb = -(-K // bs)
    perm = np.argsort(np.asarray(g_idx).reshape(-1), kind="stable")
    codes = unpack_b(np.asarray(w.B, np.uint8).reshape(N, kb, bs // 2), kb * bs)
    moved = np.zeros_like(codes)
    moved[:, :K] = codes[:, perm]
    return (MatMulNBitsWeights(B=pack_b(moved.reshape(N, kb, bs)), scales=w.scales, zero_points=w.zero_points, K=K,
                               N=N, block_size=bs), perm.astype(np.int64))


def prepare_nbits(node: NodeInfo, target: Target, epilogue: dict[str, Any] | None = None,
                  ep_consts: dict[str, np.ndarray] | None = None) -> Prepared:
    K, N, bs = int(node.attr("K")), int(node.attr("N")), int(node.attr("block_size"))
    zp = node.input(3)
    w = MatMulNBitsWeights(B=node.input(1).value, scales=node.input(2).value,
                           zero_points=None if zp is None else zp.value, K=K, N=N, block_size=bs)
    consts: dict[str, np.ndarray] = dict(ep_consts or {})
    level = int(node.attr("accuracy_level", 0))
    if node.input(4) is not None:  # act-order (accepted by check_nbits)
        w, consts[PERM] = _act_order(w, node.input(4).value)
        level = 0  # ORT's CPU kernel runs a node with g_idx on float32 dequantized weights whatever the level
    consts.update(packed_consts(w, level))
    ep = dict(epilogue or {})
    bias = node.input(5)
    if bias is not None and bias.value is not None:
        b = np.asarray(bias.value, np.float32)
        consts["ep_bias"] = b + consts["ep_bias"] if "ep_bias" in consts else b
        ep["bias"] = True
    dt = node.input(0).dtype.name if node.input(0).dtype is not None else "float32"
    attrs = {"op": "MatMulNBits", "K": K, "N": N, "block_size": bs, "accuracy_level": level, "dtype": dt,
             "plan_a": dt, "plan_b": "int4", "plan_out": dt, "epilogue": ep,
             "runtime_bias": bias is not None and bias.value is None}
    p = Prepared(attrs, consts, target)
    sources = {"B": w.B, "scales": w.scales, "zero_points": w.zero_points}
    if level == 4 and runtime.borrowed_from_ort(w.B):  # (scales and zero points below 64 KiB are copies)
        roles = {"b": "nb_b", "scales": "nb_scales", **({} if w.zero_points is None else {"zp": "nb_zp"})}
        p.derived = [DerivedConsts(_TILES, roles, sources, {"K": K, "N": N, "block_size": bs})]
    a = node.input(0).shape
    if a is not None and all(isinstance(d, int) for d in a):
        static_plan(p, matmul_dims(a, (K, N)))
    return p


_TILES = "int8_tiles"


def _tiles_recipe(sources: dict[str, np.ndarray | None], params: dict[str, int]) -> dict[str, np.ndarray]:
    """Level 4's tiles again from the node's initializers (a cache entry's ``DerivedConsts``)."""
    K, N, bs = (int(params[k]) for k in ("K", "N", "block_size"))
    kb = -(-K // bs) if K > 0 and 16 <= bs <= 256 and not bs & (bs - 1) else 0
    b, scales, zp = sources["B"], sources["scales"], sources.get("zero_points")
    if N <= 0 or kb == 0 or b is None or scales is None or b.size != N * kb * bs // 2 or scales.size != N * kb or (
            zp is not None and zp.size != N * ((kb + 1) // 2)):
        raise ValueError(f"int8_tiles: initializers do not fit K={K}, N={N}, block_size={bs}")
    tiles, scales, zp = level_layout(MatMulNBitsWeights(B=b, scales=scales, zero_points=zp, K=K, N=N, block_size=bs), 4)
    return {"b": tiles, "scales": scales, **({} if zp is None else {"zp": zp})}


RECIPES[_TILES] = _tiles_recipe


def _max_x86(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x86's MAXPS, lane by lane: ``a > b ? a : b``, so a NaN in either operand gives ``b``."""
    return np.where(a > b, a, b)


def mlas_block_max(blocks: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """``max|a|`` per block ``[..., kb, bs]`` as MLAS's AVX-512 ``QuantizeARow_CompInt8`` finds it (ORT's CompInt8 on
    x86), NaN rule included: 16 lanes, each the running MAXPS of its chunk's ``|a|`` over the chunks that start
    before ``valid`` (the block's real elements; the last chunk's lanes past it read 0), then reduced 16 -> 8 -> 4
    -> 2 -> 1 with MAXPS (upper half first). A NaN is so kept or dropped depending on where it sits: in a lane
    that reads another chunk after it, or on the first operand's side of a reduction step, it is dropped (and
    that lane's earlier values with it)."""
    *lead, kb, bs = blocks.shape
    chunks = -(-bs // 16)
    lanes = np.abs(np.pad(blocks, [(0, 0)] * len(lead) + [(0, 0), (0, chunks * 16 - bs)]))
    lanes = lanes.reshape(*lead, kb, chunks, 16)
    m = np.zeros((*lead, kb, 16), np.float32)
    for c in range(chunks):
        m = np.where((c * 16 < valid)[:, None], _max_x86(m, lanes[..., c, :]), m)
    m = _max_x86(m[..., 8:], m[..., :8])
    m = _max_x86(m[..., 4:], m[..., :4])
    return _max_x86(_max_x86(m[..., 0], m[..., 2]), _max_x86(m[..., 1], m[..., 3]))


def quantize_a_codes(a: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``[..., K]`` quantized to int8 per block along K as ORT's CompInt8 path on x86 (MLAS's AVX-512
    ``QuantizeARow_CompInt8``): ``amax`` by ``mlas_block_max``, ``scale = amax / 127``, codes
    ``rint(a * (127 / amax))`` (half to even; ``127 / amax`` is 0 for amax 0 or Inf) converted to int32 (NaN and
    out-of-range: INT_MIN) and truncated to their low byte. So a NaN element is code 0, an infinite amax makes
    every code 0 with an infinite scale, a NaN amax every code 0 with a NaN scale. Returns (codes ``[..., kb,
    block_size]`` int8, zero past K; scales ``[..., kb]`` float32)."""
    K = a.shape[-1]
    kb = -(-K // block_size)
    pad = kb * block_size - K
    ap = np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)]) if pad else a
    blocks = ap.reshape(*a.shape[:-1], kb, block_size).astype(np.float32, copy=False)
    valid = np.minimum(block_size, K - np.arange(kb) * block_size)
    amax = mlas_block_max(blocks, valid)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        inv = np.where(np.isinf(amax), np.float32(0.0), inv)
        r = np.rint(blocks * inv[..., None])
        in_range = (r >= -2.0 ** 31) & (r < 2.0 ** 31)  # NaN is not
        wide = np.where(in_range, r, 0).astype(np.int64)
    codes = np.where(in_range, wide & 0xFF, 0).astype(np.uint8).view(np.int8)
    codes[..., (np.arange(block_size)[None, :] >= valid[:, None])] = 0
    return codes, (amax / np.float32(127.0)).astype(np.float32)


def quantize_a_blockwise(a: np.ndarray, block_size: int) -> np.ndarray:
    """A ``[..., K]`` fake-quantized as ORT's CompInt8 path (``quantize_a_codes``): ``codes * scale`` float32.
    An all-zero block has scale 0 and codes 0."""
    codes, scales = quantize_a_codes(a, block_size)
    with np.errstate(invalid="ignore"):
        q = codes.astype(np.float32) * scales[..., None]
    return q.reshape(*a.shape[:-1], -1)[..., :a.shape[-1]]


def level_layout(w: MatMulNBitsWeights, level: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """B, scales and zero points (None: symmetric) of ``w`` as the native kernel takes them at ``level``: ORT's
    layout, or at accuracy_level 4 the int8 unit's tiles (``quantization.matmul_nbits.int8_tiles``)."""
    if level == 4:
        nat = runtime.native_module()

        def tile_b(b: np.ndarray, n: int, row_bytes: int) -> np.ndarray:
            out = page_array((-(-n // TILE_COLS), row_bytes // 2, 64), np.uint8)
            nat.tile_int4(b, n, row_bytes, out, _compile_threads())
            return out

        tiles, scales, zp = int8_tiles(w, None if nat is None else tile_b)
        return (tiles if on_own_pages(tiles) else copy_to_pages(tiles), copy_to_pages(scales),
                None if zp is None else copy_to_pages(zp))
    kb = -(-w.K // w.block_size)
    return (np.ascontiguousarray(np.asarray(w.B, np.uint8).reshape(w.N, kb * w.block_size // 2)),
            np.ascontiguousarray(np.asarray(w.scales, np.float32).reshape(w.N, kb)),
            None if w.zero_points is None else np.ascontiguousarray(
                np.asarray(w.zero_points, np.uint8).reshape(w.N, (kb + 1) // 2)))


def _compile_threads() -> int:
    """Compile time: every core this process may run on (not the host's count, in a container)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def packed_consts(w: MatMulNBitsWeights, level: int) -> dict[str, np.ndarray]:
    """The packed weight constants of one MatMulNBits node in its level's layout (names shared with fused
    kernels)."""
    b, scales, zp = level_layout(w, level)
    return {"nb_b": b, "nb_scales": scales, **({} if zp is None else {"nb_zp": zp})}


PERM = "nb_perm"  # const of an act-order node: A's column order (_act_order)
NBITS_MEMBERS = "nb_members"  # attr of an npu::MatMulGroup over MatMulNBits: its packed weights are per member


def packed_weights(p: Prepared) -> tuple:
    """B, scales and zero points (None: symmetric) of ``p`` in ORT's layout: one array each, or for a MatMulGroup
    lists of its members' arrays (``m{i}/...``), which the native kernel reads side by side as column segments."""
    c = p.consts
    n = p.attrs.get(NBITS_MEMBERS)
    if n is None:
        return c["nb_b"], c["nb_scales"], c.get("nb_zp")
    return ([c[f"m{i}/nb_b"] for i in range(n)], [c[f"m{i}/nb_scales"] for i in range(n)],
            [c[f"m{i}/nb_zp"] for i in range(n)] if "m0/nb_zp" in c else None)


def ort_weights(p: Prepared) -> list[MatMulNBitsWeights]:
    """The packed weights of ``p`` (one per MatMulGroup member) in ORT's layout, whatever the level's."""
    at = p.attrs
    K, bs, kb = at["K"], at["block_size"], -(-at["K"] // at["block_size"])
    bl, sl, zl = packed_weights(p)
    bl, sl, zl = ([bl], [sl], [zl]) if not isinstance(bl, list) else (bl, sl, zl or [None] * len(bl))
    if at["accuracy_level"] == 4:
        return [from_int8_tiles(b, sc, z, K, sc.size // kb, bs) for b, sc, z in zip(bl, sl, zl)]
    return [MatMulNBitsWeights(B=b.reshape(-1, kb, bs // 2), scales=sc, zero_points=z, K=K, N=b.shape[0],
                               block_size=bs) for b, sc, z in zip(bl, sl, zl)]


def nbits_matmul(p: Prepared, a: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``A[..., K] @ W (+ bias)`` as float32 ``[..., N]`` from the packed constants of ``p`` (attrs K, N,
    block_size, accuracy_level), on the native kernel or the reference model as the session chose."""
    at, c = p.attrs, p.consts
    K, N, bs, level = at["K"], at["N"], at["block_size"], at["accuracy_level"]
    if PERM in c:  # act-order: the weights' rows were permuted at compile time, A's columns follow
        a = np.take(a, c[PERM], axis=-1)
    nat = runtime.native(p)
    if nat is not None:
        a2 = np.ascontiguousarray(a, np.float32).reshape(-1, K)
        y = run_native_counted(p, nat.matmul_nbits, (a2, *_native_args(p, bias)), _native_tail(p, a2.shape[0]),
                               a2.shape[0], N, K)
        return y.reshape(*a.shape[:-1], N)
    a32 = a if a.dtype == np.float32 else a.astype(np.float32)
    w = p.kernel_cache.get("reference_w")
    if w is None:  # the reference model's float copy, built on first use
        w = p.kernel_cache["reference_w"] = np.concatenate([dequantize_b(m) for m in ort_weights(p)], axis=1)
    y = host_blas.matmul(quantize_a_blockwise(a32, bs) if level == 4 else a32, w)
    if bias is not None:
        y += bias
    if level == 4 and not np.isfinite(y).all():
        y = _non_finite_as_ort(p, a32, y)
    return y


def _non_finite_as_ort(p: Prepared, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Level 4's NaN rule of ORT's CompInt8 kernel (measured on ORT 1.31, AVX-512): an output whose row and column
    meet a block where ``scale_a * scale_w`` is not finite (an infinite or NaN weight scale, an infinite or NaN
    scale of A) is NaN, whatever the signs (the kernel scales partial sums that include zeros). Such an output is
    non-finite here already (Inf or NaN), so only those are looked at; finite outputs keep their value. The native
    kernel applies the same rule (matmul_nbits.cc). Not matched: for a few such outputs ORT gives an infinity instead,
    by its kernel's partial sums (seen at block size 16, and in one row of a 17-row product at 32)."""
    at = p.attrs
    _, sa = quantize_a_codes(a.reshape(-1, at["K"]), at["block_size"])  # [M, kb]
    sw = np.concatenate([np.asarray(m.scales, np.float32).reshape(m.N, -1) for m in ort_weights(p)])  # [N, kb]
    with np.errstate(all="ignore"):
        poisoned = (~np.isfinite(sa[:, None, :] * sw[None])).any(axis=2).reshape(y.shape)
    return np.where(~np.isfinite(y) & poisoned, np.float32(np.nan), y)


def _native_args(p: Prepared, bias: np.ndarray | None) -> tuple:
    """The native kernel's arguments after A and before the plan."""
    at = p.attrs
    return (*packed_weights(p), bias, at["K"], at["N"], at["block_size"], at["accuracy_level"], runtime.threads(p))


def _native_tail(p: Prepared, m: int) -> tuple:
    """The native kernel's arguments after the plan: fp32 levels from M >= 16 on run dequantized column panels
    times A on the BLAS (sgemm 0: the kernel's own loops)."""
    return ((host_blas.sgemm_address() or 0) if p.attrs["accuracy_level"] != 4 and m >= 16 else 0,)


def bind_nbits(p: Prepared, inputs, outs) -> Any:
    """A float32 or float16 node with at most a constant bias as one native call for A's shape
    (ep/step_binding.py)."""
    nat = runtime.native(p)
    a = inputs[0] if inputs else None
    if (nat is None or not _bias_only(p) or runtime.counting_dma(p) or PERM in p.consts or not isinstance(a, np.ndarray)
            or a.dtype != p.attrs["dtype"] or not a.flags.c_contiguous or a.ndim < 1 or a.shape[-1] != p.attrs["K"]):
        return None
    bias = p.consts["ep_bias"] if p.attrs["epilogue"].get("bias") else None
    # float32's product comes as [..., N] already, float16's as [M, N]
    shape = None if a.dtype == np.float32 else outs[0].shape
    return nbits_step(p, a, bias, [(-1, shape)], ort_buffer(p, outs, 2))


def nbits_step(p: Prepared, a: np.ndarray, bias: np.ndarray | None, outputs: list, ort_outputs: list | None = None,
               ) -> Any:
    """``A @ W (+ bias)`` for a float32 C-contiguous A of this shape as one native call step (the weights converted
    once), for a MatMulNBits or a MatMulGroup of them (``packed_weights``); ``outputs`` as ``runtime.call_step``'s,
    over the [..., N] product; ``ort_outputs``: ORT's buffer as the product's ``into`` (float32 only). A float16 A:
    the bound kernel's ``half`` on an [M, K] view (widened, the float32 kernel, rounded once to float16, as
    ``run_nbits``)."""
    k = p.attrs["K"]
    m = a.size // k
    bound = runtime.native(p).BoundNBits(*_native_args(p, bias), *_native_tail(p, m), None)
    if a.dtype == np.float16:
        return runtime.call_step(p, bound.half, (None,), [(0, 0, a.dtype, a.shape, (m, k))], outputs, None)
    # the method itself (no type slot lookup per call), given A as it comes (no view per call)
    return runtime.call_step(p, bound.__call__, (None, None, None), [(0, 0, a.dtype, a.shape, None)], outputs, None,
                             ort_outputs=ort_outputs)


def _bias_only(p: Prepared) -> bool:
    """A float32 or float16 node whose epilogue is at most a constant bias: the kernel adds it (decided once per
    node)."""
    ok = p.kernel_cache.get("bias_only")
    if ok is None:
        at = p.attrs
        ok = p.kernel_cache["bias_only"] = ({k for k, v in at["epilogue"].items() if v} <= {"bias"}
                                    and not at["runtime_bias"] and at["dtype"] in ("float32", "float16"))
    return ok


def run_nbits(p: Prepared, inputs) -> list[np.ndarray]:
    if _bias_only(p):
        y = nbits_matmul(p, arg(p, inputs, 0), p.consts["ep_bias"] if p.attrs["epilogue"].get("bias") else None)
        return [y.astype(p.attrs["dtype"], copy=False)]
    at = p.attrs
    y = nbits_matmul(p, arg(p, inputs, 0))
    if at["runtime_bias"]:
        y += arg(p, inputs, 5).astype(np.float32)
    y = apply_float_epilogue(y, at["epilogue"], p.consts)
    if at["epilogue"].get("quantize"):
        return [y]
    return [y.astype(at["dtype"], copy=False)]


def cost_nbits(p: Prepared, shapes) -> OpCost:
    return planned_cost(p, *matmul_dims(tuple(shapes[0]), (p.attrs["K"], p.attrs["N"])))


register(KernelDef("com.microsoft", "MatMulNBits", prepare_nbits, run_nbits, cost_nbits, check_nbits,
                   bind=bind_nbits))
