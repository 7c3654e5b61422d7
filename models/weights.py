"""Config and seeded random weights for the tiny decoders.

Weights are stored in MatMul layout ``[in, out]`` (the transpose of torch's ``Linear.weight``), because that is
what exporters put next to a MatMul. Dimensions: D hidden, N heads, Nkv kv heads, H head dim, R rotary dim,
I intermediate, V vocab.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def inv_freq(rotary_dim: int, theta: float) -> np.ndarray:
    """[R/2] float32 rotary frequencies, as HF computes them."""
    return (1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / rotary_dim)
            ).astype(np.float32)


def make_weights(cfg: LlamaConfig, *, rotary_dim: int, fused_qkv: bool = False, seed: int = 0
                 ) -> dict[str, np.ndarray]:
    """Seeded weights. Scales ~1/sqrt(fan_in) so attention is far from uniform and numeric tests bite."""
    rng = np.random.default_rng(seed)
    d, hd = cfg.hidden_size, cfg.head_dim
    n, nkv, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size

    def lin(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)

    def norm_w() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((cfg.vocab_size, d)).astype(np.float32)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm_w()
        wq, wk, wv = lin(d, n * hd), lin(d, nkv * hd), lin(d, nkv * hd)
        if fused_qkv:
            w[f"{p}.self_attn.qkv_proj.weight"] = np.concatenate([wq, wk, wv], axis=1)
        else:
            w[f"{p}.self_attn.q_proj.weight"], w[f"{p}.self_attn.k_proj.weight"] = wq, wk
            w[f"{p}.self_attn.v_proj.weight"] = wv
        w[f"{p}.self_attn.o_proj.weight"] = lin(n * hd, d)
        w[f"{p}.post_attention_layernorm.weight"] = norm_w()
        w[f"{p}.mlp.gate_proj.weight"] = lin(d, inter)
        w[f"{p}.mlp.up_proj.weight"] = lin(d, inter)
        w[f"{p}.mlp.down_proj.weight"] = lin(inter, d)
    w["model.norm.weight"] = norm_w()
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = lin(d, cfg.vocab_size)
    freqs = inv_freq(rotary_dim, cfg.rope_theta)
    w["rotary.inv_freq"] = freqs
    angles = np.outer(np.arange(cfg.max_position_embeddings, dtype=np.float32), freqs).astype(np.float32)
    w["rotary.sincos"] = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)  # GPT-J embed_positions
    return w
