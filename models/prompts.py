"""Fixed, tokenizer-free prompts (token ids) for the demo and the tests.

Seeded so every machine sees the same ids; lengths chosen to exercise shape buckets (short, mid, > 32, > 128).
"""

from __future__ import annotations

import numpy as np

PROMPT_LENGTHS: tuple[int, ...] = (5, 17, 40, 150)


def prompts(vocab_size: int = 1000, *, seed: int = 1234) -> list[list[int]]:
    """Token-id lists of lengths PROMPT_LENGTHS, ids in [1, vocab_size) (0 is kept free for padding)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab_size, size=n).tolist() for n in PROMPT_LENGTHS]


PROMPTS: list[list[int]] = prompts()
