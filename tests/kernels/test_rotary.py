"""com.microsoft RotaryEmbedding vs ORT CPU: half/interleaved, partial rotary, [B,S] ids and scalar offset,
3-D [B,S,N*H] and 4-D [B,N,S,H] inputs. Tolerances: float32 1e-5, float16 2e-3."""

from __future__ import annotations

import numpy as np
import pytest

from _vector_ortref import check_against_ort, rand

MAX_POS = 64


def caches(half: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    ang = np.arange(MAX_POS)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def _inputs(x, pos, half, dtype, runtime_caches=False):
    cos, sin = caches(half, dtype)
    return [("x", x, False), ("pos", pos, False), ("cos", cos, runtime_caches), ("sin", sin, runtime_caches)]


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
def test_full_rotary_with_position_ids(interleaved, dtype, layout):
    b, s, n, h = 2, 5, 3, 16
    x = rand((b, s, n * h) if layout == "bsd" else (b, n, s, h), dtype, seed=1)
    pos = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]], np.int64)
    check_against_ort("RotaryEmbedding", _inputs(x, pos, h // 2, dtype), [("y", dtype)],
                      {"interleaved": interleaved}, domain="com.microsoft")


@pytest.mark.parametrize("interleaved", [0, 1])
def test_scalar_position_offset(interleaved):
    x = rand((2, 1, 4 * 32), np.float32, seed=2)  # decode step at position 37
    check_against_ort("RotaryEmbedding", _inputs(x, np.array([37], np.int64), 16, np.float32, runtime_caches=True),
                      [("y", np.float32)], {"interleaved": interleaved}, domain="com.microsoft")


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
def test_partial_rotary_passes_tail_through(interleaved, layout):
    b, s, n, h, rdim = 1, 6, 2, 32, 16
    x = rand((b, s, n * h) if layout == "bsd" else (b, n, s, h), np.float32, seed=3)
    pos = np.arange(s, dtype=np.int64)[None, :] + 3
    check_against_ort("RotaryEmbedding", _inputs(x, pos, rdim // 2, np.float32), [("y", np.float32)],
                      {"interleaved": interleaved, "num_heads": n, "rotary_embedding_dim": rdim},
                      domain="com.microsoft")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_signed_sin_rotation_is_bit_identical_to_the_formulas(interleaved, dtype):
    """rotate_signed and rotate_inplace (x cos + swap(x) (-sin, sin); GroupQueryAttention rotates its Q|K scratch
    in place) equal x0 c - x1 s, x1 c + x0 s exactly, for full and partial rotary."""
    from npu_ep.kernels.ops.rotary import rotate_inplace, rotate_signed, signed_sin, wide_cos
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 32)).astype(dtype)
    for half in (16, 8):
        c, s = (rng.standard_normal((2, 3, 1, half)).astype(dtype) for _ in range(2))
        xf, cf, sf = (a.astype(np.float32) for a in (x, c, s))
        if interleaved:
            x0, x1 = xf[..., 0:2 * half:2], xf[..., 1:2 * half:2]
            head = np.stack([x0 * cf - x1 * sf, x1 * cf + x0 * sf], axis=-1).reshape(2, 3, 4, 2 * half)
        else:
            x0, x1 = xf[..., :half], xf[..., half:2 * half]
            head = np.concatenate([x0 * cf - x1 * sf, x1 * cf + x0 * sf], axis=-1)
        want = np.concatenate([head, xf[..., 2 * half:]], axis=-1).astype(dtype)
        got = rotate_signed(x, c, signed_sin(s, interleaved), interleaved)
        assert got.dtype == dtype and np.array_equal(got, want)
        inplace = x.astype(np.float32)
        rotate_inplace(inplace, wide_cos(c, interleaved), signed_sin(s, interleaved), interleaved)
        assert np.array_equal(inplace.astype(dtype), want)
