"""com.microsoft GroupQueryAttention vs ORT CPU: prefill, decode with 512 past tokens, multi-token chunks with past,
batch 1 and 2 (equal and ragged lengths), packed QKV, do_rotary (half/interleaved), local window, softcap, scale,
kv_num_heads < num_heads. Every output is compared: output, present_key, present_value.

Tolerance: float32 rtol=atol=5e-5 (softmax over up to 513 keys, different summation order than ORT's GEMM).
"""

from __future__ import annotations

import numpy as np
import pytest

from _vector_ortref import (assert_close, check_against_ort, feeds_of, gqa_inputs, make_model, rand,
                            rotary_cache, run_npu)

TOL32 = (5e-5, 5e-5)
MAX_POS = 1024


def _cache(half: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    return rotary_cache(half, dtype, MAX_POS)


def gqa(b, s, n, nkv, h, past=None, seqlens=None, total=None, packed=False, rotary=None, dtype=np.float32, seed=0,
        rotary_dim=None, position_ids=None, runtime_caches=False, **attrs):
    """Build the inputs (``_vector_ortref.gqa_inputs``) and run the comparison."""
    inputs, a = gqa_inputs(b, s, n, nkv, h, past, seqlens, total, packed, rotary, dtype, seed, rotary_dim,
                           position_ids, runtime_caches, MAX_POS, **attrs)
    outs = [("y", dtype), ("present_key", dtype), ("present_value", dtype)]
    return check_against_ort("GroupQueryAttention", inputs, outs, a, domain="com.microsoft",
                              tol=TOL32 if dtype == np.float32 else (4e-3, 4e-3))


@pytest.mark.parametrize("b", [1, 2])
@pytest.mark.parametrize("n,nkv", [(4, 2), (8, 1), (2, 2)])
def test_prefill_without_past(b, n, nkv):
    gqa(b, 7, n, nkv, 16)


@pytest.mark.parametrize("b", [1, 2])
def test_decode_with_512_past_tokens(b):
    got, cost = gqa(b, 1, 8, 2, 64, past=512)
    assert got[1].shape == (b, 2, 513, 64)
    assert cost.macs == 2 * b * 8 * 1 * 513 * 64 and cost.unit == "matrix"


def test_decode_ragged_batch_in_shared_size_buffer():
    """Batch 2 in a 512-slot buffer holding 511 and 300 valid tokens: present keeps the buffer size."""
    got, _ = gqa(2, 1, 8, 2, 32, past=512, seqlens=[511, 300], total=512)
    assert got[1].shape == (2, 2, 512, 32)


def test_multi_token_chunk_with_past():
    gqa(1, 4, 4, 2, 16, past=16)


def test_multi_token_chunk_batch2_equals_two_batch1_runs():
    """ORT CPU refuses S > 1 with past for B > 1; the kernel handles it, and each batch row must equal the
    ORT-checked batch-1 run on that row (ragged: 16 and 9 valid past tokens)."""
    s, n, nkv, h, p = 3, 4, 2, 16, 16
    q, k, v = rand((2, s, n * h), seed=1), rand((2, s, nkv * h), seed=2), rand((2, s, nkv * h), seed=3)
    pk, pv = rand((2, nkv, p, h), seed=4), rand((2, nkv, p, h), seed=5)
    seqlens = [p + s - 1, 9 + s - 1]
    attrs = {"num_heads": n, "kv_num_heads": nkv}

    def inputs(rows, sl, total):
        return [("q", q[rows], False), ("k", k[rows], False), ("v", v[rows], False), ("pk", pk[rows], False),
                ("pv", pv[rows], False), ("seqlens_k", np.array(sl, np.int32), False),
                ("total", np.array(total, np.int32), False)]

    outs = [("y", np.float32), ("present_key", np.float32), ("present_value", np.float32)]
    both = inputs(slice(0, 2), seqlens, p + s)
    model = make_model("GroupQueryAttention", both, outs, attrs, domain="com.microsoft")
    got, _, _ = run_npu(model, feeds_of(both))
    for row in (0, 1):
        one, _ = check_against_ort("GroupQueryAttention", inputs(slice(row, row + 1), [seqlens[row]], seqlens[row] + 1),
                                   outs, attrs, domain="com.microsoft", tol=TOL32)
        assert_close(got[0][row:row + 1], one[0], TOL32, f"row {row} output")
        t = one[1].shape[2]
        assert_close(got[1][row:row + 1, :, :t], one[1], TOL32, f"row {row} present_key")


@pytest.mark.parametrize("rotary", ["half", "interleaved"])
@pytest.mark.parametrize("phase", ["prefill", "decode", "chunk"])
def test_do_rotary_with_caches(rotary, phase):
    if phase == "prefill":
        gqa(2, 5, 4, 2, 32, rotary=rotary)
    elif phase == "decode":
        gqa(2, 1, 4, 2, 32, past=40, seqlens=[40, 17], total=41, rotary=rotary)
    else:
        gqa(1, 3, 4, 2, 32, past=10, rotary=rotary)


@pytest.mark.parametrize("rotary", ["half", "interleaved"])
def test_partial_rotary_from_narrow_caches(rotary):
    gqa(1, 4, 4, 2, 32, rotary=rotary, rotary_dim=16)
    gqa(1, 1, 4, 2, 32, past=7, rotary=rotary, rotary_dim=16)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_packed_qkv(phase):
    if phase == "prefill":
        gqa(2, 6, 4, 2, 16, packed=True, rotary="half")
    else:
        gqa(1, 1, 4, 2, 16, past=20, packed=True)


def test_local_window_prefill_and_decode():
    gqa(1, 9, 4, 2, 16, local_window_size=3)
    gqa(2, 1, 4, 2, 16, past=12, local_window_size=4)


def test_softcap_and_explicit_scale():
    gqa(1, 5, 4, 2, 16, softcap=2.0)
    gqa(1, 1, 4, 1, 16, past=9, scale=0.3)


def test_float16():
    gqa(1, 1, 4, 2, 32, past=33, dtype=np.float16)
    gqa(1, 6, 4, 2, 32, dtype=np.float16, rotary="half")


def _gqa_node():
    from npu_ep.ep.onnx_graph import nodes_from_model
    inputs = [("q", rand((1, 1, 4 * 16)), False), ("k", rand((1, 1, 2 * 16)), False),
              ("v", rand((1, 1, 2 * 16)), False),
              ("pk", rand((1, 2, 8, 16)), False), ("pv", rand((1, 2, 8, 16)), False),
              ("seqlens_k", np.array([8], np.int32), False), ("total", np.array(9, np.int32), False)]
    outs = [("y", np.float32, [1, 1, 64]), ("present_key", np.float32, [1, 2, 9, 16]),
            ("present_value", np.float32, [1, 2, 9, 16])]
    model = make_model("GroupQueryAttention", inputs, outs, {"num_heads": 4, "kv_num_heads": 2}, domain="com.microsoft")
    return nodes_from_model(model)[0]


def test_coverage_follows_target_gqa_needs_a_float_matrix_mode():
    from npu_ep.kernels.support import why_not
    from npu_ep.kernels.target import Target
    node = _gqa_node()
    assert why_not(node, Target.load("npu-ref")) is None
    edge = Target.load("npu-edge")
    reason = why_not(node, edge)
    assert reason is not None and "npu-edge" in reason  # not in the target's op table
    from npu_ep.kernels.registry import kernel_for
    own = kernel_for("com.microsoft", "GroupQueryAttention").check(node, edge)  # and the kernel says why
    assert own is not None and "no float matrix mode" in own


def test_decode_cost_stacks_query_heads_as_matrix_rows():
    """Decode (S=1) with G=4 query heads per kv head: the matrix unit sees m=4 rows per kv head, so the cost grows
    with kv heads, not query heads; macs count QK^T and PV."""
    from npu_ep.kernels.registry import kernel_for
    from npu_ep.kernels.target import Target
    tgt = Target.load("npu-ref")
    k = kernel_for("com.microsoft", "GroupQueryAttention")

    def cost(n, nkv):
        p = k.prepare(_gqa_node(), tgt)
        p.attrs.update(num_heads=n, kv_num_heads=nkv)
        return k.cost(p, [(1, 1, n * 128), (1, 1, nkv * 128), (1, 1, nkv * 128), (1, nkv, 512, 128),
                          (1, nkv, 512, 128), (1,), ()])

    c8, c32 = cost(8, 8), cost(32, 8)
    assert c32.macs == 4 * c8.macs == 4 * 2 * 8 * 513 * 128
    assert c32.compute_cycles < 2 * c8.compute_cycles  # 4x the MACs on the same padded tiles
    assert c32.dma_bytes > 0 and 0 < c32.utilization <= 1


def test_first_prompt_right_padded_batch_valid_rows():
    """Batch 2 prompt of S=6 where batch 1 has 4 real tokens (seqlens_k = [5, 3]): the real rows and the whole
    present cache match ORT; padded query rows (ORT leaves them undefined) are not compared."""
    from _vector_ortref import run_ort
    b, s, n, nkv, h = 2, 6, 4, 2, 32
    cos, sin = _cache(h // 2)
    inputs = [("q", rand((b, s, n * h), seed=1), False), ("k", rand((b, s, nkv * h), seed=2), False),
              ("v", rand((b, s, nkv * h), seed=3), False), None, None,
              ("seqlens_k", np.array([5, 3], np.int32), False), ("total", np.array(6, np.int32), False),
              ("cos", cos, True), ("sin", sin, True)]
    outs = [("y", np.float32), ("present_key", np.float32), ("present_value", np.float32)]
    model = make_model("GroupQueryAttention", inputs, outs, {"num_heads": n, "kv_num_heads": nkv, "do_rotary": 1},
                       domain="com.microsoft")
    want = run_ort(model, feeds_of(inputs))
    got, _, _ = run_npu(model, feeds_of(inputs))
    assert_close(got[0][0], want[0][0], TOL32, "batch 0 output")
    assert_close(got[0][1, :4], want[0][1, :4], TOL32, "batch 1 real rows")
    for i in (1, 2):
        assert_close(got[i], want[i], TOL32, f"present {i}")


@pytest.mark.parametrize("packed,runtime_caches,rotary", [(False, False, "half"), (True, True, "interleaved"),
                                                             (False, True, None)])
def test_first_prompt_batch1_right_padded(packed, runtime_caches, rotary):
    """The tiny-Llama prefill: B = 1, S = 8 bucket holding 5 real tokens (seqlens_k = [4], total = S), empty
    past [1, Nkv, 0, H], position_ids 0..4 then 0 for the padding. Real rows of the output and the presents match
    ORT. (The padding rows of present_key do not: ORT 1.31's CPU kernel rotates row s by position_ids[b, 0] + s,
    the kernel by position_ids[b, s]; no query ever reads them.)"""
    from _vector_ortref import run_ort
    s, n, nkv, h, valid = 8, 8, 2, 32, 5
    d = (n + 2 * nkv) * h if packed else n * h
    inputs = [("q", rand((1, s, d), seed=1), False), None if packed else ("k", rand((1, s, nkv * h), seed=2), False),
              None if packed else ("v", rand((1, s, nkv * h), seed=3), False),
              ("pk", np.zeros((1, nkv, 0, h), np.float32), False), ("pv", np.zeros((1, nkv, 0, h), np.float32), False),
              ("seqlens_k", np.array([valid - 1], np.int32), False), ("total", np.array(s, np.int32), False)]
    attrs = {"num_heads": n, "kv_num_heads": nkv}
    if rotary:
        cos, sin = _cache(h // 2)
        pos = np.array([list(range(valid)) + [0] * (s - valid)], np.int64)
        inputs += [("cos", cos, not runtime_caches), ("sin", sin, not runtime_caches), ("position_ids", pos, False)]
        attrs.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"))
    outs = [("y", np.float32), ("present_key", np.float32), ("present_value", np.float32)]
    model = make_model("GroupQueryAttention", inputs, outs, attrs, domain="com.microsoft")
    want = run_ort(model, feeds_of(inputs))
    got, _, _ = run_npu(model, feeds_of(inputs))
    assert_close(got[0][:, :valid], want[0][:, :valid], TOL32, "real rows")
    for i in (1, 2):
        assert got[i].shape == (1, nkv, s, h)
        assert_close(got[i][:, :, :valid], want[i][:, :, :valid], TOL32, f"present {i}")


def test_long_prefill_runs_in_query_row_blocks(monkeypatch):
    """A tiny scores budget forces the row-blocked path (3 query rows per block); results still match ORT."""
    from npu_ep.kernels.ops import attention_gqa as attention
    monkeypatch.setattr(attention, "_SCORES_BUDGET", 3 * 4 * 11 * 4)
    gqa(1, 11, 4, 2, 16, rotary="half", local_window_size=5)


# --- fixed-capacity KV cache (the generator's layout): past [B, Nkv, C, H] holds L valid rows, total = C + S, so
# present has C + S rows of which L + S are valid and the rest must be zero; only keys < L + S are read.

@pytest.mark.parametrize("rotary", ["half", "interleaved"])
@pytest.mark.parametrize("total_extra", [1, 0])
def test_decode_fixed_capacity_past_valid_prefix(rotary, total_extra):
    """Tiny-Llama decode: C = 512 slots, 40 valid, position_ids given; total = C + 1 (present grows) or C."""
    got, _ = gqa(1, 1, 8, 2, 32, past=512, seqlens=[40], total=512 + total_extra, rotary=rotary,
                 position_ids=[[40]])
    assert got[1].shape == (1, 2, 512 + total_extra, 32)
    assert not got[1][:, :, 41:].any() and not got[2][:, :, 41:].any()


def test_decode_fixed_capacity_runtime_caches():
    gqa(1, 1, 8, 2, 32, past=64, seqlens=[20], total=65, rotary="half", position_ids=[[20]], runtime_caches=True)


@pytest.mark.parametrize("rotary", [None, "half"])
def test_decode_ragged_batch_fixed_capacity(rotary):
    """B = 2 decode in a 64-slot cache with 40 and 17 valid rows: each row keeps its own prefix and zero tail."""
    pos = [[40], [17]] if rotary else None
    gqa(2, 1, 8, 2, 32, past=64, seqlens=[40, 17], total=65, rotary=rotary, position_ids=pos)


@pytest.mark.parametrize("window", [1, 8, 64])
def test_local_window_decode_deep_in_cache(window):
    """The window starts past key 0 (keys before it are not read at all); B = 2 ragged too."""
    gqa(1, 1, 4, 2, 16, past=64, seqlens=[40], total=65, local_window_size=window)
    gqa(2, 1, 4, 2, 16, past=64, seqlens=[40, 9], total=65, local_window_size=window)


def test_decode_step_variants():
    """Decode steps: one token with softcap + window (the flat one-token path), packed QKV for B = 2 with rotary
    (the general path), and the first token of a prompt (no past; and into a static 8-slot cache, whose 7 tail rows
    stay zero)."""
    gqa(1, 1, 4, 2, 16, past=9, softcap=2.0, local_window_size=4)
    gqa(2, 1, 4, 2, 16, past=20, packed=True, rotary="interleaved")
    gqa(1, 1, 4, 2, 16, rotary="half")
    gqa(1, 1, 4, 2, 16, past=8, seqlens=[0], total=1, rotary="half")


def test_prefill_and_chunk_into_static_cache():
    """First prompt (S = total = 8) into a 32-slot past: present keeps 32 rows, 8 valid, causal inside the 8;
    then a 4-token chunk after 16 valid rows (total <= P: ORT's static cache)."""
    gqa(1, 8, 4, 2, 16, past=32, seqlens=[7], total=8, rotary="half")
    gqa(1, 4, 4, 2, 16, past=32, seqlens=[19], total=32, rotary="half", local_window_size=6)


def _static_cache_decode(seqlens: list[int], cap: int = 64):
    """A B=len(seqlens) decode model over a ``cap``-slot cache, its kernel, and feeds per valid-length list."""
    from npu_ep.ep.onnx_graph import nodes_from_model
    from npu_ep.kernels.registry import kernel_for
    from npu_ep.kernels.target import Target
    b, n, nkv, h = len(seqlens), 4, 2, 16

    def inputs(lens, seed):
        return [("q", rand((b, 1, n * h), seed=seed), False), ("k", rand((b, 1, nkv * h), seed=seed + 1), False),
                ("v", rand((b, 1, nkv * h), seed=seed + 2), False),
                ("pk", rand((b, nkv, cap, h), seed=seed + 3), False),
                ("pv", rand((b, nkv, cap, h), seed=seed + 4), False),
                ("seqlens_k", np.array(lens, np.int32), False), ("total", np.array(cap + 1, np.int32), False)]

    outs = [("y", np.float32), ("present_key", np.float32), ("present_value", np.float32)]
    model = make_model("GroupQueryAttention", inputs(seqlens, 0), outs, {"num_heads": n, "kv_num_heads": nkv},
                       domain="com.microsoft")
    tgt = Target.load("npu-ref")
    node = nodes_from_model(model)[0]
    kernel = kernel_for(node.domain, node.op_type)
    return model, kernel, kernel.prepare(node, tgt), inputs


@pytest.mark.parametrize("seqlens", [[50], [50, 20]])
def test_present_buffers_are_reused_and_stale_rows_rezeroed(seqlens):
    """Outputs dropped between calls (as ORT does after copying them) let the node reuse its present buffer; a
    shorter valid length after a longer one must still leave zeros after the new valid rows."""
    from _vector_ortref import run_ort
    model, kernel, prepared, inputs = _static_cache_decode(seqlens)
    addresses = set()
    for step, lens in enumerate([seqlens, [x - 15 for x in seqlens], [x - 5 for x in seqlens], seqlens]):
        ins = inputs(lens, seed=10 * step)
        want = run_ort(model, feeds_of(ins))
        got = kernel.run(prepared, [x[1] for x in ins])
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, TOL32, f"step {step} output {i}")
        addresses.add(got[1].__array_interface__["data"][0])
        del got, g
    assert len(addresses) == 1  # every call after the first reused the buffer


def test_present_buffers_in_use_are_never_overwritten():
    """Outputs (or any view of them) still held by the caller keep their buffer out of the pool."""
    _model, kernel, prepared, inputs = _static_cache_decode([40])
    first = kernel.run(prepared, [x[1] for x in inputs([40], seed=1)])
    tail_view = first[2][:, :, 30:]
    kept = [np.array(o) for o in first]
    del first
    for step in range(4):  # more calls than pool slots, outputs dropped or kept
        out = kernel.run(prepared, [x[1] for x in inputs([10 + step], seed=2 + step)])
        if step % 2:
            del out
    np.testing.assert_array_equal(tail_view, kept[2][:, :, 30:])


def _static_buffer_gqa_model(past: int, n: int = 4, nkv: int = 2, h: int = 64):
    """GQA with a static past buffer declared [1, Nkv, past, H]: ORT's shape inference then declares the presents
    with length ``past`` too."""
    import onnx
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tot"], ["y", "pko", "pvo"],
                            domain="com.microsoft", num_heads=n, kv_num_heads=nkv, name="gqa")
    ins = [vi("q", TensorProto.FLOAT, [1, 1, n * h]), vi("k", TensorProto.FLOAT, [1, 1, nkv * h]),
           vi("v", TensorProto.FLOAT, [1, 1, nkv * h]), vi("pk", TensorProto.FLOAT, [1, nkv, past, h]),
           vi("pv", TensorProto.FLOAT, [1, nkv, past, h]), vi("sl", TensorProto.INT32, [1]),
           vi("tot", TensorProto.INT32, [])]
    outs = [vi("y", TensorProto.FLOAT, [1, 1, n * h]), vi("pko", TensorProto.FLOAT, [1, nkv, past, h]),
            vi("pvo", TensorProto.FLOAT, [1, nkv, past, h])]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    return model


def _static_buffer_feeds(past: int, seqlen: int, n: int = 4, nkv: int = 2, h: int = 64):
    rng = np.random.default_rng(seqlen)
    return {"q": rng.standard_normal((1, 1, n * h), np.float32), "k": rng.standard_normal((1, 1, nkv * h), np.float32),
            "v": rng.standard_normal((1, 1, nkv * h), np.float32),
            "pk": rng.standard_normal((1, nkv, past, h), np.float32),
            "pv": rng.standard_normal((1, nkv, past, h), np.float32),
            "sl": np.array([seqlen], np.int32), "tot": np.array(seqlen + 1, np.int32)}


@pytest.mark.parametrize("seqlen", [5, 36, 37])  # 37: the step overflows the 37-row buffer (issue 13)
def test_static_past_buffer_presents_match_cpu_ep_in_a_session(seqlen):
    """ORT's CPU EP grows the presents to P + 1 = 38 when the buffer overflows (its inferred shape says 37 and it
    only warns): NpuEP produces exactly that, through a real session."""
    from npu_testing import assignment, cpu_run, npu_session

    model, feeds = _static_buffer_gqa_model(37), _static_buffer_feeds(37, seqlen)
    sess = npu_session(model)
    assert assignment(sess) == {"gqa": "NpuEP"}
    got, ref = sess.run(None, feeds), cpu_run(model, feeds)
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert ref[1].shape[2] == (38 if seqlen == 37 else 37)
    for g, r in zip(got, ref):
        assert_close(g, r, TOL32, "static buffer")


def test_total_length_past_the_static_buffer_is_refused_with_orts_rule():
    from npu_testing import npu_session

    sess = npu_session(_static_buffer_gqa_model(37))
    with pytest.raises(Exception, match=r"no greater than past_sequence_length for a static cache. "
                                        "Got total_sequence_length=41"):
        sess.run(None, _static_buffer_feeds(37, 40))
