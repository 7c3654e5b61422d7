"""A QNN-style a16w8 decoder: a random Llama exported by torch (``torch_export``), then quantized with ORT's QNN
recipe (``get_qnn_qdq_config`` + ``quantize``: uint16 activations through com.microsoft Q/DQ, uint8 weights; a8w8
and a16w4 on request), the graph a Qualcomm user brings. Random weights, no download; the width is a real one
(hidden 2048) so the weight DQs, the 16-bit activation units and the exporter's mask plumbing look as they do in a
shipped 1B model.

Calibration: a few feeds of 8 new tokens after a random 4-token past, in the graph contract of ``torch_export``
(input_ids, attention_mask, position_ids, past_key_values.*).

torch and transformers are imported inside the functions only (through ``torch_export``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

DEFAULTS = dict(layers=2, hidden=2048, heads=32, kv_heads=8, vocab=1024, intermediate=5632)


def sample_feeds(model_path: str | Path, seed: int = 0, *, batch: int = 1, seq: int = 8, past: int = 4
                 ) -> dict[str, np.ndarray]:
    """One feed dict for the exported decoder at ``model_path`` (sizes read from its graph inputs)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    vocab = 2
    for init in graph.initializer:  # the embedding table is the initializer Gather reads input_ids through
        if len(init.dims) == 2 and init.dims[0] > vocab and init.dims[0] < 300000 and "embed" in init.name:
            vocab = int(init.dims[0])
    for vi in graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "input_ids":
            feeds[vi.name] = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
        elif vi.name == "attention_mask":
            feeds[vi.name] = np.ones((batch, past + seq), np.int64)
        elif vi.name == "position_ids":
            feeds[vi.name] = np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), (batch, seq)).copy()
        else:  # past_key_values.{i}.key/value [B, Nkv, P, H]
            feeds[vi.name] = rng.standard_normal((batch, dims[1], past, dims[3])).astype(np.float32)
    return feeds


class _Reader:
    """ORT's CalibrationDataReader protocol over a list of feed dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def quantize_qnn(float_path: str | Path, out_path: str | Path, *, samples: int = 2, activation_bits: int = 16,
                 weight_bits: int = 8, per_channel: bool = False) -> Path:
    """Quantize ``float_path`` with ORT's QNN config into ``out_path``: unsigned activations and weights of the
    given widths (a16w8 by default; 8 or 16 bits for activations, 4, 8 or 16 for weights)."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    types = {4: QuantType.QUInt4, 8: QuantType.QUInt8, 16: QuantType.QUInt16}
    if activation_bits not in (8, 16) or weight_bits not in types:
        raise ValueError(f"a{activation_bits}w{weight_bits}: activations take 8 or 16 bits, weights 4, 8 or 16")
    feeds = [sample_feeds(float_path, seed=i) for i in range(samples)]
    config = get_qnn_qdq_config(str(float_path), _Reader(feeds), activation_type=types[activation_bits],
                                weight_type=types[weight_bits], per_channel=per_channel)
    out_path = Path(out_path)
    quantize(str(float_path), str(out_path), config)
    return out_path


def build(folder: str | Path, *, exporter: str = "torchscript", seed: int = 0, activation_bits: int = 16,
          weight_bits: int = 8, **config) -> tuple[Path, Path]:
    """Export a random Llama (``DEFAULTS`` overridden by ``config``) into ``folder`` and quantize it;
    returns (float model, quantized model ``llama_<exporter>_a<bits>w<bits>.onnx``). Refuses (FileExistsError)
    when either file, or a data file beside it, already exists: it writes only new files."""
    folder = Path(folder)
    names = (f"llama_{exporter}_float.onnx", f"llama_{exporter}_a{activation_bits}w{weight_bits}.onnx")
    taken = [folder / n for n in names if (folder / n).exists() or (folder / f"{n}.data").exists()]
    if taken:
        raise FileExistsError(f"{taken[0]}: already exists; qnn_llm writes only new files (choose another folder)")
    from .torch_export import export_tiny_hf

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**DEFAULTS, **config}
    float_path = export_tiny_hf("llama", folder / names[0], exporter=exporter, seed=seed, **cfg)
    out = folder / names[1]
    return float_path, quantize_qnn(float_path, out, activation_bits=activation_bits, weight_bits=weight_bits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.models.qnn_llm", description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="output folder (new files llama_<exporter>_float.onnx and _a<A>w<W>.onnx)")
    ap.add_argument("--exporter", default="torchscript", choices=("torchscript", "dynamo"))
    ap.add_argument("--activation-bits", type=int, default=16, choices=(8, 16))
    ap.add_argument("--weight-bits", type=int, default=8, choices=(4, 8, 16))
    for k, v in DEFAULTS.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    args = ap.parse_args(argv)
    cfg = {k: getattr(args, k) for k in DEFAULTS}
    try:
        paths = build(args.folder, exporter=args.exporter, activation_bits=args.activation_bits,
                      weight_bits=args.weight_bits, **cfg)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
