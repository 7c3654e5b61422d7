"""Differential sweep of the native scaled-dot-product core ``kernels.sdpa`` (kernels/native/sdpa.cc, issue 40)
against the reference model (kernels/ops/_sdpa.py attend and the three ops' masks), through ONNX Attention,
com.microsoft MultiHeadAttention and com.microsoft Attention, at every instruction-set path (``isa``; com.microsoft
Attention's projection runs the packed GEMM, so that op is native on AVX-512 hosts only and swept there).

The grid: head dims 8/16/64/80/128; query counts around the core's 4-row passes and its 16-row switch to a
transposed K; key counts around the 16-key score rows and vector lanes; GQA groups; 3-D and 4-D layouts; past
keys with presents; bool, float, key-length, end/start and raw int32 masks, causal/unidirectional, attention_bias;
rows whose every key is masked (-inf: zeros; ORT's -10000 fill: a plain softmax); NaN and infinities in Q, K and
the mask (NaN rows where the reference has them); every qk_matmul_output stage; float16. The bound step is checked
against the kernel bit for bit by ``_sweep``; sessions show NpuEP ran each op as its bound native step with the CPU
EP's values.

Tolerances: float32 rtol = atol = 2e-5 (the core sums its dot products and P V in its own order and uses its own
exp, within a few float32 ulps of numpy's BLAS and exp; the scores feed an exp, which turns an absolute error of
the scores into a relative one of the weights); float16 rtol = atol = 4e-3 (both sides round a float32 result to
float16 once: values that differ in the last float32 bits may round to neighbouring halves, one half ulp is 2e-3
below 4).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from _sweep import check, native_vs_reference
from npu_ep.ep.sessions import tag_session_options
from npu_ep.kernels import runtime
from npu_testing import assignment, cpu_run, make_model, npu_session, session_options

pytestmark = pytest.mark.skipif(runtime.native_module() is None, reason="native extension not built")

MS = "com.microsoft"
TOL = {np.float32: 2e-5, np.float16: 4e-3}
RNG = np.random.default_rng(4040)


def _rand(shape, dt=np.float32, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dt)


def _check(op: str, inputs, dt, n_out: int = 1, domain: str = "", **attrs) -> list[np.ndarray]:
    tol = TOL[dt]
    return check(op, inputs, "sdpa", exact=False, rtol=tol, atol=tol, domain=domain, n_out=n_out, **attrs)


def _onnx(b, n, nkv, s, t, h, hv, dt, *, rank=4, past=0, mask=None, n_out=1, **attrs):
    if rank == 4:
        q, k, v = _rand((b, n, s, h), dt), _rand((b, nkv, t, h), dt), _rand((b, nkv, t, hv), dt)
    else:
        q, k, v = _rand((b, s, n * h), dt), _rand((b, t, nkv * h), dt), _rand((b, t, nkv * hv), dt)
        attrs |= {"q_num_heads": n, "kv_num_heads": nkv}
    inputs = [("q", q, False), ("k", k, False), ("v", v, False), ("m", mask, False) if mask is not None else
              ("m", None, False)]
    if past:
        inputs += [("pk", _rand((b, nkv, past, h), dt), False), ("pv", _rand((b, nkv, past, hv), dt), False)]
    return _check("Attention", inputs, dt, n_out=n_out, **attrs)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("h", [8, 16, 64, 80, 128])
def test_head_dims_and_lengths(isa, dt, h):
    """Query rows around the 4-row passes and the 16-row transposed K, keys around the 16-key rows."""
    for s, t in ((1, 1), (3, 17), (5, 16), (16, 15), (17, 33)):
        _onnx(1, 2, 2, s, t, h, h, dt, scale=1.0 / h)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_transposed_keys_in_tiles(isa, dt):
    """From 16 query rows on K is transposed, 16 keys by 16 head channels at a time in registers on AVX-512 (read
    where they are stored: past tiles, new tiles without a bias), and the scores kernel scales, adds the bias and takes
    the row maxima in its epilogue: key counts around whole 16-key tiles and the epilogue's 64-key blocks, head dims
    on the tiles (16, 256) and off them (72), 3-D (strided) Q and keys, a past whole in tiles or across a tile, GQA
    over two batches, 1-3 query rows in the last pass, a float mask."""
    for h in (16, 72, 256):
        for t in (16, 31, 32, 49):
            _onnx(1, 2, 2, 16, t, h, 16, dt, scale=1.0 / h)
    _onnx(1, 2, 2, 20, 33, 32, 32, dt, rank=3)
    _onnx(1, 2, 1, 17, 16, 64, 64, dt, past=16, n_out=3)
    _onnx(2, 4, 2, 19, 40, 32, 32, dt, past=20, n_out=3)
    _onnx(1, 2, 2, 18, 70, 16, 16, dt, rank=3, mask=_rand((18, 70), dt))
    _onnx(1, 1, 1, 33, 129, 64, 64, dt, mask=RNG.random((1, 1, 33, 129)) < 0.8)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_passes_over_key_panels(isa, dt):
    """With the fused scores (AVX-512, from 16 query rows on) up to 64 query rows share a pass over K and V in
    4-row groups (fewer rows when their scores would pass 1 MB), K is transposed in 64-key panels and P V is summed
    panel by panel: query counts around the groups and passes, key counts around the panels, head dims with a
    value-channel tail, a past across a panel, GQA, masks whose fully masked rows land in a later pass, and 4100
    keys (60-row passes)."""
    for h, hv in ((16, 16), (80, 40), (128, 128)):
        for s, t in ((16, 63), (63, 64), (65, 65), (130, 129), (67, 200)):
            _onnx(1, 2, 2, s, t, h, hv, dt, scale=1.0 / h)
    _onnx(1, 4, 2, 66, 40, 64, 64, dt, past=50, n_out=3, is_causal=1)
    _onnx(1, 2, 1, 70, 100, 32, 32, dt, rank=3, past=64, n_out=3)
    keep = RNG.random((2, 1, 70, 150)) < 0.7
    keep[0, 0, 5], keep[1, 0, 66] = False, False  # every key masked: zeros, in the first and the second pass
    _onnx(2, 2, 2, 70, 150, 32, 32, dt, mask=keep)
    _onnx(2, 2, 2, 70, 150, 32, 32, dt, mask=np.where(keep, _rand(keep.shape, dt), -np.inf).astype(dt))
    _onnx(1, 1, 1, 130, 4100, 16, 16, dt)


def test_specials_across_panels(isa):
    """NaN and infinities past the first key panel and the first pass: the row maximum taken panel by panel keeps
    a NaN (NaN row) and an infinite score (NaN row); a row whose every score is -inf gives zeros."""
    b, n, s, t, h = 1, 2, 70, 200, 32
    q, k, v = _rand((b, n, s, h)), _rand((b, n, t, h)), _rand((b, n, t, h))
    q[0, 0, 66, 3], k[0, 1, 130, 0] = np.nan, np.inf
    mask = _rand((s, t))
    mask[20, 140], mask[40, 70], mask[50, :] = np.nan, np.inf, -np.inf
    mask[67, 64:] = -np.inf  # only the first panel's keys count
    inputs = [("q", q, False), ("k", k, False), ("v", v, False), ("m", mask, False)]
    got = _check("Attention", inputs, np.float32)
    assert np.isnan(got[0]).any() and not np.isnan(got[0]).all()


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_gqa_layouts_past_and_presents(isa, dt):
    for rank in (3, 4):
        _onnx(2, 6, 2, 5, 7, 16, 8, dt, rank=rank)
        _onnx(2, 4, 1, 17, 9, 16, 16, dt, rank=rank, past=6, n_out=3, is_causal=1)
    _onnx(1, 2, 2, 1, 1, 8, 8, dt, past=20, n_out=3, is_causal=1)  # a decode step sees every key


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_onnx_masks_with_fully_masked_rows(isa, dt):
    s, t = 18, 20
    keep = RNG.random((2, 1, s, t)) < 0.7
    keep[0, 0, 3] = False  # every key masked: zeros
    _onnx(2, 2, 2, s, t, 16, 16, dt, mask=keep)
    _onnx(2, 2, 2, s, t, 16, 16, dt, mask=keep[0, 0], is_causal=1, softcap=2.5)
    additive = np.where(keep, _rand(keep.shape, dt), -np.inf).astype(dt)
    _onnx(2, 2, 2, s, t, 16, 16, dt, mask=additive)
    _onnx(2, 2, 2, s, t - 5, 16, 16, dt, mask=additive[:, :, :, :t], past=5, n_out=3, is_causal=1)


def test_specials_in_q_k_and_mask(isa):
    """NaN and infinities: a NaN in a query or key gives NaN rows, an infinite score a NaN row, a -inf key score
    (an infinite key against a positive query channel) weight 0; the reference says which."""
    b, n, s, t, h = 1, 2, 17, 19, 16
    q, k, v = _rand((b, n, s, h)), _rand((b, n, t, h)), _rand((b, n, t, h))
    q[0, 0, 2, 3], k[0, 1, 4, 0] = np.nan, np.inf
    mask = _rand((s, t))
    mask[5, 7], mask[6, :] = np.nan, -np.inf
    mask[7, 2] = np.inf
    inputs = [("q", q, False), ("k", k, False), ("v", v, False), ("m", mask, False)]
    got = _check("Attention", inputs, np.float32)
    assert np.isnan(got[0]).any() and not np.isnan(got[0]).all()


def _mha(dt, *, s=5, kv_len=7, past=0, per_head=False, bias=True, mask=None, ab=None, n_out=1, **attrs):
    b, n, h = 2, 2, 16
    d = n * h
    if per_head:
        k, v = _rand((b, n, kv_len, h), dt), _rand((b, n, kv_len, h), dt)
    else:
        k, v = _rand((b, kv_len, d), dt), _rand((b, kv_len, d), dt)
    inputs = [("q", _rand((b, s, d), dt), False), ("k", k, False), ("v", v, False),
              ("bias", _rand((3 * d,), dt) if bias else None, True), ("kpm", mask, False), ("ab", ab, False)]
    if past:
        inputs += [("pk", _rand((b, n, past, h), dt), False), ("pv", _rand((b, n, past, h), dt), False)]
    return _check("MultiHeadAttention", inputs, dt, n_out=n_out, domain=MS, num_heads=n, **attrs)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_mha_masks_bias_past(isa, dt):
    _mha(dt)
    _mha(dt, per_head=True)
    _mha(dt, s=17, kv_len=17, mask=np.array([0, 9], np.int32))  # batch 0: every key masked by the -10000 fill
    _mha(dt, s=17, kv_len=20, mask=(RNG.random((2, 20)) < 0.6).astype(np.int32), ab=_rand((1, 2, 17, 20), dt))
    _mha(dt, mask=(RNG.random((2, 5, 7)) < 0.6).astype(np.int32) * 3, mask_filter_value=-1.0e4 / 3)
    _mha(dt, s=4, kv_len=4, past=3, n_out=3, unidirectional=1, ab=_rand((2, 1, 4, 7), dt))


def _ms(*, b=2, s=5, din=24, n=2, head=8, past=0, mask=None, ab=None, n_out=1, **attrs):
    d = n * head
    inputs = [("x", _rand((b, s, din)), False), ("w", _rand((din, 3 * d), scale=0.3), True),
              ("bias", _rand((3 * d,)), True), ("m", mask, False),
              ("past", _rand((2, b, n, past, head)) if past else None, False), ("ab", ab, False)]
    return _check("Attention", inputs, np.float32, n_out=n_out, domain=MS, num_heads=n, **attrs)


def test_ms_attention_masks_past_unidirectional(isa):
    if isa not in ("avx512", "avx512_vnni", "amx_int8"):
        pytest.skip("com.microsoft Attention is native where its projection runs the packed GEMM (AVX-512)")
    _ms()
    _ms(s=17, mask=np.array([17, 0], np.int32))  # batch 1: every key masked by the -10000 fill
    _ms(mask=np.array([5, 4, 1, 0], np.int32))  # ends then starts
    _ms(mask=(RNG.random((2, 5)) < 0.6).astype(np.int32), ab=_rand((1, 2, 5, 5)))
    _ms(mask=(RNG.random((2, 5, 5)) < 0.6).astype(np.int32) - 1)
    _ms(mask=np.ones((2, 1), np.int32))  # the dummy form masks nothing
    _ms(s=6, past=4, n_out=2, unidirectional=1, mask=np.array([10, 8], np.int32))


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_qk_matmul_output_modes(isa, dt):
    """Every qk_matmul_output stage (scaled scores, after softcap, after the mask with -inf as float32's lowest,
    softmax) with a fully masked row and, in float32, a NaN and an infinite score (the softmax stage of such rows
    as the reference computes it: unshifted exp over its sum)."""
    s, t = 17, 18
    keep = RNG.random((s, t)) < 0.7
    keep[4] = False
    for mode in range(4):
        q, k, v = _rand((1, 2, s, 16), dt), _rand((1, 2, t, 16), dt), _rand((1, 2, t, 16), dt)
        mask = np.where(keep, _rand((s, t), dt), -np.inf).astype(dt)
        if dt == np.float32:
            mask[6, 3], mask[7, 5] = np.nan, np.inf
        inputs = [("q", q, False), ("k", k, False), ("v", v, False), ("m", mask, False)]
        _check("Attention", inputs, dt, n_out=4, qk_matmul_output_mode=mode, softcap=3.0, is_causal=1)
    mha = [("q", _rand((2, 5, 32), dt), False), ("k", _rand((2, 7, 32), dt), False),
           ("v", _rand((2, 7, 32), dt), False), ("bias", _rand((96,), dt), True)]
    _check("MultiHeadAttention", mha, dt, n_out=4, domain=MS, num_heads=2)


def test_declines_odd_masks():
    """A key_padding_mask that is not int32 runs the reference (no native call)."""
    mha = [("q", _rand((2, 4, 16)), False), ("k", _rand((2, 4, 16)), False), ("v", _rand((2, 4, 16)), False),
           ("bias", None, False), ("kpm", RNG.random((2, 4)) < 0.7, False)]
    _, _, calls = native_vs_reference("MultiHeadAttention", mha, domain=MS, num_heads=2)
    assert "sdpa" not in calls


def _session_case(op: str, dt):
    """(model, feeds, initializers) of one node: ONNX Attention, MultiHeadAttention or com.microsoft Attention
    ("ComAttention") with a mask and a causal or padding pattern."""
    f = TensorProto.FLOAT16 if dt == np.float16 else TensorProto.FLOAT
    if op == "Attention":
        b, n, s, h = 1, 4, 80, 32  # two passes of query rows, two key panels
        node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], name="the_op", is_causal=1)
        shapes = {"q": (b, n, s, h), "k": (b, n, s, h), "v": (b, n, s, h)}
        feeds = {name: _rand(shape, dt) for name, shape in shapes.items()} | {"m": RNG.random((s, s)) < 0.8}
        inputs = [helper.make_tensor_value_info(k, f, list(v)) for k, v in shapes.items()]
        inputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [s, s]))
        return make_model([node], inputs, [helper.make_tensor_value_info("y", f, [b, n, s, h])], opset=23), feeds, {}
    b, s, d, n = 2, 24, 64, 2
    if op == "MultiHeadAttention":
        node = helper.make_node(op, ["q", "k", "v", "bias", "kpm"], ["y"], name="the_op", domain=MS, num_heads=n)
        shapes = {"q": (b, s, d), "k": (b, s, d), "v": (b, s, d)}
        feeds = {name: _rand(shape, dt) for name, shape in shapes.items()} | {"kpm": np.array([24, 7], np.int32)}
        inputs = [helper.make_tensor_value_info(k, f, list(v)) for k, v in shapes.items()]
        inputs.append(helper.make_tensor_value_info("kpm", TensorProto.INT32, [b]))
        inits = {"bias": _rand((3 * d,), dt)}
    else:
        node = helper.make_node("Attention", ["x", "w", "bias", "m"], ["y"], name="the_op", domain=MS,
                                num_heads=n, unidirectional=1)
        feeds = {"x": _rand((b, s, d)), "m": np.array([24, 7], np.int32)}
        inputs = [helper.make_tensor_value_info("x", f, [b, s, d]),
                  helper.make_tensor_value_info("m", TensorProto.INT32, [b])]
        inits = {"w": _rand((d, 3 * d), scale=0.2), "bias": _rand((3 * d,))}
    outs = [helper.make_tensor_value_info("y", f, [b, s, d])]
    return make_model([node], inputs, outs, inits, opset=21, extra_opsets=[(MS, 1)]), feeds, inits


@pytest.mark.parametrize("op,dt", [("Attention", np.float32), ("Attention", np.float16),
                                   ("MultiHeadAttention", np.float32), ("MultiHeadAttention", np.float16),
                                   ("ComAttention", np.float32)])
def test_session_runs_natively_with_cpu_ep_values(op, dt):
    """Three calls: the kernel's run, then the bound step; NpuEP ran the node, no step ran its Python kernel, and
    the values are the CPU EP's within the sweep's tolerance (ORT's kernels sum and exponentiate in their own
    order too)."""
    from npu_ep.tools.bench.ops import python_steps

    if op == "ComAttention" and runtime.native_module().isa() not in ("avx512", "avx512_vnni", "amx_int8"):
        pytest.skip("com.microsoft Attention is native where its projection runs the packed GEMM (AVX-512)")
    model, feeds, _ = _session_case(op, dt)
    so = session_options()
    tag_session_options(so)
    sess = npu_session(model, so=so)
    assert assignment(sess) == {"the_op": "NpuEP"}
    want = cpu_run(model, feeds)[0]
    for _ in range(3):
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=TOL[dt], atol=TOL[dt])
    assert python_steps(sess) == [], "the node ran its Python kernel instead of the bound native step"


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_threads_give_the_same_bits(dt):
    """Above the one-thread floor (about 1M multiply-adds) the tasks split heads and query blocks by the thread
    count; every row's bits stay the same, and the two-thread run matches the reference."""
    q, k, v = _rand((1, 3, 70, 64), dt), _rand((1, 3, 90, 64), dt), _rand((1, 3, 90, 64), dt)
    inputs = [("q", q, False), ("k", k, False), ("v", v, False)]
    one = _check("Attention", inputs, dt)
    got, _, calls = native_vs_reference("Attention", inputs, threads=2)
    assert "sdpa" in calls and got[0].tobytes() == one[0].tobytes()
