"""GroupQueryAttention decode (S = 1 after ``past`` cached tokens) and prefill (a ``prompt``-token first prompt):
the kernel called directly and through real NpuEP sessions, native and reference, vs ORT's CPU EP in the same run.

Usage: ``python -m npu_ep.tools.bench.gqa_decode [--past 512] [--prompt 128] [--iters 20] [--rounds 3]``. Host
wall time per call: medians of ``iters`` calls in interleaved rounds, best round kept (the machine is shared). Columns:
``kernel`` runs the prepared kernel without a session on one host thread (isolates the kernel); ``NpuEP`` is a session
with provider option ``kernels=native`` or ``reference`` (graph assignment checked; host_threads default); ratios are
against the CPU EP session on the same feeds. The presents come from the node's buffer pool
(``kernels/ops/_kv_pool.py``): with fresh buffers per call, page faults would dominate.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import functools
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ...ep.onnx_graph import nodes_from_model
from ...kernels import runtime
from ...kernels.registry import kernel_for
from ...kernels.target import Target

SETTLE_S = 0.25  # ORT's intra-op workers spin ~50 ms after a run: each timed block starts after this pause


def gqa_model(batch: int, seq: int, past: int, num_heads: int = 32, kv_num_heads: int = 8, head: int = 128
              ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One GroupQueryAttention node (separate Q/K/V; past inputs only when ``past`` > 0) and its feeds."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    feeds = {"q": rng.standard_normal((batch, seq, num_heads * head), f32),
             "k": rng.standard_normal((batch, seq, kv_num_heads * head), f32),
             "v": rng.standard_normal((batch, seq, kv_num_heads * head), f32)}
    if past:
        feeds["pk"] = rng.standard_normal((batch, kv_num_heads, past, head), f32)
        feeds["pv"] = rng.standard_normal((batch, kv_num_heads, past, head), f32)
    feeds["sl"] = np.full((batch,), past + seq - 1, np.int32)
    feeds["tot"] = np.array(past + seq, np.int32)
    vi = helper.make_tensor_value_info
    elem = {np.dtype(f32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    ins = [vi(k, elem[v.dtype], list(v.shape)) for k, v in feeds.items()]
    t = past + seq  # presents as ORT's CPU kernel returns them (its schema infers P for a shared KV buffer)
    outs = [vi("y", TensorProto.FLOAT, [batch, seq, num_heads * head]),
            vi("pk_out", TensorProto.FLOAT, [batch, kv_num_heads, t, head]),
            vi("pv_out", TensorProto.FLOAT, [batch, kv_num_heads, t, head])]
    names = ["q", "k", "v", "pk" if past else "", "pv" if past else "", "sl", "tot"]
    node = helper.make_node("GroupQueryAttention", names, ["y", "pk_out", "pv_out"], domain="com.microsoft",
                            num_heads=num_heads, kv_num_heads=kv_num_heads)
    model = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model, feeds


def _timings(fns: dict, iters: int, rounds: int) -> dict[str, float]:
    """Milliseconds per call of each fn: the median of ``iters`` calls, taken in ``rounds`` interleaved rounds
    (every variant once per round, so a load spike from other processes hits all of them), best round kept."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(SETTLE_S)
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            best[name] = min(best[name], statistics.median(ts) * 1e3)
    return best


def _session(model: onnx.ModelProto, kernels: str | None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3  # ORT's schema assumes a shared KV buffer and warns that present grew to P + S
    if kernels is None:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = ort.InferenceSession(model.SerializeToString(), so, enable_fallback=0, providers=[
        (get_ep_name(), {"target": "npu-ref", "cache_dir": "", "kernels": kernels})])
    if {sg.ep_name for sg in sess.get_provider_graph_assignment_info()} != {get_ep_name()}:
        raise RuntimeError("NpuEP did not take the GroupQueryAttention node")
    return sess


def bench_gqa(batch: int = 1, seq: int = 1, past: int = 512, iters: int = 20, rounds: int = 3
              ) -> dict[str, float]:
    """Milliseconds per call: ``kernel_native``, ``kernel_reference``, ``npu_native``, ``npu_reference``, ``ort``."""
    model, feeds = gqa_model(batch, seq, past)
    cpu = _session(model, None)
    want = cpu.run(None, feeds)
    kernel = kernel_for("com.microsoft", "GroupQueryAttention")
    (node,) = nodes_from_model(model)
    given = [feeds.get(v.name) if not v.missing else None for v in node.inputs]
    fns = {"ort": lambda: cpu.run(None, feeds)}
    for kernels in ("native", "reference"):
        p = kernel.prepare(node, Target.load("npu-ref"))
        runtime.configure([p], kernels, 1)
        np.testing.assert_allclose(kernel.run(p, given)[0], want[0], rtol=1e-4, atol=1e-4)
        fns[f"kernel_{kernels}"] = functools.partial(kernel.run, p, given)
        sess = _session(model, kernels)
        np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)
        fns[f"npu_{kernels}"] = functools.partial(sess.run, None, feeds)
    return _timings(fns, iters, rounds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.gqa_decode", description=__doc__.splitlines()[0])
    ap.add_argument("--past", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    shapes = [(f"decode B={b} P={args.past}", b, 1, args.past) for b in (1, 2)]
    shapes.append((f"prefill B=1 S={args.prompt}", 1, args.prompt, 0))
    print("GroupQueryAttention N=32 Nkv=8 H=128, ms per call (ratio = / CPU EP)")
    for label, b, s, past in shapes:
        r = bench_gqa(b, s, past, args.iters, args.rounds)
        ort_ms = r["ort"]
        cells = ", ".join(f"{k} {r[k]:.3f} ({r[k] / ort_ms:.2f}x)"
                          for k in ("npu_native", "npu_reference", "kernel_native", "kernel_reference"))
        print(f"{label}: CPU EP {ort_ms:.3f}; {cells}")


if __name__ == "__main__":
    main()
