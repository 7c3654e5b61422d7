"""com.microsoft EmbedLayerNormalization (ORT's BERT embedding fusion) vs ORT's CPU EP, through the kernel and
NpuEP sessions on npu-ref and npu-edge (ORT's assignment shows NpuEP ran it): with and without segments, with a
mask (mask_index counts the ones) and without (zeros), position_ids [B, S] and [1, S], the embedding_sum output,
odd sizes; out-of-range ids are an error naming the table; float16 tables are declined with a reason.

Tolerances: float32 rtol=atol=1e-5 (``_vector_ortref.TOL``).
"""

from __future__ import annotations

import numpy as np
import pytest

from _ep_single import check_on_ep
from _vector_ortref import make_model, rand, run_npu

MS = "com.microsoft"
B, S, D, V, P, G = 2, 5, 7, 11, 9, 3


def _inputs(segments=True, mask=None, position_ids=None, dtype=np.float32):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    seg = [("seg", rng.integers(0, G, (B, S)).astype(np.int32), False)] if segments else [None]
    inputs = [("ids", ids, False), *seg, ("word", rand((V, D), dtype, 1), True), ("pos", rand((P, D), dtype, 2), True),
              ("segemb", rand((G, D), dtype, 3), True) if segments else None, ("gamma", rand((D,), dtype, 4), True),
              ("beta", rand((D,), dtype, 5, lo=-1, hi=1), True)]
    if mask is not None or position_ids is not None:
        inputs.append(("mask", mask, False) if mask is not None else None)
    if position_ids is not None:
        inputs.append(("pos_ids", position_ids, False))
    return inputs


def _check(inputs, outs=2, attrs=None):
    names = [("y", np.float32, [B, S, D]), ("mask_index", np.int32, [B]), ("esum", np.float32, [B, S, D])][:outs]
    check_on_ep("EmbedLayerNormalization", inputs, names, {"epsilon": 1e-5, **(attrs or {})}, domain=MS,
                targets=("npu-ref", "npu-edge"))


def test_embed_layernorm_with_segments_and_mask():
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    _check(_inputs(mask=mask))


def test_embed_layernorm_without_segments_or_mask():
    _check(_inputs(segments=False))


@pytest.mark.parametrize("shape", [(B, S), (1, S)])
def test_embed_layernorm_position_ids(shape):
    pos = np.random.default_rng(1).integers(0, P, shape).astype(np.int32)
    _check(_inputs(mask=np.ones((B, S), np.int32), position_ids=pos))


def test_embed_layernorm_embedding_sum_output():
    _check(_inputs(mask=np.ones((B, S), np.int32)), outs=3)


def test_embed_layernorm_out_of_range_id_names_the_table():
    inputs = _inputs()
    inputs[0] = ("ids", np.full((B, S), V, np.int32), False)
    model = make_model("EmbedLayerNormalization", inputs, [("y", np.float32, [B, S, D]), ("m", np.int32, [B])],
                       {"epsilon": 1e-5}, domain=MS)
    with pytest.raises(ValueError, match=r"input_ids index out of range \[0, 11\)"):
        run_npu(model, {"ids": inputs[0][1], "seg": inputs[1][1]})


def test_embed_layernorm_declines_with_reasons():
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.support import why_not
    from npu_ep.kernels.target import Target

    def reason(inputs, target="npu-ref"):
        model = make_model("EmbedLayerNormalization", inputs, [("y", np.float32, [B, S, D])], {}, domain=MS)
        (node,) = nodes_from_model(model)
        return why_not(node, Target.load(target))

    assert "word_embedding" in reason(_inputs(dtype=np.float16)) and "float32" in reason(_inputs(dtype=np.float16))
