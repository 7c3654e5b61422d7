"""npu-report on a session generators ran on (issue 41 item 5): the three KV facts per decode token told apart in the
JSON, the terminal and the HTML, one row per KV mode, and the HTML timeline of the decode step with and without
residency (the KV's copies as DMA segments)."""

from __future__ import annotations

import onnx
import pytest

import npu_ep
from npu_ep.models.prompts import PROMPTS
from npu_ep.models.tiny_llama import build_tiny_llama
from npu_ep.rewriter import rewrite
from npu_ep.tools.generation import Generator, inspect_model
from npu_ep.tools.report.build import validate
from npu_ep.tools.report.html import KV_RESIDENCY_ID, render_html
from npu_testing import assignment

NPU = [(npu_ep.get_ep_name(), {"cache_dir": ""}), "CPUExecutionProvider"]
CAPACITY, STEPS = 64, 4


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One NpuEP session with its KV in NPU memory, run by a resident generator and then by a copying one."""
    d = tmp_path_factory.mktemp("report_kv")
    rewritten = rewrite(str(build_tiny_llama(d / "t.onnx")), passes=("cleanup", "rope", "gqa", "int4"))
    path = rewritten.save(d / "t.npu.onnx")
    resident = Generator(path, providers=NPU, buckets=(16, 32), max_kv_len=CAPACITY, kv_memory="npu")
    tokens = resident.generate(PROMPTS[1], STEPS).tokens
    copying = Generator(resident.session, buckets=(16, 32), max_kv_len=CAPACITY, kv_in_place=False)
    assert copying.generate(PROMPTS[1], STEPS).tokens == tokens
    gqa = [n.name for n in onnx.load(str(path), load_external_data=False).graph.node
           if n.op_type == "GroupQueryAttention"]
    placed = assignment(resident.session)
    assert gqa and all(placed[n] == npu_ep.get_ep_name() for n in gqa)
    doc = npu_ep.report(resident.session, model=str(path))
    return doc, inspect_model(onnx.load(str(path), load_external_data=False))


def test_json_tells_the_three_kv_facts_apart_per_mode(report):
    doc, info = report
    validate(doc)
    rows = {r["mode"]: r for r in doc["entries"]["kv_per_decode_step"]}
    assert list(rows) == ["resident npu", "copying"]
    token = 2 * info.n_layers * info.kv_heads * info.head_dim * 4  # one token's K and V, every layer, float32
    res, cop = rows["resident npu"], rows["copying"]
    assert res["decode_steps"] == cop["decode_steps"] == STEPS - 1
    assert res["kv_across_boundary_bytes"] == 0 and res["moved_in_npu_memory_bytes"] == token
    assert res["full_copies"] == 0 and res["past_copied_bytes"] == 0
    assert res["dma_us"]["across_boundary"] == 0 and res["dma_us"]["full_copies"] == 0 < res["dma_us"]["in_place"]
    assert cop["kv_across_boundary_bytes"] > 2 * info.n_layers * CAPACITY * token // info.n_layers // 2
    assert cop["moved_in_npu_memory_bytes"] == 0 and cop["full_copies"] == info.n_layers
    assert cop["past_copied_bytes"] > 0 and cop["dma_us"]["full_copies"] > 0 and cop["dma_us"]["across_boundary"] > 0
    assert res["npu_us"] > 0 and cop["npu_us"] > 0


def test_terminal_prints_the_kv_per_token_table(report, capsys):
    from rich.console import Console

    from npu_ep.tools.report.render import render

    render(report[0], Console(width=240, force_terminal=False))
    out = capsys.readouterr().out
    assert "KV per decode token" in out
    lines = [line for line in out.splitlines() if "resident npu" in line or "copying" in line]
    assert len(lines) == 2 and all(f"{STEPS - 1}" in line for line in lines)


def test_html_draws_the_decode_step_with_and_without_residency(report):
    doc, _ = report
    page = render_html(doc)
    assert f'id="{KV_RESIDENCY_ID}"' in page
    assert "decode step with and without KV residency" in page
    for segment in ("DMA: KV across the boundary", "DMA: append in place in NPU memory",
                    "DMA: full copies of the past"):
        assert segment in page
    assert "KV per decode token" in page and "bytes moved inside NPU memory (in place)" in page
