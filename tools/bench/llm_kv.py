"""KV resident vs the copying path (issue 41 item 2), on one rewritten decoder: NpuEP with past and present bound to
one buffer per layer (``Generator(kv_in_place=True)``), NpuEP and the CPU EP with the copying cache (the past fed,
a fresh present returned, the new rows copied out), the same prompt and greedy steps, repeats alternating.

Per decode step it prints the three facts apart:
  * KV bytes crossing the CPU<->NPU boundary: the bridge's count (``partition_stats``: every partition input and
    output it hands across) for the past/present tensors, i.e. what the partition reads and writes of the KV in
    host memory; 0 needs NPU-memory OrtValues (the device allocator);
  * bytes appended in place and past bytes copied into a separate present, with the count of full copies: the
    GroupQueryAttention nodes' own counters (``kernels/ops/_kv_traffic``);
  * inter-token host time (median over repeats of each run's median), NpuEP resident / copying / CPU EP.
Tokens must be identical across the three.

``python -m npu_ep.tools.bench.llm --kv-resident [--model M] [--prompt-len N] [--new-tokens N] [--repeats R]``;
``python -m npu_ep.tools.bench.llm_1b --kv-resident`` runs it on the 1B-width int4 decoder (1k-token context).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

SETTLE_S = 0.25  # see bench.kernels.SETTLE_S
MODES = ("NpuEP resident", "NpuEP copying", "CPU EP copying")
TARGET_CPU = 1.0  # issue 41: inter-token with KV resident <= 1.0x the CPU EP's (and <= the copying path's)


def _generators(model: str, capacity: int, npu_options: dict[str, str]) -> dict[str, Any]:
    import npu_ep

    from ..generation import Generator

    npu = [(npu_ep.get_ep_name(), {"cache_dir": "", **npu_options}), "CPUExecutionProvider"]
    return {"NpuEP resident": Generator(model, providers=npu, max_kv_len=capacity, kv_in_place=True,
                                        ort_log_level=3),
            "NpuEP copying": Generator(model, providers=npu, max_kv_len=capacity, kv_in_place=False, ort_log_level=3),
            "CPU EP copying": Generator(model, providers=["CPUExecutionProvider"], max_kv_len=capacity,
                                        kv_in_place=False, ort_log_level=3)}


def _kv_names(gen) -> set[str]:
    io, n = gen.info.io, gen.info.n_layers
    return {name % i for i in range(n) for name in (io.past_key, io.past_value, io.present_key, io.present_value)}


def _counters(gen) -> dict[str, int]:
    """The GQA nodes' KV counters and the bridge's boundary bytes of this generator's NpuEP session."""
    from ...ep.kv_state import gqa_steps
    from ...kernels.ops import _kv_traffic
    from ...kernels.runtime import extension

    out = _kv_traffic.total(gqa_steps(gen.session))
    names = {name for ep in gen._runner.eps for name in ep.programs}
    stats = [s for name, s in extension().partition_stats().items() if name in names]
    out["boundary_bytes"] = sum(s["bytes_in"] + s["bytes_out"] for s in stats)
    return out


def _kv_boundary_per_step(gen, capacity: int) -> int:
    """KV bytes the bridge hands across per decode step: the past inputs (C slots) and the presents it returns
    (C slots resident, C + 1 copying), every layer; the bridge counts whole tensors, wherever they were written."""
    info = gen.info
    slot = info.kv_heads * info.head_dim * 4
    present = capacity if gen.kv_in_place else capacity + 1
    return 2 * info.n_layers * (capacity + present) * slot


def run(model: str, prompt_len: int, new_tokens: int, repeats: int, capacity: int | None = None,
        npu_options: dict[str, str] | None = None, vocab: int | None = None) -> dict[str, Any]:
    """Measure (module docstring); returns the numbers it prints."""
    capacity = capacity or prompt_len + new_tokens + 16
    gens = _generators(model, capacity, npu_options or {})
    vocab = vocab or gens["CPU EP copying"].info.vocab or 1000
    prompt = [int(t) for t in np.random.default_rng(0).integers(1, vocab, prompt_len)]
    per_step: dict[str, dict[str, float]] = {}
    for name, gen in gens.items():  # also the warm-up: every entry's first call
        a = _counters(gen) if gen.uses_npu else None
        gen.generate(prompt, 1, keep_logits=False)
        b = _counters(gen) if gen.uses_npu else None
        gen.generate(prompt, new_tokens, keep_logits=False)
        if gen.uses_npu:  # per decode step: N tokens minus 1 token (prefill and first token alike), / (N - 1)
            c = _counters(gen)
            per_step[name] = {k: ((c[k] - b[k]) - (b[k] - a[k])) / (new_tokens - 1) for k in c}
            per_step[name]["kv_boundary_bytes"] = _kv_boundary_per_step(gen, capacity)
    itl: dict[str, list[float]] = {name: [] for name in gens}
    tokens: dict[str, list[int]] = {}
    for _ in range(repeats):
        for name, gen in gens.items():
            time.sleep(SETTLE_S)
            res = gen.generate(prompt, new_tokens, keep_logits=False)
            itl[name].append(statistics.median(res.itl_s))
            tokens.setdefault(name, res.tokens)
            if res.tokens != tokens[name]:
                raise SystemExit(f"{name}: tokens changed between repeats")
    same = len({tuple(t) for t in tokens.values()}) == 1
    med = {name: statistics.median(v) * 1e3 for name, v in itl.items()}
    out = {"model": str(model), "prompt_len": prompt_len, "new_tokens": new_tokens, "capacity": capacity,
           "repeats": repeats, "tokens_identical": same, "itl_ms": med, "per_decode_step": per_step,
           "load": os.getloadavg()}
    _print(out)
    return out


def _print(r: dict[str, Any]) -> None:
    med = r["itl_ms"]
    print(f"{r['model']}: prompt {r['prompt_len']}, {r['new_tokens']} tokens, KV capacity {r['capacity']}, median of "
          f"{r['repeats']}; tokens identical across {', '.join(MODES)}: {r['tokens_identical']}")
    for name, step in r["per_decode_step"].items():
        print(f"  {name:15s} per decode step: KV across the boundary {step['kv_boundary_bytes'] / 1e6:.3f} MB "
              f"(all tensors {step['boundary_bytes'] / 1e6:.3f} MB), appended in place "
              f"{step['appended_bytes'] if step['in_place'] else 0:.0f} B, appended into a copy "
              f"{0 if step['in_place'] else step['appended_bytes']:.0f} B, past copied "
              f"{step['copied_bytes'] / 1e6:.3f} MB in {step['full_copies']:.0f} full copies")
    res, cop, cpu = (med[m] for m in MODES)
    print(f"  inter-token host ms (median): NpuEP resident {res:.2f}, NpuEP copying {cop:.2f}, CPU EP {cpu:.2f}; "
          f"resident / copying {res / cop:.2f}x (target <= 1.0x: {'met' if res <= cop else 'NOT met'}), "
          f"resident / CPU EP {res / cpu:.2f}x (target <= {TARGET_CPU}x: "
          f"{'met' if res <= TARGET_CPU * cpu else 'NOT met'}); load average "
          f"{' '.join(f'{x:.1f}' for x in r['load'])}")
