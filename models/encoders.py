"""Tiny random BERT-style and ViT-style encoders exported by ``torch.onnx.export`` (needs torch + transformers):
the encoder graphs users bring (LayerNorm, Gelu/Erf, attention with a padding mask, patch-embedding Conv), with
no download. Weights are redrawn with scale ~1/sqrt(fan_in), as in ``torch_export`` (HF's default std 0.02
leaves attention almost uniform, which would let a broken kernel pass).

Graph contract:
  bert  input_ids, attention_mask, token_type_ids [batch, sequence] int64 -> last_hidden_state [batch, sequence, D],
        pooler_output [batch, D]
  vit   pixel_values [batch, 3, IMAGE, IMAGE] float32 -> logits [batch, LABELS]

torch and transformers are imported inside the functions only: importing this module needs neither.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np

KINDS: tuple[str, ...] = ("bert", "vit")
EXPORTERS: tuple[str, ...] = ("dynamo", "torchscript")
VOCAB, IMAGE, PATCH, LABELS = 512, 32, 8, 10


class EncoderExportError(RuntimeError):
    """The encoder cannot be exported here (missing packages, bad arguments); the message says why."""


def _require_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise EncoderExportError(f"exporting needs torch and transformers ({e.name} is not installed): "
                                 "pip install torch==2.13.0 transformers") from None
    return torch, transformers


def _check(kind: str, exporter: str) -> None:
    if kind not in KINDS:
        raise EncoderExportError(f"unknown encoder {kind!r}; expected one of {', '.join(KINDS)}")
    if exporter not in EXPORTERS:
        raise EncoderExportError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")


def make_encoder(kind: str, *, layers: int = 2, hidden: int = 64, heads: int = 4, seed: int = 0) -> Any:
    """A float32 eval-mode torch module with the graph contract's flat inputs and outputs."""
    _check(kind, "dynamo")
    torch, transformers = _require_torch()
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=2 * hidden, attn_implementation="eager")
    if kind == "bert":
        inner = transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=64,
                                                               **common))
    else:
        inner = transformers.ViTForImageClassification(transformers.ViTConfig(
            image_size=IMAGE, patch_size=PATCH, num_channels=3, num_labels=LABELS, **common))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in inner.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))

    class Bert(torch.nn.Module):  # named arguments: the dynamo exporter maps dynamic axes by parameter
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    class Vit(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            return self.inner(pixel_values=pixel_values).logits

    return (Bert if kind == "bert" else Vit)().eval().float()


def io_names(kind: str) -> tuple[list[str], list[str]]:
    if kind == "bert":
        return ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler_output"]
    return ["pixel_values"], ["logits"]


def sample_feeds(kind: str, rng: np.random.Generator, batch: int = 2, sequence: int = 16) -> dict[str, np.ndarray]:
    """Inputs by graph-input name; BERT's last row is padded (mask zeros) after 10 tokens."""
    if kind == "vit":
        return {"pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32)}
    mask = np.ones((batch, sequence), np.int64)
    mask[-1, min(10, sequence - 1):] = 0
    return {"input_ids": rng.integers(0, VOCAB, (batch, sequence)).astype(np.int64), "attention_mask": mask,
            "token_type_ids": np.zeros((batch, sequence), np.int64)}


def export_encoder(kind: str, path: str | Path, *, exporter: str = "dynamo", seed: int = 0) -> Path:
    """Export a tiny ``kind`` encoder to ``path`` (the dynamo exporter may put weights in ``path.data``); batch
    (and BERT's sequence) dynamic."""
    _check(kind, exporter)
    torch, _ = _require_torch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = make_encoder(kind, seed=seed)
    feeds = sample_feeds(kind, np.random.default_rng(seed))
    inputs, outputs = io_names(kind)
    args = tuple(torch.from_numpy(feeds[n]) for n in inputs)
    dyn = {n: {0: "batch", 1: "sequence"} for n in inputs} if kind == "bert" else {"pixel_values": {0: "batch"}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dyn,
                          dynamo=exporter == "dynamo", opset_version=18 if exporter == "dynamo" else 17)
    return path


def run_torch(kind: str, feeds: dict[str, np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """The torch module's outputs on ``feeds`` (the reference an exported graph is checked against)."""
    torch, _ = _require_torch()
    model = make_encoder(kind, seed=seed)
    with torch.no_grad():
        out = model(*(torch.from_numpy(feeds[n]) for n in io_names(kind)[0]))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
