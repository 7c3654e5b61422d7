"""Tiny random Hugging Face decoders exported to ONNX by torch's own exporters (needs torch + transformers).

The torch-free generator (``tiny_llama.py``) imitates exporter output; this module produces the real thing, so
the rewriter is tested on graphs that ``torch.onnx.export`` actually emits, with both the dynamo exporter
(``torch.export`` + onnxscript's torchlib) and the legacy TorchScript exporter.

Dimensions: B batch, S sequence (new tokens), P past, T total (= P + S), N query heads, Nkv kv heads, H head dim,
D hidden (= N * H), V vocab.

Graph contract (Optimum / onnxruntime-genai names, the same as ``tiny_llama.py``):
  inputs  input_ids [B,S] int64, attention_mask [B,T] int64, position_ids [B,S] int64,
          past_key_values.{i}.key / .value [B,Nkv,P,H] float32
  outputs logits [B,S,V] float32, present.{i}.key / .value [B,Nkv,T,H] float32

Architectures (configs built in code, weights random and seeded, no downloads):
  llama  RMSNorm, rotate_half RoPE, GQA (kv_heads < heads), SwiGLU
  qwen2  as llama, with q/k/v biases
  phi3   fused qkv_proj and gate_up_proj, GQA
  gptj   interleaved (rotate_every_two) partial RoPE (rotary_dim = head_dim / 2), LayerNorm, parallel attention +
         MLP, no GQA (kv_heads == heads), biases on the MLP and lm_head

Attention is exported with transformers' "eager" implementation (the decomposed MatMul/Softmax graph the
rewriter normalizes); ``attn_implementation="sdpa"`` is accepted for experiments.

torch and transformers are imported inside the functions only: importing this module needs neither.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

ARCHS: tuple[str, ...] = ("llama", "qwen2", "phi3", "gptj")
EXPORTERS: tuple[str, ...] = ("dynamo", "torchscript")

# sample shapes used for tracing: all distinct and > 1 so no dimension is specialized to a constant
_TRACE_BATCH, _TRACE_SEQ, _TRACE_PAST = 2, 3, 5


class ExportError(RuntimeError):
    """An architecture/exporter combination cannot be exported here; the message says why."""


def _require_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ExportError(f"exporting needs torch and transformers ({e.name} is not installed): "
                          "pip install torch==2.13.0 transformers") from None
    return torch, transformers


def check_args(arch: str, exporter: str = "dynamo", *, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
    """Raise ``ExportError`` for arguments no torch version could export (checked before importing torch)."""
    if arch not in ARCHS:
        raise ExportError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHS)}")
    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    if min(hidden, heads, kv_heads) < 1 or hidden % heads or heads % kv_heads or (hidden // heads) % 2:
        raise ExportError(f"hidden {hidden} / heads {heads} / kv_heads {kv_heads}: hidden must be a multiple of "
                          "heads, the head dim even, and heads a multiple of kv_heads")
    if arch == "gptj" and kv_heads != heads:
        raise ExportError(f"gptj has no grouped KV heads: kv_heads ({kv_heads}) must equal heads ({heads})")


def make_config(arch: str, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                vocab: int = 256, intermediate: int | None = None, max_positions: int = 256,
                attn_implementation: str = "eager") -> Any:
    """A transformers config for a tiny ``arch`` decoder (see the module docstring)."""
    check_args(arch, hidden=hidden, heads=heads, kv_heads=kv_heads)
    _, transformers = _require_torch()
    intermediate = intermediate or 2 * hidden
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                  tie_word_embeddings=False, use_cache=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, use_sliding_window=False)
    elif arch == "phi3":
        cfg = transformers.Phi3Config(**common, original_max_position_embeddings=max_positions)
    else:
        cfg = transformers.GPTJConfig(vocab_size=vocab, n_positions=max_positions, n_embd=hidden, n_layer=layers,
                                      n_head=heads, rotary_dim=hidden // heads // 2, n_inner=intermediate,
                                      tie_word_embeddings=False, use_cache=True, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = attn_implementation
    return cfg


def make_model(arch: str, *, seed: int = 0, **config_kwargs: Any) -> Any:
    """A randomly initialized ``AutoModelForCausalLM`` in eval mode, float32.

    Weights are redrawn after construction with scale ~1/sqrt(fan_in) (HF's default std 0.02 leaves attention
    almost uniform and logits almost flat, which would let numeric tests pass on a broken rewrite).
    """
    torch, transformers = _require_torch()
    cfg = make_config(arch, **config_kwargs)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=cfg._attn_implementation)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    return model.eval().float()


def kv_layout(model: Any) -> tuple[int, int, int]:
    """(layers, Nkv, H) of the KV cache of a transformers causal LM."""
    cfg = model.config.get_text_config(decoder=True)
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return layers, kv, head_dim


def _make_wrapper(torch: Any, transformers: Any, model: Any) -> Any:
    """A module with flat tensor inputs/outputs: (input_ids, attention_mask, position_ids, past tuple) ->
    (logits, present.0.key, present.0.value, ...), building the DynamicCache transformers expects."""
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers 5 renamed the argument
    dynamic_cache = transformers.DynamicCache

    class KVWrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, past):
            pairs = [(past[i], past[i + 1]) for i in range(0, len(past), 2)]
            cache = dynamic_cache(pairs, config=self.model.config)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, **{cache_kw: cache})
            new_cache = out[cache_kw] if cache_kw in out else out["past_key_values"]
            present = []
            for layer in new_cache.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return KVWrapper().eval()


def io_names(layers: int) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    for i in range(layers):
        inputs += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outputs += [f"present.{i}.key", f"present.{i}.value"]
    return inputs, outputs


def sample_inputs(model: Any, batch: int = _TRACE_BATCH, seq: int = _TRACE_SEQ, past: int = _TRACE_PAST,
                  seed: int = 0) -> tuple:
    """Tracing inputs: (input_ids, attention_mask, position_ids, past tuple)."""
    torch, _ = _require_torch()
    layers, nkv, hd = kv_layout(model)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq, dtype=torch.int64).expand(batch, seq).contiguous()
    kv = tuple(torch.randn(batch, nkv, past, hd, generator=gen) for _ in range(2 * layers))
    return ids, mask, pos, kv


def run_torch(model: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """Run ``model`` through the export wrapper on numpy ``feeds`` (graph-input names); numpy outputs by graph
    output name. The reference the exported graph is checked against."""
    torch, transformers = _require_torch()
    layers = kv_layout(model)[0]
    in_names, out_names = io_names(layers)
    args = [torch.from_numpy(feeds[name]) for name in in_names]
    with torch.no_grad():
        outs = _make_wrapper(torch, transformers, model)(*args[:3], tuple(args[3:]))
    return {name: t.numpy() for name, t in zip(out_names, outs)}


def export_model(model: Any, path: str | Path, *, exporter: str = "dynamo", opset: int | None = None) -> Path:
    """Export a transformers causal LM with the past-KV contract to ``path`` (one file, no external data)."""
    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")
    torch, transformers = _require_torch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = _make_wrapper(torch, transformers, model)
    layers = kv_layout(model)[0]
    in_names, out_names = io_names(layers)
    args = sample_inputs(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            _export_dynamo(torch, wrapper, args, path, in_names, out_names, layers, opset)
        else:
            _export_torchscript(torch, wrapper, args, path, in_names, out_names, opset)
    _annotate(path, model, exporter)
    return path


def _export_dynamo(torch, wrapper, args, path, in_names, out_names, layers, opset) -> None:
    dim = torch.export.Dim
    batch, seq, past, total = dim("batch"), dim("sequence"), dim("past_sequence"), dim("total_sequence")
    kv = {0: batch, 2: past}
    dynamic_shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
                      tuple(kv for _ in range(2 * layers)))
    quiet = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        program = torch.onnx.export(wrapper, args, dynamo=True, input_names=in_names, output_names=out_names,
                                    dynamic_shapes=dynamic_shapes, opset_version=opset or 18,
                                    external_data=False, verbose=False)
    except Exception as e:  # torch raises many kinds; the first line says why
        raise ExportError(f"dynamo export failed: {type(e).__name__}: {_first_line(e)}") from e
    finally:
        quiet.setLevel(level)
    program.save(str(path), external_data=False)


def _export_torchscript(torch, wrapper, args, path, in_names, out_names, opset) -> None:
    dynamic_axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"},
                    "position_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    for name in in_names[3:]:
        dynamic_axes[name] = {0: "batch", 2: "past_sequence"}
    for name in out_names[1:]:
        dynamic_axes[name] = {0: "batch", 2: "total_sequence"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(wrapper, args, str(path), dynamo=False, input_names=in_names, output_names=out_names,
                              dynamic_axes=dynamic_axes, opset_version=opset or 17, do_constant_folding=True)
    except Exception as e:
        raise ExportError(f"torchscript export failed: {type(e).__name__}: {_first_line(e)}") from e


def _annotate(path: Path, model: Any, exporter: str) -> None:
    """Record the config in metadata (max_position_embeddings sizes the rewriter's RoPE cache)."""
    import onnx

    proto = onnx.load(str(path))
    cfg = model.config
    meta = {"npu_ep.exporter": exporter, "npu_ep.arch": cfg.model_type,
            "max_position_embeddings": str(getattr(cfg, "max_position_embeddings", None)
                                           or cfg.n_positions)}
    for k, v in meta.items():
        entry = next((p for p in proto.metadata_props if p.key == k), None) or proto.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(proto, str(path))


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def export_tiny_hf(arch: str, path: str | Path, *, exporter: str = "dynamo", seed: int = 0, layers: int = 2,
                   hidden: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 256,
                   intermediate: int | None = None, max_positions: int = 256, attn_implementation: str = "eager",
                   opset: int | None = None) -> Path:
    """Build a tiny random ``arch`` decoder and export it with ``exporter`` to ``path``; returns the path.

    Raises ``ExportError`` (naming the arch, exporter and reason) when the combination cannot be exported.
    For gptj, ``kv_heads`` is ignored (set to ``heads``).
    """
    if arch == "gptj":
        kv_heads = heads
    check_args(arch, exporter, hidden=hidden, heads=heads, kv_heads=kv_heads)
    model = make_model(arch, seed=seed, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab,
                       intermediate=intermediate, max_positions=max_positions,
                       attn_implementation=attn_implementation)
    try:
        return export_model(model, path, exporter=exporter, opset=opset)
    except ExportError as e:
        raise ExportError(f"{arch} with the {exporter} exporter: {e}") from e.__cause__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.models.torch_export", description=__doc__.splitlines()[0])
    ap.add_argument("arch", choices=ARCHS)
    ap.add_argument("out", help="output .onnx path")
    ap.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=None)
    ap.add_argument("--max-positions", type=int, default=256)
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager", help="transformers attention impl")
    a = ap.parse_args(argv)
    try:
        path = export_tiny_hf(a.arch, a.out, exporter=a.exporter, seed=a.seed, layers=a.layers, hidden=a.hidden,
                              heads=a.heads, kv_heads=a.kv_heads, vocab=a.vocab, intermediate=a.intermediate,
                              max_positions=a.max_positions, attn_implementation=a.attn)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {a.arch}, {a.exporter} exporter)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
