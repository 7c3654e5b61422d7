"""The decoder generation loop: bucketed right-padded prefill, chunking, fixed-capacity KV cache, and greedy tokens
on NpuEP identical to ORT's CPU EP (fp32 exporter graph and the RoPE+GQA+INT4 rewritten graph)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import npu_ep
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import Generator, KvCapacityError, PromptTooLongError, generate, reference_generate
from npu_ep.tools.generation import DEFAULT_BUCKETS, KvCache, KvLayout, plan_prefill
from npu_testing import assignment

CPU = ["CPUExecutionProvider"]
NPU = [(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"]
BUCKETS = (32, 128)
DECODE_STEPS = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen")
    fp32 = build_tiny_llama(d / "tiny.onnx")
    result = rewrite(str(fp32), passes=("cleanup", "rope", "gqa", "int4"))
    counts = result.report.counts
    assert counts["MatMulToNBits"] > 0 and any(k.startswith("GroupQueryAttention") for k in counts), counts
    int4 = result.save(d / "tiny.npu.onnx")
    return {"fp32": fp32, "int4": int4}


# -- shape planning (no ORT) ---------------------------------------------------------------------------------------
def test_prefill_plan_buckets_and_chunks():
    assert [(c.length, c.bucket) for c in plan_prefill(5, BUCKETS)] == [(5, 32)]
    assert [(c.length, c.bucket) for c in plan_prefill(32, BUCKETS)] == [(32, 32)]
    # 40 tokens: 32 + 8 padded to 32 (64 executed) instead of one 128 bucket; only the last step is padded
    assert [(c.length, c.bucket) for c in plan_prefill(40, BUCKETS)] == [(32, 32), (8, 32)]
    assert [(c.length, c.bucket) for c in plan_prefill(100, BUCKETS)] == [(100, 128)]  # 3x32 + 4->32 is no fewer
    plan = plan_prefill(300, BUCKETS)  # full chunks of the largest bucket first, the remainder's pieces after
    assert [(c.start, c.length, c.bucket, c.first) for c in plan] == [(0, 128, 128, True), (128, 128, 128, False),
                                                                     (256, 32, 32, False), (288, 12, 32, False)]
    with pytest.raises(PromptTooLongError,
                       match=r"longer than the largest prefill bucket.*chunked prefill is disabled"):
        plan_prefill(150, BUCKETS, chunked=False)
    assert [(c.length, c.bucket) for c in plan_prefill(40, BUCKETS, chunked=False)] == [(40, 128)]


def _waste(n: int, buckets, chunk=None) -> float:
    plan = plan_prefill(n, buckets, chunk=chunk)
    assert sum(c.length for c in plan) == n and all(c.padding == 0 for c in plan[:-1])
    return 1 - n / sum(c.bucket for c in plan)


def test_chunk_option_and_waste_figures():
    """The demo's 40-token prompt (69% waste in one 128 bucket) and a 1k-token prompt at chunk 128 (< 10%)."""
    assert _waste(40, (32, 128, 512)) == pytest.approx(24 / 64)          # was 88 / 128
    assert _waste(40, DEFAULT_BUCKETS) == pytest.approx(8 / 48)          # the default buckets have 16
    assert _waste(1000, DEFAULT_BUCKETS, chunk=128) == pytest.approx(8 / 1008)  # 7x128 + 3x32 + 8->16
    assert _waste(1000, (32, 128, 512), chunk=128) == pytest.approx(24 / 1024)  # 7x128 + 104->128
    assert _waste(1024, DEFAULT_BUCKETS, chunk=128) == 0.0
    assert _waste(1000, DEFAULT_BUCKETS) == pytest.approx(8 / 1008)      # 512 + 3x128 + 3x32 + 8->16
    plan = plan_prefill(1000, DEFAULT_BUCKETS, chunk=128)
    assert [c.bucket for c in plan] == [128] * 7 + [32] * 3 + [16]       # buckets above the chunk are not used
    plan = plan_prefill(200, (32, 128), chunk=64)                        # a chunk size that is no bucket
    assert [(c.length, c.bucket) for c in plan] == [(64, 64), (64, 64), (64, 64), (8, 32)]
    with pytest.raises(ValueError, match="prefill chunk must be a positive"):
        plan_prefill(10, BUCKETS, chunk=0)


def test_kv_cache_refuses_to_overflow_and_never_overwrites():
    cache = KvCache(1, 2, 4, capacity=3)
    present = np.arange(2 * 2 * 4, dtype=np.float32).reshape(1, 2, 2, 4) + 1
    cache.append([(present, present)], [KvLayout.VALID_PREFIX], 2, past_len=3)
    before = cache.keys[0].copy()
    with pytest.raises(KvCapacityError, match=r"2 valid tokens \+ 2 new > capacity 3"):
        cache.append([(present, present)], [KvLayout.VALID_PREFIX], 2, past_len=3)
    np.testing.assert_array_equal(cache.keys[0], before)
    assert cache.length == 2


def test_generation_past_capacity_is_a_clear_error(models):
    with pytest.raises(KvCapacityError, match="capacity 40"):
        generate(models["fp32"], PROMPTS[2], 8, providers=CPU, buckets=BUCKETS, max_kv_len=40)


def test_long_prompt_refused_without_chunking(models):
    with pytest.raises(PromptTooLongError, match="150 tokens"):
        generate(models["fp32"], PROMPTS[3], 2, providers=CPU, buckets=BUCKETS, chunked_prefill=False)


# -- padding side: padded prefill == unpadded prefill (next token and valid KV), both graph styles -----------------
@pytest.mark.parametrize("kind", ["fp32", "int4"])
def test_right_padded_prefill_matches_unpadded(models, kind):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(models[kind]), providers=CPU)
    names = [o.name for o in sess.get_outputs()]
    prompt = PROMPTS[1]                       # 17 tokens -> bucket 32
    n, empty = len(prompt), np.zeros((1, 2, 0, 32), np.float32)
    past = {f"past_key_values.{i}.{k}": empty for i in range(4) for k in ("key", "value")}

    def run(ids, mask):
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.array([mask], np.int64),
                 "position_ids": np.array([list(range(n)) + [0] * (len(ids) - n)], np.int64), **past}
        return dict(zip(names, sess.run(None, feeds)))

    plain = run(prompt, [1] * n)
    padded = run(prompt + [0] * (32 - n), [1] * n + [0] * (32 - n))
    assert int(padded["logits"][0, n - 1].argmax()) == int(plain["logits"][0, -1].argmax())
    np.testing.assert_allclose(padded["logits"][0, :n], plain["logits"][0], atol=1e-5)
    for i in range(4):
        np.testing.assert_allclose(padded[f"present.{i}.key"][:, :, :n], plain[f"present.{i}.key"], atol=1e-5)
        np.testing.assert_allclose(padded[f"present.{i}.value"][:, :, :n], plain[f"present.{i}.value"], atol=1e-5)


@pytest.mark.parametrize("kind", ["fp32", "int4"])
def test_bucketed_loop_matches_naive_cpu_loop(models, kind):
    """Padding, chunking and the gap-masked capacity buffer change nothing: same tokens as the plain exporter loop."""
    for prompt in (PROMPTS[0], PROMPTS[3]):   # bucket-padded prompt, and a chunked one (150 > 128)
        ref_tokens, ref_rows = reference_generate(models[kind], prompt, 12)
        res = generate(models[kind], prompt, 12, providers=CPU, buckets=BUCKETS, max_kv_len=256)
        assert res.tokens == ref_tokens
        assert max(float(np.abs(a - b).max()) for a, b in zip(ref_rows, res.logits)) < 1e-4
        assert res.kv_length == len(prompt) + 11


# -- NpuEP vs CPU EP: >= 64 decode steps, several prompts --------------------------------------------------------
def _check_npu_ran(gen: Generator, model_path) -> dict[str, str]:
    """MatMuls must all run on NpuEP (ORT's assignment record); attention/RoPE/Softmax nodes must be on NpuEP
    unless NpuEP's capability declined them with a recorded reason (returned, so the report can show it)."""
    placed = assignment(gen.session)
    ops = {n.name: n.op_type for n in onnx.load(str(model_path), load_external_data=False).graph.node}
    declined = {d.node.name: d.reason for ep in gen._runner.eps for _, cap in ep.capabilities for d in cap.declined}
    summary = {}
    for op in ("MatMul", "MatMulNBits", "GroupQueryAttention", "RotaryEmbedding", "Softmax"):
        nodes = [n for n, t in ops.items() if t == op]
        if not nodes:
            continue
        off = [n for n in nodes if placed.get(n) != npu_ep.get_ep_name()]
        if op.startswith("MatMul"):
            assert not off, f"{op} nodes not on NpuEP: {off[:3]}"
        unexplained = [n for n in off if n not in declined]
        assert not unexplained, f"{op} nodes on the CPU without a decline reason: {unexplained[:3]}"
        summary[op] = f"{len(nodes) - len(off)}/{len(nodes)} on NpuEP" + (f" ({declined[off[0]]})" if off else "")
    assert any(k.startswith("MatMul") for k in summary)
    return summary


@pytest.mark.parametrize("kind", ["fp32", "int4"])
def test_npu_greedy_tokens_identical_to_cpu(models, kind, capsys):
    npu = Generator(models[kind], providers=NPU, buckets=BUCKETS, max_kv_len=256)
    cpu = Generator(models[kind], providers=CPU, buckets=BUCKETS, max_kv_len=256)
    on_npu = _check_npu_ran(npu, models[kind])
    lines = []
    for prompt in PROMPTS:
        a = npu.generate(prompt, DECODE_STEPS + 1)
        b = cpu.generate(prompt, DECODE_STEPS + 1)
        diff = max(float(np.abs(x - y).max()) for x, y in zip(a.logits, b.logits))
        assert a.tokens == b.tokens, f"prompt of {len(prompt)}: first mismatch at step " \
            f"{next(i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y)}"
        assert len(a.itl_s) == DECODE_STEPS and a.npu_prefill_s > 0 and all(t > 0 for t in a.npu_decode_s)
        lines.append(f"{kind} prompt {len(prompt):4d}: {len(a.tokens)} tokens identical, "
                     f"max |logits diff| {diff:.2e}, padding waste {a.padding.waste:.0%}")
    stats = npu.compile_stats()
    assert stats["npu_partitions"] >= 1 and stats["compiles"] == stats["npu_partitions"]
    # one decode shape for every prompt, and only the planned prefill shapes; the GQA graph runs with the KV
    # resident by default (tools/generation/resident.py): its first prefill binds the 256-slot buffer as the past
    assert npu.kv_in_place == (kind == "int4")
    first = 256 if npu.kv_in_place else 0
    assert set(npu.shapes) == {(32, first), (128, first), (32, 256), (1, 256)}
    assert npu.shapes[(1, 256)].calls == DECODE_STEPS * len(PROMPTS)
    with capsys.disabled():
        print("\n" + "\n".join(lines) + f"\n{kind} on NpuEP: {on_npu}, {stats}")


def test_four_threads_generating_on_one_npu_session_get_the_single_thread_tokens(models):
    """Shared per-node state (present-buffer pools, the matmul split helper, memoized tables) under concurrency:
    four threads decoding different prompts on one session produce exactly the single-threaded tokens."""
    import threading

    shared = Generator(models["int4"], providers=NPU, buckets=BUCKETS, max_kv_len=256)
    assert set(assignment(shared.session).values()) == {npu_ep.get_ep_name()}  # NpuEP runs every node
    want = [shared.generate(p, 16, keep_logits=False).tokens for p in PROMPTS[:4]]
    got: dict[int, list[int]] = {}

    def work(i: int) -> None:
        gen = Generator(shared.session, buckets=BUCKETS, max_kv_len=256)
        for _ in range(3):
            got.setdefault(i, []).append(gen.generate(PROMPTS[i], 16, keep_logits=False).tokens)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i] == [want[i]] * 3 for i in range(4)), (got, want)
