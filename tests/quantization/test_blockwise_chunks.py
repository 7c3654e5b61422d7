"""Column-chunked RTN block quantization gives the same bits as one whole-array pass (chunks split N only)."""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.quantization import blockwise


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("K,N,dtype", [(96, 50, np.float32), (70, 33, np.float16), (16, 7, np.float32)])
def test_chunked_quantization_matches_a_single_chunk(monkeypatch, symmetric, K, N, dtype):
    w = np.random.default_rng(K * N).standard_normal((K, N)).astype(dtype)
    w[:, 3] = 0  # zero blocks: scale 0 takes the reciprocal-0 branch
    whole = blockwise.quantize_blockwise_rtn(w, 32 if K >= 32 else 16, symmetric)
    monkeypatch.setattr(blockwise, "_CHUNK_ELEMENTS", 1)  # one column per chunk
    chunked = blockwise.quantize_blockwise_rtn(w, 32 if K >= 32 else 16, symmetric)
    for name in ("q", "scales", "zero_points"):
        a, b = getattr(whole, name), getattr(chunked, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
