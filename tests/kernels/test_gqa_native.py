"""The native GroupQueryAttention kernel (kernels/native/gqa.cc) equals the numpy reference model
(kernels/ops/attention_gqa.py), and runs inside real NpuEP sessions against ORT's CPU EP.

Tolerance for the attention output: rtol = atol = 2e-5 for float32 (the native kernel sums dot products and the
softmax in a different order and uses a polynomial exp within ~2 ulp of numpy's); float16 in/out, 2e-3 (one
float16 rounding of the float32 result). The presents are compared
bit for bit: they are copies, and rotary is computed with the reference's operations and roundings. Every
instruction-set path this host runs is checked (scalar, AVX2, AVX-512).
"""

from __future__ import annotations

import numpy as np
import pytest

from _vector_ortref import gqa_inputs, make_model, rand
from _isa import cap_isa, host_isas
from npu_ep.ep import _native
from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.ep.sessions import session_of, tag_session_options
from npu_ep.ep.onnx_graph import nodes_from_model
from npu_ep.kernels import runtime
from npu_ep.kernels.ops._gqa_native import FALLBACK
from npu_ep.kernels.registry import kernel_for
from npu_ep.kernels.target import Target
from tests.npu_testing import assignment, count_kernel_runs, cpu_run, npu_session, session_options

NK = _native.kernels
TOL = dict(rtol=2e-5, atol=2e-5)
TOL16 = dict(rtol=2e-3, atol=2e-3)  # one float16 rounding of outputs of magnitude <= ~3 (ulp 2e-3 at 2..4)
TARGET = Target.load("npu-ref")
KERNEL = kernel_for("com.microsoft", "GroupQueryAttention")
MAX_POS = 256


@pytest.fixture(params=host_isas("avx512"))  # the GQA kernel has no VNNI path of its own
def isa(request):
    yield from cap_isa(request.param)


def _model(b, s, n, nkv, h, past=None, seqlens=None, total=None, packed=False, rotary=None, rotary_dim=None,
           position_ids=None, runtime_caches=False, dtype=np.float32, seed=0, **attrs):
    """(one-node model, feeds) from ``_vector_ortref.gqa_inputs``."""
    inputs, a = gqa_inputs(b, s, n, nkv, h, past, seqlens, total, packed, rotary, dtype, seed, rotary_dim,
                           position_ids, runtime_caches, MAX_POS, **attrs)
    outs = [("y", dtype, [b, s, n * h]), ("present_key", dtype, None), ("present_value", dtype, None)]
    model = make_model("GroupQueryAttention", inputs, outs, a, domain="com.microsoft")
    return model, {x[0]: x[1] for x in inputs if x is not None and not x[2]}


def _prepared(model, kernels, threads=1):
    (node,) = nodes_from_model(model)
    p = KERNEL.prepare(node, TARGET)
    runtime.configure([p], kernels, threads)
    return node, p


def _run(node, p, feeds):
    args = [None if v.missing or v.is_constant else feeds[v.name] for v in node.inputs]
    return [np.array(o) for o in KERNEL.run(p, args)]


def _compare(model, feeds, threads=1, tol=TOL):
    """Native vs reference on the same feeds; returns the native outputs."""
    node, nat = _prepared(model, "native", threads)
    got = _run(node, nat, feeds)
    assert nat.kernel_cache[FALLBACK] is None  # the native kernel ran
    node, ref = _prepared(model, "reference")
    want = _run(node, ref, feeds)
    assert FALLBACK not in ref.kernel_cache
    assert got[0].dtype == want[0].dtype
    np.testing.assert_allclose(got[0].astype(np.float32), want[0].astype(np.float32), **tol)
    for g, w in zip(got[1:], want[1:]):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return got


CASES = {  # name: _model kwargs (odd head dims, past lengths 0/1/odd, ragged batches, prefill and decode)
    "prefill_h24": dict(b=1, s=7, n=6, nkv=2, h=24),
    "prefill_h17_mha": dict(b=2, s=5, n=3, nkv=3, h=17),
    "prefill_g8_h40": dict(b=1, s=9, n=8, nkv=1, h=40),
    "decode_past0_static": dict(b=1, s=1, n=4, nkv=2, h=33, past=8, seqlens=[0], total=8),
    "decode_past1": dict(b=1, s=1, n=4, nkv=2, h=32, past=1),
    "decode_past37_h128": dict(b=1, s=1, n=8, nkv=2, h=128, past=37),
    "decode_ragged_b3": dict(b=3, s=1, n=6, nkv=3, h=20, past=40, seqlens=[5, 0, 39], total=40),
    "chunk_ragged_b2": dict(b=2, s=3, n=4, nkv=2, h=48, past=20, seqlens=[9, 22], total=23),
    "first_prompt_padded_b2": dict(b=2, s=7, n=4, nkv=2, h=16, seqlens=[3, 6], total=7),
    "first_prompt_padded_b2_long": dict(b=2, s=12, n=4, nkv=2, h=16, seqlens=[5, 11], total=12),
    "window_padded_rows_see_no_key": dict(b=2, s=10, n=4, nkv=2, h=8, seqlens=[2, 9], total=10, local_window_size=3),
    "chunk_mha_groups_span_tokens": dict(b=1, s=5, n=2, nkv=2, h=16, past=7),
    "prefill_mha_long": dict(b=1, s=20, n=2, nkv=2, h=12),
    "packed_decode": dict(b=2, s=1, n=4, nkv=1, h=36, past=11, packed=True),
    "packed_prefill": dict(b=1, s=6, n=4, nkv=2, h=8, packed=True),
    "softcap_scale": dict(b=1, s=4, n=4, nkv=2, h=32, past=9, softcap=3.0, scale=0.3),
    "window_prefill": dict(b=1, s=12, n=4, nkv=2, h=16, local_window_size=5),
    "window_decode": dict(b=2, s=1, n=4, nkv=2, h=16, past=30, seqlens=[29, 12], total=30, local_window_size=7),
    "rotary_half": dict(b=2, s=3, n=4, nkv=2, h=32, past=5, rotary="half"),
    "rotary_interleaved_decode": dict(b=1, s=1, n=8, nkv=2, h=64, past=37, rotary="interleaved"),
    "rotary_partial_odd_h": dict(b=1, s=4, n=2, nkv=1, h=21, rotary="half", rotary_dim=12),
    "rotary_position_ids": dict(b=2, s=2, n=4, nkv=2, h=16, past=6, rotary="interleaved",
                                position_ids=[[40, 41], [3, 9]]),
    "rotary_runtime_caches": dict(b=1, s=1, n=4, nkv=2, h=16, past=13, rotary="half", runtime_caches=True),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # the reference's NaN rows
@pytest.mark.parametrize("case", CASES)
def test_native_equals_reference(isa, case):
    got = _compare(*_model(**CASES[case], seed=len(case)))
    if case == "window_padded_rows_see_no_key":  # batch 0's tokens 5.. see no key: NaN rows, as the reference's
        assert np.isnan(got[0][0, 5:]).all() and not np.isnan(got[0][0, :5]).any()


@pytest.mark.parametrize("case", ["decode_ragged_b3", "chunk_ragged_b2", "prefill_g8_h40", "window_decode"])
def test_same_bits_at_any_thread_count(case):
    model, feeds = _model(**CASES[case])
    runs = [_run(*_prepared(model, "native", t), feeds) for t in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_reused_present_buffer_rezeroes_stale_rows():
    """A shorter call after a longer one on the same node (same pool buffer): rows the first call filled past the
    second's valid length read as zeros, as the reference's."""
    long_model, long_feeds = _model(b=2, s=3, n=4, nkv=2, h=16, past=20, seqlens=[19, 22], total=23)
    node, p = _prepared(long_model, "native")
    _run(node, p, long_feeds)  # outputs dropped: the buffer returns to the pool
    short = dict(long_feeds, seqlens_k=np.array([4, 2], np.int32))
    got = _run(node, p, short)
    assert p.kernel_cache[FALLBACK] is None
    node, ref = _prepared(long_model, "reference")
    want = _run(node, ref, short)
    np.testing.assert_allclose(got[0], want[0], **TOL)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    assert not got[1][:, :, 5:].any()


FP16_CASES = ["decode_past37_h128", "decode_ragged_b3", "chunk_ragged_b2", "first_prompt_padded_b2_long", "rotary_half",
              "rotary_interleaved_decode", "rotary_position_ids", "packed_decode", "window_prefill", "softcap_scale",
              "prefill_g8_h40"]


@pytest.mark.parametrize("case", FP16_CASES)
def test_float16_native_equals_reference(isa, case):
    """float16 in/out, float32 math on the rounded present rows, as the reference's general path."""
    _compare(*_model(**CASES[case], dtype=np.float16, seed=len(case)), tol=TOL16)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")  # the reference's NaN x 0
def test_float16_rounding_edges_match_the_reference(isa):
    """Two tokens, zero queries: token 0 outputs V[0], token 1 (V[0] + V[1]) / 2, exact in float32, so the float16
    results show the rounding alone: largest finite, ties to even in normal and subnormal range, the
    normal/subnormal boundary, NaN and Inf (in key 0, which both tokens see)."""
    v0 = [65504, 2**-24, 3 * 2**-24, 1, 1 + 2**-10, np.nan, np.inf, -65504, 2**-14]
    v1 = [65504, 0, 0, 1 + 2**-10, 1 + 2**-9, 1, 1, -65504, 2**-24]
    h = len(v0)
    f16 = np.float16
    inputs = [("q", np.zeros((1, 2, h), f16), False), ("k", rand((1, 2, h), f16, 1), False),
              ("v", np.array([[v0, v1]], f16), False), None, None,
              ("seqlens_k", np.array([1], np.int32), False), ("total", np.array(2, np.int32), False)]
    model = make_model("GroupQueryAttention", inputs, [("y", f16, [1, 2, h]), ("pk", f16, None), ("pv", f16, None)],
                       {"num_heads": 1, "kv_num_heads": 1}, domain="com.microsoft")
    feeds = {x[0]: x[1] for x in inputs if x is not None}
    node, p = _prepared(model, "native")
    got = _run(node, p, feeds)
    assert p.kernel_cache[FALLBACK] is None
    node, ref = _prepared(model, "reference")
    want = _run(node, ref, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    expect = np.array([65504, 0, 2 * 2**-24, 1, 1 + 2**-9, np.nan, np.inf, -65504, 2**-15], f16)
    np.testing.assert_array_equal(got[0][0, 1], expect)


def test_float64_runs_the_reference_with_the_reason_recorded():
    model, feeds = _model(b=1, s=1, n=4, nkv=2, h=16, past=5, dtype=np.float64)
    node, p = _prepared(model, "native")
    got = _run(node, p, feeds)
    assert p.kernel_cache[FALLBACK] == "native GroupQueryAttention takes float32 or float16 (query is float64)"
    node, ref = _prepared(model, "reference")
    for g, w in zip(got, _run(node, ref, feeds)):
        np.testing.assert_array_equal(g, w)


def test_rotary_position_outside_the_cache_is_a_clear_error():
    model, feeds = _model(b=1, s=2, n=2, nkv=1, h=8, past=3, rotary="half", position_ids=[[4, MAX_POS]])
    node, p = _prepared(model, "native")
    with pytest.raises(IndexError, match=rf"rotary position {MAX_POS} \(batch 0, token 1\) outside the cos/sin "
                                         rf"cache \[0, {MAX_POS}\)"):
        _run(node, p, feeds)


def _npu_gqa_steps(kernels):
    return [s.prepared for ep in LIVE_SESSIONS if ep.options.kernels == kernels for prog in ep.programs.values()
            for s in prog.steps if s.op == "com.microsoft::GroupQueryAttention"]


def _program(sess):
    (program,) = session_of(sess).programs.values()
    return program


def _tagged_session(model):
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, {"kernels": "native"}, cpu=False, so=so)
    assert set(assignment(sess).values()) == {"NpuEP"}
    return sess


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_session_matches_cpu_ep_and_runs_the_native_kernel(phase):
    """Decode: 8 query heads over 2 kv heads x 64, 37 cached tokens, rotary; prefill: a 16-token prompt."""
    kw = dict(b=1, s=1, past=37) if phase == "decode" else dict(b=1, s=16)
    model, feeds = _model(n=8, nkv=2, h=64, rotary="half", **kw)
    sess = npu_session(model, {"kernels": "native"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    got = sess.run(None, feeds)
    want = cpu_run(model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=5e-5, atol=5e-5)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    steps = _npu_gqa_steps("native")
    assert steps and all(p.kernel_cache.get(FALLBACK, "not run") is None for p in steps)
    del sess


def test_session_same_bits_on_orts_pool_at_any_thread_count():
    """Inside a session the (batch, kv head) tasks run on ORT's intra-op pool: each task's order is fixed, so the
    bits do not depend on the pool's size or host_threads."""
    model, feeds = _model(b=2, s=3, n=8, nkv=4, h=64, past=30, seqlens=[20, 32], total=33, rotary="half")
    results = []
    for intra, host in ((1, 1), (2, 2), (3, 2), (2, 1)):
        so = session_options()
        so.intra_op_num_threads = intra
        sess = npu_session(model, {"host_threads": str(host), "kernels": "native"}, cpu=False, so=so)
        assert set(assignment(sess).values()) == {"NpuEP"}
        results.append(sess.run(None, feeds))
        del sess
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_presents_are_written_into_orts_output_buffers(monkeypatch):
    """Both presents are outputs of the partition: the kernel writes them straight into ORT's buffers (the bridge
    copies nothing). ORT's arena hands back buffers holding an earlier, longer call's rows, so every row past the
    new valid length must still come out zero, as the CPU EP's memset makes it."""
    model, _ = _model(b=2, s=1, n=8, nkv=2, h=64, past=40, rotary="half")
    sess = _tagged_session(model)
    hits = []
    real = runtime.ort_output

    def spy(p, index, shape, dtype):
        view = real(p, index, shape, dtype)
        hits.append((index, view is not None))
        return view

    monkeypatch.setattr(runtime, "ort_output", spy)
    for seqlens in ([39, 40], [3, 11], [40, 0]):  # long, short (stale rows behind), and long again
        _, feeds = _model(b=2, s=1, n=8, nkv=2, h=64, past=40, rotary="half", seqlens=seqlens, seed=len(hits))
        got, want = sess.run(None, feeds), cpu_run(model, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=5e-5, atol=5e-5)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert hits == [(1, True), (2, True)]  # the first call; the later ones ran the bound step (below)
    assert _program(sess).native_step_counts == (2, 0)
    del sess


@pytest.mark.parametrize("kw", [
    dict(b=2, s=1, past=40, rotary="half"),  # decode, ragged batch rows below
    dict(b=1, s=3, past=24, rotary="interleaved", packed=True),  # a chunk over a past, packed QKV
    dict(b=1, s=1, past=16, rotary="half", position_ids=[[7]]),
    dict(b=1, s=2, past=None, rotary=None),  # a first prompt: no past, no rotary
])
def test_bound_step_equals_the_kernel_bit_for_bit(kw):
    """After a signature's first call the program's loop runs GroupQueryAttention as a bound step (gqa_step.cc):
    it resolves seqlens_k and total_sequence_length on every call as the Python kernel does, writes both presents
    into ORT's buffers, and gives the kernel's own bits, stale rows zeroed, for lengths that change per call."""
    model, _ = _model(n=8, nkv=2, h=32, **kw)
    sess = _tagged_session(model)
    node, p = _prepared(model, "native")
    b, s, past = kw["b"], kw["s"], kw["past"] or 0
    lengths = [[past + s - 1] * b, [s - 1 + min(past, 5)] * b, [past + s - 1 - r for r in range(b)]]
    if past == 0:
        lengths = [[s - 1] * b] * 3
    for i, seqlens in enumerate(lengths):
        _, feeds = _model(n=8, nkv=2, h=32, seqlens=seqlens, seed=i, **kw)
        got, want = sess.run(None, feeds), _run(node, p, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert _program(sess).native_step_counts == (2, 0)
    del sess


def test_bound_step_declines_what_the_kernel_refuses():
    """seqlens_k past the cache: the bound step declines and the Python kernel raises its own error."""
    model, feeds = _model(b=1, s=1, n=8, nkv=2, h=32, past=16, rotary="half")
    sess = _tagged_session(model)
    sess.run(None, feeds)
    _, bad = _model(b=1, s=1, n=8, nkv=2, h=32, past=16, rotary="half", seqlens=[40], total=17)
    with pytest.raises(Exception, match="GroupQueryAttention"):
        sess.run(None, bad)
    assert _program(sess).native_step_counts == (0, 1)
    del sess


def test_column_slices_of_one_product_are_read_in_place():
    """q, k, v as column views of one [B, S, (N + 2 Nkv) H] product (a fused QKV group's outputs): the same bits as
    contiguous copies, without copying them."""
    n, nkv, h, b, s, past = 8, 2, 32, 2, 3, 10
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((b, s, (n + 2 * nkv) * h)).astype(np.float32)
    q, k, v = qkv[..., : n * h], qkv[..., n * h: (n + nkv) * h], qkv[..., (n + nkv) * h:]
    pk, pv = (rng.standard_normal((b, nkv, past, h)).astype(np.float32) for _ in range(2))

    def attend(q, k, v):
        presents = [np.empty((b, nkv, past + s, h), np.float32) for _ in range(2)]
        out = NK.gqa(q, k, v, pk, pv, *presents, past + s, [past] * b, [past + s] * b, n, nkv, 0.125, 0.0, -1,
                     None, None, False, None, 1)
        return [out, *presents]

    for got, want in zip(attend(q, k, v), attend(*map(np.ascontiguousarray, (q, k, v)))):
        np.testing.assert_array_equal(got, want)
    # key at its own pitch, value a slice (GPT-J: K rotated by a RotaryEmbedding node into a fresh array, V read
    # from the product): each at its own pitch, the same bits
    for got, want in zip(attend(q, k.copy(), v), attend(*map(np.ascontiguousarray, (q, k, v)))):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="evenly spaced rows"):
        attend(q[:, ::2], k[:, ::2], v[:, ::2])  # rows of one batch entry not at the batch pitch / S


def test_outside_a_partition_call_the_presents_come_from_the_pool():
    """A kernel called directly (tests, npu-report --compare) has no ORT buffer to write: ort_output is None."""
    model, feeds = _model(b=1, s=1, n=4, nkv=2, h=16, past=5)
    node, p = _prepared(model, "native")
    p.runtime.partition_outputs = {1: 1, 2: 2}
    assert runtime.ort_output(p, 1, (1, 2, 6, 16), np.dtype(np.float32)) is None
    got = _run(node, p, feeds)
    assert got[1].shape == (1, 2, 6, 16) and p.kernel_cache["present_pool"]


def _run_shared(sess, feeds):
    """One run with each present bound to its past's own buffer (IOBinding; genai's past_present_share_buffer)."""
    import onnxruntime as ort

    caches = [feeds[n].copy() for n in ("pk", "pv")]  # the OrtValues borrow these: they must outlive the run
    pk, pv = (ort.OrtValue.ortvalue_from_numpy(c) for c in caches)
    io = sess.io_binding()
    for name, value in feeds.items():
        if name not in ("pk", "pv"):
            io.bind_cpu_input(name, value)
    io.bind_ortvalue_input("pk", pk)
    io.bind_ortvalue_input("pv", pv)
    outs = sess.get_outputs()
    io.bind_output(outs[0].name)
    io.bind_ortvalue_output(outs[1].name, pk)
    io.bind_ortvalue_output(outs[2].name, pv)
    sess.run_with_iobinding(io)
    return io.copy_outputs_to_cpu()[0], caches[0], caches[1]


def test_presents_bound_to_the_past_buffers_are_updated_in_place(monkeypatch):
    """A present bound to its past's buffer gets the new rows in place and keeps every other row, as the CPU EP
    leaves them (no copy of the cache, no zeroing of its free rows)."""
    import onnxruntime as ort

    model, feeds = _model(b=2, s=1, n=8, nkv=2, h=64, past=40, rotary="half", seqlens=[20, 33], total=40)
    sess = npu_session(model, {"kernels": "native"}, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    hits = []
    real = runtime.ort_output
    monkeypatch.setattr(runtime, "ort_output", lambda *a: hits.append(1) or real(*a))
    got = _run_shared(sess, feeds)
    want = _run_shared(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]), feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=5e-5, atol=5e-5)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[1][:, :, 34:], feeds["pk"][:, :, 34:])  # rows no batch writes: untouched
    assert len(hits) == 2
    del sess


def test_a_growing_past_runs_the_step_bound_for_the_first_length():
    """A decoder's past one longer every call (a new input-shape signature each time): the GroupQueryAttention
    step bound on the first call takes every later length (it resolves the lengths from the past it is given), so
    each new signature's first call runs it natively and binds nothing new; the kernel's bits throughout."""
    model, _ = _model(b=1, s=1, n=8, nkv=2, h=32, past=16, rotary="half")
    model.graph.input[3].type.tensor_type.shape.dim[2].dim_param = "past"
    model.graph.input[4].type.tensor_type.shape.dim[2].dim_param = "past"
    sess = _tagged_session(model)
    node, p = _prepared(model, "native")
    program = _program(sess)
    kernel_runs = count_kernel_runs(program)
    for past in range(16, 21):
        _, feeds = _model(b=1, s=1, n=8, nkv=2, h=32, past=past, rotary="half", seed=past)
        got, want = sess.run(None, feeds), _run(node, p, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    # the later lengths are scouted (ep/program.py _scout): the step bound on the first call takes them, so they are
    # kept on it without binding anything of their own
    assert len(program.signatures) == 5 and len(program._bindings) == 1 and not program._pending
    assert kernel_runs["com.microsoft::GroupQueryAttention"] == 1
    (i,) = [k for k, st in enumerate(program.steps) if st.op == "com.microsoft::GroupQueryAttention"]
    assert type(next(iter(program._bindings.values()))[i]).__name__ == "GqaStep"
    del sess


def _gptj_attention(s: int, n: int = 4, h: int = 16, rotary_dim: int = 8):
    """(model, feeds) of a GPT-J-style attention block's prefill: q, k, v projections of one input (the compiler
    groups them into one product whose outputs are column slices), q and k through interleaved partial
    RotaryEmbedding nodes of their own, then GroupQueryAttention without rotary over an empty past."""
    from onnx import TensorProto, helper

    from _vector_ortref import rotary_cache
    from npu_testing import make_model as graph_model

    d, ms = n * h, "com.microsoft"
    rng = np.random.default_rng(11)
    weights = {f"w{c}": rng.standard_normal((d, d)).astype(np.float32) / 8 for c in "qkv"}
    cos, sin = rotary_cache(rotary_dim // 2, np.float32, 64)
    rope = dict(domain=ms, interleaved=1, num_heads=n, rotary_embedding_dim=rotary_dim)
    nodes = [*(helper.make_node("MatMul", ["x", f"w{c}"], [c], name=f"proj_{c}") for c in "qkv"),
             helper.make_node("RotaryEmbedding", ["q", "pos", "cos", "sin"], ["q_rot"], name="rope_q", **rope),
             helper.make_node("RotaryEmbedding", ["k", "pos", "cos", "sin"], ["k_rot"], name="rope_k", **rope),
             helper.make_node("GroupQueryAttention", ["q_rot", "k_rot", "v", "pk", "pv", "seqlens_k", "total"],
                              ["y", "present_key", "present_value"], name="attn", domain=ms, num_heads=n,
                              kv_num_heads=n)]
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    inputs = [helper.make_tensor_value_info("x", f32, [1, s, d]),
              helper.make_tensor_value_info("pos", TensorProto.INT64, [1, s]),
              helper.make_tensor_value_info("pk", f32, [1, n, "past", h]),
              helper.make_tensor_value_info("pv", f32, [1, n, "past", h]),
              helper.make_tensor_value_info("seqlens_k", i32, [1]), helper.make_tensor_value_info("total", i32, [])]
    outputs = [helper.make_tensor_value_info("y", f32, [1, s, d]),
               *(helper.make_tensor_value_info(name, f32, [1, n, s, h]) for name in ("present_key", "present_value"))]
    model = graph_model(nodes, inputs, outputs, {**weights, "cos": cos, "sin": sin}, extra_opsets=[(ms, 1)])
    empty = np.zeros((1, n, 0, h), np.float32)
    feeds = {"x": rng.standard_normal((1, s, d)).astype(np.float32), "pos": np.arange(s, dtype=np.int64)[None],
             "pk": empty, "pv": empty, "seqlens_k": np.array([s - 1], np.int32), "total": np.array(s, np.int32)}
    return model, feeds


def test_a_gptj_style_prefill_runs_rotary_and_attention_as_native_steps():
    """GPT-J's prefill: the rotary nodes' q and k and the attention's v are column slices of one grouped product
    (strided rows), while the attention's k is the rotary's fresh array (another pitch than v). The bound
    RotaryEmbedding and GroupQueryAttention steps take them as they are: after the first call no Python kernel runs
    (each used to decline every prefill call: the rotary wanted C-order x, the attention one pitch for k and v);
    the CPU EP's values."""
    model, feeds = _gptj_attention(s=17)
    sess = _tagged_session(model)
    program = _program(sess)
    assert "npu::MatMulGroup" in [st.op for st in program.steps]
    want = cpu_run(model, feeds)
    sess.run(None, feeds)
    kernel_runs = count_kernel_runs(program)
    for _ in range(3):
        got = sess.run(None, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=5e-5, atol=5e-5)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert kernel_runs["com.microsoft::RotaryEmbedding"] == 0 and kernel_runs["com.microsoft::GroupQueryAttention"] == 0
    del sess
