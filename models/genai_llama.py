"""A tiny onnxruntime-genai model folder (``model.onnx`` + ``genai_config.json`` + tokenizer), made by genai's own
model builder from a Hugging Face Llama with random weights: the graphs genai users bring (packed-QKV
GroupQueryAttention with rotary inside, MatMulNBits, SkipSimplifiedLayerNormalization, a symbolic
``kv_cache_dim``), with no download.

Needs torch, transformers and onnxruntime-genai (imported inside the functions: importing this module needs none
of them). ``python -m npu_ep.models.genai_llama OUT_DIR`` builds one from the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BUILDER = "onnxruntime_genai.models.builder"


class GenaiBuildError(RuntimeError):
    """The folder cannot be built here (a package is missing, or genai's builder failed); the message says why."""


@dataclasses.dataclass(frozen=True)
class GenaiLlamaConfig:
    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 512
    context: int = 512
    seed: int = 0
    precision: str = "int4"  # the builder's -p: int4, int8, fp32
    extra_options: tuple[str, ...] = ()  # the builder's --extra_options KEY=VALUE


# special tokens of the word-level tokenizer written next to the weights (genai's builder copies it)
PAD, BOS, EOS, UNK = 0, 1, 2, 3


def _require() -> tuple:
    try:
        import onnxruntime_genai  # noqa: F401  (the builder ships inside it)
        import torch
        import transformers
    except ImportError as e:
        raise GenaiBuildError(f"building a genai model needs torch, transformers and onnxruntime-genai "
                              f"({e.name} is not installed): pip install torch==2.13.0 transformers "
                              "onnxruntime-genai==0.18.0") from None
    return torch, transformers


def save_hf_llama(folder: Path, cfg: GenaiLlamaConfig) -> None:
    """A random-weight ``LlamaForCausalLM`` and a word-level tokenizer (``t4`` .. ``t{vocab-1}``) in ``folder``."""
    torch, transformers = _require()
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(cfg.seed)
    hf_cfg = transformers.LlamaConfig(
        hidden_size=cfg.hidden, intermediate_size=cfg.intermediate, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, vocab_size=cfg.vocab,
        max_position_embeddings=cfg.context, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(folder)
    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<unk>": UNK, **{f"t{i}": i for i in range(4, cfg.vocab)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>", pad_token="<pad>").save_pretrained(folder)


def build_genai_llama(out_dir: str | os.PathLike, cfg: GenaiLlamaConfig = GenaiLlamaConfig()) -> Path:
    """Build the genai folder ``out_dir`` (which must not exist yet, or be empty) and return its path."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GenaiBuildError(f"{out}: exists and is not an empty folder; give a new folder")
    _require()
    with tempfile.TemporaryDirectory(prefix="npu_ep_genai_") as tmp:
        hf = Path(tmp) / "hf"
        save_hf_llama(hf, cfg)
        cmd = [sys.executable, "-m", BUILDER, "-i", str(hf), "-o", str(out.resolve()), "-p", cfg.precision,
               "-e", "cpu", "-c", str(Path(tmp) / "cache")]
        if cfg.extra_options:
            cmd += ["--extra_options", *cfg.extra_options]
        # cwd: the builder imports its sibling modules by bare names (``quantization``), which a working
        # directory holding a same-named package (this repository's root) would shadow
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:]
            raise GenaiBuildError(f"onnxruntime-genai's model builder failed ({' '.join(tail) or proc.returncode})")
    if not (out / "genai_config.json").is_file():
        raise GenaiBuildError(f"{out}: the builder wrote no genai_config.json")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu_ep.models.genai_llama", description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="new folder for model.onnx, genai_config.json and the tokenizer")
    p.add_argument("--precision", default="int4", choices=("int4", "int8", "fp32"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--extra-options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="passed to the builder's --extra_options (e.g. int4_accuracy_level=4)")
    args = p.parse_args(argv)
    try:
        path = build_genai_llama(args.out_dir, GenaiLlamaConfig(layers=args.layers, precision=args.precision,
                                                                extra_options=tuple(args.extra_options)))
    except GenaiBuildError as exc:
        print(f"genai_llama: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
