"""Plain numpy forward pass of the tiny decoder: the independent reference the generated ONNX is tested against.

Layouts: input_ids/position_ids [B,S], attention_mask [B,T], past/present KV [B,Nkv,P|T,H], logits [B,S,V].
"""

from __future__ import annotations

import numpy as np

from .weights import LlamaConfig


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _rope(x: np.ndarray, pos: np.ndarray, freqs: np.ndarray, interleaved: bool) -> np.ndarray:
    """x [B,Nh,S,H]; rotates the first R = 2*len(freqs) channels of each head by angle pos * freq."""
    r = 2 * freqs.size
    ang = pos[:, None, :, None].astype(np.float32) * freqs  # [B,1,S,R/2]
    cos, sin = np.cos(ang), np.sin(ang)
    rot, rest = x[..., :r], x[..., r:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = np.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(rot.shape)
    else:
        a, b = rot[..., : r // 2], rot[..., r // 2:]
        out = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return np.concatenate([out, rest], axis=-1)


def reference_forward(weights: dict[str, np.ndarray], cfg: LlamaConfig, *, interleaved: bool,
                      input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
                      past: list[tuple[np.ndarray, np.ndarray]],
                      ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Return (logits [B,S,V], [(present_key, present_value) per layer]) in float64-free float32 math."""
    n, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    b, s = input_ids.shape
    freqs = weights["rotary.inv_freq"]
    x = weights["model.embed_tokens.weight"][input_ids]
    t = attention_mask.shape[1]
    p_len = t - s
    causal = np.arange(t)[None, :] <= (p_len + np.arange(s))[:, None]               # [S,T]
    allowed = causal[None, None] & (attention_mask[:, None, None, :] != 0)          # [B,1,S,T]
    presents = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        h = _rms(x, weights[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps)
        if f"{p}.self_attn.qkv_proj.weight" in weights:
            q, k, v = np.split(h @ weights[f"{p}.self_attn.qkv_proj.weight"], [n * hd, (n + nkv) * hd], axis=-1)
        else:
            q, k, v = (h @ weights[f"{p}.self_attn.{nm}_proj.weight"] for nm in "qkv")
        q = q.reshape(b, s, n, hd).transpose(0, 2, 1, 3)
        k = k.reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
        v = v.reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
        q, k = _rope(q, position_ids, freqs, interleaved), _rope(k, position_ids, freqs, interleaved)
        k_all = np.concatenate([past[i][0], k], axis=2)
        v_all = np.concatenate([past[i][1], v], axis=2)
        presents.append((k_all, v_all))
        k_rep, v_rep = (np.repeat(a, n // nkv, axis=1) for a in (k_all, v_all))
        scores = q @ k_rep.transpose(0, 1, 3, 2) * hd ** -0.5
        scores = np.where(allowed, scores, -np.inf)
        scores = scores - scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v_rep).transpose(0, 2, 1, 3).reshape(b, s, n * hd)
        x = x + attn @ weights[f"{p}.self_attn.o_proj.weight"]
        h = _rms(x, weights[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = h @ weights[f"{p}.mlp.gate_proj.weight"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ weights[f"{p}.mlp.up_proj.weight"])) @ \
            weights[f"{p}.mlp.down_proj.weight"]
    x = _rms(x, weights["model.norm.weight"], cfg.rms_norm_eps)
    lm = weights["model.embed_tokens.weight"].T if cfg.tie_word_embeddings else weights["lm_head.weight"]
    return (x @ lm).astype(np.float32), presents
