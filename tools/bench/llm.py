"""TTFT and mean inter-token latency, NpuEP vs ORT's CPU EP on the same rewritten (RoPE+GQA+INT4) tiny Llama, same
run, as ratios; plus the emulated NPU prefill/decode times.

``python -m npu_ep.tools.bench.llm [--model M.onnx] [--new-tokens N] [--repeats R] [--profile] [--npu-option K=V]``;
``--growing-past N`` times the exporter's own loop instead (the past one longer every token, issue 40).
Both EPs use the same loop and shapes (bucketed prefill, fixed KV capacity); each is warmed up once, then the
repeats alternate between the two EPs (so a change in host load hits both), each after a pause that lets the other
session's ORT worker threads stop spinning (they keep a core busy for ~50 ms after a run), and the median over
repeats is taken.
Targets (issue 12): TTFT and inter-token <= 1.5x the CPU EP. A steady decode step (the same feeds run again and
again, the EPs alternating in blocks) is printed too: on a shared host a token's time after a pause swings by a
third, the step's own time much less. ``--profile`` adds where one decode step's host time
goes: ``session.run`` on both EPs with the same feeds, NpuEP's program call, and its steps per op kind split into
native kernel time and the rest (``step_profile``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

SETTLE_S = 0.25  # see bench.kernels.SETTLE_S
TARGET = 1.5  # issue 12: TTFT and inter-token, NpuEP / CPU EP


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.llm", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="rewritten decoder .onnx (default: build + rewrite the tiny Llama)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-kv-len", type=int, default=512)
    ap.add_argument("--profile", action="store_true", help="print where one decode step's host time goes")
    ap.add_argument("--growing-past", type=int, default=0, metavar="N",
                    help="instead: N tokens of the exporter's own loop (past one longer every token: a new input "
                         "signature each step), both EPs with one intra-op thread")
    ap.add_argument("--npu-option", action="append", default=[], metavar="KEY=VALUE",
                    help="NpuEP provider option (repeatable), e.g. host_threads=1")
    ap.add_argument("--kv-resident", action="store_true",
                    help="instead: KV resident (past and present bound to one buffer) vs the copying path and the CPU "
                         "EP, per decode step: KV bytes across the boundary, appended in place, full copies (llm_kv)")
    ap.add_argument("--prompt-len", type=int, default=200, help="--kv-resident: prompt tokens")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="npu_bench_") as tmp:  # the built model, removed at the end
        if args.growing_past:
            return _growing_past(args, Path(tmp))
        if args.kv_resident:
            return _kv_resident(args, Path(tmp))
        return _run(args, ap, Path(tmp))


GROW_PROMPT = 17  # tokens of the growing-past prompt


def _kv_resident(args: argparse.Namespace, tmp: Path) -> int:
    from . import llm_kv

    model = args.model
    if model is None:
        from ...models.tiny_llama import build_tiny_llama
        from ..demo import rewrite_available

        rewrite_available(build_tiny_llama(tmp / "tiny.onnx"), tmp / "tiny.npu.onnx")
        model = tmp / "tiny.npu.onnx"
    r = llm_kv.run(str(model), args.prompt_len, args.new_tokens, args.repeats,
                   npu_options=dict(o.split("=", 1) for o in args.npu_option))
    return 0 if r["tokens_identical"] else 1


def _growing_past(args: argparse.Namespace, tmp: Path) -> int:
    """TTFT and inter-token of the naive exporter loop (unpadded prompt, past grown by one each token, as
    ``reference_generate``), NpuEP vs the CPU EP, one intra-op thread each, alternating repeats; tokens must agree.
    Repeat 0's tokens are first calls of their past lengths (what a real decoder pays on every token); the later
    repeats visit the same lengths again."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from ...ep.sessions import tag_session_options
    from ..generation import default_providers, inspect_model

    model = args.model
    if model is None:
        from ...models.tiny_llama import build_tiny_llama
        from ..demo import rewrite_available

        rewrite_available(build_tiny_llama(tmp / "tiny.onnx"), tmp / "tiny.npu.onnx")
        model = tmp / "tiny.npu.onnx"
    info = inspect_model(onnx.load(str(model), load_external_data=False))

    def session(npu: bool) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        providers: list = ["CPUExecutionProvider"]
        if npu:
            tag_session_options(so)
            providers = default_providers()
            providers[0] = (providers[0][0], {"host_threads": "1", **dict(o.split("=", 1) for o in args.npu_option)})
        return ort.InferenceSession(str(model), sess_options=so, providers=providers, enable_fallback=0)

    def generate(sess: ort.InferenceSession, prompt: list[int]) -> tuple[list[int], list[int]]:
        names = [o.name for o in sess.get_outputs()]
        empty = np.zeros((1, info.kv_heads, 0, info.head_dim), np.float32)
        past, ids, tokens, times = [(empty, empty)] * info.n_layers, list(prompt), [], []
        for _ in range(args.growing_past):
            p = past[0][0].shape[2]
            feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, p + len(ids)), np.int64)}
            if info.feeds_position_ids:
                feeds["position_ids"] = np.arange(p, p + len(ids), dtype=np.int64)[None]
            for i, (k, v) in enumerate(past):
                feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = k, v
            t0 = time.perf_counter_ns()
            out = dict(zip(names, sess.run(None, feeds)))
            times.append(time.perf_counter_ns() - t0)
            tokens.append(int(np.argmax(out["logits"][0, -1])))
            past = [(out[f"present.{i}.key"], out[f"present.{i}.value"]) for i in range(info.n_layers)]
            ids = [tokens[-1]]
        return tokens, times

    sessions = {"NpuEP": session(True), "CPU EP": session(False)}
    vocab = info.vocab or 256
    runs: dict[str, list] = {name: [] for name in sessions}
    for rep in range(max(2, args.repeats)):
        prompt = [(7 * i + 3 + rep) % vocab for i in range(GROW_PROMPT)]
        for name, sess in sessions.items():
            time.sleep(SETTLE_S)
            runs[name].append(generate(sess, prompt))
    for a, b in zip(runs["NpuEP"], runs["CPU EP"]):
        assert a[0] == b[0], "NpuEP and CPU EP tokens differ"
    us = lambda v: statistics.median(v) / 1e3
    first = {n: us(r[0][1][1:]) for n, r in runs.items()}
    ttft = {n: us([t[0] for _, t in r[1:]]) for n, r in runs.items()}
    again = {n: statistics.median(statistics.median(t[1:]) for _, t in r[1:]) / 1e3 for n, r in runs.items()}
    print(f"{model}: growing past, prompt {GROW_PROMPT}, {args.growing_past} tokens, tokens identical; host us "
          f"(medians) NpuEP / CPU EP:\n  inter-token, first calls of each past length: {first['NpuEP']:.0f} / "
          f"{first['CPU EP']:.0f} = {first['NpuEP'] / first['CPU EP']:.2f}x\n  TTFT (prompt signature seen): "
          f"{ttft['NpuEP']:.0f} / {ttft['CPU EP']:.0f} = {ttft['NpuEP'] / ttft['CPU EP']:.2f}x\n  inter-token, "
          f"lengths seen before: {again['NpuEP']:.0f} / {again['CPU EP']:.0f} = "
          f"{again['NpuEP'] / again['CPU EP']:.2f}x\n  a new past length's extra (first call - seen): NpuEP "
          f"{first['NpuEP'] - again['NpuEP']:+.0f}, CPU EP {first['CPU EP'] - again['CPU EP']:+.0f} (ORT pays a share "
          f"on both)\n  Python steps on the last new past length (NpuEP): "
          f"{', '.join(python_steps_on_a_new_length(sessions['NpuEP'])) or 'none'}")
    return 0


def python_steps_on_a_new_length(sess) -> list[str]:
    """The steps of the session's programs that ran their Python kernel in the last scouted call (a new input
    signature: a past one longer), as "op (node)": those without a native step and those whose native step declined
    the new inputs (``ep.program.Program._scout``). Each costs a kernel run on every token of a growing past."""
    from ...ep.sessions import session_of

    out = []
    for program in session_of(sess).programs.values():
        declined = set(program._declines)
        for j, step in enumerate(program.steps):
            if j in declined or program._latest_natives.get(id(step)) is None:
                out.append(f"{step.op} ({step.node_name})")
    return out


def _run(args: argparse.Namespace, ap: argparse.ArgumentParser, tmp: Path) -> int:
    from ...models.prompts import PROMPTS
    from ..generation import Generator, default_providers

    model = args.model
    if model is None:
        from ...models.tiny_llama import build_tiny_llama
        from ..demo import rewrite_available

        counts, skipped = rewrite_available(build_tiny_llama(tmp / "tiny.onnx"), tmp / "tiny.npu.onnx")
        model = tmp / "tiny.npu.onnx"
        print("rewritten:", ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
              *(f"\nskipped pass {s}" for s in skipped))
    providers = default_providers()
    if args.npu_option:
        bad = [o for o in args.npu_option if "=" not in o]
        if bad:
            ap.error(f"--npu-option {bad[0]!r}: expected KEY=VALUE")
        providers[0] = (providers[0][0], dict(o.split("=", 1) for o in args.npu_option))
    # the same copying loop on both EPs (the KV resident path is --kv-resident's comparison)
    gens = {"NpuEP": Generator(model, providers=providers, max_kv_len=args.max_kv_len, kv_in_place=False),
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
        med = lambda rs, f: statistics.median(f(r) for r in rs)
        ttft_c, ttft_n = med(cpu, lambda r: r.ttft_s), med(npu, lambda r: r.ttft_s)
        itl_c, itl_n = med(cpu, lambda r: r.mean_itl_s), med(npu, lambda r: r.mean_itl_s)
        worst["ttft"], worst["itl"] = max(worst["ttft"], ttft_n / ttft_c), max(worst["itl"], itl_n / itl_c)
        buckets = "+".join(str(s.shape[0]) for s in npu[0].steps if s.kind != "decode")
        table.add_row(str(len(prompt)), buckets, f"{ttft_c * 1e3:.1f}", f"{ttft_n * 1e3:.1f}",
                      f"{ttft_n / ttft_c:.2f}x",
                      f"{itl_c * 1e3:.2f}", f"{itl_n * 1e3:.2f}", f"{itl_n / itl_c:.2f}x",
                      f"{npu[0].npu_prefill_s * 1e3:.3f}", f"{npu[0].mean_npu_decode_s * 1e3:.4f}")
    console = Console(width=150)
    console.print(table)
    stats = gens["NpuEP"].compile_stats()
    console.print(f"NpuEP session: {stats['npu_partitions']} partitions ({stats['compiles']} compiled, "
                  f"{stats['cache_hits']} cached), {stats['session_s']:.2f} s to create")
    console.print(f"worst ratio NpuEP/CPU: TTFT {worst['ttft']:.2f}x (target <= {TARGET}x: "
                  f"{'met' if worst['ttft'] <= TARGET else 'NOT met'}), inter-token {worst['itl']:.2f}x (target <= "
                  f"{TARGET}x: {'met' if worst['itl'] <= TARGET else 'NOT met'}); load average "
                  f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    console.print(_steady_decode(gens, PROMPTS[0]))
    if args.profile:
        console.print(_decode_profile(gens, PROMPTS[0]))
    return 0


STEADY_BLOCKS, STEADY_RUNS = 5, 100


def _steady_decode(gens: dict, prompt: Sequence[int]) -> str:
    """One decode step of ``prompt`` run again and again with the same feeds, the EPs alternating in blocks: the
    step's own time, without the swings a token's time takes after the pause before each generation on a shared
    host (the inter-token column above)."""
    import numpy as np

    feeds = {}
    for name, gen in gens.items():
        captured: list[dict] = []
        real = gen._runner.run
        gen._runner.run = lambda f, real=real, captured=captured: (captured.append(dict(f)), real(f))[1]
        try:
            gen.generate(prompt, 2, keep_logits=False)  # prefill, then one decode step: the last call
        finally:
            gen._runner.run = real
        feeds[name] = captured[-1]
    samples: dict[str, list[int]] = {name: [] for name in gens}
    for _ in range(STEADY_BLOCKS):
        for name, gen in gens.items():
            time.sleep(SETTLE_S)
            for _ in range(20):
                gen.session.run(None, feeds[name])
            for _ in range(STEADY_RUNS):
                t0 = time.perf_counter_ns()
                gen.session.run(None, feeds[name])
                samples[name].append(time.perf_counter_ns() - t0)
    med = {name: statistics.median(v) / 1e3 for name, v in samples.items()}
    fast = {name: float(np.mean(sorted(v)[: len(v) // 4])) / 1e3 for name, v in samples.items()}
    return (f"steady decode step (prompt {len(prompt)}, the same feeds, {STEADY_BLOCKS} alternating blocks of "
            f"{STEADY_RUNS}): NpuEP {med['NpuEP']:.0f} us, CPU EP {med['CPU EP']:.0f} us (medians), ratio "
            f"{med['NpuEP'] / med['CPU EP']:.2f}x; fastest quarters {fast['NpuEP']:.0f} / {fast['CPU EP']:.0f} us, "
            f"{fast['NpuEP'] / fast['CPU EP']:.2f}x")


def _decode_profile(gens: dict, prompt: Sequence[int]) -> Table:
    """One decode step of ``prompt``: session.run on both EPs with the same feeds, then NpuEP's program and steps."""
    import numpy as np

    from ...ep.program import Program
    from .step_profile import fast_quarter_us, loop_profile, profile_call

    npu = gens["NpuEP"]
    feeds: list[dict] = []
    calls: list[tuple[Program, tuple]] = []
    real_run, real_observe = npu._runner.run, Program._observe
    programs = [p for ep in npu._runner.eps for p in ep.programs.values()]
    if not programs:
        raise RuntimeError("--profile found no NpuEP program behind the benchmarked session")

    def keep_feeds(f):
        feeds.append({k: np.array(v) for k, v in f.items()})
        return real_run(f)

    def keep_inputs(self, inputs):
        calls.append((self, tuple(np.array(x) for x in inputs)))
        return real_observe(self, inputs)

    # ORT's calls reach the program's C++ hot path; recording sends each through the observing call instead
    npu._runner.run, Program._observe = keep_feeds, keep_inputs
    for program in programs:
        program.record = True
    try:
        npu.generate(prompt, 2, keep_logits=False)  # prefill, then one decode step: the last call
    finally:
        npu._runner.run, Program._observe = real_run, real_observe
        for program in programs:
            program.record = False
    decode = feeds[-1]

    def session_us(gen) -> tuple[float, float]:
        """(mean of the fastest quarter, mean) of session.run; the bridge's counters cover the same runs."""
        time.sleep(SETTLE_S)
        for _ in range(20):
            gen.session.run(None, decode)
        samples = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            gen.session.run(None, decode)
            samples.append(time.perf_counter_ns() - t0)
        return fast_quarter_us(samples), float(np.mean(samples)) / 1e3

    from ...kernels.runtime import extension

    extension().reset_stats()
    sess_npu, mean_npu = session_us(npu)
    stats = [st for st in extension().partition_stats().values() if st["calls"]]
    sess_cpu, _ = session_us(gens["CPU EP"])
    last = {}
    for program, inputs in calls:
        last[id(program)] = (program, inputs)  # each partition's decode call
    table = Table(title=f"one decode step (prompt {len(prompt)}), host us, mean of the fastest quarter of 200")
    for col in ("what", "steps", "total", "native", "Python + numpy"):
        table.add_column(col, justify="right")
    table.add_row("session.run CPU EP", "", f"{sess_cpu:.1f}", "", "")
    table.add_row("session.run NpuEP", "", f"{sess_npu:.1f}", "", "")
    for program, inputs in last.values():
        prof = profile_call(program, inputs)
        table.add_row(f"program() of partition {program.label.split(' ')[0]}", str(len(program.steps)),
                      f"{prof.call_us:.1f}", "", "")
        for o in prof.ops:
            table.add_row(f"  {o.op}", str(o.steps), f"{o.total_us:.1f}", f"{o.native_us:.1f}", f"{o.python_us:.1f}")
        table.add_row("  steps timed one by one, summed", "", f"{prof.steps_us:.1f}", "", "")
    # means over the same 200 NpuEP runs (the bridge counts means): its Compute callback, the program inside it
    calls_n = sum(st["calls"] for st in stats) or 1
    total = sum(st["total_ns"] for st in stats) / calls_n / 1e3
    inside = sum(st["program_ns"] for st in stats) / calls_n / 1e3
    table.add_row("session.run NpuEP, mean of the same runs", "", f"{mean_npu:.1f}", "", "")
    table.add_row("  program inside it (bridge counter, mean)", "", f"{inside:.1f}", "", "")
    table.add_row("  bridge around the program (mean)", "", f"{total - inside:.1f}", "", "")
    table.add_row("  ORT around the partition (mean)", "", f"{mean_npu - total:.1f}", "", "")
    for program in {id(p): p for p, _ in calls}.values():
        if not program._bound:
            continue
        table.add_row(f"inside session.run: partition {program.label.split(' ')[0]}, by op and step kind (mean)",
                      "", "", "", "")
        for row in loop_profile(program, lambda: npu.session.run(None, decode)):
            table.add_row(f"  {row.op} ({row.kind})", str(row.steps), f"{row.us_per_call:.1f}", "", "")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
