"""Generation's entry points (issue 41 item 3): the first prefill, prefill with history (chunked prefill) and decode
are named, each runs its own static bucket on the same NpuEP programs (one weight copy, one KV cache), chunked
prefill gives the unchunked prefill's tokens, and npu-report names the entries."""

from __future__ import annotations

import numpy as np
import pytest

import npu_ep
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import Generator
from npu_testing import assignment

NPU = [(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"]
CPU = ["CPUExecutionProvider"]
BUCKETS = (16, 32, 128, 256)
CAPACITY = 256


@pytest.fixture(scope="module")
def int4_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("entries")
    result = rewrite(str(build_tiny_llama(d / "tiny.onnx")), passes=("cleanup", "rope", "gqa", "int4"))
    return result.save(d / "tiny.npu.onnx")


def _all_on_npu(gen: Generator, model) -> None:
    import onnx

    placed = assignment(gen.session)
    ops = {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    for op in ("MatMulNBits", "GroupQueryAttention"):
        nodes = [n for n, t in ops.items() if t == op]
        assert nodes and all(placed.get(n) == npu_ep.get_ep_name() for n in nodes), op


def test_entries_are_named_share_the_programs_and_one_weight_copy(int4_model):
    gen = Generator(int4_model, providers=NPU, buckets=BUCKETS, max_kv_len=CAPACITY, prefill_chunk=32)
    _all_on_npu(gen, int4_model)
    programs = dict(gen._runner.eps[0].programs)
    weights = gen.entries.weight_bytes()
    assert weights > 0
    res = gen.generate(PROMPTS[3], 6)  # 150 tokens: 4 chunks of 32, then 22 padded to 32
    first_p = res.steps[0].shape[1]  # 0, or the capacity when the KV is resident (one buffer for every step)
    assert first_p in (0, CAPACITY)
    assert [(s.kind, s.logical, s.shape) for s in res.steps if s.kind != "decode"] == \
        [("prefill", 32, (32, first_p))] + [("prefill_history", 32, (32, CAPACITY))] * 3 + \
        [("prefill_history", 22, (32, CAPACITY))]
    by_name = {e["name"]: e for e in res.entries}
    assert list(by_name) == [f"prefill[S=32,P={first_p}]", f"prefill_history[S=32,P={CAPACITY}]",
                             f"decode[S=1,P={CAPACITY}]"]
    assert [by_name[n]["calls"] for n in by_name] == [1, 4, 5]
    assert by_name[f"prefill_history[S=32,P={CAPACITY}]"]["logical_tokens"] == 32 * 3 + 22
    # every entry ran every NpuEP program, each under an input signature of its own
    signatures = {tuple(tuple(map(tuple, sig)) for sig in e["programs"].values()) for e in res.entries}
    assert all(set(e["programs"]) == set(programs) for e in res.entries) and len(signatures) == len(res.entries)
    # the same programs (nothing compiled per entry) and the same weight buffers, however many entries ran
    gen.generate(PROMPTS[2], 2)  # 40 tokens: 32 + 8 -> 16, a new prefill-with-history bucket
    assert len(gen.entries.entries) == 4
    assert gen._runner.eps[0].programs == programs and gen.compile_stats()["compiles"] == len(programs)
    assert gen.entries.weight_bytes() == weights


def test_chunked_prefill_tokens_identical_to_unchunked(int4_model):
    """One 256-token bucket vs chunks of 32 vs chunks of 16, on NpuEP, and the CPU EP unchunked: same tokens."""
    prompt = PROMPTS[3]
    runs = {}
    for chunk in (None, 32, 16):
        gen = Generator(int4_model, providers=NPU, buckets=BUCKETS, max_kv_len=CAPACITY, prefill_chunk=chunk,
                        chunked_prefill=chunk is not None)
        runs[chunk] = gen.generate(prompt, 16)
    cpu = Generator(int4_model, providers=CPU, buckets=BUCKETS, max_kv_len=CAPACITY,
                    chunked_prefill=False).generate(prompt, 16)
    assert [s.shape[0] for s in runs[None].steps[:1]] == [256] and runs[None].padding.waste > 0.4
    assert len([s for s in runs[16].steps if s.kind == "prefill_history"]) == 9
    for chunk in (32, 16):
        assert runs[chunk].tokens == runs[None].tokens == cpu.tokens
        drift = max(float(np.abs(a - b).max()) for a, b in zip(runs[chunk].logits, runs[None].logits))
        assert drift < 1e-4, (chunk, drift)
        assert runs[chunk].padding.waste < 0.1


def test_report_names_the_entries(int4_model):
    from npu_ep.tools.report.build import validate

    gen = Generator(int4_model, providers=NPU, buckets=BUCKETS, max_kv_len=CAPACITY, prefill_chunk=32)
    gen.generate(PROMPTS[2], 3)
    doc = npu_ep.report(gen.session, model=str(int4_model))
    validate(doc)
    entries = doc["entries"]
    assert [(e["kind"], e["new_tokens"]) for e in entries["entries"]] == \
        [("prefill", 32), ("prefill_history", 16), ("decode", 1)]
    assert [e["calls"] for e in entries["entries"]] == [1, 1, 2] and entries["weight_bytes"] > 0
    labelled = {t["entry"] for t in doc["timeline"]}
    assert {e["name"] for e in entries["entries"]} <= labelled
    from npu_ep.tools.report.html import render_html

    page = render_html(doc)
    assert "generation entry points" in page and all(e["name"] in page for e in entries["entries"])


def test_cli_prints_the_entries_and_the_chunk_plan(int4_model, capsys):
    from npu_ep.tools.npu_generate import main

    ids = ",".join(str(i) for i in range(1, 21))
    assert main([str(int4_model), "--prompt-ids", ids, "--max-new-tokens", "3", "--prefill-chunk", "8",
                 "--max-kv-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "20 logical -> 24 executed tokens (17% waste; chunk 8: 8+8+4->8)" in out
    entries = [line.split()[1] for line in out.splitlines() if line.startswith("  entry ")]
    assert [e.split("[")[0] for e in entries] == ["prefill", "prefill_history", "decode"]
    assert entries[1] == "prefill_history[S=8,P=64]" and entries[2] == "decode[S=1,P=64]"
    assert "KV cache format float32: 2,048 bytes per token" in out  # 4 layers x K+V x 2 heads x 32 x 4 B
    with pytest.raises(SystemExit):
        main([str(int4_model), "--prompt-ids", "1", "--prefill-chunk", "0"])


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_new_entries_add_no_weight_copy_to_resident_memory(tmp_path):
    """Three more entries (new buckets: each binds its own native steps) on a decoder with ~30 MB of int4 weights:
    resident memory grows by far less than one copy of them (a copy per entry would add ~30 MB each)."""
    from npu_ep.models.weights import LlamaConfig

    cfg = LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=12,
                      num_key_value_heads=4, vocab_size=4000)
    model = rewrite(str(build_tiny_llama(tmp_path / "mid.onnx", cfg)), passes=("cleanup", "rope", "gqa", "int4"))
    gen = Generator(model.save(tmp_path / "mid.npu.onnx"), providers=NPU, buckets=(16, 32, 64), max_kv_len=256,
                    prefill_chunk=64)
    weights = gen.entries.weight_bytes()
    assert weights > 25e6
    for _ in range(2):  # the first entries, twice: their buffers are allocated and reused
        gen.generate(list(range(1, 33)), 4)
    before, first = _rss_bytes(), len(gen.entries.entries)
    for n in (199, 129, 199):  # 64+64+64+7->16 and 64+64+1->16: three new entries
        gen.generate(list(range(1, n + 1)), 4)
    assert len(gen.entries.entries) == first + 3
    grown = _rss_bytes() - before
    assert grown < 0.1 * weights, f"resident memory grew {grown / 1e6:.1f} MB for 3 entries ({weights / 1e6:.1f} MB)"
    assert gen.entries.weight_bytes() == weights


def test_entries_are_named_in_the_compiled_context(int4_model, tmp_path):
    """A generator declares its entry points to the session before it compiles; the EPContext model dumped from it
    names them in its nodes' notes, and a session loaded from that context model reads them back."""
    import onnx

    from npu_ep.ep.sessions import session_of
    from npu_ep.tools.generation.entries import declared_entries

    ctx = tmp_path / "tiny_ctx.onnx"
    gen = Generator(int4_model, providers=NPU, buckets=(16, 32), max_kv_len=CAPACITY, prefill_chunk=32,
                    session_config={"ep.context_enable": "1", "ep.context_file_path": str(ctx)})
    first_p = CAPACITY if gen.kv_in_place else 0
    want = declared_entries((16, 32), True, CAPACITY, first_p)
    assert want == [f"prefill[S=16,P={first_p}]", f"prefill[S=32,P={first_p}]", f"prefill_history[S=16,P={CAPACITY}]",
                    f"prefill_history[S=32,P={CAPACITY}]", f"decode[S=1,P={CAPACITY}]"]
    assert gen._runner.eps[0].declared_entries == want
    nodes = [n for n in onnx.load(str(ctx)).graph.node if n.op_type == "EPContext"]
    notes = [next(a.s.decode() for a in n.attribute if a.name == "notes") for n in nodes]
    assert nodes and all(note.endswith(";entries=" + " ".join(want)) for note in notes)
    loaded = Generator(ctx, providers=NPU, buckets=(16, 32), max_kv_len=CAPACITY, prefill_chunk=32)
    assert session_of(loaded.session).declared_entries == want
    assert loaded.generate(PROMPTS[1], 4).tokens == gen.generate(PROMPTS[1], 4).tokens
    doc = npu_ep.report(gen.session, model=str(int4_model))
    assert doc["entries"]["declared"] == want
    assert {e["name"] for e in doc["entries"]["entries"]} <= set(want)  # every entry that ran was declared
