"""onnxruntime-genai's own generation loop on NpuEP vs its CPU provider, same model folder, same run: time to the
first token (prefill) and mean time per later token, as ratios; tokens must be identical.

``python -m npu_ep.tools.bench.genai [--folder DIR] [--new-tokens N] [--repeats R]`` (needs onnxruntime-genai;
without ``--folder`` it builds the tiny genai Llama, which needs torch and transformers too). Each provider's model
is loaded once and warmed up; the repeats alternate between them, each after a pause that lets the other's ORT
worker threads stop spinning, and the medians are printed.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name, register_with_genai

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

SETTLE_S = 0.25  # see bench.kernels.SETTLE_S
PROMPT = [1, 5, 6, 7, 8]


def _run(og, model, new_tokens: int) -> tuple[list[int], float, list[float]]:
    params = og.GeneratorParams(model)
    length = len(PROMPT) + new_tokens
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(PROMPT)
    gen.generate_next_token()
    ttft = time.perf_counter() - t0
    itl = []
    while not gen.is_done():
        t0 = time.perf_counter()
        gen.generate_next_token()
        itl.append(time.perf_counter() - t0)
    return [int(t) for t in gen.get_sequence(0)][len(PROMPT):], ttft, itl


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.bench.genai", description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=None, help="genai model folder (default: build the tiny genai Llama)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256, help="width of the built model (intermediate: 2x)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the built model")
    ap.add_argument("--extra-options", nargs="*", default=[], metavar="KEY=VALUE",
                    help="genai builder options of the built model (e.g. accuracy_level=0)")
    args = ap.parse_args(argv)

    import onnxruntime_genai as og

    with tempfile.TemporaryDirectory(prefix="npu_bench_genai_") as tmp:
        folder = args.folder
        if folder is None:
            from ...models.genai_llama import GenaiLlamaConfig, build_genai_llama

            cfg = GenaiLlamaConfig(hidden=args.hidden, intermediate=2 * args.hidden, layers=args.layers,
                                   extra_options=tuple(args.extra_options))
            folder = build_genai_llama(Path(tmp) / "tiny_llama", cfg)
        return _bench(og, folder, args)


def _bench(og, folder, args) -> int:
    register_with_genai(og)
    models = {}
    for name in ("CPU", "NpuEP"):
        cfg = og.Config(str(folder))
        cfg.clear_providers()
        if name == "NpuEP":
            cfg.append_provider(get_ep_name())
        models[name] = og.Model(cfg)
    tokens = {name: _run(og, m, args.new_tokens)[0] for name, m in models.items()}  # warm-up
    ttft: dict[str, list[float]] = {n: [] for n in models}
    itl: dict[str, list[float]] = {n: [] for n in models}
    for _ in range(args.repeats):
        for name, m in models.items():
            time.sleep(SETTLE_S)
            got, first, rest = _run(og, m, args.new_tokens)
            if got != tokens[name]:
                raise SystemExit(f"{name}: tokens changed between runs")
            ttft[name].append(first)
            itl[name].append(statistics.fmean(rest) if rest else 0.0)
    same = tokens["CPU"] == tokens["NpuEP"]
    first_diff = next((i for i, (a, b) in enumerate(zip(tokens["CPU"], tokens["NpuEP"])) if a != b), None)
    print(f"{folder}: prompt {len(PROMPT)} tokens, {args.new_tokens} new, median of {args.repeats}; "
          f"tokens identical: {same}" + ("" if same else f" (first difference at new token {first_diff})"))
    med = {k: {n: statistics.median(v) * 1e3 for n, v in d.items()} for k, d in (("ttft", ttft), ("itl", itl))}
    for key, label in (("ttft", "first token (prefill)"), ("itl", "per later token")):
        cpu, npu = med[key]["CPU"], med[key]["NpuEP"]
        print(f"{label:22s} CPU {cpu:8.3f} ms  NpuEP {npu:8.3f} ms  ratio {npu / cpu:5.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
