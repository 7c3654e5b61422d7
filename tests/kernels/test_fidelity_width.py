"""Fidelity at the widths of a 1B decoder (TinyLlama-1.1B: hidden 2048, FFN 5632, 32 query / 4 KV heads) through
real NpuEP sessions against ORT's CPU EP, graph assignment checked.

Why two kinds of test. With accuracy_level 4 every MatMulNBits quantizes A to int8 per block, so the op is
discontinuous: a 1-ulp change of A that crosses a rounding boundary moves a code by one quantum, ~1e-4 relative on
that output, and later layers amplify it (the CPU EP against itself with the embeddings moved by 1 ulp: logits
1e-2 apart after 2 layers of this width). So at level 4 a fused group is tested on its own, where NpuEP must give
A the CPU EP's bits (the Skip norm prologue follows ORT's arithmetic), and the whole decoder is tested at
accuracy_level 0, where the graph is well conditioned (the same 1-ulp experiment moves the logits by 2e-6)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_partitions, npu_session

RNG = np.random.default_rng(2048)
MS = [("com.microsoft", 1)]
HIDDEN, FFN, KV = 2048, 5632, 256


def _nbits(name, a, k, n, level=4):
    q = quantize_matmul_nbits((RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), 32, True)
    node = helper.make_node("MatMulNBits", [a, f"{name}_B", f"{name}_S"], [name], name, domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=32, accuracy_level=level)
    return node, {f"{name}_B": q.B, f"{name}_S": q.scales}


def _skip_norm_qkv(m):
    """SkipSimplifiedLayerNormalization feeding q/k/v MatMulNBits (level 4), a sibling group on NpuEP (the norm
    prologue is not folded at level 4). The residual sum is a graph output too, as in a decoder."""
    inits = {"gamma": RNG.uniform(0.5, 1.5, HIDDEN).astype(np.float32)}
    nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "res", "gamma"], ["a", "", "", "sum"],
                              "norm", domain="com.microsoft", epsilon=1e-6)]
    outs = []
    for name, n in (("q", HIDDEN), ("k", KV), ("v", KV)):
        nd, w = _nbits(name, "a", HIDDEN, n)
        nodes.append(nd)
        inits.update(w)
        outs.append(helper.make_tensor_value_info(name, F32, [1, m, n]))
    outs.append(helper.make_tensor_value_info("sum", F32, [1, m, HIDDEN]))
    ins = [helper.make_tensor_value_info(x, F32, [1, m, HIDDEN]) for x in ("x", "res")]
    model = make_model(nodes, ins, outs, inits, opset=21, extra_opsets=MS)
    return model


@pytest.mark.parametrize("m", [1, 16])
def test_skip_norm_prologue_at_level_4_gives_a_the_cpu_eps_codes(m):
    """K=2048, accuracy_level 4: with A bit-equal to ORT's norm output the int8 codes are ORT's, so only float
    summation order remains (1e-5 of the output's scale; a single flipped code would be ~1e-4)."""
    model = _skip_norm_qkv(m)
    # activations of a residual stream: a few large channels make block maxima that many values share
    x = (RNG.standard_normal((1, m, HIDDEN)) * RNG.uniform(0.2, 3.0, (1, m, 1))).astype(np.float32)
    feeds = {"x": x, "res": RNG.standard_normal((1, m, HIDDEN)).astype(np.float32)}
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want, name in zip(sess.run(None, feeds), cpu_run(model, feeds), ("q", "k", "v", "sum")):
        if name == "sum":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=name)
    del sess


def test_skip_norm_alone_has_ort_bits():
    """SkipSimplifiedLayerNormalization at D=2048 equals ORT's CPU kernel bit for bit (its float32 arithmetic)."""
    inits = {"gamma": RNG.uniform(0.5, 1.5, HIDDEN).astype(np.float32)}
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "res", "gamma"], ["y", "", "inv", "sum"],
                            "norm", domain="com.microsoft", epsilon=1e-6)
    ins = [helper.make_tensor_value_info(x, F32, [3, 7, HIDDEN]) for x in ("x", "res")]
    outs = [helper.make_tensor_value_info(n, F32, [3, 7, d]) for n, d in (("y", HIDDEN), ("inv", 1), ("sum", HIDDEN))]
    model = make_model([node], ins, outs, inits, opset=21, extra_opsets=MS)
    feeds = {"x": (RNG.standard_normal((3, 7, HIDDEN)) * 4).astype(np.float32),
             "res": RNG.standard_normal((3, 7, HIDDEN)).astype(np.float32)}
    sess = npu_session(model, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    for got, want in zip(sess.run(None, feeds), cpu_run(model, feeds)):
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def decoder_2048_fp32(tmp_path_factory):
    """2 layers at TinyLlama-1.1B widths (vocab cut to 512 to keep the build short), float32."""
    from npu_ep.models.tiny_llama import LlamaConfig, build_tiny_llama

    d = tmp_path_factory.mktemp("decoder_2048")
    return str(build_tiny_llama(d / "fp32.onnx", LlamaConfig(num_hidden_layers=2, hidden_size=HIDDEN,
                                                             intermediate_size=FFN, num_attention_heads=32,
                                                             num_key_value_heads=4, vocab_size=512)))


@pytest.fixture(scope="module")
def decoder_2048(decoder_2048_fp32):
    """The same decoder rewritten to int4 at accuracy_level 0."""
    from pathlib import Path

    from npu_ep.rewriter import rewrite

    dst = Path(decoder_2048_fp32).with_name("int4.onnx")
    rewrite(decoder_2048_fp32, passes=("cleanup", "rope", "gqa", "int4"), int4_accuracy_level=0).save(dst)
    return str(dst)


def test_decoder_at_1b_width_matches_cpu_ep(decoder_2048):
    """Prefill logits within 1e-4 of the CPU EP's scale (target 1e-3; measured ~2e-6) and 64 greedy tokens
    identical; every MatMulNBits, attention and norm on NpuEP."""
    import onnx

    from npu_ep.tools.generation import Generator
    from tests.npu_testing import session_options
    import onnxruntime as ort

    sess = npu_session(decoder_2048)
    owner = assignment(sess)
    ops = {n.name: n.op_type for n in onnx.load(decoder_2048, load_external_data=False).graph.node}
    for name, op in ops.items():
        if op in ("MatMulNBits", "GroupQueryAttention", "SimplifiedLayerNormalization",
                  "SkipSimplifiedLayerNormalization"):
            assert owner.get(name) == "NpuEP", (name, op)
    assert len(npu_partitions(sess)) == 1
    cpu = ort.InferenceSession(decoder_2048, session_options(), providers=["CPUExecutionProvider"])
    prompt = [int(t) for t in RNG.integers(1, 512, 12)]
    ours = Generator(sess, max_kv_len=96).generate(prompt, 64, keep_logits=True)
    ref = Generator(cpu, max_kv_len=96).generate(prompt, 64, keep_logits=True)
    first, want = np.asarray(ours.logits[0]), np.asarray(ref.logits[0])
    np.testing.assert_allclose(first, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert ours.tokens == ref.tokens


def test_fp32_decoder_at_1b_width_runs_its_prefill_on_the_packed_gemm_and_matches_cpu_ep(decoder_2048_fp32):
    """float32 at 1B width: the prompt's 2048- and 5632-wide products are large enough for NpuEP's own packed-B
    GEMM on AVX-512 hosts (its own summation order, not the BLAS's). Prefill logits within 1e-4 of the CPU EP's
    scale (target 1e-3) and 32 greedy tokens identical; every MatMul on NpuEP."""
    import onnx
    import onnxruntime as ort

    from npu_ep.ep.sessions import session_of, tag_session_options
    from npu_ep.kernels import runtime
    from npu_ep.kernels.ops import matmul
    from npu_ep.tools.generation import Generator
    from tests.npu_testing import session_options

    so = session_options()
    tag_session_options(so)
    sess = npu_session(decoder_2048_fp32, so=so)
    owner = assignment(sess)
    matmuls = [n.name for n in onnx.load(decoder_2048_fp32, load_external_data=False).graph.node
               if n.op_type == "MatMul"]
    assert matmuls and all(owner.get(name) == "NpuEP" for name in matmuls)
    cpu = ort.InferenceSession(decoder_2048_fp32, session_options(), providers=["CPUExecutionProvider"])
    prompt = [int(t) for t in RNG.integers(1, 512, 24)]
    ours = Generator(sess, max_kv_len=64).generate(prompt, 32, keep_logits=True)
    ref = Generator(cpu, max_kv_len=64).generate(prompt, 32, keep_logits=True)
    first, want = np.asarray(ours.logits[0]), np.asarray(ref.logits[0])
    np.testing.assert_allclose(first, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert ours.tokens == ref.tokens
    print(f"\nfp32 1B-width prefill: max |logits diff| {np.abs(first - want).max():.2e} on a scale of "
          f"{np.abs(want).max():.2f}")
    packed = [st for prog in session_of(sess).programs.values() for st in prog.steps
              if matmul.PACKED_B in st.prepared.kernel_cache]
    if runtime.native_module() is not None and runtime.native_module().isa() in ("avx512", "avx512_vnni", "amx_int8"):
        assert packed  # the prefill's products ran on the packed GEMM
