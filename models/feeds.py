"""Input feeds for the decoder graphs (HF/Optimum names), for tests, checks and the generation loop.

Layouts: input_ids/position_ids [B,S] int64, attention_mask [B,T] int64, past KV [B,Nkv,P,H] float32.
"""

from __future__ import annotations

import numpy as np

from .weights import LlamaConfig


def decoder_feeds(cfg: LlamaConfig, input_ids: np.ndarray, *, past: list[tuple[np.ndarray, np.ndarray]] | None = None,
                  attention_mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Feeds for one step. Without ``past`` the KV inputs are empty ([B,Nkv,0,H]); positions continue after P.

    With ``attention_mask`` (right padding: ones then zeros) positions are still P + arange(S), as HF does for
    right-padded batches.
    """
    input_ids = np.asarray(input_ids, dtype=np.int64)
    b, s = input_ids.shape
    if past is None:
        empty = np.zeros((b, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
        past = [(empty, empty)] * cfg.num_hidden_layers
    p_len = past[0][0].shape[2]
    if attention_mask is None:
        attention_mask = np.ones((b, p_len + s), np.int64)
    feeds = {"input_ids": input_ids, "attention_mask": np.asarray(attention_mask, np.int64),
             "position_ids": np.tile(np.arange(p_len, p_len + s, dtype=np.int64), (b, 1))}
    for i, (k, v) in enumerate(past):
        feeds[f"past_key_values.{i}.key"] = k
        feeds[f"past_key_values.{i}.value"] = v
    return feeds


def split_outputs(names: list[str],
                  outputs: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """(logits, [(present_key, present_value) per layer]) from a session's output list."""
    by_name = dict(zip(names, outputs))
    n_layers = sum(1 for n in names if n.startswith("present.") and n.endswith(".key"))
    return by_name["logits"], [(by_name[f"present.{i}.key"], by_name[f"present.{i}.value"]) for i in range(n_layers)]
