"""KV cache formats inside GroupQueryAttention (issue 41 item 4): the kernel stores each new K/V row in the target's
kv_cache_dtype (quantize on write, dequantize on read) and attends over the stored values; float32 changes nothing.

Exact checks: the format itself against a model of its definition in integer/float64 math (codes are integers in
range, each the nearest to x / scale, the scale amax / qmax, value = code * scale in float32); the presents of a
session with a format against the float32 session's presents stored in that format, bit for bit (both run the
reference kernel, so their rotary math is the same); the output against float64 attention over those presents.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npu_ep
from npu_ep.ep.options import OptionError, parse
from npu_ep.kernels.ops import _kv_format
from npu_ep.kernels.target import KV_CACHE_DTYPES, Target, TargetError
from npu_testing import assignment, npu_session

QMAX = {"int8_per_head": 127, "int8_per_token": 127, "int4_per_head": 7}


def _model_of_format(x: np.ndarray, fmt: str) -> np.ndarray:
    """What the format holds for rows x [..., Nkv, S, H], from its definition: per-(token, head) or per-token
    float32 scale amax / qmax, integer codes nearest to x / scale (ties to even), value code * scale."""
    if fmt == "float32":
        return x.copy()
    if fmt == "float16":
        return x.astype(np.float16).astype(np.float32)
    qmax = QMAX[fmt]
    moved = np.moveaxis(x, -2, -3)  # [..., S, Nkv, H]: one scale per [H] (per head) or per [Nkv, H] (per token)
    groups = moved.reshape(*moved.shape[:-2], -1, moved.shape[-1]) if fmt != "int8_per_token" else \
        moved.reshape(*moved.shape[:-2], 1, -1)
    out = np.empty_like(groups)
    for idx in np.ndindex(groups.shape[:-1]):
        v = groups[idx].astype(np.float64)
        scale = np.float32(np.float32(np.abs(groups[idx]).max()) / np.float32(qmax))
        if scale == 0:
            out[idx] = 0
            continue
        ratio = v / np.float64(scale)
        codes = np.array([int(np.round(r)) for r in ratio])  # Python ints: round half to even
        codes = np.clip(codes, -qmax, qmax)
        assert np.abs(codes).max() == qmax  # the largest value takes the largest code
        out[idx] = (codes * np.float64(scale)).astype(np.float32)
    return np.moveaxis(out.reshape(moved.shape), -3, -2)


@pytest.mark.parametrize("fmt", KV_CACHE_DTYPES)
def test_store_matches_the_formats_definition(fmt):
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((2, 1, 4, 5, 32)).astype(np.float32) * 3  # [K|V, B, Nkv, S, H]
    rows[0, 0, 1, 2] = 0  # a zero row: scale 0, codes 0
    want = _model_of_format(rows, fmt)
    got = rows.copy()
    _kv_format.store(fmt, got)
    np.testing.assert_array_equal(got, want)
    if fmt in QMAX:  # every stored value is an integer code times its float32 scale
        per = (-3, -1) if fmt == "int8_per_token" else (-1,)
        scale = np.abs(rows).max(axis=per, keepdims=True).astype(np.float32) / np.float32(QMAX[fmt])
        codes = np.rint(np.divide(got, scale, out=np.zeros_like(got), where=scale > 0))
        np.testing.assert_array_equal(codes * scale, got)
        assert np.abs(codes).max() == QMAX[fmt]


def test_row_bytes_are_the_formats_size():
    assert _kv_format.row_bytes("float32", 4, 64, 4) == 4 * 64 * 4
    assert _kv_format.row_bytes("float16", 4, 64, 4) == 4 * 64 * 2
    assert _kv_format.row_bytes("int8_per_head", 4, 64, 4) == 4 * 64 + 4 * 4
    assert _kv_format.row_bytes("int8_per_token", 4, 64, 4) == 4 * 64 + 4
    assert _kv_format.row_bytes("int4_per_head", 4, 64, 4) == 4 * 32 + 4 * 4


def test_option_and_target_key_are_checked():
    assert parse({"ep.npuep.kv_cache_dtype": "int8_per_head"}).kv_cache_dtype == "int8_per_head"
    assert parse({}).kv_cache_dtype is None
    with pytest.raises(OptionError, match=r"kv_cache_dtype='int3'.*int8_per_head"):
        parse({"ep.npuep.kv_cache_dtype": "int3"})
    ref = Target.load("npu-ref")
    assert ref.kv_cache_dtype == "float32" and ref.with_kv_cache_dtype(None) is ref
    assert ref.with_kv_cache_dtype("int4_per_head").digest != ref.digest  # never served another format's program
    with pytest.raises(TargetError, match="kv_cache_dtype = 'fp8'"):
        Target.from_dict({**ref.raw, "kv_cache_dtype": "fp8"})


# -- in a session: GroupQueryAttention with a static past buffer, as the generator runs it -----------------------
N, NKV, H, CAP = 4, 2, 32, 48


def _gqa_model() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, "s", N * H]),
              helper.make_tensor_value_info("k", f, [1, "s", NKV * H]),
              helper.make_tensor_value_info("v", f, [1, "s", NKV * H]),
              helper.make_tensor_value_info("pk", f, [1, NKV, "p", H]),
              helper.make_tensor_value_info("pv", f, [1, NKV, "p", H]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("y", f, [1, "s", N * H]),
               helper.make_tensor_value_info("present_key", f, [1, NKV, "t", H]),
               helper.make_tensor_value_info("present_value", f, [1, NKV, "t", H])]
    node = helper.make_node("GroupQueryAttention", [i.name for i in inputs], [o.name for o in outputs], name="gqa",
                            domain="com.microsoft", num_heads=N, kv_num_heads=NKV)
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(s: int, valid_past: int, past: np.ndarray | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    kv = np.zeros((2, 1, NKV, CAP, H), np.float32) if past is None else past
    return {"q": rng.standard_normal((1, s, N * H)).astype(np.float32),
            "k": rng.standard_normal((1, s, NKV * H)).astype(np.float32) * 2,
            "v": rng.standard_normal((1, s, NKV * H)).astype(np.float32),
            "pk": kv[0], "pv": kv[1], "seqlens_k": np.array([valid_past + s - 1], np.int32),
            "total": np.array(CAP + s, np.int32)}


def _attention64(q: np.ndarray, pk: np.ndarray, pv: np.ndarray, valid_past: int) -> np.ndarray:
    """float64 GQA over the stored presents: query i of S sees keys 0..valid_past + i."""
    s = q.shape[1]
    qh = q.reshape(s, N, H).astype(np.float64)
    out = np.zeros((s, N, H))
    for head in range(N):
        k, v = pk[0, head // (N // NKV)].astype(np.float64), pv[0, head // (N // NKV)].astype(np.float64)
        for i in range(s):
            seen = valid_past + i + 1
            sc = k[:seen] @ qh[i, head] / np.sqrt(H)
            w = np.exp(sc - sc.max())
            out[i, head] = (w / w.sum()) @ v[:seen]
    return out.reshape(1, s, N * H)


@pytest.mark.parametrize("fmt", ["float16", "int8_per_head", "int8_per_token", "int4_per_head"])
def test_session_stores_kv_in_the_format_and_attends_over_it(fmt):
    model = _gqa_model()
    ref = npu_session(model, {"kernels": "reference"})
    sess = npu_session(model, {"kernels": "reference", "kv_cache_dtype": fmt})
    native = npu_session(model, {"kv_cache_dtype": fmt})  # the native choice: the reference runs, and says why
    assert assignment(sess) == {"gqa": npu_ep.get_ep_name()}
    first = _feeds(6, 0, np.zeros((2, 1, NKV, 0, H), np.float32), seed=9)  # an empty past: the first-prompt path
    first["total"] = np.array(6, np.int32)
    y32, pk32, pv32 = ref.run(None, first)
    y, pk, pv = sess.run(None, first)
    for got, want in ((pk, pk32.copy()), (pv, pv32.copy())):
        _kv_format.store(fmt, want)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(y, _attention64(first["q"], pk, pv, 0), rtol=2e-5, atol=2e-5)
    past = None
    valid = 0
    for step, s in enumerate((5, 3, 1, 1)):  # a first chunk, a later chunk, decode: each appends to the buffer
        feeds = _feeds(s, valid, past, seed=step)
        y32, pk32, pv32 = ref.run(None, feeds)
        y, pk, pv = sess.run(None, feeds)
        rows = slice(valid, valid + s)
        want_k, want_v = pk32.copy(), pv32.copy()
        _kv_format.store(fmt, want_k[:, :, rows])
        _kv_format.store(fmt, want_v[:, :, rows])
        np.testing.assert_array_equal(pk, want_k)  # the new rows in the format, the past as it was fed
        np.testing.assert_array_equal(pv, want_v)
        np.testing.assert_allclose(y, _attention64(feeds["q"], pk, pv, valid), rtol=2e-5, atol=2e-5)
        if fmt != "float16" or step == 0:
            assert not np.array_equal(y, y32)  # the format changes numerics: that is why it is opt-in
        np.testing.assert_array_equal(native.run(None, feeds)[0], y)
        past = np.stack([pk[:, :, :CAP], pv[:, :, :CAP]])  # what a generator's cache keeps: slots 0..CAP-1
        valid += s


def test_native_choice_records_why_the_reference_runs_and_costs_the_formats_bytes():
    from npu_ep.ep.sessions import session_of, tag_session_options
    from npu_ep.kernels.ops._gqa_native import FALLBACK
    from npu_testing import session_options

    model, costs = _gqa_model(), {}
    for fmt in ("float32", "int8_per_head", "int4_per_head"):
        so = session_options()
        tag_session_options(so)
        sess = npu_session(model, {"kv_cache_dtype": fmt}, so=so)
        feeds = _feeds(1, 10, seed=1)
        sess.run(None, feeds)
        (program,) = session_of(sess).programs.values()
        (step,) = program.steps
        assert (step.prepared.kernel_cache.get(FALLBACK) is None) == (fmt == "float32")
        if fmt != "float32":
            why = step.prepared.kernel_cache[FALLBACK]
            assert fmt in why and "reference kernel" in why
        costs[fmt] = program.cost_for(tuple(feeds[i].shape for i in ("q", "k", "v", "pk", "pv", "seqlens_k",
                                                                      "total"))).dma_bytes
    # activations stay float32; past (CAP rows) and present (CAP + 1 rows) K/V are moved at the format's size
    kv_rows = 2 * (CAP + CAP + 1)
    assert costs["float32"] - costs["int8_per_head"] == kv_rows * (NKV * H * 4 - (NKV * H + NKV * 4))
    assert costs["float32"] - costs["int4_per_head"] == kv_rows * (NKV * H * 4 - (NKV * H // 2 + NKV * 4))


def test_report_names_the_format_and_moves_kv_at_its_size():
    from npu_ep.ep.sessions import tag_session_options
    from npu_ep.tools.report.build import validate
    from npu_testing import session_options

    model, docs = _gqa_model(), {}
    for fmt in ("float32", "int8_per_head"):
        so = session_options()
        tag_session_options(so)
        sess = npu_session(model, {"kv_cache_dtype": fmt}, so=so)
        sess.run(None, _feeds(1, 10, seed=1))
        docs[fmt] = npu_ep.report(sess, model=model)
        validate(docs[fmt])
        assert docs[fmt]["kv_cache_dtype"] == fmt
    moved = {fmt: sum(t["dma_bytes"] for t in doc["timeline"]) for fmt, doc in docs.items()}
    assert moved["float32"] - moved["int8_per_head"] == 2 * (CAP + CAP + 1) * (NKV * H * 4 - (NKV * H + NKV * 4))
    file_doc = npu_ep.report(model, provider_options={"kv_cache_dtype": "int4_per_head"})
    assert file_doc["kv_cache_dtype"] == "int4_per_head"


def test_npu_report_cli_takes_the_format(tmp_path, capsys):
    from npu_ep.tools.npu_report import main

    path = tmp_path / "gqa.onnx"
    onnx.save(_gqa_model(), path)
    assert main([str(path), "--kv-cache-dtype", "int8_per_head", "--json", str(tmp_path / "r.json"),
                 "--dim", "s=1", "--dim", "p=16", "--dim", "t=17"]) == 0
    import json

    assert json.loads((tmp_path / "r.json").read_text())["kv_cache_dtype"] == "int8_per_head"
    assert "KV cache int8_per_head" in " ".join(capsys.readouterr().out.split())
    assert main([str(path), "--kv-cache-dtype", "int3"]) == 2
    assert "kv_cache_dtype = 'int3'" in capsys.readouterr().err
