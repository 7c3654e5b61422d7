"""Session start: cold compile vs warm from the on-disk cache vs warm from an EPContext model (issue 5).

Builds the tiny decoder LLM from ``models/``, then times ``InferenceSession`` creation on NpuEP, in one process:
1. cold: empty cache directory (every partition compiled, weights re-laid out);
2. warm cache: same model, same cache directory (programs loaded: no prepare, no re-packing);
3. warm EPContext: a ``_ctx.onnx`` dumped in step 1 (embed_mode=1), loaded with the cache disabled;
and again with a simulated slow compiler (every kernel ``prepare`` delayed) to show warm starts do not depend on
compiler time. Usage: ``python -m npu_ep.tools.bench.context [--layers 4] [--compile-delay-ms 20]``.
"""

from __future__ import annotations

from ...ep.registration import get_ep_name

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

from npu_ep.kernels import registry
from npu_ep.models.tiny_llama import LlamaConfig, build_tiny_llama


def _create(model: str, options: dict, **config: str) -> float:
    so = ort.SessionOptions()
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    t0 = time.perf_counter()
    ort.InferenceSession(model, so, providers=[(get_ep_name(), options), "CPUExecutionProvider"],
                         enable_fallback=0)
    return time.perf_counter() - t0


def _slow_prepare(delay_s: float):
    """Wrap every kernel's prepare with a sleep: a stand-in for an expensive NPU compiler."""
    registry._load_ops()
    saved = dict(registry.KERNELS)
    for key, k in saved.items():
        def prepare(node, target, _inner=k.prepare):
            time.sleep(delay_s)
            return _inner(node, target)
        registry.KERNELS[key] = dataclasses.replace(k, prepare=prepare)
    return saved


def measure(work: Path, layers: int, delay_s: float, repeats: int = 3) -> dict[str, float]:
    model = str(build_tiny_llama(work / "llm.onnx", LlamaConfig(num_hidden_layers=layers)))
    _create(model, {"cache_dir": ""})  # warm-up: imports, kernel registry, ORT's own first-session costs
    cpu_t0 = time.perf_counter()
    ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    cpu_only = time.perf_counter() - cpu_t0
    saved = _slow_prepare(delay_s) if delay_s else None
    try:
        cold = []
        for i in range(repeats):
            cold.append(_create(model, {"cache_dir": str(work / f"cache{i}")}))
        ctx = str(work / "llm_ctx.onnx")
        _create(model, {"cache_dir": ""}, **{"ep.context_enable": "1", "ep.context_file_path": ctx,
                                             "ep.context_embed_mode": "1"})
        warm_cache = [_create(model, {"cache_dir": str(work / "cache0")}) for _ in range(repeats)]
        warm_ctx = [_create(ctx, {"cache_dir": ""}) for _ in range(repeats)]
    finally:
        if saved is not None:
            registry.KERNELS.clear()
            registry.KERNELS.update(saved)
    return {"cpu_ep_s": cpu_only, "cold_s": statistics.median(cold), "warm_cache_s": statistics.median(warm_cache),
            "warm_epcontext_s": statistics.median(warm_ctx)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--compile-delay-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    print(f"{'compiler':>22s} {'cold (s)':>9s} {'warm cache (s)':>15s} {'warm EPContext (s)':>19s} "
          f"{'cache/cold':>11s} {'ctx/cold':>9s} {'CPU EP only (s)':>16s}")
    with tempfile.TemporaryDirectory() as tmp:
        for delay in (0.0, args.compile_delay_ms / 1e3):
            work = Path(tmp) / f"d{delay}"
            work.mkdir()
            r = measure(work, args.layers, delay)
            label = "as is" if not delay else f"+{delay * 1e3:.0f} ms per op"
            print(f"{label:>22s} {r['cold_s']:9.3f} {r['warm_cache_s']:15.3f} {r['warm_epcontext_s']:19.3f} "
                  f"{r['warm_cache_s'] / r['cold_s']:11.3f} {r['warm_epcontext_s'] / r['cold_s']:9.3f} "
                  f"{r['cpu_ep_s']:16.3f}")
    print("target: warm <= 1/10 of cold, and warm independent of compiler time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
