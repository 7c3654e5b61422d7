"""The generator with the KV resident (``kv_in_place``, tools/generation/resident.py): every step binds each
layer's past and present to one buffer of C slots, so a decode step appends one token's K/V in place and nothing
copies the cache. Greedy tokens equal the copying path's and the CPU EP's (padded and chunked prompts), every
GroupQueryAttention node runs on NpuEP, and the nodes' KV counters show appends only."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import npu_ep
from npu_ep.ep.kv_state import gqa_steps
from npu_ep.kernels.ops import _kv_traffic
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import Generator, KvCapacityError, inspect_model
from npu_testing import assignment

CPU = ["CPUExecutionProvider"]
NPU = [(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"]
BUCKETS = (16, 32)
STEPS = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen_resident")
    fp32 = build_tiny_llama(d / "tiny.onnx")
    return {"fp32": fp32, "int4": rewrite(str(fp32), passes=("cleanup", "rope", "gqa", "int4")).save(d / "t.npu.onnx")}


def test_resident_kv_tokens_equal_the_copying_path_and_the_cpu_ep(models):
    path = models["int4"]
    info = inspect_model(onnx.load(str(path), load_external_data=False))
    resident = Generator(path, providers=NPU, buckets=BUCKETS, max_kv_len=128, kv_in_place=True)
    copying = Generator(path, providers=NPU, buckets=BUCKETS, max_kv_len=128, kv_in_place=False)
    cpu = Generator(path, providers=CPU, buckets=BUCKETS, max_kv_len=128, kv_in_place=False)
    placed = assignment(resident.session)
    assert all(ep == npu_ep.get_ep_name() for name, ep in placed.items() if "GroupQueryAttention" in name)
    before = _kv_traffic.total(gqa_steps(resident.session))
    executed = 0
    for prompt in (PROMPTS[1], PROMPTS[3][:70]):  # 17 tokens (padded to 32); 70 = 2 chunks of 32 + 6 -> 16
        a, b, c = (g.generate(prompt, STEPS) for g in (resident, copying, cpu))
        assert a.tokens == b.tokens == c.tokens
        assert max(float(np.abs(x - y).max()) for x, y in zip(a.logits, c.logits)) < 1e-4
        executed += a.padding.executed_tokens + STEPS - 1
    traffic = _kv_traffic.total(gqa_steps(resident.session))
    row = 2 * info.kv_heads * info.head_dim * 4  # one position's K and V
    assert traffic["appended_bytes"] - before["appended_bytes"] == info.n_layers * executed * row
    assert traffic["copied_bytes"] == traffic["full_copies"] == 0  # the past is never copied
    assert traffic["in_place"] - before["in_place"] == info.n_layers * sum(s.calls for s in resident.shapes.values())
    assert _kv_traffic.total(gqa_steps(copying.session))["full_copies"] > 0  # the copying path copies every step


def test_resident_kv_counts_padded_rows_against_the_capacity(models):
    """A padded step writes its padding in place too: 17 tokens padded to 32 need 32 slots."""
    gen = Generator(models["int4"], providers=CPU, buckets=BUCKETS, max_kv_len=24, kv_in_place=True)
    with pytest.raises(KvCapacityError, match=r"0 valid tokens \+ 32 executed > capacity 24"):
        gen.generate(PROMPTS[1], 2)
    assert gen.generate(PROMPTS[1][:16], 8).kv_length == 16 + 7


def test_resident_kv_needs_group_query_attention_presents(models):
    with pytest.raises(ValueError, match="kv_in_place needs every layer's present from GroupQueryAttention"):
        Generator(models["fp32"], providers=CPU, kv_in_place=True)
    assert not Generator(models["fp32"], providers=NPU).kv_in_place  # the default: only where it applies


def test_kv_resident_in_npu_memory_crosses_no_kv_byte(models):
    """The KV as OrtValues in NpuEP's device memory (``kv_memory="npu"``, ep.device_memory): the CPU EP's tokens,
    and per decode step the only bytes ORT copies between host and NPU memory are input_ids, position_ids and the
    [1, C] mask in and the logits out (NpuEP's data-transfer counters); the partition finds all its inputs and
    outputs in NPU memory."""
    from npu_ep.ep.device_memory import device_counters
    from npu_ep.kernels.runtime import extension

    path, capacity = models["int4"], 64
    gen = Generator(path, providers=NPU, buckets=BUCKETS, max_kv_len=capacity, kv_memory="npu")
    want = Generator(path, providers=CPU, buckets=BUCKETS, max_kv_len=capacity, kv_in_place=False)
    prompt = PROMPTS[1]
    assert gen.generate(prompt, STEPS).tokens == want.generate(prompt, STEPS).tokens
    names = {name for ep in gen._runner.eps for name in ep.programs}

    def crossed() -> tuple[int, int]:
        stats = [s for name, s in extension().partition_stats().items() if name in names]
        host = sum(s["bytes_in"] - s["bytes_in_npu"] + s["bytes_out"] - s["bytes_out_npu"] for s in stats)
        device = device_counters(gen.session)
        return host, device["bytes_to_npu"] + device["bytes_to_host"]

    a = crossed()
    gen.generate(prompt, 1)
    b = crossed()
    gen.generate(prompt, STEPS)
    c = crossed()
    per_step = [((z - y) - (y - x)) / (STEPS - 1) for x, y, z in zip(a, b, c)]
    info = gen.info
    assert per_step == [0, 8 * (1 + 1 + capacity) + 4 * info.vocab]  # ids, positions, mask; logits: no KV
    with pytest.raises(ValueError, match="kv_memory='npu'"):
        Generator(path, providers=CPU, kv_memory="npu")


def test_generation_result_tells_the_three_kv_facts_apart(models):
    """GenerationResult.kv_decode, per decode step: KV bytes across the host<->NPU boundary, bytes appended in place
    or into a copy, past bytes copied and full copies, for the resident modes and the copying path."""
    path, capacity = models["int4"], 64
    info = inspect_model(onnx.load(str(path), load_external_data=False))
    row = 2 * info.n_layers * info.kv_heads * info.head_dim * 4  # one token's K and V, every layer
    got = {}
    for name, kw in (("npu", dict(kv_memory="npu")), ("host", {}), ("copying", dict(kv_in_place=False))):
        gen = Generator(path, providers=NPU, buckets=BUCKETS, max_kv_len=capacity, **kw)
        got[name] = gen.generate(PROMPTS[1], STEPS).kv_decode
    assert got["npu"] == {"mode": "resident npu", "kv_across_boundary_bytes": 0.0,
                          "all_across_boundary_bytes": 8 * (2 + capacity) + 4 * info.vocab,
                          "appended_in_place_bytes": row, "appended_into_copy_bytes": 0.0, "past_copied_bytes": 0.0,
                          "full_copies": 0.0}
    slots = row // info.n_layers // 2  # bytes of one position's K (or V) in one layer
    assert got["host"]["kv_across_boundary_bytes"] == 2 * info.n_layers * 2 * capacity * slots  # pasts in, presents out
    assert got["host"]["appended_in_place_bytes"] == row and got["host"]["full_copies"] == 0
    assert got["copying"]["appended_into_copy_bytes"] == row and got["copying"]["full_copies"] == info.n_layers
    assert got["copying"]["past_copied_bytes"] > 0
    assert Generator(path, providers=CPU, buckets=BUCKETS).generate(PROMPTS[1], 2).kv_decode is None


def test_npu_generate_kv_option(models, capsys):
    from npu_ep.tools.npu_generate import main

    argv = [str(models["int4"]), "--prompt-ids", *map(str, PROMPTS[1]), "--max-new-tokens", "4", "--max-kv-len", "64"]
    assert main([*argv, "--kv", "resident-npu"]) == 0
    out = capsys.readouterr().out
    assert "KV per decode step (resident npu): 0 bytes across the host<->NPU boundary" in out
    assert main([*argv, "--kv", "copying", "--json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_per_decode_step"]
    assert kv["mode"] == "copying" and kv["full_copies"] == 4  # one per layer
