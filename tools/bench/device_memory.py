"""NpuEP's two memories on the default path: partition inputs/outputs in host memory (its "host" OrtEpDevice, what
``providers=["NpuEP"]`` selects) or in NPU memory (its "npu" OrtEpDevice: ORT places them there and copies through
NpuEP's data transfer at every CPU<->NPU boundary).

    python -m npu_ep.tools.bench.device_memory [--reps 40] [--rounds 4] [--tokens 16]

Models: the small conv net of ``bench.convnet`` (1x3x64x64) and the demo decoder (``models.tiny_llama``, as built,
a 17-token prompt and ``--tokens`` greedy tokens through ``tools.generation.Generator`` with host KV arrays, i.e. the
copying path). The CPU EP and NpuEP on each device run in alternating blocks (``bench.timing``); printed: the median
run (conv: one session.run; decoder: one whole generation), its ratio to the CPU EP's in the same blocks, and the
NPU device's copies per run (count, bytes, emulated DMA us from the target's DMA formula).
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import statistics
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort

from npu_ep.ep.device_memory import add_npu_ep, device_counters
from npu_ep.ep.sessions import tag_session_options

from .timing import alternating_blocks, block_ratios

EPS = ("cpu", "host", "npu")
COPY_KEYS = ("copies_to_npu", "copies_to_host", "bytes_to_npu", "bytes_to_host", "dma_us_to_npu", "dma_us_to_host")


def session(model: onnx.ModelProto, ep: str) -> ort.InferenceSession:
    """The CPU EP, or NpuEP on its ``ep`` memory device with the CPU EP after it; NpuEP's failures raise."""
    if ep == "cpu":
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    tag_session_options(so)
    add_npu_ep(so, {"cache_dir": "", "log_level": "error"}, memory=ep)
    sess = ort.InferenceSession(model.SerializeToString(), so, enable_fallback=0)
    if not any(sg.ep_name == get_ep_name() for sg in sess.get_provider_graph_assignment_info()):
        raise RuntimeError(f"NpuEP ({ep} memory) took no node of {model.graph.name}")
    return sess


def conv_runs() -> tuple[dict[str, Callable[[], object]], dict[str, ort.InferenceSession]]:
    from .convnet import small_net

    model = small_net()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    sessions = {ep: session(model, ep) for ep in EPS}
    return {ep: (lambda s=s: s.run(None, {"x": x})) for ep, s in sessions.items()}, sessions


def decoder_runs(tokens: int) -> tuple[dict[str, Callable[[], object]], dict[str, ort.InferenceSession]]:
    from ...models.prompts import PROMPTS
    from ...models.tiny_llama import build_tiny_llama_proto
    from ..generation import Generator

    model = build_tiny_llama_proto()
    sessions = {ep: session(model, ep) for ep in EPS}
    gens = {ep: Generator(s, kv_in_place=False) for ep, s in sessions.items()}
    outs = {ep: g.generate(PROMPTS[1], tokens).tokens for ep, g in gens.items()}
    if len({tuple(t) for t in outs.values()}) != 1:
        raise RuntimeError(f"the decoder's tokens differ between EPs: {outs}")
    return {ep: (lambda g=g: g.generate(PROMPTS[1], tokens, keep_logits=False)) for ep, g in gens.items()}, sessions


def measure(runs: dict[str, Callable[[], object]], sessions: dict[str, ort.InferenceSession], reps: int,
            rounds: int) -> dict[str, dict]:
    before = device_counters(sessions["npu"])
    blocks = alternating_blocks(runs, reps, rounds)
    after = device_counters(sessions["npu"])
    n_npu = sum(len(b) for b in blocks["npu"]) + 1  # + the warm-up call alternating_blocks made
    out = {ep: {"median_ms": statistics.median(t for b in blocks[ep] for t in b) * 1e3} for ep in EPS}
    for ep in ("host", "npu"):
        out[ep]["ratio_vs_cpu"] = statistics.median(block_ratios(blocks, ep, "cpu"))
    out["npu"]["per_run"] = {k: (after[k] - before[k]) / n_npu for k in COPY_KEYS}
    return out


def report(name: str, r: dict[str, dict]) -> None:
    print(f"{name}: CPU EP {r['cpu']['median_ms']:.3f} ms; NpuEP host memory {r['host']['median_ms']:.3f} ms "
          f"({r['host']['ratio_vs_cpu']:.2f}x); NpuEP NPU memory {r['npu']['median_ms']:.3f} ms "
          f"({r['npu']['ratio_vs_cpu']:.2f}x)")
    c = r["npu"]["per_run"]
    print(f"  NPU memory, per run: {c['copies_to_npu']:.1f} copies to the NPU ({c['bytes_to_npu']:.0f} B, "
          f"{c['dma_us_to_npu']:.2f} us DMA), {c['copies_to_host']:.1f} to the host ({c['bytes_to_host']:.0f} B, "
          f"{c['dma_us_to_host']:.2f} us DMA)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    report("conv net 1x3x64x64", measure(*conv_runs(), args.reps, args.rounds))
    report(f"demo decoder, 17-token prompt + {args.tokens} tokens", measure(*decoder_runs(args.tokens),
                                                                          max(args.rounds, args.reps // 4),
                                                                          args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
