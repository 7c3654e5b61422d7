"""GroupQueryAttention decode step (S = 1, ``past`` cached tokens): the kernel called directly vs ORT's CPU EP.

Usage: ``python -m npu_ep.tools.bench.gqa_decode [--past 512] [--iters 50]``. Host wall time per call, not the
emulated NPU time. The kernel runs without a session (no bridge), so this isolates the kernel; ``bench.kernels``
measures the same shape through a real NpuEP session. The two [B, Nkv, P+1, H] presents come from the node's
buffer pool (``kernels/ops/_kv_pool.py``): with fresh buffers per call, page faults would dominate.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from ...ep.onnx_graph import nodes_from_model
from ...kernels.registry import kernel_for
from ...kernels.target import Target


def bench_gqa_decode(batch: int = 1, past: int = 512, num_heads: int = 32, kv_num_heads: int = 8, head: int = 128,
                     iters: int = 50) -> dict[str, float]:
    """Milliseconds per call of the kernel and of ORT's CPU EP on the same feeds: ``{"npu_ms", "ort_ms", "ratio"}``."""
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
    kernel = kernel_for("com.microsoft", "GroupQueryAttention")
    prepared = kernel.prepare(nodes_from_model(model)[0], Target.load("npu-ref"))
    runtime = list(feeds.values())
    np.testing.assert_allclose(kernel.run(prepared, runtime)[0], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters * 1e3

    npu_ms = timed(lambda: kernel.run(prepared, runtime))
    ort_ms = timed(lambda: sess.run(None, feeds))
    return {"npu_ms": npu_ms, "ort_ms": ort_ms, "ratio": npu_ms / ort_ms}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.gqa_decode", description=__doc__.splitlines()[0])
    ap.add_argument("--past", type=int, default=512)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    for bsz in (1, 2):
        r = bench_gqa_decode(batch=bsz, past=args.past, iters=args.iters)
        print(f"GQA decode B={bsz} P={args.past} N=32 Nkv=8 H=128: kernel {r['npu_ms']:.3f} ms, "
              f"ORT CPU {r['ort_ms']:.3f} ms, ratio {r['ratio']:.2f}x")


if __name__ == "__main__":
    main()
