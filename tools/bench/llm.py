"""TTFT and mean inter-token latency, NpuEP vs ORT's CPU EP on the same rewritten (RoPE+GQA+INT4) tiny Llama, same
run, as ratios; plus the emulated NPU prefill/decode times.

``python -m npu_ep.tools.bench.llm [--model M.onnx] [--new-tokens N] [--repeats R]``. Both EPs use the same loop
and shapes (bucketed prefill, fixed KV capacity); each is warmed up once, then the repeats alternate between the
two EPs (so a change in host load hits both), each after a pause that lets the other session's ORT worker
threads stop spinning (they keep a core busy for ~50 ms after a run), and the median over repeats is taken.
Targets (issue 7): NpuEP host time <= 2x CPU EP for prefill, <= 3x for decode.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

SETTLE_S = 0.25  # see bench.kernels.SETTLE_S


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.llm", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="rewritten decoder .onnx (default: build + rewrite the tiny Llama)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-kv-len", type=int, default=512)
    args = ap.parse_args(argv)

    from ...models.prompts import PROMPTS
    from ..demo import rewrite_available
    from ..generation import Generator, default_providers

    model = args.model
    if model is None:
        from ...models.tiny_llama import build_tiny_llama

        d = Path(tempfile.mkdtemp(prefix="npu_bench_"))
        counts, skipped = rewrite_available(build_tiny_llama(d / "tiny.onnx"), d / "tiny.npu.onnx")
        model = d / "tiny.npu.onnx"
        print("rewritten:", ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
              *(f"\nskipped pass {s}" for s in skipped))
    gens = {"NpuEP": Generator(model, providers=default_providers(), max_kv_len=args.max_kv_len),
            "CPU EP": Generator(model, providers=["CPUExecutionProvider"], max_kv_len=args.max_kv_len)}
    table = Table(title=f"tiny Llama, {args.new_tokens} new tokens, median of {args.repeats} (host ms; NPU = emulated)")
    for col in ("prompt", "bucket", "CPU TTFT", "NpuEP TTFT", "TTFT ratio", "CPU ITL", "NpuEP ITL", "ITL ratio",
                "NPU prefill", "NPU decode/token"):
        table.add_column(col, justify="right")
    worst = {"ttft": 0.0, "itl": 0.0}
    for prompt in PROMPTS:
        res = {name: [] for name in gens}
        for gen in gens.values():
            gen.generate(prompt, 2, keep_logits=False)  # warm-up (first-call costs, emulated cost per shape)
        for _ in range(args.repeats):  # interleaved, so both EPs see the same host load over time
            for name, gen in gens.items():
                time.sleep(SETTLE_S)  # the other EP's ORT workers spin ~50 ms after its last run
                res[name].append(gen.generate(prompt, args.new_tokens, keep_logits=False))
        npu, cpu = res["NpuEP"], res["CPU EP"]
        assert all(r.tokens == cpu[0].tokens for r in npu + cpu), "NpuEP and CPU EP tokens differ"
        med = lambda rs, f: statistics.median(f(r) for r in rs)  # noqa: E731
        ttft_c, ttft_n = med(cpu, lambda r: r.ttft_s), med(npu, lambda r: r.ttft_s)
        itl_c, itl_n = med(cpu, lambda r: r.mean_itl_s), med(npu, lambda r: r.mean_itl_s)
        worst["ttft"], worst["itl"] = max(worst["ttft"], ttft_n / ttft_c), max(worst["itl"], itl_n / itl_c)
        buckets = "+".join(str(s.shape[0]) for s in npu[0].steps if s.kind != "decode")
        table.add_row(str(len(prompt)), buckets, f"{ttft_c * 1e3:.1f}", f"{ttft_n * 1e3:.1f}", f"{ttft_n / ttft_c:.2f}x",
                      f"{itl_c * 1e3:.2f}", f"{itl_n * 1e3:.2f}", f"{itl_n / itl_c:.2f}x",
                      f"{npu[0].npu_prefill_s * 1e3:.3f}", f"{npu[0].mean_npu_decode_s * 1e3:.4f}")
    console = Console(width=150)
    console.print(table)
    stats = gens["NpuEP"].compile_stats()
    console.print(f"NpuEP session: {stats['npu_partitions']} partitions ({stats['compiles']} compiled, "
                  f"{stats['cache_hits']} cached), {stats['session_s']:.2f} s to create")
    console.print(f"worst ratio NpuEP/CPU: TTFT {worst['ttft']:.2f}x (target <= 2x: "
                  f"{'met' if worst['ttft'] <= 2 else 'NOT met'}), inter-token {worst['itl']:.2f}x (target <= 3x: "
                  f"{'met' if worst['itl'] <= 3 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
