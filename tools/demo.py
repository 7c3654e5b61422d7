"""The README's main job: tiny Llama -> npu-rewrite (RoPE, GQA, INT4) -> prefill + decode on NpuEP -> numbers.

``python -m npu_ep.tools.demo [--out DIR] [--max-new-tokens N]`` builds the demo decoder (seeded, no downloads),
rewrites it with every available pass (a missing pass is reported and skipped), generates greedily on NpuEP with
bucketed prefill entries (the prompt's padding waste beside what one bucket would waste) and a fixed-capacity KV
cache, checks the tokens against ORT's CPU EP on the same model, and prints the generated ids, TTFT and inter-token
latency (host wall time and emulated NPU time), the coverage (nodes on NpuEP / total, from ORT's graph assignment
record) and writes the HTML report when ``npu_ep.tools.report`` is present. A few seconds to a minute on 2 cores.
"""

from __future__ import annotations

from ..ep.registration import get_ep_name
from .report.build import build_report

import argparse
import importlib.util
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

DEMO_PASSES = ("cleanup", "rope", "gqa", "int4")


def rewrite_available(src: Path, dst: Path, passes: Sequence[str] = DEMO_PASSES) -> tuple[dict, list[str]]:
    """Rewrite with every pass that exists; returns ({rule: count}, [skipped pass: reason])."""
    from ..rewriter import RewriteError, rewrite

    wanted, skipped = list(passes), []
    while wanted:
        try:
            result = rewrite(str(src), passes=tuple(wanted))
            result.save(dst)
            return dict(result.report.counts), skipped
        except RewriteError as exc:
            bad = next((p for p in wanted if f"pass {p!r}" in str(exc)), None)
            if bad is None:
                raise
            wanted.remove(bad)
            skipped.append(f"{bad}: {exc}")
    raise RuntimeError("no rewrite pass is available")


def coverage(session) -> tuple[int, int]:
    """(nodes on NpuEP, total nodes) from ORT's graph assignment record."""

    on, total = 0, 0
    for sg in session.get_provider_graph_assignment_info():
        n = len(sg.get_nodes())
        total += n
        if sg.ep_name == get_ep_name():
            on += n
    return on, total


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.tools.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for the models and the report (default: a temp folder)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=2, help="index into npu_ep.models.prompts.PROMPTS")
    args = ap.parse_args(argv)

    from ..models.prompts import PROMPTS
    from ..models.tiny_llama import build_tiny_llama
    from .generation import Generator, default_providers, plan_prefill
    from .npu_generate import format_result

    out = Path(args.out or tempfile.mkdtemp(prefix="npu_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    src = build_tiny_llama(out / "tiny_llama.onnx")
    print(f"[1/4] built {src}")
    dst = out / "tiny_llama.npu.onnx"
    counts, skipped = rewrite_available(src, dst)
    print(f"[2/4] rewrote -> {dst}: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    for s in skipped:
        print(f"      pass skipped (not available): {s}")

    prompt = PROMPTS[args.prompt]
    npu = Generator(dst, providers=default_providers())
    res = npu.generate(prompt, args.max_new_tokens)
    cpu = Generator(dst, providers=["CPUExecutionProvider"]).generate(prompt, args.max_new_tokens)
    same = res.tokens == cpu.tokens
    diff = max(float(np.abs(a - b).max()) for a, b in zip(res.logits, cpu.logits))
    print(f"[3/4] generated on NpuEP\n{format_result(res)}")
    one_step = plan_prefill(len(prompt), npu.buckets, chunked=False)[0].bucket  # the whole prompt in one bucket
    print(f"      prefill entries: {res.padding.waste:.0%} padding waste; one {one_step}-token bucket would waste "
          f"{1 - len(prompt) / one_step:.0%}")
    print(f"      CPU EP reference: tokens {'IDENTICAL' if same else 'DIFFERENT'}, max |logits diff| {diff:.2e}; "
          f"CPU EP TTFT {cpu.ttft_s * 1e3:.1f} ms, inter-token {cpu.mean_itl_s * 1e3:.1f} ms (host)")
    on, total = coverage(npu.session)
    stats = npu.compile_stats()
    print(f"      coverage: {on}/{total} nodes on NpuEP ({on / max(total, 1):.0%}); {stats['npu_partitions']} NpuEP "
          f"partitions, {stats['compiles']} compiled, {stats['cache_hits']} from the compiled-context cache")

    if importlib.util.find_spec("npu_ep.tools.report") is None:
        print("[4/4] HTML report skipped: npu_ep.tools.report is not available")
    else:
        try:
            from .report.html import write_html

            doc = build_report(npu.session, model=str(dst))
            html = out / "report.html"
            write_html(doc, html)
            print(f"[4/4] HTML report: {html}")
        except Exception as exc:  # noqa: BLE001 - the report is optional for the demo; say why it is missing
            print(f"[4/4] HTML report failed: {type(exc).__name__}: {exc}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
