"""com.microsoft GroupQueryAttention: QK^T and PV on the matrix unit, masking + softmax on the vector unit.

Layouts (B batch, S new tokens, P past buffer length, T total/present length, N heads, Nkv kv heads,
G = N / Nkv query heads per kv head, H head dim):
  query [B, S, N*H], key/value [B, S, Nkv*H]   or packed query [B, S, (N + 2 Nkv) * H] with key/value omitted
  past_key/past_value [B, Nkv, P, H] (right-padded per batch), seqlens_k [B] int32 = total_b - 1,
  total_sequence_length: scalar int32, cos_cache/sin_cache [max_pos, R/2] (do_rotary=1)
  output [B, S, N*H], present_key/present_value [B, Nkv, T, H] with T = max(total_sequence_length, P)

ORT CPU semantics reproduced here:
  * first prompt (S == total_sequence_length): past_b = 0; otherwise past_b = seqlens_k[b] + 1 - S.
  * present[b, :, :past_b] = past[b, :, :past_b]; present[b, :, past_b:past_b+S] = new K/V; the rest is zero
    (ORT's non-shared-buffer path memsets present).
  * query s of batch b sees keys t with t <= past_b + s and t < total_b (causal), and, when
    local_window_size > 0, t > past_b + s - local_window_size (the window counts the query's own key, as ORT 1.31).
  * rotary positions past_b + s (also for the padding rows of a right-padded first prompt, as ORT 1.31's CPU
    kernel does), unless position_ids are given; Q and the new K rotate, V does not.
  * scale = 1/sqrt(H) unless given; softcap > 0 applies softcap * tanh(x / softcap) before masking.

No repeated KV: the G query heads of one kv head are stacked as G*S rows of one matmul,
Q [B, Nkv, G*S, H] @ K^T [B, Nkv, H, T] -> [B, Nkv, G*S, T] (== Q [B, Nkv, G, S, H] against K [B, Nkv, 1, T, H]),
so the matrix unit sees m = G*S rows even in decode (S = 1) and K/V are read once per kv head.

Cost (per execution; mode = target.float_mode(dtype), tiles padded to the native tile_m x tile_n x tile_k):
  matrix = B * Nkv * (ceil(GS/tm) ceil(T/tn) ceil(H/tk) + ceil(GS/tm) ceil(H/tn) ceil(T/tk)) * tm tn tk / macs_per_cycle
  vector = ceil(B N S T / lanes) * (5 + transcendental_cycles)      (scale/mask/max/sum/divide + exp)
  dma    = Q, K, V, past K/V in; present K/V and output out
  cycles = max(max(matrix, vector), dma) + one DMA latency (heads are pipelined: softmax of head i overlaps the
  matmuls of head i+1, and double-buffered loads overlap both).
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..cost import dma_cycles
from ..node import NodeInfo
from ..registry import KernelDef, OpCost, Prepared, register
from ..target import Target
from ._util import arg, stash_constants
from ._vector import itemsize_of, transcendental
from .rotary import rotate

_ATTRS = (("num_heads", 0), ("kv_num_heads", 0), ("scale", 0.0), ("softcap", 0.0), ("local_window_size", -1),
          ("do_rotary", 0), ("rotary_interleaved", 0))


def _prepare(node: NodeInfo, target: Target) -> Prepared:
    attrs = {k: node.attr(k, d) for k, d in _ATTRS}
    attrs["itemsize"] = itemsize_of(node.inputs[0])
    return Prepared(attrs, stash_constants(node), target)


def _check(node: NodeInfo, target: Target) -> str | None:
    op = node.describe()
    q = node.input(0)
    if q is None or q.dtype is None or not np.issubdtype(q.dtype, np.floating):
        return f"{op}: GroupQueryAttention needs a float query"
    if target.float_mode(q.dtype.name) is None:
        return f"{op}: target {target.name} has no float matrix mode for {q.dtype.name} (QK^T/PV need one)"
    n, nkv = int(node.attr("num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if n <= 0 or nkv <= 0 or n % nkv:
        return f"{op}: num_heads={n} must be a positive multiple of kv_num_heads={nkv}"
    for attr in ("smooth_softmax", "qk_output"):  # ORT's defaults are -1 ("off"); 0 is off too
        if int(node.attr(attr, -1)) > 0:
            return f"{op}: {attr}={node.attr(attr)} not supported"
    for i, what in ((10, "attention_bias"), (11, "head_sink")):
        if node.input(i) is not None:
            return f"{op}: optional input {what} not supported"
    if any(not o.missing for o in node.outputs[3:]):
        return f"{op}: output_qk not supported"
    return None


def _lengths(seqlens_k: np.ndarray, total: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(past_b, total_b) per ORT's rules (module docstring): a first prompt (S == total) has no past."""
    total_b = np.asarray(seqlens_k, dtype=np.int64).reshape(-1) + 1
    first = s == total
    past_b = np.zeros_like(total_b) if first else total_b - s
    if (past_b < 0).any():
        raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens_k.tolist()} shorter than the {s} new tokens")
    return past_b, total_b


def _present(past: np.ndarray | None, new_bsnh: np.ndarray, past_b: np.ndarray, t_buf: int) -> np.ndarray:
    """present [B, Nkv, T, H]: the valid past prefix of each batch, then the S new rows, zeros elsewhere."""
    b, s, nkv, h = new_bsnh.shape
    p = 0 if past is None else past.shape[2]
    new = new_bsnh.transpose(0, 2, 1, 3)
    if past is not None and t_buf == p + s and (past_b == p).all():  # full past buffer: one concatenation
        return np.concatenate([past, new.astype(past.dtype, copy=False)], axis=2)
    out = np.zeros((b, nkv, t_buf, h), dtype=new_bsnh.dtype)
    if (past_b == past_b[0]).all():  # one valid length for the whole batch (always for B=1): plain slices
        start = int(past_b[0])
        if past is not None and start:
            out[:, :, :start] = past[:, :, :start]
        out[:, :, start:start + s] = new
        return out
    for i, start in enumerate(past_b.tolist()):  # ragged batch: one slice copy per batch row (B rows, not tiles)
        if past is not None and start:
            out[i, :, :start] = past[i, :, :start]
        out[i, :, start:start + s] = new[i]
    return out


def _mask(past_b: np.ndarray, total_b: np.ndarray, s: int, t: int, window: int) -> np.ndarray | None:
    """[B, 1, 1, S, T] bool of visible keys, or None when every key in [0, T) is visible to every query."""
    key = np.arange(t)[None, None, :]
    last = past_b[:, None, None] + np.arange(s)[None, :, None]  # [B, S, 1]: the query's own position
    vis = (key <= last) & (key < total_b[:, None, None])
    if window > 0:
        vis &= key > last - window
    if vis.all():
        return None
    return vis[:, None, None]


_SCORES_BUDGET = 64 << 20  # bytes of attention scores materialized at once (long prefills run in row blocks)


def _attend(q5: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, softcap: float) -> np.ndarray:
    """softmax(mask(softcap(Q K^T))) V for pre-scaled q5 [B, Nkv, G, s, H] against k, v [B, Nkv, T, H].

    The G query heads sharing a kv head are stacked as G*s matmul rows: [B, Nkv, G*s, H] @ [B, Nkv, H, T].
    """
    b, nkv, g, s, h = q5.shape
    t = k.shape[2]
    scores = np.matmul(q5.reshape(b, nkv, g * s, h), k.transpose(0, 1, 3, 2))  # [B, Nkv, G*s, T]
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    scores = scores.reshape(b, nkv, g, s, t)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores.reshape(b, nkv, g * s, t), v).reshape(b, nkv, g, s, h)


def _run(p: Prepared, inputs) -> list[np.ndarray]:
    a = p.attrs
    n, nkv = int(a["num_heads"]), int(a["kv_num_heads"])
    g = n // nkv
    query, key, value = arg(p, inputs, 0), arg(p, inputs, 1), arg(p, inputs, 2)
    past_k, past_v = arg(p, inputs, 3), arg(p, inputs, 4)
    seqlens_k, total = arg(p, inputs, 5), int(np.asarray(arg(p, inputs, 6)).reshape(-1)[0])
    b, s, _ = query.shape
    if key is None:  # packed QKV
        h = query.shape[2] // (n + 2 * nkv)
        qkv = query.reshape(b, s, n + 2 * nkv, h)
        q, k_new, v_new = qkv[:, :, :n], qkv[:, :, n:n + nkv], qkv[:, :, n + nkv:]
    else:
        h = query.shape[2] // n
        q, k_new, v_new = query.reshape(b, s, n, h), key.reshape(b, s, nkv, h), value.reshape(b, s, nkv, h)
    past_b, total_b = _lengths(seqlens_k, total, s)

    if a["do_rotary"]:
        cos, sin = arg(p, inputs, 7), arg(p, inputs, 8)
        pos_in = arg(p, inputs, 9)
        if pos_in is not None:
            pos = np.asarray(pos_in, dtype=np.int64).reshape(b, s)
        else:
            pos = past_b[:, None] + np.arange(s)[None, :]  # padding rows of a first prompt keep s (ORT 1.31 CPU)
        half = cos.shape[1]
        q = rotate(q, cos[pos, :half], sin[pos, :half], bool(a["rotary_interleaved"]))
        k_new = rotate(k_new, cos[pos, :half], sin[pos, :half], bool(a["rotary_interleaved"]))

    p_len = 0 if past_k is None else past_k.shape[2]
    t_buf = max(total, p_len)
    present_k = _present(past_k, k_new, past_b, t_buf)
    present_v = _present(past_v, v_new, past_b, t_buf)

    t = int(min(total_b.max(), t_buf))  # keys beyond every batch's total length are never visible
    cdt = np.float64 if query.dtype == np.float64 else np.float32
    scale = float(a["scale"]) or 1.0 / math.sqrt(h)
    # Q [B, S, N, H] -> [B, Nkv, G, S, H] (head n = kv * G + g, as ORT maps head n to kv head n // G)
    q5 = (q.astype(cdt, copy=False) * cdt(scale)).transpose(0, 2, 1, 3).reshape(b, nkv, g, s, h)
    k = present_k[:, :, :t].astype(cdt, copy=False)
    v = present_v[:, :, :t].astype(cdt, copy=False)
    mask = _mask(past_b, total_b, s, t, int(a["local_window_size"]))
    out = np.empty((b, nkv, g, s, h), dtype=cdt)
    rows = max(1, _SCORES_BUDGET // (b * n * t * np.dtype(cdt).itemsize))  # query rows per score block
    for s0 in range(0, s, rows):  # one block unless the [B, N, S, T] scores would exceed the budget
        s1 = min(s, s0 + rows)
        block = None if mask is None else mask[..., s0:s1, :]
        out[:, :, :, s0:s1] = _attend(q5[:, :, :, s0:s1], k, v, block, float(a["softcap"]))
    out = out.reshape(b, n, s, h).transpose(0, 2, 1, 3).reshape(b, s, n * h).astype(query.dtype, copy=False)
    return [out, present_k, present_v]


def _cost(p: Prepared, shapes) -> OpCost:
    a, tgt = p.attrs, p.target
    n, nkv = int(a["num_heads"]), int(a["kv_num_heads"])
    g = n // nkv
    b, s, d = shapes[0]
    h = d // (n + 2 * nkv) if shapes[1] is None else d // n
    past = shapes[3][2] if shapes[3] is not None else 0
    t = past + s if past else s
    item = a["itemsize"]
    mode = tgt.float_mode({2: "float16", 4: "float32"}.get(item, "float32")) or "float16"
    tm, tn, tk = tgt.tile
    rows = math.ceil(g * s / tm)
    native = rows * math.ceil(t / tn) * math.ceil(h / tk) + rows * math.ceil(h / tn) * math.ceil(t / tk)
    matrix = b * nkv * native * tm * tn * tk / tgt.mac_rate(mode)
    vector = math.ceil(b * n * s * t / int(tgt.vector["lanes"])) * (5.0 + transcendental(tgt))
    moved = item * (b * s * (n + 2 * nkv) * h + 2 * b * nkv * past * h + 2 * b * nkv * t * h + b * s * n * h)
    dma = dma_cycles(tgt, moved, transfers=6)
    compute = max(matrix, vector)
    cycles = max(compute, dma) + float(tgt.dma["latency_cycles"])
    macs = 2 * b * n * s * t * h
    sram = item * (2 * t * h + g * s * (h + t)) * 2  # one kv head's K, V, Q rows and scores, double-buffered
    return OpCost(compute_cycles=compute, dma_cycles=dma, cycles=cycles, dma_bytes=moved, sram_peak=sram, macs=macs,
                  utilization=macs / (cycles * tgt.mac_rate(mode)) if cycles else 0.0, unit="matrix")


register(KernelDef("com.microsoft", "GroupQueryAttention", _prepare, _run, _cost, _check))


def bench_gqa_decode(batch: int = 1, past: int = 512, num_heads: int = 32, kv_num_heads: int = 8, head: int = 128,
                     iters: int = 50) -> dict[str, float]:
    """Host time per call of the kernel vs ORT CPU for one GQA decode step (S = 1, ``past`` cached tokens).

    Returns ``{"npu_ms", "ort_ms", "ratio"}``; numbers are host wall time, not the emulated NPU time.
    Note: most of the kernel's time is the page faulting of the two fresh [B, Nkv, P+1, H] present outputs
    (glibc returns large blocks to the OS on free); ORT's arena allocator avoids that.
    Run: ``python -m npu_ep.kernels.ops.attention``.
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from ...ep.onnx_graph import nodes_from_model

    rng = np.random.default_rng(0)
    f32 = np.float32
    feeds = {"q": rng.standard_normal((batch, 1, num_heads * head), f32),
             "k": rng.standard_normal((batch, 1, kv_num_heads * head), f32),
             "v": rng.standard_normal((batch, 1, kv_num_heads * head), f32),
             "pk": rng.standard_normal((batch, kv_num_heads, past, head), f32),
             "pv": rng.standard_normal((batch, kv_num_heads, past, head), f32),
             "sl": np.full((batch,), past, np.int32), "tot": np.array(past + 1, np.int32)}
    vi = helper.make_tensor_value_info
    elem = {np.dtype(f32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    ins = [vi(k, elem[v.dtype], list(v.shape)) for k, v in feeds.items()]
    outs = [vi(o, TensorProto.FLOAT, None) for o in ("y", "pk_out", "pv_out")]
    node = helper.make_node("GroupQueryAttention", list(feeds), ["y", "pk_out", "pv_out"], domain="com.microsoft",
                            num_heads=num_heads, kv_num_heads=kv_num_heads)
    model = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.log_severity_level = 3  # ORT's schema assumes a shared KV buffer and warns that present grew to P + 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    tgt = Target.load("npu-ref")
    prepared = _prepare(nodes_from_model(model)[0], tgt)
    runtime = list(feeds.values())

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters * 1e3

    npu_ms = timed(lambda: _run(prepared, runtime))
    ort_ms = timed(lambda: sess.run(None, feeds))
    return {"npu_ms": npu_ms, "ort_ms": ort_ms, "ratio": npu_ms / ort_ms}


if __name__ == "__main__":
    for bsz in (1, 2):
        r = bench_gqa_decode(batch=bsz)
        print(f"GQA decode B={bsz} P=512 N=32 Nkv=8 H=128: kernel {r['npu_ms']:.3f} ms, ORT CPU {r['ort_ms']:.3f} ms, "
              f"ratio {r['ratio']:.2f}x")
