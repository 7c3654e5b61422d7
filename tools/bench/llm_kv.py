"""KV resident vs the copying path (issue 41 item 2), on one rewritten decoder: NpuEP with past and present bound to
one buffer per layer (``Generator(kv_in_place=True)``, in host memory and in NpuEP's device memory), NpuEP and the
CPU EP with the copying cache (the past fed, a fresh present returned, the new rows copied out), the same prompt and
greedy steps, repeats alternating.

Per decode step it prints the three facts apart:
  * KV bytes crossing the CPU<->NPU boundary (``GenerationResult.kv_decode``): the partition inputs and outputs
    the bridge found in host memory plus ORT's copies through NpuEP's data transfer (``ep.device_memory``), less the
    step's other tensors (ids, positions, mask in; logits out). With the KV in host memory the partition reads
    and writes the whole past and present there; with the KV resident in NPU memory (``kv_memory="npu"``) none of
    it crosses;
  * bytes appended in place and past bytes copied into a separate present, with the count of full copies: the
    GroupQueryAttention nodes' own counters (``kernels/ops/_kv_traffic``);
  * inter-token host time (median over repeats of each run's median), each mode against the CPU EP's.
Tokens are compared across the modes (on an accuracy_level 4 decoder NpuEP and the CPU EP part on float rounding:
bench.llm_1b's docstring). Free-running greedy tokens against the CPU EP's say little on random weights: their
logits are near-tied, so one flipped token changes every later context (the CPU EP against itself with the
embeddings one ulp up agrees on 1 of 64). The check against the CPU EP is therefore teacher-forced, as
``npu-generate --compare-kv`` does: the CPU EP's greedy run gives the tokens and logits; each resident NpuEP mode
(and, when given, the CPU EP on ``floor_model``, the float floor) is fed those tokens step after step, so every
step sees the CPU EP's context; per step its top-1 against the CPU EP's, and the logit drift (max and mean
|difference|), beside the CPU EP's own top-1/top-2 margins (how near-tied the logits are).

``python -m npu_ep.tools.bench.llm --kv-resident [--model M] [--prompt-len N] [--new-tokens N] [--repeats R]``;
``python -m npu_ep.tools.bench.llm_1b --kv-resident`` runs it on the 1B-width int4 decoder (1k-token context).
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import os
import statistics
import time
from typing import Any

import numpy as np

SETTLE_S = 0.25  # see bench.kernels.SETTLE_S
MODES = ("NpuEP resident NPU memory", "NpuEP resident", "NpuEP copying", "CPU EP copying")
TARGET_CPU = 1.0  # issue 41: inter-token with KV resident <= 1.0x the CPU EP's (and <= the copying path's)


def _generators(model: str, capacity: int, npu_options: dict[str, str]) -> dict[str, Any]:

    from ..generation import Generator

    npu = [(get_ep_name(), {"cache_dir": "", **npu_options}), "CPUExecutionProvider"]
    return {"NpuEP resident NPU memory": Generator(model, providers=npu, max_kv_len=capacity, kv_in_place=True,
                                                   kv_memory="npu", ort_log_level=3),
            "NpuEP resident": Generator(model, providers=npu, max_kv_len=capacity, kv_in_place=True,
                                        ort_log_level=3),
            "NpuEP copying": Generator(model, providers=npu, max_kv_len=capacity, kv_in_place=False, ort_log_level=3),
            "CPU EP copying": Generator(model, providers=["CPUExecutionProvider"], max_kv_len=capacity,
                                        kv_in_place=False, ort_log_level=3)}


STEADY_BLOCKS, STEADY_RUNS = 6, 10


def _decode_step(gen, prompt: list[int]):
    """A function running one decode step of ``gen`` after ``prompt`` again and again (the same token at the same
    slot): a copying generator's captured feeds, or a resident cache filled by the prompt's prefill steps."""
    from ..generation.entries import PREFILL, PREFILL_HISTORY
    from ..generation.resident import ResidentKv
    from ..generation.shapes import plan_prefill

    if not gen.kv_in_place:
        captured: list[dict] = []
        real = gen._runner.run
        gen._runner.run = lambda f: (captured.append(dict(f)), real(f))[1]
        try:
            gen.generate(prompt, 2, keep_logits=False)  # prefill, then one decode step: the last call
        finally:
            gen._runner.run = real
        feeds = captured[-1]
        return lambda: gen.session.run(None, feeds)
    cache = ResidentKv(gen.info, gen.max_kv_len, npu_session=gen.session if gen.kv_memory == "npu" else None)
    for ch in plan_prefill(len(prompt), gen.buckets, chunk=gen.prefill_chunk):
        gen._step(cache, prompt[ch.start: ch.start + ch.length], ch.bucket, PREFILL if ch.first else PREFILL_HISTORY)
    position = np.array([cache.length], np.int64)
    return lambda: cache.run(gen.session, [5], position, 1, False)


def _steady(gens: dict[str, Any], prompt: list[int]) -> dict[str, float]:
    """Median ms of one decode step after ``prompt`` per mode, the modes alternating in blocks: the step's own time,
    without the swings a whole generation takes on a shared host."""
    steps = {name: _decode_step(gen, prompt) for name, gen in gens.items()}
    samples: dict[str, list[float]] = {name: [] for name in gens}
    for _ in range(STEADY_BLOCKS):
        for name, step in steps.items():
            time.sleep(SETTLE_S)
            for _ in range(3):
                step()
            for _ in range(STEADY_RUNS):
                t0 = time.perf_counter()
                step()
                samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) * 1e3 for name, v in samples.items()}


FORCED_MODES = ("NpuEP resident NPU memory", "NpuEP resident")
FLOOR = "CPU EP, embeddings 1 ulp up"


def teacher_forced(gens: dict[str, Any], prompt: list[int], new_tokens: int, floor: Any = None) -> dict[str, Any]:
    """Top-1 agreement and logit drift against the CPU EP's greedy run, each mode fed the CPU EP's tokens
    (module docstring); ``floor``: a generator whose drift is float rounding alone."""
    base = gens["CPU EP copying"].generate(prompt, new_tokens, keep_logits=True)
    top2 = [np.sort(row.astype(np.float64))[-2:] for row in base.logits]
    margins = [float(b - a) for a, b in top2]
    out: dict[str, Any] = {"steps": len(base.tokens), "cpu_margin_median": statistics.median(margins),
                           "cpu_margin_min": min(margins), "modes": {}}
    runs = {name: gens[name] for name in FORCED_MODES}
    if floor is not None:
        runs[FLOOR] = floor
    for name, gen in runs.items():
        forced = gen.generate(prompt, new_tokens, keep_logits=True, feed_tokens=base.tokens)
        n = min(len(forced.tokens), len(base.tokens))
        diffs = [np.abs(a.astype(np.float64) - b) for a, b in zip(forced.logits[:n], base.logits[:n])]
        agree = [a == b for a, b in zip(forced.tokens[:n], base.tokens[:n])]
        out["modes"][name] = {"agree": sum(agree), "steps": n, "max_drift": float(max(d.max() for d in diffs)),
                              "mean_drift": float(np.mean([d.mean() for d in diffs])),
                              "disagree_margin_max": max((m for m, ok in zip(margins, agree) if not ok), default=None)}
    return out


def run(model: str, prompt_len: int, new_tokens: int, repeats: int, capacity: int | None = None,
        npu_options: dict[str, str] | None = None, vocab: int | None = None, floor_model: str | None = None
        ) -> dict[str, Any]:
    """Measure (module docstring); returns the numbers it prints."""
    capacity = capacity or prompt_len + new_tokens + 16
    gens = _generators(model, capacity, npu_options or {})
    vocab = vocab or gens["CPU EP copying"].info.vocab or 1000
    prompt = [int(t) for t in np.random.default_rng(0).integers(1, vocab, prompt_len)]
    per_step: dict[str, dict[str, float]] = {}
    for name, gen in gens.items():  # also the warm-up: every entry's first call
        gen.generate(prompt, 2, keep_logits=False)
        if gen.uses_npu:  # the generator's own per-decode-step account (GenerationResult.kv_decode)
            per_step[name] = gen.generate(prompt, new_tokens, keep_logits=False).kv_decode
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
    agree = sum(a == b for a, b in zip(tokens["NpuEP resident NPU memory"], tokens["CPU EP copying"]))
    med = {name: statistics.median(v) * 1e3 for name, v in itl.items()}
    floor = None
    if floor_model is not None:
        from ..generation import Generator

        floor = Generator(floor_model, providers=["CPUExecutionProvider"], max_kv_len=capacity, kv_in_place=False,
                          ort_log_level=3)
    forced = teacher_forced(gens, prompt, new_tokens, floor)
    out = {"model": str(model), "prompt_len": prompt_len, "new_tokens": new_tokens, "capacity": capacity,
           "repeats": repeats, "tokens_identical": same,
           "resident_equals_copying": tokens["NpuEP resident"] == tokens["NpuEP copying"]
           == tokens["NpuEP resident NPU memory"],
           "agree_with_cpu": agree, "teacher_forced": forced, "itl_ms": med, "steady_ms": _steady(gens, prompt),
           "per_decode_step": per_step,
           "load": os.getloadavg()}
    _print(out)
    return out


def _print(r: dict[str, Any]) -> None:
    med = r["itl_ms"]
    print(f"{r['model']}: prompt {r['prompt_len']}, {r['new_tokens']} tokens, KV capacity {r['capacity']}, median of "
          f"{r['repeats']}; tokens identical across {', '.join(MODES)}: {r['tokens_identical']} (NpuEP modes equal: "
          f"{r['resident_equals_copying']}; resident in NPU memory vs CPU EP: {r['agree_with_cpu']} of "
          f"{r['new_tokens']} greedy tokens equal)")
    for name, step in r["per_decode_step"].items():
        print(f"  {name:26s} per decode step: KV across the boundary {step['kv_across_boundary_bytes'] / 1e6:.3f} MB "
              f"(all tensors {step['all_across_boundary_bytes'] / 1e6:.3f} MB), appended in place "
              f"{step['appended_in_place_bytes']:.0f} B, into a copy {step['appended_into_copy_bytes']:.0f} B, past "
              f"copied {step['past_copied_bytes'] / 1e6:.3f} MB in {step['full_copies']:.0f} full copies")
    npu_mem, res, cop, cpu = (med[m] for m in MODES)
    print(f"  inter-token host ms (median): NpuEP resident in NPU memory {npu_mem:.2f}, resident in host memory "
          f"{res:.2f}, copying {cop:.2f}, CPU EP {cpu:.2f}; NPU-memory resident / copying {npu_mem / cop:.2f}x "
          f"(target <= 1.0x: {'met' if npu_mem <= cop else 'NOT met'}), / CPU EP {npu_mem / cpu:.2f}x (target <= "
          f"{TARGET_CPU}x: {'met' if npu_mem <= TARGET_CPU * cpu else 'NOT met'}); load average "
          f"{' '.join(f'{x:.1f}' for x in r['load'])}")
    st = r["steady_ms"]
    npu_mem, res, cop, cpu = (st[m] for m in MODES)
    print(f"  steady decode step at the prompt's length ({STEADY_BLOCKS} alternating blocks of {STEADY_RUNS}, median "
          f"ms): resident in NPU memory {npu_mem:.2f}, in host memory {res:.2f}, copying {cop:.2f}, CPU EP {cpu:.2f}; "
          f"resident / copying {npu_mem / cop:.2f}x (NPU memory), {res / cop:.2f}x (host memory); / CPU EP "
          f"{npu_mem / cpu:.2f}x, {res / cpu:.2f}x")
    tf = r["teacher_forced"]
    print(f"  teacher-forced against the CPU EP (each fed the CPU EP's {tf['steps']} greedy tokens; the CPU EP's "
          f"top-1/top-2 logit margin: median {tf['cpu_margin_median']:.3g}, min {tf['cpu_margin_min']:.3g}):")
    for name, m in tf["modes"].items():
        worst = "-" if m["disagree_margin_max"] is None else f"{m['disagree_margin_max']:.3g}"
        print(f"    {name:28s} top-1 equal on {m['agree']} of {m['steps']} steps; logit drift max "
              f"{m['max_drift']:.3g}, mean {m['mean_drift']:.3g}; largest CPU EP margin where top-1 differs: {worst}")
