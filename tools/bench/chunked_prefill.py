"""A long prompt through chunked prefill on the 1B-width int4 decoder (``bench.llm_1b``'s model), NpuEP vs ORT's
CPU EP: TTFT, bucket waste, and the tokens against unchunked prefill (issue 41's target: a 1k-token prompt at
chunk 128, waste < 10%, tokens identical to unchunked prefill, TTFT <= 1.0x the CPU EP's).

    python -m npu_ep.tools.bench.chunked_prefill [--prompt-len 1000] [--chunk 128] [--layers 8] [--repeats 2]

Three runs, each in its own child process, alternating for ``--repeats`` rounds (the host's load moves by 2x in
minutes); each metric is the median over rounds:
  * ``NpuEP chunked``: the prompt as chunks of ``--chunk`` tokens (the first-prefill entry, then
    prefill-with-history entries, the remainder in the smaller buckets, only the last padded), then decode;
  * ``NpuEP unchunked``: the prompt as one prefill step of exactly its length (no padding): the tokens to match;
  * ``CPU EP``: the same single exact-length prefill on ORT's CPU EP: the TTFT to beat (its best case, no waste).
TTFT is host time from the first prefill step to the first token; the first generation of each child warms the
entries' first calls and is not timed.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

RUNS = ("NpuEP chunked", "NpuEP unchunked", "CPU EP")


def measure(model: str, run: str, prompt_len: int, chunk: int, new_tokens: int) -> dict:
    """One run (``RUNS``) in this process: TTFT of a timed generation after a warm-up one, waste, tokens."""
    import numpy as np


    from ..generation import DEFAULT_BUCKETS, Generator
    from .llm_1b import CONFIG

    npu = run.startswith("NpuEP")
    providers = ([(get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"] if npu
                 else ["CPUExecutionProvider"])
    chunked = run == "NpuEP chunked"
    buckets = DEFAULT_BUCKETS if chunked else (prompt_len,)
    gen = Generator(model, providers=providers, buckets=buckets, max_kv_len=prompt_len + new_tokens + 8,
                    chunked_prefill=chunked, prefill_chunk=chunk if chunked else None, ort_log_level=3)
    prompt = [int(t) for t in np.random.default_rng(0).integers(1, CONFIG["vocab_size"], prompt_len)]
    gen.generate(prompt, 2, keep_logits=False)  # warm-up: every entry's first call
    res = gen.generate(prompt, new_tokens, keep_logits=False)
    return {"run": run, "ttft_s": res.ttft_s, "tokens": res.tokens, "waste": res.padding.waste,
            "executed": res.padding.executed_tokens, "logical": res.padding.logical_tokens,
            "prefill_steps": sum(s.kind != "decode" for s in res.steps),
            "entries": [e["name"] for e in res.entries]}


def main(argv: list[str] | None = None) -> int:
    from .llm_1b import _child_env, build

    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.chunked_prefill",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=None, help="bench.llm_1b's folder (default: its default)")
    ap.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.model, a.child, a.prompt_len, a.chunk, a.new_tokens)))
        return 0
    import subprocess
    import tempfile

    workdir = a.workdir or Path(tempfile.gettempdir()) / "npu_ep_bench_llm_1b"
    t0 = time.perf_counter()
    model = str(build(workdir, a.layers))
    print(f"model: {model} (ready in {time.perf_counter() - t0:.0f} s)")
    env = _child_env(workdir)
    rows: dict[str, list[dict]] = {r: [] for r in RUNS}
    for _ in range(a.repeats):
        for run in RUNS:
            out = subprocess.run([sys.executable, "-m", "npu_ep.tools.bench.chunked_prefill", "--child", run,
                                  "--model", model, "--prompt-len", str(a.prompt_len), "--chunk", str(a.chunk),
                                  "--new-tokens", str(a.new_tokens)], check=True, stdout=subprocess.PIPE,
                                 text=True, env=env).stdout
            rows[run].append(json.loads(out.strip().splitlines()[-1]))
    ttft = {r: statistics.median(x["ttft_s"] for x in rs) for r, rs in rows.items()}
    chunked, whole, cpu = (rows[r][0] for r in RUNS)
    print(f"{a.prompt_len}-token prompt, chunk {a.chunk}, {a.layers} layers; medians of {a.repeats} alternating "
          f"child processes per run")
    print(f"  chunked plan: {chunked['prefill_steps']} prefill steps, {chunked['logical']} -> {chunked['executed']} "
          f"tokens ({chunked['waste']:.1%} waste); entries {', '.join(chunked['entries'])}")
    for r in RUNS:
        print(f"  {r:16s} TTFT {ttft[r] * 1e3:9.1f} ms  ({ttft[r] / ttft['CPU EP']:.2f}x the CPU EP)")
    same = chunked["tokens"] == whole["tokens"]
    print(f"  tokens: chunked {'IDENTICAL to' if same else 'DIFFER from'} unchunked NpuEP; "
          f"{'identical to' if chunked['tokens'] == cpu['tokens'] else 'differ from'} the CPU EP's "
          f"({a.new_tokens} greedy tokens)")
    print(f"  target: waste < 10% ({chunked['waste']:.1%}), TTFT <= 1.0x the CPU EP "
          f"({ttft['NpuEP chunked'] / ttft['CPU EP']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
